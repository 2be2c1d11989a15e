"""The store contract (:mod:`cronoq.shard.store.base`), run against every kind of store.

Each kind is a :class:`Backend`: it makes store instances that share one database (replicas of one
leader group, so leader/standby and fencing can be exercised) and reaches behind the store's back
for what a test must do to the database itself (let a leader's lease lapse, bump the schema version,
break a row). Adding a kind means one Backend subclass and one entry in :data:`KINDS`.

Stores are imported as ``shard.store...`` like the rest of the tests (that is the name mypy resolves);
import a new kind the same way, since ``cronoq.shard.store`` is a second copy of the same modules whose
exception classes ``pytest.raises`` would not match.
"""

from __future__ import annotations

import abc
import asyncio
import contextlib
import re
import sqlite3
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import replace
from pathlib import Path
from typing import ClassVar

import psycopg
import pytest
from psycopg import sql

from cronoq.engine.model import Priority, RetryPolicy, Status, Task, TaskSpec
from cronoq.shards import ShardMap
from shard.store import Batch, Fenced, Leadership, SchemaTooNew, Store
from shard.store.memory import MemoryDatabase, MemoryStore
from shard.store.postgres import PostgresStore, lock_key
from shard.store.rows import COLUMNS
from shard.store.sqlite import SqliteStore

POLL = 0.02  # lock_poll of every store made here, so standbys notice a free lead quickly
STANDBY_WINDOW = 0.3  # how long a standby is watched to prove it keeps waiting (15 polls)
HANDOVER_TIMEOUT = 5.0  # upper bound for a standby to notice a free lead; met in well under a second
NOW = 1_700_000_000.0  # times are NOW + k/2 so that they survive the trip through nanoseconds exactly


class Backend(abc.ABC):
    """One database shared by the store instances a test makes, and the test's ways into it."""

    durable: ClassVar[bool]
    # Why this kind has no schema version to bump, when it has none (skips that one test).
    no_schema: ClassVar[str | None] = None

    def __init__(self) -> None:
        self.stores: list[Store] = []

    async def opened(self, *, lapsing: bool = False) -> Store:
        """A new opened instance on this database. A ``lapsing`` one loses its lead soon after it
        acquires unless :meth:`expire` does that (it does not renew); the contract only relies on it
        after :meth:`expire`."""
        store = self.make(lapsing=lapsing)
        self.stores.append(store)
        await store.open()
        return store

    @abc.abstractmethod
    def make(self, *, lapsing: bool) -> Store:
        """A new, unopened instance on this database, with lock_poll=POLL."""

    @abc.abstractmethod
    async def expire(self) -> None:
        """Make the current lead lapse without telling the leader (a lease running out, a lock session
        killed), so that a standby can take over."""

    @abc.abstractmethod
    async def corrupt(self, task_id: int) -> None:
        """Make the stored row of ``task_id`` undecodable (its tags no longer JSON)."""

    @abc.abstractmethod
    async def state(self, task_id: int) -> tuple[int, bool, str]:
        """The stored (status, terminal, message) of ``task_id``, read without decoding the row."""

    async def set_schema_version(self, version: int) -> None:
        """Record ``version`` as the database's schema version, as a newer cronoq would."""
        raise NotImplementedError(self.no_schema)


class MemoryBackend(Backend):
    durable = False
    no_schema = "the memory store keeps no schema, so there is no version to be too new"

    def __init__(self) -> None:
        super().__init__()
        self.db = MemoryDatabase()

    def make(self, *, lapsing: bool) -> Store:
        return MemoryStore(self.db, lock_poll=POLL)

    async def expire(self) -> None:
        self.db.take_over()

    async def corrupt(self, task_id: int) -> None:
        self.db.tasks[task_id].row[COLUMNS.index("tags")] = "not json"

    async def state(self, task_id: int) -> tuple[int, bool, str]:
        row = self.db.tasks[task_id].row
        return (
            row[COLUMNS.index("status")],
            bool(row[COLUMNS.index("terminal")]),
            row[COLUMNS.index("message")],
        )


