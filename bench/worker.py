"""A benchmark worker process: no-op handler; records submit→start latency when the payload carries
the submit time (Unix ns as text), and prints a JSON summary after ``--expect`` tasks, with the CPU the
process spent between registering and its last task (its start-up is not the drain's cost)."""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import time
from collections.abc import Sequence

from cronoq.client import Lease, Worker

from . import on_loop


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--target", required=True)
    p.add_argument("--pool", default="default")
    p.add_argument("--slots", type=int, default=64)
    p.add_argument("--expect", type=int, required=True)
    p.add_argument("--plain", action="store_true", help="Workers.Work, without the batched extension")
    args = p.parse_args()
    latencies: list[float] = []
    done = asyncio.Event()
    count = 0

    async def handler(lease: Lease) -> None:
        nonlocal count
        if lease.payload:
            latencies.append((time.time_ns() - int(lease.payload)) / 1e9)
        count += 1
        if count >= args.expect:
            done.set()

    worker = Worker(args.target, args.pool, handler, slots=args.slots, name="bench", batches=not args.plain)
    task = asyncio.create_task(worker.run())
    await worker.wait_registered(30)
    print(json.dumps({"registered": True}), flush=True)
    registered_cpu = time.process_time()
    await done.wait()
    cpu_s = time.process_time() - registered_cpu  # every thread's, start-up and shutdown left out
    await worker.stop()
    await task
    print(json.dumps({"handled": count, "latencies": latencies, "cpu_s": cpu_s}), flush=True)
    sys.exit(0)


PYTHON_WORKER = (sys.executable, "-m", "bench.worker")


def start_worker(
    target: str,
    expect: int,
    slots: int,
    pool: str = "default",
    *,
    plain: bool = False,
    command: Sequence[str] = PYTHON_WORKER,
) -> subprocess.Popen[str]:
    """A bench worker process, registered; ``plain``: on Workers.Work (as a worker without the batched
    extension, such as the reference's, would be). ``command`` runs another SDK's bench worker that
    takes the same options and prints the same JSON lines (``bench.sdk_workers``)."""
    return registered_worker(
        [
            *command,
            "--target",
            target,
            "--pool",
            pool,
            "--expect",
            str(expect),
            "--slots",
            str(slots),
            *(["--plain"] if plain else []),
        ]
    )


def registered_worker(command: list[str], env: dict[str, str] | None = None) -> subprocess.Popen[str]:
    """A bench worker process (any SDK's) started with ``command`` (and ``env``, default this one's),
    once its first line says it registered; its last line is the summary :func:`main` prints."""
    proc = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=env)
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if "registered" not in line:
        raise RuntimeError(f"bench worker failed to register: {line!r}")
    return proc


if __name__ == "__main__":
    on_loop(main())
