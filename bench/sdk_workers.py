"""``python -m bench.sdk_workers``: the same drain of no-op tasks (20,000 by default, one worker process
with 64 slots, on the memory store) served by the Python SDK's worker and by the TypeScript SDK's
(``sdk/typescript``), each over the BatchedWorkers extension and over plain Workers.Work, with the CPU
per task of each process. The worker's CPU per task is the figure that differs: the server's work is the
same whoever serves the pool. A part of ``make bench`` (``--stores sdks``); the TypeScript lines are
skipped, saying why, where node or npm is missing.
"""

from __future__ import annotations

import argparse
import tempfile
from collections.abc import Sequence
from pathlib import Path

from tests.integration.serverproc import running_server
from tests.typescript import build, missing_toolchain

from . import on_loop
from .worker import PYTHON_WORKER


def run(tasks: int, slots: int) -> None:
    from .__main__ import POOL_CONFIG, cpu_figures, drain  # __main__ imports this module for its parts

    workers: list[tuple[str, Sequence[str]]] = [("Python", PYTHON_WORKER)]
    reason = missing_toolchain()
    if reason is None:
        workers.append(("TypeScript", ("node", str(build() / "bench" / "worker.js"))))
    worker_us: dict[str, float] = {}
    with tempfile.TemporaryDirectory() as tmp, running_server(Path(tmp), POOL_CONFIG) as server:
        for name, command in workers:
            for plain in (False, True):
                d = on_loop(drain(server, tasks, slots, plain=plain, worker_command=command))
                stream = "Workers.Work" if plain else "BatchedWorkers.Work"
                print(
                    f"{name} SDK worker, drain of {d['tasks']:,.0f} no-op tasks over {stream}, 1 worker x "
                    f"{slots} slots: {d['tasks_per_s']:,.0f} tasks/s (total {d['total_s']:.2f} s)\n{cpu_figures(d)}",
                    flush=True,
                )
                worker_us[f"{name} {stream}"] = d["worker_us"]
    if reason is not None:
        print(f"TypeScript SDK worker: skipped ({reason})", flush=True)
        return
    for stream in ("BatchedWorkers.Work", "Workers.Work"):
        python, typescript = worker_us[f"Python {stream}"], worker_us[f"TypeScript {stream}"]
        print(
            f"worker CPU per task over {stream}: Python {python:.0f} us, TypeScript {typescript:.0f} us "
            f"(the TypeScript worker's is {typescript / python:.0%} of the Python worker's)",
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