class SqliteBackend(Backend):
    """A file in tmp_path. A lapsing instance's lease lasts 0.3 s and is never renewed, so
    :meth:`expire` has nothing to do but let it run out."""

    durable = True

    def __init__(self, path: Path) -> None:
        super().__init__()
        self.path = path

    def make(self, *, lapsing: bool) -> Store:
        if lapsing:
            return SqliteStore(self.path, lease_ttl=0.3, lease_renew=60.0, lock_poll=POLL)
        return SqliteStore(self.path, lock_poll=POLL)

    async def expire(self) -> None:
        """The lapsing leader's lease runs out by itself; the standby's poll notices."""

    def _execute(self, sql: str, *args: object) -> list[tuple[object, ...]]:
        with contextlib.closing(sqlite3.connect(self.path, isolation_level=None)) as conn:
            return conn.execute(sql, args).fetchall()

    async def corrupt(self, task_id: int) -> None:
        self._execute("UPDATE cronoq_tasks SET tags = 'not json' WHERE id = ?", task_id)

    async def state(self, task_id: int) -> tuple[int, bool, str]:
        [(status, terminal, message)] = self._execute(
            "SELECT status, terminal, message FROM cronoq_tasks WHERE id = ?", task_id
        )
        assert isinstance(status, int) and isinstance(message, str)
        return status, bool(terminal), message

    async def set_schema_version(self, version: int) -> None:
        self._execute("UPDATE cronoq_schema_version SET version = ?", version)


class PostgresBackend(Backend):
    """A schema of its own on the suite's Postgres. A lapsing instance checks its lock session only
    hourly, so after :meth:`expire` kills that session it keeps believing it leads until a commit is
    fenced."""

    durable = True

    def __init__(self, url: str, schema: str) -> None:
        super().__init__()
        self.url = url
        self.schema = schema

    def make(self, *, lapsing: bool) -> Store:
        check = 3600.0 if lapsing else 1.0
        return PostgresStore(self.url, schema=self.schema, lock_poll=POLL, check_interval=check)

    async def _execute(self, query: sql.Composable | str, *args: object) -> list[tuple[object, ...]]:
        async with await psycopg.AsyncConnection.connect(self.url, autocommit=True) as conn:
            await conn.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(self.schema)))
            cursor = await conn.execute(query, args)  # type: ignore[arg-type]
            return await cursor.fetchall() if cursor.description else []

    async def expire(self) -> None:
        classid, objid = lock_key(self.schema)
        await self._execute(
            "SELECT pg_terminate_backend(pid) FROM pg_locks WHERE locktype = 'advisory' AND granted"
            " AND classid = %s AND objid = %s AND objsubid = 2",
            classid,
            objid & 0xFFFFFFFF,
        )

    async def corrupt(self, task_id: int) -> None:
        await self._execute("UPDATE cronoq_tasks SET tags = 'not json' WHERE id = %s", task_id)

    async def state(self, task_id: int) -> tuple[int, bool, str]:
        [(status, terminal, message)] = await self._execute(
            "SELECT status, terminal, message FROM cronoq_tasks WHERE id = %s", task_id
        )
        assert isinstance(status, int) and isinstance(message, str)
        return status, bool(terminal), message

    async def set_schema_version(self, version: int) -> None:
        await self._execute("UPDATE cronoq_schema_version SET version = %s", version)


KINDS: dict[str, Callable[[pytest.FixtureRequest], Backend]] = {
    "memory": lambda request: MemoryBackend(),
    "sqlite": lambda request: SqliteBackend(request.getfixturevalue("tmp_path") / "cronoq.db"),
    "postgres": lambda request: PostgresBackend(
        request.getfixturevalue("postgres_url"), request.getfixturevalue("pg_schema")
    ),
}


@pytest.fixture(params=sorted(KINDS))
async def backend(request: pytest.FixtureRequest) -> AsyncIterator[Backend]:
    made = KINDS[request.param](request)
    yield made
    for store in reversed(made.stores):
        await store.close()


