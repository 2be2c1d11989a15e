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

from cronoq.cluster.shards import ShardMap
from cronoq.engine.model import (
    DepEdge,
    DepOn,
    MissPolicy,
    Overlap,
    Priority,
    Recurring,
    RecurringSpec,
    RetryRule,
    Status,
    Task,
    TaskSpec,
)
from cronoq.engine.snapshot import Totals
from shard.store import Batch, Fenced, Leadership, SchemaTooNew, Store
from shard.store import postgres as postgres_store
from shard.store import sqlite as sqlite_store
from shard.store.memory import MemoryDatabase, MemoryStore
from shard.store.postgres import PostgresStore, lock_key
from shard.store.rows import COLUMNS
from shard.store.sqlite import SqliteStore
from tests.fulltask import NOW, full_spec, full_task

POLL = 0.02  # lock_poll of every store made here, so standbys notice a free lead quickly
STANDBY_WINDOW = 0.3  # how long a standby is watched to prove it keeps waiting (15 polls)
HANDOVER_TIMEOUT = 5.0  # upper bound for a standby to notice a free lead; met in well under a second


class Backend(abc.ABC):
    """One database shared by the store instances a test makes, and the test's ways into it."""

    durable: ClassVar[bool]
    # Why this kind has no schema version to bump, when it has none (skips that one test).
    no_schema: ClassVar[str | None] = None
    # The schema version this cronoq migrates to, when the kind has one.
    schema_version: ClassVar[int | None] = None

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

    @abc.abstractmethod
    async def corrupt_schedule(self, name: str) -> None:
        """Make the stored row of schedule ``name`` undecodable (its spec no longer JSON)."""

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

    async def corrupt_schedule(self, name: str) -> None:
        self.db.schedules[name] = (name, "not json", None, None, 0)


class SqliteBackend(Backend):
    """A file in tmp_path. A lapsing instance's lease lasts 0.3 s and is never renewed, so
    :meth:`expire` has nothing to do but let it run out."""

    durable = True
    schema_version = sqlite_store.SCHEMA_VERSION

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

    async def corrupt_schedule(self, name: str) -> None:
        self._execute("UPDATE cronoq_recurring SET spec = 'not json' WHERE name = ?", name)

    async def set_schema_version(self, version: int) -> None:
        self._execute("UPDATE cronoq_schema_version SET version = ?", version)


