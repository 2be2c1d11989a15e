"""pgqueuer's drain and submit→start latency, on the same machine and Postgres as cronoq's, in the same run.

pgqueuer is the plain Postgres job queue cronoq is measured against (issue #25): ``python -m
bench.pgqueuer_drain``, and the ``pgqueuer`` part of ``make bench``, printed beside cronoq's Postgres drain.

pgqueuer 1.6.0 (pinned in the ``dev`` extra, with its asyncpg driver) is installed by its own installer
(``Queries.install``) into a schema of its own, dropped first and afterwards, with its defaults: every
table logged (``durable``), on the Postgres the rest of ``make bench`` uses (fsync on, no tuning for
either side). The shape is the issue's: 20,000 no-op jobs enqueued in lists of 1,000 (as cronoq's drain
submits) and drained by 2 worker processes of 16 concurrent jobs each, then submit→start latency at
200 jobs/s for 10 s, each job enqueued alone carrying its enqueue time (Unix ns as text, as
``bench.worker`` reads it). Each worker is pgqueuer's ``QueueManager`` on one asyncpg connection
(``bench.pgqueuer_worker``; not ``PgQueuer``, which also runs its cron scheduler, polling a schedules
table nothing here uses every second) run with ``max_concurrent_tasks=16``, pgqueuer's per-worker cap (an entrypoint's
``concurrency_limit`` is a cap over all workers), and ``batch_size=8``, the largest dequeue batch pgqueuer
accepts under that cap (it requires ``max_concurrent_tasks >= 2 * batch_size``; its default batch is 10).
It completes jobs through its log buffer, a batch of 8 or every 0.1 s. It does not poll while idle:
a statement-level trigger NOTIFYs on every change of the queue table and the workers LISTEN; while
jobs are queued and a worker is full it re-checks every 0.1 s as well (its ``min_dequeue_poll_interval``),
and its ``dequeue_timeout`` of 30 s bounds the wait otherwise.

The drain's time runs from the first enqueue to the exit of the last worker, told to stop once the
workers together have started every job and gone once they have written the last completions; the
CPU per job is the producer's (this process), the workers' (from ready to their last completion
written) and the Postgres server's (its postmaster and all its processes, when it runs on this
machine). Afterwards the queue table must be empty and the log must hold every job as successful.
Nothing here asserts a speed: the numbers are for people.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from pgqueuer import AsyncpgDriver, Queries
from pgqueuer.adapters.connections import connect_asyncpg
from pgqueuer.adapters.persistence.qb import (
    QueryBuilderEnvironment,
    QueryQueueBuilder,
    QuerySchedulerBuilder,
)
from pgqueuer.domain.settings import DBSettings
from pgqueuer.domain.types import Channel

from . import local_port, on_loop, percentile, postgres_or_skip
from .cpu import cost_line, postgres_cpu_s, self_cpu_s

VERSION = "1.6.0"  # what pyproject.toml pins
ENTRYPOINT = "noop"
SCHEMA = "pgqueuer_bench"
ENQUEUE_BATCH = 1000
JOBS = 20_000
RATE = 200.0
SECONDS = 10.0


@dataclass(frozen=True, slots=True)
class Shape:
    """The workers: ``processes`` QueueManagers, each with ``slots`` (``max_concurrent_tasks``) and
    ``batch`` jobs per dequeue (``batch_size``; pgqueuer requires slots >= 2 * batch)."""

    processes: int = 2
    slots: int = 16
    batch: int = 8


@dataclass(frozen=True, slots=True)
class Plan:
    """What to measure: a drain of ``jobs`` jobs, then latency at ``rate`` jobs/s for ``seconds``, both
    with workers of ``shape``."""

    jobs: int = JOBS
    rate: float = RATE
    seconds: float = SECONDS
    shape: Shape = Shape()


@dataclass(frozen=True, slots=True)
class Session:
    """One run of the workers: the jobs enqueued and run (by id), the latencies the workers saw, the
    seconds enqueueing took and the whole session took (first enqueue to the last worker's exit), and
    the CPU seconds the producer, the workers together and Postgres spent meanwhile."""

    enqueued: list[int]
    ran: list[int]
    latencies: list[float]
    enqueue_s: float
    total_s: float
    producer_s: float
    workers_s: float
    database_s: float

    @property
    def jobs_per_s(self) -> float:
        return len(self.ran) / self.total_s

    def cpu_line(self) -> str:
        seconds = {"producer": self.producer_s, "workers": self.workers_s, "Postgres": self.database_s}
        return cost_line("job", {name: s / len(self.ran) * 1e6 for name, s in seconds.items()})


def settings_for(schema: str) -> DBSettings:
    """pgqueuer's defaults, in ``schema``, notifying on a channel named after it (NOTIFY channels are
    per database: another run in another schema of the same database must not wake these workers)."""
    return DBSettings(db_schema=schema, channel=Channel(f"{schema}_changed"))


def queries_for(connection: Any, schema: str) -> Queries:
    """pgqueuer's ``Queries`` on an asyncpg ``connection`` (pgqueuer's ``connect_asyncpg``; asyncpg has
    no type information, hence Any) with every query built for ``schema``."""
    settings = settings_for(schema)
    return Queries(
        AsyncpgDriver(connection),
        qbe=QueryBuilderEnvironment(settings),
        qbq=QueryQueueBuilder(settings),
        qbs=QuerySchedulerBuilder(settings),
    )


async def enqueue_batches(queries: Queries, jobs: int) -> list[int]:
    """The drain's producer: ``jobs`` no-op jobs without payload, in lists of ENQUEUE_BATCH."""
    ids: list[int] = []
    for i in range(0, jobs, ENQUEUE_BATCH):
        k = min(ENQUEUE_BATCH, jobs - i)
        ids += await queries.enqueue([ENTRYPOINT] * k, [None] * k, [0] * k)
    return ids


