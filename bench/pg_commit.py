"""Postgres commit latency and rows/s for batches of 1, 64 and 1000 tasks: ``python -m bench.pg_commit``.

Uses ``DATABASE_URL`` when set, else a throwaway local server with ``fsync=on`` (see ``tests/postgres.py``),
so every commit waits for a real flush. Each batch is committed twice: first as new tasks (inserts, the
spec and payload written), then with every task moved to RUNNING (state-only updates), as a leader does
when it dispatches. With a local server it also prints the CPU per row written, of this process (the
store's side of a server's cost) and of the store's Postgres backends. Nothing here asserts: the
numbers are for people.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid
from dataclasses import dataclass, field, replace

import psycopg
from psycopg import sql

from cronoq.engine.model import Status, Task, TaskSpec
from cronoq.logs import configure
from shard.store.base import Batch
from shard.store.postgres import PostgresStore
from tests.postgres import running_postgres

from . import on_loop
from .cpu import processes_cpu_s

SIZES = (1, 64, 1000)
PAYLOAD = b"x" * 200


def tasks(first: int, n: int) -> list[Task]:
    now = time.time()
    return [
        Task(
            id=first + i,
            spec=TaskSpec(
                pool="default", payload=PAYLOAD, kind="bench", key=f"k{first + i}", tags={"t": "v"}
            ),
            seq=first + i,
            status=Status.READY,
            created=now,
            max_attempts=3,
        )
        for i in range(n)
    ]


@dataclass(slots=True)
class Phase:
    """One phase's commits: their seconds, and the CPU seconds they cost us and Postgres's backends."""

    seconds: list[float] = field(default_factory=list)
    cpu_s: float = 0.0
    backend_s: float = 0.0


async def measure(store: PostgresStore, size: int, commits: int, backends: list[int]) -> dict[str, Phase]:
    """The commits of inserts and of updates, after a few unmeasured warm-up commits. ``backends``: the
    pids of the store's Postgres backends (none: Postgres is not on this machine)."""
    results = {"insert": Phase(), "update": Phase()}
    first = 1
    for i in range(commits + 3):
        batch = tasks(first, size)
        first += size
        for phase, items in (
            ("insert", batch),
            ("update", [replace(t, status=Status.RUNNING) for t in batch]),
        ):
            cpu, backend, start = time.process_time(), processes_cpu_s(backends), time.perf_counter()
            await store.commit(Batch(items, [], first))
            if i >= 3:
                results[phase].seconds.append(time.perf_counter() - start)
                results[phase].cpu_s += time.process_time() - cpu
                results[phase].backend_s += processes_cpu_s(backends) - backend
    return results


async def store_backends(url: str) -> list[int]:
    """The pids of the store's pool connections (``application_name = 'cronoq'``)."""
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
        found = await conn.execute(
            "SELECT pid FROM pg_stat_activity WHERE application_name = 'cronoq' AND datname = current_database()"
        )
        return [int(pid) for (pid,) in await found.fetchall()]


async def run(url: str, commits: int, local: bool) -> None:
    for size in SIZES:
        schema = f"cronoq_bench_{uuid.uuid4().hex[:8]}"
        store = PostgresStore(url, schema=schema)
        try:
            await store.open()
            await store.acquire()
            backends = await store_backends(url) if local else []
            results = await measure(store, size, max(5, commits * 64 // (size + 63)), backends)
        finally:
            await store.close()
            async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
                await conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
        for name, phase in results.items():
            seconds = phase.seconds
            median = statistics.median(seconds)
            p99 = sorted(seconds)[min(len(seconds) - 1, int(0.99 * len(seconds)))]
            rows = size * len(seconds)
            cpu = (
                f", CPU per row: cronoq {phase.cpu_s / rows * 1e6:6.1f} us, Postgres {phase.backend_s / rows * 1e6:6.1f} us"
                if local
                else ""
            )
            print(
                f"batch {size:5d} {name:6s}: {len(seconds):4d} commits, median {median * 1e3:7.2f} ms,"
                f" p99 {p99 * 1e3:7.2f} ms, {size / median:9.0f} rows/s{cpu}"
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--commits", type=int, default=200, help="commits of single tasks (fewer for larger batches)"
    )
    args = parser.parse_args()
    configure(
        {"CRONOQ_LOG": os.environ.get("CRONOQ_LOG", "warning")}
    )  # the store's info lines are noise here
    with running_postgres() as server:
        on_loop(run(server.url, args.commits, server.local))


if __name__ == "__main__":
    main()
