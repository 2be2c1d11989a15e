"""Postgres commit latency and rows/s for batches of 1, 64 and 1000 tasks: ``python -m bench.pg_commit``.

Uses ``DATABASE_URL`` when set, else a throwaway local server with ``fsync=on`` (see ``tests/postgres.py``),
so every commit waits for a real flush. Each batch is committed twice: first as new tasks (inserts, the
spec and payload written), then with every task moved to RUNNING (state-only updates), as a leader does
when it dispatches. Nothing here asserts: the numbers are for people.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import uuid
from dataclasses import replace

import psycopg
from psycopg import sql

from cronoq.engine.model import Status, Task, TaskSpec
from cronoq.logs import configure
from shard.store.base import Batch
from shard.store.postgres import PostgresStore
from tests.postgres import running_postgres

from . import on_loop

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


async def measure(store: PostgresStore, size: int, commits: int) -> dict[str, list[float]]:
    """Seconds per commit, for inserts and for updates, after a few unmeasured warm-up commits."""
    results: dict[str, list[float]] = {"insert": [], "update": []}
    first = 1
    for i in range(commits + 3):
        batch = tasks(first, size)
        first += size
        for phase, items in (
            ("insert", batch),
            ("update", [replace(t, status=Status.RUNNING) for t in batch]),
        ):
            start = time.perf_counter()
            await store.commit(Batch(items, [], first))
            if i >= 3:
                results[phase].append(time.perf_counter() - start)
    return results


async def run(url: str, commits: int) -> None:
    for size in SIZES:
        schema = f"cronoq_bench_{uuid.uuid4().hex[:8]}"
        store = PostgresStore(url, schema=schema)
        try:
            await store.open()
            await store.acquire()
            results = await measure(store, size, max(5, commits * 64 // (size + 63)))
        finally:
            await store.close()
            async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn:
                await conn.execute(sql.SQL("DROP SCHEMA {} CASCADE").format(sql.Identifier(schema)))
        for phase, seconds in results.items():
            median = statistics.median(seconds)
            p99 = sorted(seconds)[min(len(seconds) - 1, int(0.99 * len(seconds)))]
            print(
                f"batch {size:5d} {phase:6s}: {len(seconds):4d} commits, median {median * 1e3:7.2f} ms,"
                f" p99 {p99 * 1e3:7.2f} ms, {size / median:9.0f} rows/s"
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
        on_loop(run(server.url, args.commits))


if __name__ == "__main__":
    main()