async def enqueue_paced(queries: Queries, rate: float, jobs: int) -> list[int]:
    """The latency run's producer: ``jobs`` jobs enqueued alone at ``rate`` a second, each carrying the
    time it was enqueued."""
    ids: list[int] = []
    t0 = time.perf_counter()
    for i in range(jobs):
        delay = t0 + i / rate - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        ids += await queries.enqueue(ENTRYPOINT, str(time.time_ns()).encode())
    return ids


async def session(
    url: str,
    queries: Queries,
    shape: Shape,
    jobs: int,
    produce: Callable[[Queries], Awaitable[list[int]]],
    database_port: int | None,
) -> Session:
    """Start the workers, wait until they listen, run ``produce`` (which enqueues ``jobs`` jobs) and
    wait until the workers have run them all and written their completions."""
    schema = queries.qbe.settings.db_schema
    assert schema is not None
    command = [sys.executable, "-m", "bench.pgqueuer_worker", "--schema", schema]
    command += ["--slots", str(shape.slots), "--batch", str(shape.batch)]
    env = {**os.environ, "DATABASE_URL": url}
    pipe = asyncio.subprocess.PIPE
    workers = [
        await asyncio.create_subprocess_exec(*command, stdin=pipe, stdout=pipe, env=env)
        for _ in range(shape.processes)
    ]
    try:
        for worker in workers:
            assert worker.stdout is not None
            line = await worker.stdout.readline()
            if b"ready" not in line:
                raise RuntimeError(f"pgqueuer worker failed to start: {line!r}")
        counts = [0] * len(workers)
        summaries: list[dict[str, Any]] = [{} for _ in workers]
        all_started = asyncio.Event()

        async def follow(i: int, worker: asyncio.subprocess.Process) -> None:
            assert worker.stdout is not None
            async for line in worker.stdout:
                if line.startswith(b"{"):
                    summaries[i] = json.loads(line)
                    return
                counts[i] = int(line)
                if sum(counts) >= jobs:
                    all_started.set()
            raise RuntimeError(f"pgqueuer worker exited ({await worker.wait()}) without its summary")

        def database_s() -> float:
            return postgres_cpu_s(database_port) if database_port else 0.0

        cpu = (self_cpu_s(), database_s())
        followers = [asyncio.create_task(follow(i, worker)) for i, worker in enumerate(workers)]
        start = time.perf_counter()
        enqueued = await produce(queries)
        enqueued_at = time.perf_counter()
        started = asyncio.create_task(all_started.wait())
        done, _ = await asyncio.wait([started, *followers], return_when=asyncio.FIRST_COMPLETED)
        if started not in done:
            started.cancel()
            await asyncio.gather(*done)  # a worker ended early: its error
        for worker in workers:
            assert worker.stdin is not None
            worker.stdin.write(b"stop\n")
            worker.stdin.close()
        await asyncio.gather(*followers)
        for worker in workers:
            if await worker.wait() != 0:
                raise RuntimeError(f"pgqueuer worker exited with {worker.returncode}")
        end = time.perf_counter()
        return Session(
            enqueued=enqueued,
            ran=[job for summary in summaries for job in summary["ran"]],
            latencies=[s for summary in summaries for s in summary["latencies"]],
            enqueue_s=enqueued_at - start,
            total_s=end - start,
            producer_s=self_cpu_s() - cpu[0],
            workers_s=sum(summary["cpu_s"] for summary in summaries),
            database_s=database_s() - cpu[1],
        )
    finally:
        for worker in workers:
            if worker.returncode is None:
                worker.kill()
                await worker.wait()