async def leader(backend: Backend) -> tuple[Store, Leadership]:
    store = await backend.opened()
    return store, await store.acquire()


def task(
    task_id: int,
    status: Status = Status.READY,
    *,
    key: str = "",
    finished: float | None = None,
    payload: bytes | None = b"payload",
) -> Task:
    return Task(
        id=task_id,
        spec=TaskSpec(pool="default", payload=payload, key=key),
        seq=task_id,
        status=status,
        created=NOW,
        finished=finished,
    )


def ids(tasks: list[Task]) -> list[int]:
    return [t.id for t in tasks]


# ---------------------------------------------------------------------------------------- basics


async def test_fresh_store_leads_with_first_epoch_and_is_empty(backend: Backend) -> None:
    """A durable store's first leader gets epoch 1 (never 0: ids of epoch 0 could repeat across
    restarts). Memory's first leader gets epoch 0, so its ids start at 1 as without a store."""
    store, lead = await leader(backend)
    assert store.durable is backend.durable
    assert lead.epoch == (1 if backend.durable else 0)
    assert not lead.lost.is_set()
    recovered = await store.recover(0)
    assert recovered.tasks == []
    assert recovered.max_id == 0
    await store.commit(Batch())  # an empty batch is a valid commit
    assert await store.fetch(1) is None
    assert await store.fetch("absent") is None


async def test_close_is_idempotent_and_safe_before_open(backend: Backend) -> None:
    unopened = backend.make(lapsing=False)
    await unopened.close()
    await unopened.close()
    store, _ = await leader(backend)
    await store.close()
    await store.close()


# ----------------------------------------------------------------------------------------- tasks


def full_task() -> tuple[Task, Task]:
    """A task with every field set, NUL in every string that may hold one, and what comes back."""
    sent = Task(
        id=ShardMap([]).first_id(1, 0),
        spec=TaskSpec(
            pool="default",
            payload=b"\x00\x01binary\xff",
            content_type="application/x\x00y",
            kind="report\x00",
            priority=Priority.HIGH,
            key="key\x00one",
            deadline=NOW + 60.5,
            duration_hint=1.25,
            timeout=30.0,
            retry=RetryPolicy(5, 0.5, 3.0, 120.0, False),
            tags={"t\x00": "v\x00", "env": "prod"},
            labels={"team": "core\x00"},
            tenant="acme\x00",
        ),
        seq=42,
        status=Status.RETRYING,
        created=NOW + 0.5,
        attempt=2,
        max_attempts=5,
        ready_at=NOW + 1.5,
        started=NOW + 2.5,
        finished=None,
        message="retrying\x00after timeout",
    )
    back = replace(
        sent,
        spec=replace(
            sent.spec,
            content_type="application/x\ufffdy",
            kind="report\ufffd",
            key="key\ufffdone",
            tags={"t\ufffd": "v\ufffd", "env": "prod"},
            labels={"team": "core\ufffd"},
            tenant="acme\ufffd",
        ),
        message="retrying\ufffdafter timeout",
    )
    return sent, back


async def test_every_field_survives_a_handover(backend: Backend) -> None:
    """What one leader commits, the next one recovers and fetches field for field (NUL as U+FFFD)."""
    sent, back = full_task()
    bare = Task(
        id=sent.id + 1,
        spec=TaskSpec(pool="other", payload=None, priority=Priority.LOW),
        seq=43,
        status=Status.SUCCEEDED,
        created=NOW + 3.5,
        attempt=1,
        finished=NOW + 4.5,
    )
    first, _ = await leader(backend)
    await first.commit(Batch([sent, bare], max_id=bare.id))
    await first.release()

    second, _ = await leader(backend)
    recovered = await second.recover(NOW)
    assert recovered.tasks == [back, bare]
    assert recovered.max_id == bare.id
    fetched = await second.fetch(sent.id)
    assert fetched is not None and fetched.task == back
    by_key = await second.fetch(sent.spec.key)
    assert by_key is not None and by_key.task == back


