"""``python -m bench.sdk_workers`` (and the ``sdks`` part of ``make bench``): the drain of the memory
part, 20,000 no-op tasks submitted in batches of 1,000 and served by one worker process with 64 slots,
once with each SDK's worker, and the CPU each worker process spent per task (issue #26). The Go worker
is sdk/go/internal/testworker with ``-noop -expect``, built before its drain (compiling is not the
drain's cost); without ``go`` on the PATH its line says it was skipped and why."""

from __future__ import annotations

import argparse
import os
import subprocess

from tests.integration.gosdk import built_testworker

from .worker import registered_worker


def go_worker(target: str, expect: int, slots: int, *, procs: int | None = None) -> subprocess.Popen[str]:
    """The Go SDK's worker for a drain, registered, as :func:`bench.worker.start_worker` starts the
    Python one: its last line is the same summary. ``procs`` sets its GOMAXPROCS (default: the cores)."""
    return registered_worker(
        [str(built_testworker()), "-target", target, "-slots", str(slots), "-noop", "-expect", str(expect)],
        env=None if procs is None else {**os.environ, "GOMAXPROCS": str(procs)},
    )


def main() -> None:
    from bench.__main__ import sdk_figures  # bench.__main__ imports this module

    p = argparse.ArgumentParser(prog="python -m bench.sdk_workers", description=__doc__)
    p.add_argument("--tasks", type=int, default=20_000, help="tasks in each drain (default: %(default)s)")
    p.add_argument("--slots", type=int, default=64, help="the worker's slots (default: %(default)s)")
    args = p.parse_args()
    sdk_figures(args.tasks, args.slots)


if __name__ == "__main__":
    main()
