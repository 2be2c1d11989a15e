"""``python -m bench.sdk_workers`` (and the ``sdks`` part of ``make bench``): the drain of the memory
part, 20,000 no-op tasks submitted in batches of 1,000 and served by one worker process with 64 slots, by
each SDK's worker (Python, TypeScript, Go, Rust), over the BatchedWorkers extension and over plain
Workers.Work, with the CPU per task of each process (issue #26). The worker's CPU per task is the figure
that differs: the server's work is the same whoever serves the pool. The TypeScript worker is
sdk/typescript's bench/worker.js, the Go worker sdk/go/internal/testworker with ``-noop -expect``, the Rust
worker sdk/rust/examples/testworker.rs (a release build) with the same flags, each built before its
drains (building is not a drain's cost); where node, go or cargo is missing, its lines say it was
skipped and why."""

from __future__ import annotations

import argparse
import functools
import os
import shutil
import subprocess
import tempfile
from collections.abc import Callable
from pathlib import Path

from tests.integration import rustsdk
from tests.integration.gosdk import built_testworker
from tests.integration.serverproc import running_server
from tests.typescript import build, missing_toolchain

from . import on_loop
from .worker import registered_worker, start_worker

Launch = Callable[[str, int, int], subprocess.Popen[str]]  # (target, tasks, slots) -> a registered worker


def go_worker(
    target: str,
    expect: int,
    slots: int,
    *,
    plain: bool = False,
    procs: int | None = None,
    binary: Callable[[], Path] = built_testworker,
    flags: tuple[str, ...] = (),
) -> subprocess.Popen[str]:
    """The Go SDK's worker for a drain, registered, as :func:`bench.worker.start_worker` starts the
    Python one: its last line is the same summary. ``procs`` sets its GOMAXPROCS (default: the cores).
    ``binary`` gives another SDK's test worker taking the same flags (the Rust one), ``flags`` more of
    its own."""
    command = [
        str(binary()),
        "-target",
        target,
        "-slots",
        str(slots),
        "-noop",
        "-expect",
        str(expect),
    ]
    return registered_worker(
        [*command, *flags, *(["-no-batches"] if plain else [])],
        env=None if procs is None else {**os.environ, "GOMAXPROCS": str(procs)},
    )


def workers() -> tuple[list[tuple[str, Callable[[bool], Launch]]], list[str]]:
    """The SDK workers this machine can run, each by name with how to start it over either stream
    (``plain``: Workers.Work), built; and a line for each that it cannot, saying why."""
    found: list[tuple[str, Callable[[bool], Launch]]] = [
        ("Python", lambda plain: functools.partial(start_worker, plain=plain))
    ]
    skipped = []
    reason = missing_toolchain()
    if reason is None:
        node = ("node", str(build() / "bench" / "worker.js"))
        found.append(("TypeScript", lambda plain: functools.partial(start_worker, plain=plain, command=node)))
    else:
        skipped.append(f"TypeScript SDK worker: skipped ({reason})")
    if shutil.which("go") is None:
        skipped.append(
            "Go SDK worker: skipped (go is not installed; `make sdk-go` installs it as root where apt-get exists)"
        )
    else:
        built_testworker()
        found.append(("Go", lambda plain: functools.partial(go_worker, plain=plain)))
        found.append(("Go (GOMAXPROCS=1)", lambda plain: functools.partial(go_worker, plain=plain, procs=1)))
    reason = rustsdk.missing_toolchain()
    if reason is None:
        release = functools.partial(rustsdk.built_testworker, release=True)
        release()
        found.append(("Rust", lambda plain: functools.partial(go_worker, plain=plain, binary=release)))
        found.append(
            (
                "Rust (one thread)",
                lambda plain: functools.partial(
                    go_worker, plain=plain, binary=release, flags=("-threads", "1")
                ),
            )
        )
    else:
        skipped.append(f"Rust SDK worker: skipped ({reason})")
    return found, skipped


def run(tasks: int, slots: int) -> None:
    from .__main__ import POOL_CONFIG, cpu_figures, drain  # __main__ imports this module for its parts

    found, skipped = workers()
    worker_us: dict[tuple[str, bool], float] = {}
    with tempfile.TemporaryDirectory() as tmp, running_server(Path(tmp), POOL_CONFIG) as server:
        for name, launch in found:
            for plain in (False, True):
                d = on_loop(drain(server, tasks, slots, launch=launch(plain)))
                stream = "Workers.Work" if plain else "BatchedWorkers.Work"
                print(
                    f"{name} SDK worker, drain of {d['tasks']:,.0f} no-op tasks over {stream}, 1 worker x "
                    f"{slots} slots: {d['tasks_per_s']:,.0f} tasks/s (total {d['total_s']:.2f} s)\n{cpu_figures(d)}",
                    flush=True,
                )
                worker_us[(name, plain)] = d["worker_us"]
    for line in skipped:
        print(line, flush=True)
    for plain in (False, True):
        python = worker_us[("Python", plain)]
        others = ", ".join(
            f"{name} {us:.0f} us ({us / python:.0%})"
            for (name, p), us in worker_us.items()
            if p == plain and name != "Python"
        )
        stream = "Workers.Work" if plain else "BatchedWorkers.Work"
        print(
            f"worker CPU per task over {stream}: Python {python:.0f} us; {others or 'no other SDK here'}",
            flush=True,
        )


def main() -> None:
    p = argparse.ArgumentParser(prog="python -m bench.sdk_workers", description=__doc__)
    p.add_argument("--tasks", type=int, default=20_000, help="tasks in each drain (default: %(default)s)")
    p.add_argument("--slots", type=int, default=64, help="the worker's slots (default: %(default)s)")
    args = p.parse_args()
    run(args.tasks, args.slots)


if __name__ == "__main__":
    main()