async def test_state_updates_never_rewrite_the_spec(backend: Backend) -> None:
    store, _ = await leader(backend)
    original = task(1, payload=b"original")
    await store.commit(Batch([original], max_id=1))
    running = replace(
        original,
        spec=replace(original.spec, payload=b"changed", kind="changed"),
        status=Status.RUNNING,
        attempt=1,
        started=NOW + 1.5,
        message="dispatched",
    )
    await store.commit(Batch([running], max_id=1))
    [recovered] = (await store.recover(0)).tasks
    assert recovered.spec == original.spec
    assert (recovered.status, recovered.attempt, recovered.started, recovered.message) == (
        Status.RUNNING,
        1,
        NOW + 1.5,
        "dispatched",
    )


async def test_recover_keeps_live_tasks_and_tasks_finished_since_the_cutoff(backend: Backend) -> None:
    store, _ = await leader(backend)
    batch = [
        task(30, Status.SUCCEEDED, finished=NOW + 10),
        task(10, Status.FAILED, finished=NOW - 10),
        task(20, Status.CANCELLED, finished=NOW),
        task(5, Status.READY),
        task(25, Status.RUNNING),
        task(15, Status.SCHEDULED),
    ]
    await store.commit(Batch(batch, max_id=30))
    assert ids((await store.recover(NOW)).tasks) == [5, 15, 20, 25, 30]
    assert ids((await store.recover(NOW + 11)).tasks) == [5, 15, 25]
    assert ids((await store.recover(0)).tasks) == [5, 10, 15, 20, 25, 30]


async def test_a_key_can_pass_from_a_finished_task_to_a_new_one_in_one_batch(backend: Backend) -> None:
    """Keys are unique among live tasks only; the batch that ends the old holder of a key may insert
    the new one first."""
    store, _ = await leader(backend)
    await store.commit(Batch([task(1, key="nightly")], max_id=1))
    await store.commit(
        Batch([task(2, key="nightly"), task(1, Status.SUCCEEDED, key="nightly", finished=NOW)], max_id=2)
    )
    recovered = (await store.recover(0)).tasks
    assert [(t.id, t.status) for t in recovered] == [(1, Status.SUCCEEDED), (2, Status.READY)]


async def test_outputs_are_fetched_by_id_and_by_newest_key(backend: Backend) -> None:
    store, _ = await leader(backend)
    done = task(10, Status.SUCCEEDED, key="report", finished=NOW)
    await store.commit(Batch([done], outputs=[(10, b'{"rows": 3}', "application/json")], max_id=10))
    await store.commit(Batch([task(20, key="report"), task(30, key="other")], max_id=30))

    by_id = await store.fetch(10)
    assert by_id is not None
    assert (by_id.task, by_id.output, by_id.output_type) == (done, b'{"rows": 3}', "application/json")
    newest = await store.fetch("report")
    assert newest is not None
    assert (newest.task.id, newest.output, newest.output_type) == (20, None, "")
    assert await store.fetch(11) is None
    assert await store.fetch("unknown") is None


async def test_prune_deletes_only_tasks_that_finished_before_the_cutoff(backend: Backend) -> None:
    store, _ = await leader(backend)
    old_live = replace(task(1, Status.READY), created=NOW - 1000)
    batch = [
        old_live,
        task(2, Status.SUCCEEDED, finished=NOW - 100),
        task(3, Status.DEAD_LETTERED, finished=NOW - 10),
        task(4, Status.FAILED, finished=NOW),
        task(5, Status.RUNNING),
    ]
    await store.commit(Batch(batch, max_id=5))
    assert await store.prune(NOW - 50) == 1
    assert await store.prune(NOW - 50) == 0
    assert await store.prune(NOW) == 1
    assert ids((await store.recover(0)).tasks) == [1, 4, 5]
    assert await store.fetch(2) is None


