"""A database that schema version 1 wrote is upgraded in place when a newer cronoq opens it.

Version 1 is built here from the stores' own version-1 migration statements (what cronoq of that version
ran) and given a task row spelled out as version 1 wrote it, so that a change to the row codec cannot
move the expectations along with it. Opened by this cronoq, the database must reach the current version,
read that row back with the defaults of every field version 1 did not have, and take rows that use the
new fields.
"""

from __future__ import annotations

import contextlib
import sqlite3
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

from cronoq.engine.model import MissPolicy, Recurring, RecurringSpec, Status, Task, TaskSpec
from shard.store import Batch, Store
from shard.store import postgres as postgres_store
from shard.store import sqlite as sqlite_store
from tests.fulltask import NOW, full_spec, full_task

# The full task as version 1 stored it: every column it had, in its encoding.
V1_ROW: dict[str, object] = {
    "id": 7,
    "seq": 42,
    "pool": "gpu",
    "kind": "report",
    "priority": 1,
    "key": "keyone",
    "payload": b"\x00\x01binary\xff",
    "content_type": "application/xy",
    "deadline_ns": 1_700_000_060_500_000_000,
    "duration_hint_s": 1.25,
    "timeout_s": 30.0,
    "retry": "[5,0.5,3.0,120.0,false]",
    "tags": '{"t":"v","env":"prod"}',
    "labels": '{"team":"core"}',
    "tenant": "acme",
    "created_ns": 1_700_000_000_500_000_000,
    "status": 5,
    "terminal": False,
    "attempt": 2,
    "max_attempts": 5,
    "ready_ns": 1_700_000_001_500_000_000,
    "started_ns": 1_700_000_002_500_000_000,
    "finished_ns": None,
    "message": "retryingafter timeout",
}
# What it reads back as: the full task, with the fields version 2 added at their defaults.
V1_TASK = replace(
    full_task(7),
    spec=replace(full_spec(), start=None, tolerance=1.0, on_miss=MissPolicy.RUN_LATE, deps=(), resources={}),
)


def new_task(nul: str) -> Task:
    """The full task as the upgraded tables take it, the fields version 1 could not hold included."""
    return replace(full_task(8, nul), seq=43, status=Status.BLOCKED)


@dataclass
class V1Database:
    """A version-1 database, a way to open a store on it, and a way to read its recorded version."""

    open: Callable[[], Store]
    version: Callable[[], Awaitable[int]]


async def sqlite_v1(request: pytest.FixtureRequest) -> V1Database:
    path: Path = request.getfixturevalue("tmp_path") / "cronoq.db"
    columns = ", ".join(V1_ROW)
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute("BEGIN")
        conn.execute("CREATE TABLE cronoq_schema_version (version INTEGER NOT NULL)")
        conn.execute("INSERT INTO cronoq_schema_version (version) VALUES (1)")
        for statement in sqlite_store._MIGRATIONS[0]:
            conn.execute(statement)
        conn.execute(
            f"INSERT INTO cronoq_tasks ({columns}) VALUES ({', '.join('?' * len(V1_ROW))})",
            tuple(V1_ROW.values()),
        )
        conn.execute("COMMIT")

    async def version() -> int:
        with contextlib.closing(sqlite3.connect(path)) as conn:
            [(found,)] = conn.execute("SELECT version FROM cronoq_schema_version").fetchall()
        return int(found)

    return V1Database(lambda: sqlite_store.SqliteStore(path, lock_poll=0.02), version)


async def postgres_v1(request: pytest.FixtureRequest) -> V1Database:
    url: str = request.getfixturevalue("postgres_url")
    schema: str = request.getfixturevalue("pg_schema")
    statements = postgres_store._statements(schema)
    insert = sql.SQL("INSERT INTO {}.cronoq_tasks ({}) VALUES ({})").format(
        sql.Identifier(schema),
        sql.SQL(", ").join(map(sql.Identifier, V1_ROW)),
        sql.SQL(", ").join(sql.Placeholder() * len(V1_ROW)),
    )
    async with await psycopg.AsyncConnection.connect(url, autocommit=True) as conn, conn.transaction():
        await conn.execute(statements.create_schema)
        await conn.execute(statements.create_version_table)
        for statement in statements.migrations[1]:
            await conn.execute(statement)
        await conn.execute(statements.record_version, (1,))
        await conn.execute(insert, tuple(V1_ROW.values()))

    async def version() -> int:
        async with await psycopg.AsyncConnection.connect(url) as conn:
            row = await (await conn.execute(statements.read_version)).fetchone()
        assert row is not None
        return int(row[0])

    return V1Database(lambda: postgres_store.PostgresStore(url, schema=schema, retry_interval=0.02), version)


V1_BUILDERS: dict[str, Callable[[pytest.FixtureRequest], Awaitable[V1Database]]] = {
    "sqlite": sqlite_v1,
    "postgres": postgres_v1,
}
CURRENT = {"sqlite": sqlite_store.SCHEMA_VERSION, "postgres": postgres_store.SCHEMA_VERSION}


@pytest.fixture(params=sorted(V1_BUILDERS))
async def v1(request: pytest.FixtureRequest) -> AsyncIterator[tuple[V1Database, int]]:
    """A version-1 database of each SQL kind, and the version this cronoq brings it to."""
    yield await V1_BUILDERS[request.param](request), CURRENT[request.param]


@pytest.fixture
async def stores() -> AsyncIterator[list[Store]]:
    made: list[Store] = []
    yield made
    for store in reversed(made):
        await store.close()


async def test_a_v1_database_is_upgraded_in_place_and_its_rows_read_with_the_new_defaults(
    v1: tuple[V1Database, int], stores: list[Store]
) -> None:
    database, current = v1
    assert CURRENT == {"sqlite": 3, "postgres": 4}  # a new version: check what it reads from older ones
    store = database.open()
    stores.append(store)
    await store.open()
    assert await database.version() == current
    await store.acquire()
    recovered = await store.recover(NOW)
    assert (recovered.tasks, recovered.max_id, recovered.schedules) == ([V1_TASK], 7, [])
    assert recovered.totals is None  # version 1 kept none: the counters start at zero
    fetched = await store.fetch(V1_TASK.spec.key)
    assert fetched is not None and fetched.task == V1_TASK

    # The upgraded tables take what version 1 could not hold, next to the old row.
    template = TaskSpec(pool="default", payload=b"tick")
    recurring = Recurring(RecurringSpec("tick", "* * * * *", template), NOW + 60.0, 8)
    await store.commit(Batch([new_task("\x00")], max_id=8, schedules=[("tick", recurring)]))
    await store.close()

    reopened = database.open()
    stores.append(reopened)
    await reopened.open()  # already current: nothing to migrate
    await reopened.acquire()
    recovered = await reopened.recover(NOW)
    assert (recovered.tasks, recovered.schedules) == ([V1_TASK, new_task("\ufffd")], [recurring])
    assert await database.version() == current