class PostgresBackend(Backend):
    """A schema of its own on the suite's Postgres. A lapsing instance checks its lock session only
    hourly, so after :meth:`expire` kills that session it keeps believing it leads until a commit is
    fenced."""

    durable = True
    schema_version = postgres_store.SCHEMA_VERSION

    def __init__(self, url: str, schema: str) -> None:
        super().__init__()
        self.url = url
        self.schema = schema

    def make(self, *, lapsing: bool) -> Store:
        check = 3600.0 if lapsing else 1.0
        return PostgresStore(self.url, schema=self.schema, retry_interval=POLL, check_interval=check)

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

    async def corrupt_schedule(self, name: str) -> None:
        await self._execute("UPDATE cronoq_recurring SET spec = 'not json' WHERE name = %s", name)

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
    deps: tuple[DepEdge, ...] = (),
) -> Task:
    return Task(
        id=task_id,
        spec=TaskSpec(pool="default", payload=payload, key=key, deps=deps),
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
    assert recovered.schedules == []
    assert recovered.max_id == 0
    assert recovered.totals is None  # no leader counted anything yet
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


async def test_every_field_survives_a_handover(backend: Backend) -> None:
    """What one leader commits, the next one recovers and fetches field for field (NUL as U+FFFD); a
    task that sets nothing optional comes back with the defaults (no fixed start, tolerance 1 s,
    run_late, no dependencies, no resources)."""
    first_id = ShardMap([]).first_id(1, 0)
    sent, back = full_task(first_id, nul="\x00"), full_task(first_id, nul="\ufffd")
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


@pytest.mark.parametrize("on_miss", list(MissPolicy))
async def test_a_fixed_start_survives_with_its_tolerance_and_miss_policy(
    backend: Backend, on_miss: MissPolicy
) -> None:
    store, _ = await leader(backend)
    fixed = task(1, Status.SCHEDULED)
    fixed.spec = replace(fixed.spec, start=NOW + 30.5, tolerance=0.5, on_miss=on_miss)
    await store.commit(Batch([fixed], max_id=1))
    assert (await store.recover(0)).tasks == [fixed]


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


async def test_a_large_batch_of_state_changes_lands_on_each_row_with_its_own_output(
    backend: Backend,
) -> None:
    """More state changes in one commit than a store writes in one statement (SQLite: 1,024 rows,
    padded up to a power of two): every row gets its own state, and its own output when it has one (an
    empty output stays an empty output, not a missing one); the others keep theirs."""
    n = 2 * sqlite_store.UPDATE_CHUNK + 77
    store, _ = await leader(backend)
    await store.commit(Batch([task(i) for i in range(1, n + 1)], max_id=n))
    outputs = {i: (str(i).encode() * (i % 3), f"type/{i}") for i in range(1, n + 1) if i % 2}
    changed = [
        task(i, Status.SUCCEEDED, finished=NOW + i / 2)
        if i % 2
        else replace(task(i, Status.RUNNING), attempt=1)
        for i in range(1, n + 1)
    ]
    await store.commit(Batch(changed, outputs=[(i, *out) for i, out in outputs.items()], max_id=n))

    assert (await store.recover(0)).tasks == changed
    for i in (1, 2, 3, 1024, 1025, 1026, 2048, 2049, n - 1, n):
        fetched = await store.fetch(i)
        assert fetched is not None and fetched.task == changed[i - 1]
        assert (fetched.output, fetched.output_type) == (outputs.get(i) or (None, ""))


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


async def test_prune_keeps_what_live_tasks_depend_on(backend: Backend) -> None:
    """Pruning spares a finished task that a live task still depends on, by id or as the newest task
    holding a key (else, after a restart, an edge on a key could wait for ever); once the dependent
    finished, it goes like any other."""
    store, _ = await leader(backend)
    old = NOW - 1000
    batch = [
        task(1, Status.SUCCEEDED, finished=old),  # depended on by id
        task(2, Status.FAILED, key="k", finished=old),  # an older holder of the key: not a target
        task(3, Status.SUCCEEDED, key="k", finished=old + 1),  # the newest holder of the key
        task(4, Status.CANCELLED, finished=old),  # nobody depends on it
        task(5, Status.SUCCEEDED, finished=old),
        task(6, Status.SUCCEEDED, finished=old, deps=(DepEdge(5),)),  # finished: its deps keep nothing
        task(7, Status.BLOCKED, deps=(DepEdge(1), DepEdge("k", DepOn.COMPLETE), DepEdge(404))),
    ]
    await store.commit(Batch(batch, max_id=7))
    assert await store.prune(NOW) == 4
    assert ids((await store.recover(0)).tasks) == [1, 3, 7]
    await store.commit(Batch([replace(batch[-1], status=Status.SKIPPED, finished=old)], max_id=7))
    assert await store.prune(NOW) == 3
    assert ids((await store.recover(0)).tasks) == []


async def test_the_totals_of_the_last_commit_survive_a_handover(backend: Backend) -> None:
    """Each commit keeps the engine's counters with its tasks, so that the next leader counts on from
    them and a snapshot never goes back across a failover; a batch without totals keeps those stored."""
    counted = Totals(submitted=35, dispatched=33, succeeded=30, failed=2, retries=4, recurring_skipped=1)
    first, _ = await leader(backend)
    await first.commit(Batch([task(1)], max_id=1, totals=Totals(submitted=1)))
    await first.commit(Batch([task(2)], max_id=2, totals=counted))
    await first.commit(Batch([task(3)], max_id=3))
    await first.release()

    second, _ = await leader(backend)
    assert (await second.recover(0)).totals == counted


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


async def test_recovery_brings_back_what_live_tasks_depend_on_however_old(backend: Backend) -> None:
    """A finished task that a live task depends on is recovered past the retention cutoff: by id, or as
    the newest task holding a key (NUL in a key matches as U+FFFD). Targets already recovered come back
    once, and what finished tasks depend on stays behind."""
    old = NOW - 1000
    store, _ = await leader(backend)
    batch = [
        task(1, Status.SUCCEEDED, finished=old),
        task(2, Status.FAILED, key="lo\x00ad", finished=old),
        task(3, Status.SUCCEEDED, key="lo\x00ad", finished=old + 1),  # the newest holder of the key
        task(4, Status.CANCELLED, finished=old),  # nobody depends on it
        task(5, Status.SUCCEEDED, finished=old),
        task(6, Status.SUCCEEDED, finished=old, deps=(DepEdge(5),)),  # finished: its deps do not count
        task(7, Status.SUCCEEDED, key="recent", finished=NOW + 10),
        task(
            8,
            deps=(
                DepEdge(1),
                DepEdge("lo\x00ad", DepOn.COMPLETE),
                DepEdge(404),
                DepEdge("nobody", DepOn.FAILURE),
            ),
        ),
        task(9, Status.BLOCKED, deps=(DepEdge(7), DepEdge("recent"), DepEdge(8, DepOn.COMPLETE))),
    ]
    await store.commit(Batch(batch, max_id=9))
    assert ids((await store.recover(NOW)).tasks) == [1, 3, 7, 8, 9]
    assert ids((await store.recover(NOW + 11)).tasks) == [1, 3, 7, 8, 9]
    assert ids((await store.recover(0)).tasks) == list(range(1, 10))

    await store.commit(Batch([task(8, Status.SUCCEEDED, finished=NOW + 20, deps=batch[7].spec.deps)]))
    assert ids((await store.recover(NOW + 11)).tasks) == [7, 8, 9]


@pytest.mark.parametrize("dep", [DepEdge(1), DepEdge("first")], ids=["by id", "by key"])
async def test_an_undecodable_dependency_target_is_quarantined_and_recovery_goes_on(
    backend: Backend, dep: DepEdge
) -> None:
    store, _ = await leader(backend)
    first = task(1, Status.SUCCEEDED, key="first", finished=NOW - 1000)
    await store.commit(Batch([first, task(2, deps=(dep,))], max_id=2))
    await backend.corrupt(1)
    assert ids((await store.recover(NOW)).tasks) == [2]
    status, terminal, message = await backend.state(1)
    assert (status, terminal) == (int(Status.FAILED), True)
    assert message.startswith("quarantined: row could not be decoded (")


# ------------------------------------------------------------------------------------- schedules


def template(nul: str) -> TaskSpec:
    """A recurring template with every field a template may have (no fixed start, no absolute deadline,
    no dependencies), ``nul`` in every string that may hold one; its priority, retry policy and miss
    policy are other values than the task's."""
    return replace(
        full_spec(nul=nul),
        deadline=None,
        start=None,
        deps=(),
        priority=Priority.CRITICAL,
        retry=RetryRule(2, 0.25, 2.0, 10.0, True),
        on_miss=MissPolicy.FAIL,
    )


def schedule(name: str, *, next_start: float | None = NOW + 60, last_task_id: int = 0) -> Recurring:
    """A schedule whose template sets every field, NUL in every string that may hold one."""
    spec = RecurringSpec(name, "0 3 * * *", template("\x00"), "Europe/Paris", Overlap.QUEUE_ON_SUCCESS, 900.0)
    return Recurring(spec, next_start, last_task_id)


def stored(recurring: Recurring) -> Recurring:
    """``recurring`` as the store gives it back: NUL as U+FFFD."""
    return replace(recurring, spec=replace(recurring.spec, template=template("\ufffd")))


async def test_schedules_are_upserted_replaced_and_deleted_and_survive_a_handover(backend: Backend) -> None:
    nightly, hourly = schedule("nightly"), schedule("hourly", next_start=None, last_task_id=12)
    hourly.spec = replace(
        hourly.spec,
        cron="0 * * * *",
        tz="UTC",
        overlap=Overlap.ALLOW,
        deadline_in=None,
        template=TaskSpec(pool="other", payload=None),
    )
    first, _ = await leader(backend)
    await first.commit(Batch([task(12)], max_id=12, schedules=[("nightly", nightly), ("hourly", hourly)]))
    await first.release()

    second, _ = await leader(backend)
    recovered = await second.recover(NOW)
    assert recovered.schedules == [hourly, stored(nightly)]  # by name
    assert ids(recovered.tasks) == [12]

    advanced = replace(nightly, next_start=NOW + 86_460, last_task_id=13)
    advanced.spec = replace(advanced.spec, cron="30 3 * * *", overlap=Overlap.SKIP)
    await second.commit(Batch(schedules=[("nightly", advanced), ("hourly", None), ("absent", None)]))
    assert (await second.recover(NOW)).schedules == [stored(advanced)]


async def test_the_last_write_of_a_schedule_in_a_batch_wins(backend: Backend) -> None:
    store, _ = await leader(backend)
    first, second = schedule("b", last_task_id=1), schedule("b", last_task_id=2)
    await store.commit(Batch(schedules=[("a", schedule("a")), ("a", None), ("b", None), ("b", first)]))
    await store.commit(Batch(schedules=[("b", second), ("c", schedule("c")), ("b", first), ("c", None)]))
    assert (await store.recover(NOW)).schedules == [stored(first)]


async def test_a_fenced_commit_writes_no_schedule(backend: Backend) -> None:
    first = await backend.opened(lapsing=True)
    await first.acquire()
    await first.commit(Batch(schedules=[("kept", schedule("kept"))]))
    second = await backend.opened()
    standby = asyncio.create_task(second.acquire())
    try:
        await backend.expire()
        await asyncio.wait_for(standby, HANDOVER_TIMEOUT)
    finally:
        standby.cancel()

    with pytest.raises(Fenced):
        await first.commit(Batch(schedules=[("kept", None), ("new", schedule("new"))]))
    assert (await second.recover(NOW)).schedules == [stored(schedule("kept"))]


async def test_an_undecodable_schedule_is_skipped_until_it_is_written_again(backend: Backend) -> None:
    """A schedule row that does not decode is left as it is (a newer cronoq may read it) and recovery
    goes on; the next write of that name replaces it."""
    store, _ = await leader(backend)
    await store.commit(Batch([task(1)], max_id=1, schedules=[("a", schedule("a")), ("b", schedule("b"))]))
    await backend.corrupt_schedule("a")
    recovered = await store.recover(NOW)
    assert (recovered.schedules, ids(recovered.tasks)) == ([stored(schedule("b"))], [1])
    await store.commit(Batch(schedules=[("a", schedule("a", last_task_id=5))]))
    assert (await store.recover(NOW)).schedules == [
        stored(schedule("a", last_task_id=5)),
        stored(schedule("b")),
    ]


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
    assert "999" in message and "upgrade" in message.lower()
    assert re.search(rf"\b{backend.schema_version}\b", message)


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