async def test_max_id_is_a_high_water_mark(backend: Backend) -> None:
    """Ids are never reused: the mark only grows, survives the pruning of the tasks that held it, and
    is never below a stored id."""
    store, _ = await leader(backend)
    await store.commit(Batch([task(5), task(9)], max_id=20))
    assert (await store.recover(0)).max_id == 20
    await store.commit(Batch(max_id=3))
    assert (await store.recover(0)).max_id == 20

    finished = [task(5, Status.SUCCEEDED, finished=NOW), task(9, Status.CANCELLED, finished=NOW)]
    await store.commit(Batch(finished, max_id=20))
    assert await store.prune(NOW + 1) == 2
    recovered = await store.recover(0)
    assert (recovered.tasks, recovered.max_id) == ([], 20)

    await store.commit(Batch([task(40)]))
    assert (await store.recover(0)).max_id == 40


# ------------------------------------------------------------------------------------ leadership


@pytest.mark.parametrize("step_down", ["release", "close"])
async def test_standby_waits_while_the_leader_leads_and_takes_over_when_it_steps_down(
    backend: Backend, step_down: str
) -> None:
    first, first_lead = await leader(backend)
    await first.commit(Batch([task(1)], max_id=1))
    second = await backend.opened()
    standby = asyncio.create_task(second.acquire())
    try:
        done, _ = await asyncio.wait({standby}, timeout=STANDBY_WINDOW)
        assert not done, "the standby took the lead while the leader still held it"
        await (first.release() if step_down == "release" else first.close())
        second_lead = await asyncio.wait_for(standby, HANDOVER_TIMEOUT)
    finally:
        standby.cancel()
    assert second_lead.epoch == first_lead.epoch + 1
    assert ids((await second.recover(0)).tasks) == [1]


async def test_a_leader_that_lost_its_lead_is_fenced(backend: Backend) -> None:
    """A leader whose lead lapsed and was taken over cannot write, not even an empty batch; its
    Leadership says so, and nothing it tried reaches the new leader."""
    first = await backend.opened(lapsing=True)
    first_lead = await first.acquire()
    second = await backend.opened()
    standby = asyncio.create_task(second.acquire())
    try:
        await backend.expire()
        second_lead = await asyncio.wait_for(standby, HANDOVER_TIMEOUT)
    finally:
        standby.cancel()
    assert second_lead.epoch > first_lead.epoch

    with pytest.raises(Fenced):
        await first.commit(Batch())
    with pytest.raises(Fenced):
        await first.commit(Batch([task(1)], max_id=1))
    assert first_lead.lost.is_set() and first_lead.reason
    assert not second_lead.lost.is_set()

    await second.commit(Batch([task(2)], max_id=2))
    assert ids((await second.recover(0)).tasks) == [2]


# ---------------------------------------------------------------------------------- schema, rows


async def test_a_schema_from_a_newer_cronoq_is_refused(backend: Backend) -> None:
    if backend.no_schema:
        pytest.skip(backend.no_schema)
    store = await backend.opened()
    await store.close()
    await backend.set_schema_version(999)
    with pytest.raises(SchemaTooNew) as refused:
        await backend.opened()
    message = str(refused.value)
    assert "999" in message and re.search(r"\b1\b", message) and "upgrade" in message.lower()


async def test_an_undecodable_row_is_quarantined_and_recovery_goes_on(backend: Backend) -> None:
    store, _ = await leader(backend)
    await store.commit(Batch([task(1), task(2), task(3)], max_id=3))
    await backend.corrupt(2)

    before = time.time()
    assert ids((await store.recover(0)).tasks) == [1, 3]
    status, terminal, message = await backend.state(2)
    assert (status, terminal) == (int(Status.FAILED), True)
    assert message.startswith("quarantined: row could not be decoded (")
    # It now counts as finished (at quarantine time), so retention prunes it like any finished task.
    assert ids((await store.recover(before + 3600)).tasks) == [1, 3]
    assert await store.prune(before - 3600) == 0
    assert await store.prune(before + 3600) == 1
