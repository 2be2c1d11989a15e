"""A pgqueuer worker process for ``bench.pgqueuer_drain``: pgqueuer's own ``QueueManager`` on one asyncpg
connection, running a no-op entrypoint with at most ``--slots`` jobs at a time.

The database URL comes from ``DATABASE_URL`` (not the command line, where other users of the machine could
read its password). Lines on stdout: ``{"ready": true}`` once pgqueuer listens for its notifications, then
the number of jobs run so far whenever it grows (one line per turn of the event loop at most: the
producer, which alone knows how many jobs there are, says ``stop`` on stdin once the workers together
have run them all), and last a JSON summary: the ids of the jobs run, the submit→start latencies of
those whose payload carried the enqueue time (Unix ns as text, as ``bench.worker`` reads it), and the
CPU the process spent from ready to the end of pgqueuer's run, its last completions written (start-up
is not the drain's cost; writing the outcomes is).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from datetime import timedelta

from pgqueuer import Job, QueueManager
from pgqueuer.adapters.connections import connect_asyncpg
from pgqueuer.domain.errors import FailingListenerError

from . import on_loop
from .pgqueuer_drain import ENTRYPOINT, queries_for

READY_WITHIN_S = 30.0


async def listening(manager: QueueManager, run: asyncio.Task[None]) -> None:
    """Until ``manager.run`` listens on its channel: pgqueuer's own health probe (a NOTIFY it must hear)
    answered. A run that fails first (e.g. a schema it does not recognise) raises its error here."""
    deadline = time.monotonic() + READY_WITHIN_S
    while time.monotonic() < deadline:
        if run.done():
            await run
            raise RuntimeError("pgqueuer's QueueManager.run returned before it listened")
        try:
            await manager.listener_healthy(timedelta(seconds=0.2))
            return
        except FailingListenerError:
            continue  # probed before LISTEN: nobody heard it
    raise RuntimeError(f"pgqueuer did not listen within {READY_WITHIN_S:.0f} s")


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--schema", required=True, help="the schema pgqueuer is installed in")
    p.add_argument("--slots", type=int, required=True, help="max_concurrent_tasks")
    p.add_argument("--batch", type=int, required=True, help="batch_size: jobs per dequeue")
    args = p.parse_args()
    ran: list[int] = []
    latencies: list[float] = []
    loop = asyncio.get_running_loop()
    reporting = False

    def report() -> None:
        nonlocal reporting
        reporting = False
        print(len(ran), flush=True)

    async with connect_asyncpg(os.environ["DATABASE_URL"]) as connection:
        queries = queries_for(connection, args.schema)
        manager = QueueManager(queries, channel=queries.qbe.settings.channel)

        @manager.entrypoint(ENTRYPOINT)
        async def noop(job: Job) -> None:
            nonlocal reporting
            if job.payload:
                latencies.append((time.time_ns() - int(job.payload)) / 1e9)
            ran.append(job.id)
            if not reporting:  # one line for every job started in this turn of the loop
                reporting = True
                loop.call_soon(report)

        run = asyncio.create_task(manager.run(batch_size=args.batch, max_concurrent_tasks=args.slots))
        await listening(manager, run)
        print(json.dumps({"ready": True}), flush=True)
        ready_cpu = time.process_time()
        await asyncio.to_thread(sys.stdin.readline)  # "stop", or EOF if the producer is gone
        manager.shutdown.set()
        await run  # pgqueuer writes the completions it still holds before it returns
        cpu_s = time.process_time() - ready_cpu
    print(json.dumps({"ran": ran, "latencies": latencies, "cpu_s": cpu_s}), flush=True)


if __name__ == "__main__":
    on_loop(main())