async def installed_session(
    url: str,
    schema: str,
    shape: Shape,
    jobs: int,
    produce: Callable[[Queries], Awaitable[list[int]]],
    database_port: int | None,
) -> Session:
    """:func:`session` on pgqueuer freshly installed in ``schema`` (dropped before and after); checks
    that pgqueuer itself recorded every job as done."""
    async with connect_asyncpg(url) as connection:
        queries = queries_for(connection, schema)
        settings = queries.qbe.settings
        drop = f'DROP SCHEMA IF EXISTS "{settings.db_schema}" CASCADE'
        await queries.driver.execute(drop)
        await queries.install()
        try:
            ran = await session(url, queries, shape, jobs, produce, database_port)
            left = await connection.fetchval(f"SELECT count(*) FROM {settings.qualified.queue_table}")
            done = await connection.fetchval(
                f"SELECT count(*) FROM {settings.qualified.queue_table_log} WHERE status = 'successful'"
            )
            if left or done != jobs:
                raise RuntimeError(
                    f"pgqueuer: {left} jobs left in the queue, {done} of {jobs} logged as done"
                )
            return ran
        finally:
            await queries.driver.execute(drop)


def run(
    url: str, plan: Plan = Plan(), *, schema: str = SCHEMA, database_port: int | None = None
) -> tuple[Session, Session]:
    """The drain, then the latency run, each on its own fresh install in ``schema``.
    ``database_port``: the local Postgres whose CPU is counted."""
    shape, paced = plan.shape, int(plan.rate * plan.seconds)

    async def both() -> tuple[Session, Session]:
        drained = await installed_session(
            url, schema, shape, plan.jobs, lambda q: enqueue_batches(q, plan.jobs), database_port
        )
        timed = await installed_session(
            url, schema, shape, paced, lambda q: enqueue_paced(q, plan.rate, paced), database_port
        )
        return drained, timed

    return on_loop(both())


def report(url: str, plan: Plan = Plan(), *, database_port: int | None = None) -> float:
    """:func:`run` with its figures printed; the drain's jobs/s (``make bench`` compares cronoq's with it)."""
    drained, timed = run(url, plan, database_port=database_port)
    shape, rate = plan.shape, plan.rate
    print(
        f"pgqueuer {VERSION} drain (Postgres, fsync on, asyncpg, every table logged): {len(drained.ran):,} no-op "
        f"jobs enqueued in lists of {ENQUEUE_BATCH:,}, {shape.processes} worker processes x {shape.slots} "
        f"concurrent jobs (max_concurrent_tasks={shape.slots}, batch_size={shape.batch}; LISTEN/NOTIFY on "
        f"every change of the queue table, re-polling every 0.1 s while a worker is full, completions "
        f"written in batches of {shape.batch} or every 0.1 s): {drained.jobs_per_s:,.0f} jobs/s "
        f"(enqueue {drained.enqueue_s:.2f} s, total {drained.total_s:.2f} s)\n{drained.cpu_line()}",
        flush=True,
    )
    lat = timed.latencies
    print(
        f"pgqueuer submit->start latency at {rate:.0f} jobs/s ({len(lat)} jobs, each enqueued alone, the same "
        f"workers): p50 {percentile(lat, 0.5) * 1e3:.2f} ms, p99 {percentile(lat, 0.99) * 1e3:.2f} ms, "
        f"max {max(lat) * 1e3:.2f} ms",
        flush=True,
    )
    return drained.jobs_per_s


def main() -> None:
    shape = Shape()
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--jobs", type=int, default=JOBS, help="jobs in the drain (default: %(default)s)")
    p.add_argument(
        "--rate", type=float, default=RATE, help="jobs/s of the latency run (default: %(default)s)"
    )
    p.add_argument(
        "--seconds", type=float, default=SECONDS, help="length of the latency run (default: %(default)s)"
    )
    p.add_argument(
        "--workers", type=int, default=shape.processes, help="worker processes (default: %(default)s)"
    )
    p.add_argument(
        "--slots", type=int, default=shape.slots, help="concurrent jobs per worker (default: %(default)s)"
    )
    p.add_argument(
        "--batch",
        type=int,
        default=shape.batch,
        help="jobs per dequeue, at most slots / 2 (default: %(default)s)",
    )
    args = p.parse_args()
    if args.slots < 2 * args.batch:
        p.error("--batch: pgqueuer requires --slots to be at least twice --batch")
    with postgres_or_skip() as pg:
        if pg is not None:
            shape = Shape(args.workers, args.slots, args.batch)
            report(pg.url, Plan(args.jobs, args.rate, args.seconds, shape), database_port=local_port(pg))


if __name__ == "__main__":
    main()
