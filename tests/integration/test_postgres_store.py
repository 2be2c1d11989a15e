"""What only the Postgres store does: migrations in a schema, advisory-lock leadership and its loss,
epoch fencing across instances. The behaviour every store shares is the contract suite's business; the
round trip here checks the Postgres encoding of real tasks (types, spec written once, outputs, keys).

Every wait is bounded and on a condition (an event, a task finishing, server state polled), never a
sleep-and-hope; a standby is seen waiting for the lock in ``pg_locks`` before anything is asserted of it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import socket
import sys
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import replace
from typing import Any, TypeVar

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo
from psycopg.rows import TupleRow

from cronoq.engine.model import Priority, RetryRule, Status, Task, TaskSpec
from shard.store.base import Batch, Fenced, SchemaTooNew, StoreError, StoreUnavailable
from shard.store.postgres import (
    COMMIT_BYTES_PER_S,
    SCHEMA_VERSION,
    Keepalives,
    PostgresStore,
    commit_timeout,
    lock_key,
)
from shard.store.rows import ADDED_IN_V2, COLUMNS
from tests.postgres import PostgresServer

Admin = psycopg.AsyncConnection[TupleRow]
OpenStore = Callable[..., Awaitable[PostgresStore]]

# Fast enough that losses show within a second; the session timeout leaves a loaded machine room.
FAST: dict[str, Any] = {"retry_interval": 0.05, "check_interval": 0.1, "session_timeout": 2.0}
WITHIN = 5.0  # bound on every wait for something that should happen within a second or two
NOW = 1_700_000_000.0
# cronoq_schema_version keeps a row per migration applied; the newest is the schema's version.
HISTORY = [(version,) for version in range(1, SCHEMA_VERSION + 1)]
T = TypeVar("T")


@pytest.fixture
async def admin(postgres_url: str) -> AsyncIterator[Admin]:
    """A connection of our own, to look at and interfere with what the stores do."""
    async with await psycopg.AsyncConnection.connect(postgres_url, autocommit=True) as conn:
        yield conn


@pytest.fixture
async def open_store(postgres_url: str, pg_schema: str) -> AsyncIterator[OpenStore]:
    """Open stores (on ``pg_schema`` unless told otherwise, with fast timings) and close them all."""
    made: list[PostgresStore] = []

    async def make(schema: str | None = None, *, url: str | None = None, **options: Any) -> PostgresStore:
        store = PostgresStore(url or postgres_url, schema=schema or pg_schema, **{**FAST, **options})
        made.append(store)
        await store.open()
        return store

    yield make
    for store in made:
        await store.close()


async def rows(admin: Admin, query: str, schema: str, *params: Any) -> list[tuple[Any, ...]]:
    """Run ``query`` with ``{s}`` standing for the quoted schema name; its rows, if it returns any."""
    cur = await admin.execute(sql.SQL(query).format(s=sql.Identifier(schema)), params)
    return await cur.fetchall() if cur.description else []


async def leading(open_store: OpenStore) -> PostgresStore:
    """A store of ``pg_schema`` that leads and has recovered (an empty schema)."""
    store = await open_store()
    await store.acquire()
    await store.recover(0.0)
    return store


async def lock_pids(admin: Admin, schema: str, *, granted: bool) -> list[int]:
    """The backend pids holding (``granted``) or queued for ``schema``'s leader lock."""
    cls, key = lock_key(schema)
    found = await (
        await admin.execute(
            "SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted = %s AND objsubid = 2"
            " AND classid = %s::bigint::oid AND objid = %s::bigint::oid",
            (granted, cls, key & 0xFFFFFFFF),
        )
    ).fetchall()
    return [int(pid) for (pid,) in found]


async def lock_holder(admin: Admin, schema: str) -> int:
    """The backend pid of the session holding ``schema``'s leader lock."""
    found = await lock_pids(admin, schema, granted=True)
    assert len(found) == 1, found
    return found[0]


async def lock_waiters(admin: Admin, schema: str, count: int) -> list[int]:
    """The backend pids queued for ``schema``'s leader lock (granted = false), once there are ``count``."""
    return await until(lambda: lock_pids(admin, schema, granted=False), lambda pids: len(pids) == count)


async def terminate(admin: Admin, pid: int) -> None:
    await admin.execute("SELECT pg_terminate_backend(%s)", (pid,))


def task(
    task_id: int, status: Status = Status.READY, *, key: str = "", finished: float | None = None, **spec: Any
) -> Task:
    return Task(
        id=task_id,
        spec=TaskSpec(pool="default", payload=f"payload {task_id}".encode(), key=key, **spec),
        seq=task_id,
        status=status,
        created=NOW - 3600,
        finished=finished,
        max_attempts=3,
    )


# ------------------------------------------------------------------------------------------ schema


async def test_open_creates_the_schema_and_tables_in_it(
    open_store: OpenStore, admin: Admin, pg_schema: str
) -> None:
    schema = f'{pg_schema}_We"ird'  # quoting: upper case and a double quote
    assert await rows(admin, "SELECT 1 FROM pg_namespace WHERE nspname = %s", schema, schema) == []
    await open_store(schema)

    tables = await rows(
        admin, "SELECT table_name FROM information_schema.tables WHERE table_schema = %s", schema, schema
    )
    assert {t for (t,) in tables} == {
        "cronoq_schema_version",
        "cronoq_leader",
        "cronoq_tasks",
        "cronoq_recurring",
    }
    columns = await rows(
        admin,
        "SELECT column_name, data_type FROM information_schema.columns"
        " WHERE table_schema = %s AND table_name = 'cronoq_tasks' ORDER BY ordinal_position",
        schema,
        schema,
    )
    # Migration 2 appended its columns after version 1's, outputs included.
    v1 = [c for c in COLUMNS if c not in ADDED_IN_V2]
    assert [name for name, _ in columns] == [*v1, "output", "output_type", *ADDED_IN_V2]
    types = dict(columns)
    assert (types["id"], types["payload"], types["terminal"]) == ("bigint", "bytea", "boolean")
    assert (types["duration_hint_s"], types["output"]) == ("double precision", "bytea")
    indexes = dict(
        await rows(admin, "SELECT indexname, indexdef FROM pg_indexes WHERE schemaname = %s", schema, schema)
    )
    assert "UNIQUE" in indexes["cronoq_tasks_live_key"]
    assert "WHERE ((key IS NOT NULL) AND (NOT terminal))" in indexes["cronoq_tasks_live_key"]
    assert "(terminal, finished_ns)" in indexes["cronoq_tasks_finished"]
    assert await rows(admin, "SELECT id, epoch, max_id FROM {s}.cronoq_leader", schema) == [(1, 0, 0)]
    # The composite types commits send rows as (version 4), in the order the store encodes them.
    fields = {
        name: [
            attribute
            for (attribute,) in await rows(
                admin,
                "SELECT attribute_name FROM information_schema.attributes WHERE udt_schema = %s"
                " AND udt_name = %s ORDER BY ordinal_position",
                schema,
                schema,
                name,
            )
        ]
        for name in ("cronoq_task_row", "cronoq_task_state")
    }
    assert fields == {
        "cronoq_task_row": [*COLUMNS, "output", "output_type"],
        "cronoq_task_state": [
            *("id", "status", "attempt", "ready_ns", "started_ns", "finished_ns", "message"),
            *("output", "output_type"),
        ],
    }

    await open_store(schema)  # a second replica finds the schema current and changes nothing
    assert (
        await rows(admin, "SELECT version FROM {s}.cronoq_schema_version ORDER BY version", schema) == HISTORY
    )


async def test_replicas_opening_together_migrate_once(
    open_store: OpenStore, admin: Admin, pg_schema: str
) -> None:
    await asyncio.gather(*(open_store() for _ in range(4)))
    assert (
        await rows(admin, "SELECT version FROM {s}.cronoq_schema_version ORDER BY version", pg_schema)
        == HISTORY
    )
    assert await rows(admin, "SELECT count(*) FROM {s}.cronoq_leader", pg_schema) == [(1,)]


async def test_a_newer_schema_is_refused(open_store: OpenStore, admin: Admin, pg_schema: str) -> None:
    await open_store()
    await rows(
        admin, "INSERT INTO {s}.cronoq_schema_version (version) VALUES (%s)", pg_schema, SCHEMA_VERSION + 1
    )
    with pytest.raises(SchemaTooNew) as refused:
        await open_store()
    message = str(refused.value)
    assert f"version {SCHEMA_VERSION + 1}" in message and f"version {SCHEMA_VERSION}" in message
    assert "upgrade cronoq" in message


async def test_connection_failures_are_store_errors_without_the_password(
    open_store: OpenStore, postgres_url: str
) -> None:
    params = conninfo_to_dict(postgres_url)
    secret = "s3cret-Pa55word"
    user, host, port = params.get("user", ""), params.get("host", "localhost"), params.get("port", 5432)
    failures = {
        "refused": make_conninfo(postgres_url, host="127.0.0.1", port=1, password=secret),
        "malformed": f"postgresql://{user}:{secret} x@{host}:{port}/postgres",
    }
    if not await connects(make_conninfo(postgres_url, password=secret)):  # unless the server trusts anyone
        failures["wrong password"] = make_conninfo(postgres_url, password=secret)
        failures["wrong password in a URL"] = f"postgresql://{user}:{secret}@{host}:{port}/postgres"
    for what, url in failures.items():
        with pytest.raises(StoreError) as failed:
            await open_store(url=url)
        message = str(failed.value)
        assert "s3cret" not in message, (what, message)
        assert (
            "invalid Postgres URL" in message if what == "malformed" else "cannot use Postgres at" in message
        )


async def connects(url: str) -> bool:
    try:
        await (await psycopg.AsyncConnection.connect(url)).close()
    except psycopg.OperationalError:
        return False
    return True


# -------------------------------------------------------------------------------------------- data


async def test_commit_recover_fetch_prune_roundtrip(open_store: OpenStore) -> None:
    store = await open_store()
    lead = await store.acquire()
    assert lead.epoch == 1
    live = task(
        1,
        key="k1",
        kind="resize",
        priority=Priority.HIGH,
        content_type="application/json",
        deadline=NOW + 60.5,
        duration_hint=3,  # an int where floats are expected: written as 3.0
        timeout=2.25,
        retry=RetryRule(5, 0.5, 3.0, 30.0, False),
        tags={"ünï": "cödé", "a": ""},
        labels={"team": "x"},
        tenant="acme",
    )
    old = task(2, Status.SUCCEEDED, key="k2", finished=NOW - 1000)
    recent = task(3, Status.FAILED, finished=NOW - 10, duration_hint=1.5)
    await store.commit(Batch([recent, old, live], [(2, b"result \x00 bytes", "text/plain")], max_id=10))

    # Later commits change the state only, even if the spec they carry differs.
    started = replace(
        live, status=Status.RUNNING, attempt=1, started=NOW, spec=replace(live.spec, payload=b"?")
    )
    await store.commit(Batch([started], [], max_id=4))

    recovered = await store.recover(NOW - 100)
    assert recovered.tasks == [replace(started, spec=live.spec), recent]
    assert recovered.max_id == 10

    stored = await store.fetch(2)
    assert stored is not None and stored.task == old
    assert (stored.output, stored.output_type) == (b"result \x00 bytes", "text/plain")
    by_key = await store.fetch("k2")
    assert by_key is not None and by_key.task.id == 2
    newer = task(11, key="k2")  # the key is free again once task 2 finished: the newest wins
    await store.commit(Batch([newer], [], max_id=11))
    by_key = await store.fetch("k2")
    assert by_key is not None and by_key.task == newer and by_key.output is None
    assert (
        await store.fetch(99) is None and await store.fetch("nope") is None and await store.fetch("") is None
    )

    assert await store.prune(NOW - 100) == 1  # task 2 only: task 3 finished later, 1 and 11 are live
    assert await store.fetch(2) is None
    remaining = await store.recover(0.0)
    assert [t.id for t in remaining.tasks] == [1, 3, 11]
    assert remaining.max_id == 11


async def test_state_updates_keep_the_spec_and_land_outputs_after_a_takeover_too(
    open_store: OpenStore, admin: Admin, pg_schema: str
) -> None:
    store = await leading(open_store)
    first = task(1, key="k")
    await store.commit(Batch([first, task(2)], [], max_id=2))
    done = replace(
        first, status=Status.SUCCEEDED, attempt=1, finished=NOW, spec=replace(first.spec, payload=None)
    )
    reusing = task(3, key="k")
    running = replace(task(2), status=Status.RUNNING, attempt=1, started=NOW)
    await store.commit(Batch([done, reusing, running], [(1, b"out", "text/plain")], max_id=3))
    await store.release()

    successor = await open_store()
    await successor.acquire()
    recovered = {t.id: t for t in (await successor.recover(0.0)).tasks}
    assert recovered[2].status is Status.RUNNING and recovered[3].spec.key == "k"
    finished = replace(
        recovered[2], status=Status.SUCCEEDED, finished=NOW + 1, spec=replace(recovered[2].spec, payload=None)
    )
    await successor.commit(
        Batch([finished], [(2, b"two", "application/json"), (3, b"three", "text/plain")], max_id=3)
    )
    assert await rows(
        admin, "SELECT id, status, payload, output, output_type FROM {s}.cronoq_tasks ORDER BY id", pg_schema
    ) == [
        (1, int(Status.SUCCEEDED), b"payload 1", b"out", "text/plain"),
        (2, int(Status.SUCCEEDED), b"payload 2", b"two", "application/json"),
        (3, int(Status.READY), b"payload 3", b"three", "text/plain"),  # an output of a task not in the batch
    ]


async def test_undecodable_rows_are_quarantined(open_store: OpenStore, admin: Admin, pg_schema: str) -> None:
    store = await open_store()
    await store.acquire()
    await store.commit(Batch([task(1), task(2)], [], max_id=2))
    await rows(admin, "UPDATE {s}.cronoq_tasks SET tags = 'not json' WHERE id = 1", pg_schema)

    assert [t.id for t in (await store.recover(0.0)).tasks] == [2]
    [(status, terminal, message)] = await rows(
        admin, "SELECT status, terminal, message FROM {s}.cronoq_tasks WHERE id = 1", pg_schema
    )
    assert (status, terminal) == (Status.FAILED, True)
    assert message.startswith("quarantined: row could not be decoded (")


async def test_a_commit_that_cannot_finish_in_time_is_unavailable_and_writes_nothing(
    open_store: OpenStore, admin: Admin, pg_schema: str
) -> None:
    store = await open_store(commit_timeout=0.3)
    await store.acquire()
    async with admin.transaction():
        await rows(admin, "SELECT * FROM {s}.cronoq_leader FOR UPDATE", pg_schema)  # blocks every commit
        with pytest.raises(StoreUnavailable, match=r"did not finish within 0\.3 s"):
            await store.commit(Batch([task(1)], [], max_id=1))
        # Keep the row locked until the abandoned statement is gone from the server (cancelled).
        await until(lambda: blocked_on_locks(admin, pg_schema), lambda waiting: waiting == 0)
    assert await store.fetch(1) is None
    # The next commit goes through, retried as the runtime retries one that timed out: on a machine
    # loaded enough, even a free commit can take 0.3 s (a full-suite run next to a chaos run did).
    async with asyncio.timeout(WITHIN):
        while True:
            with contextlib.suppress(StoreUnavailable):
                await store.commit(Batch([task(2)], [], max_id=2))
                break
    assert [t.id for t in (await store.recover(0.0)).tasks] == [2]


async def test_a_commit_postgres_can_never_take_fails_for_good_and_writes_nothing(
    open_store: OpenStore,
) -> None:
    """A row over one of Postgres's own limits (here a key past the btree entry size, which admission
    refuses; see checks.check_key) fails the same way on every retry. It was retried as transient, so
    the commit loop spun on it for good and every commit behind it waited."""
    store = await open_store()
    await store.acquire()
    await store.commit(Batch([task(1)], [], max_id=1))
    unindexable = "".join(chr(0x4E00 + (i * 7919) % 20_000) for i in range(4_000))  # 12,000 bytes, varied
    with pytest.raises(StoreError, match="commit failed: index row") as raised:
        await store.commit(Batch([task(2, key=unindexable)], [], max_id=2))
    assert not isinstance(raised.value, StoreUnavailable)
    assert await store.fetch(2) is None and await store.fetch(1) is not None


async def test_a_value_that_does_not_fit_its_column_fails_the_commit_for_good_and_writes_nothing(
    open_store: OpenStore,
) -> None:
    """The store encodes its arrays itself: a deadline past 2262 (Unix nanoseconds beyond 64 bits) is
    refused before anything is sent, as Postgres refused it when psycopg encoded it."""
    store = await leading(open_store)
    too_late = replace(task(1), spec=replace(task(1).spec, deadline=1e10))
    with pytest.raises(StoreError, match="commit failed: a value does not fit BIGINT") as raised:
        await store.commit(Batch([too_late], [], max_id=1))
    assert not isinstance(raised.value, StoreUnavailable)
    await store.commit(Batch([task(2)], [], max_id=2))  # the next commit goes through
    assert await store.fetch(1) is None and await store.fetch(2) is not None


def test_a_commits_bound_grows_with_its_bytes_from_a_seconds_worth() -> None:
    finished = task(3, Status.SUCCEEDED, finished=NOW)
    finished.spec.payload = None  # as the engine releases it once a task finished
    small = Batch([task(1), finished], [(1, b"o" * 100, "text/plain")], max_id=3)
    assert commit_timeout(small, 5.0) == 5.0
    big = replace(task(2), spec=TaskSpec(pool="default", payload=b"p" * COMMIT_BYTES_PER_S))
    assert commit_timeout(Batch([big], [(2, b"o" * COMMIT_BYTES_PER_S, "")], max_id=2), 5.0) == 7.0


async def test_a_large_commit_gets_the_time_its_bytes_need(open_store: OpenStore) -> None:
    """A burst of large payloads held for one group commit can take longer than commit_timeout: with a
    fixed bound the same batch timed out on every retry (client side, and server side by the session's
    statement_timeout), stalling every commit behind it. 64 MiB cannot be written in 50 ms."""
    store = await open_store(commit_timeout=0.05)
    await store.acquire()
    payload = os.urandom(8 * 1024 * 1024)  # incompressible, so Postgres writes all of it
    tasks = [replace(task(i), spec=TaskSpec(pool="default", payload=payload)) for i in range(1, 9)]
    await store.commit(Batch(tasks, [], max_id=8))
    fetched = await store.fetch(8)
    assert fetched is not None and fetched.task.spec.payload == payload
    await store.commit(Batch([task(9)], [], max_id=9))  # and small ones keep the one-statement commit


async def test_a_commit_overtaken_by_a_later_one_writes_nothing(
    open_store: OpenStore, admin: Admin, pg_schema: str
) -> None:
    """A commit given up on may still reach the server after its retry was applied; the per-leader
    commit sequence makes it a no-op. Simulated by recording a later sequence number by hand."""
    store = await open_store()
    lead = await store.acquire()
    await store.commit(Batch([task(1)], [], max_id=1))
    await rows(admin, "UPDATE {s}.cronoq_leader SET commit_seq = commit_seq + 100", pg_schema)
    with pytest.raises(StoreUnavailable, match="later commit"):
        await store.commit(Batch([task(2)], [(1, b"stale", "text/plain")], max_id=2))
    assert not lead.lost.is_set()
    assert await store.fetch(2) is None
    first = await store.fetch(1)
    assert first is not None and first.output is None


async def blocked_on_locks(admin: Admin, schema: str) -> int:
    """How many statements on ``schema``'s tables wait for a lock."""
    row = await (
        await admin.execute(
            "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND strpos(query, %s) > 0",
            (sql.Identifier(schema).as_string(admin),),
        )
    ).fetchone()
    return int(row[0]) if row else 0


async def until(probe: Callable[[], Awaitable[T]], done: Callable[[T], bool], timeout: float = WITHIN) -> T:
    """Poll ``probe`` until ``done`` accepts its value; fail after ``timeout`` seconds."""
    async with asyncio.timeout(timeout):
        while not done(value := await probe()):  # noqa: ASYNC110 - the condition lives in the server
            await asyncio.sleep(0.02)
    return value


# -------------------------------------------------------------------------------------- leadership


async def test_a_standby_takes_over_right_after_release(
    open_store: OpenStore, admin: Admin, pg_schema: str
) -> None:
    leader, standby = await open_store(), await open_store()
    lead = await leader.acquire()
    waiting = asyncio.create_task(standby.acquire())
    await lock_waiters(admin, pg_schema, 1)
    assert not waiting.done(), "the standby must wait while the leader holds the lock"

    await leader.release()
    assert lead.lost.is_set() and lead.reason == "released"
    taken = await asyncio.wait_for(waiting, WITHIN)
    assert taken.epoch == lead.epoch + 1
    with pytest.raises(Fenced):
        await leader.commit(Batch([task(1)], [], max_id=1))


async def test_a_standby_waits_in_postgres_for_the_lock_and_leads_when_the_leaders_session_ends(
    open_store: OpenStore, admin: Admin, pg_schema: str
) -> None:
    """The standby is queued for the lock on the server (a polling standby never is), so the server
    grants it the lock as the leader's backend ends, as it does when the leader is killed."""
    leader, standby = await open_store(), await open_store()
    await leader.acquire()
    waiting = asyncio.create_task(standby.acquire())
    [queued] = await lock_waiters(admin, pg_schema, 1)
    assert standby._session is not None and queued == standby._session.info.backend_pid

    await terminate(admin, await lock_holder(admin, pg_schema))
    assert (await asyncio.wait_for(waiting, WITHIN)).epoch == 2
    assert await lock_holder(admin, pg_schema) == queued


async def test_a_waiting_standby_asks_again_on_the_same_session_after_lock_wait(
    open_store: OpenStore, admin: Admin, pg_schema: str
) -> None:
    """Each wait is bounded (lock_timeout): the standby's session answers, and waits again."""
    leader, standby = await open_store(), await open_store(lock_wait=0.1)
    await leader.acquire()
    waiting = asyncio.create_task(standby.acquire())
    [pid] = await lock_waiters(admin, pg_schema, 1)

    async def started() -> Any:
        row = await (
            await admin.execute("SELECT query_start FROM pg_stat_activity WHERE pid = %s", (pid,))
        ).fetchone()
        return row[0] if row else None

    first = await started()
    await until(started, lambda at: at is not None and at > first)
    assert await lock_waiters(admin, pg_schema, 1) == [pid] and not waiting.done()
    await leader.release()
    assert (await asyncio.wait_for(waiting, WITHIN)).epoch == 2


@pytest.mark.parametrize("how", ["close", "cancel"])
async def test_a_standby_stopped_while_waiting_leaves_no_backend_queued_for_the_lock(
    open_store: OpenStore, admin: Admin, pg_schema: str, how: str
) -> None:
    """Closing the store, or cancelling its acquire() (a shutdown), cancels the wait on the server:
    a backend left queued would take the lock when it frees and hold it until it noticed its client
    gone. lock_wait is long here so that only the cancel can end the wait within the test."""
    leader, standby = await open_store(), await open_store(lock_wait=600.0)
    await leader.acquire()
    waiting = asyncio.create_task(standby.acquire())
    await lock_waiters(admin, pg_schema, 1)

    if how == "close":
        await asyncio.wait_for(standby.close(), WITHIN)
        with pytest.raises(StoreError, match="closed while standing by"):
            await asyncio.wait_for(waiting, WITHIN)
    else:
        waiting.cancel()
        with pytest.raises(asyncio.CancelledError):
            await asyncio.wait_for(waiting, WITHIN)
    await lock_waiters(admin, pg_schema, 0)
    assert standby._session is None


async def test_a_standby_whose_session_dies_while_waiting_waits_again_and_takes_over(
    open_store: OpenStore, admin: Admin, pg_schema: str
) -> None:
    leader, standby = await open_store(), await open_store()
    await leader.acquire()
    waiting = asyncio.create_task(standby.acquire())
    [first] = await lock_waiters(admin, pg_schema, 1)

    await terminate(admin, first)
    [again] = await until(lambda: lock_waiters(admin, pg_schema, 1), lambda pids: pids != [first])
    assert again != first and not waiting.done()
    await leader.release()
    assert (await asyncio.wait_for(waiting, WITHIN)).epoch == 2


async def test_the_lock_session_keeps_tcp_keepalives_on_both_ends(
    open_store: OpenStore, admin: Admin, pg_schema: str
) -> None:
    """Client side: the socket's options (cronoq notices a vanished Postgres). Server side: the
    backend's settings (Postgres ends the session of a vanished machine, freeing the lock)."""
    store = await open_store(keepalives=Keepalives(idle_s=7, interval_s=2, count=3, user_timeout_s=4.5))
    await store.acquire()
    session = store._session
    assert session is not None
    with socket.socket(fileno=os.dup(session.pgconn.socket)) as sock:
        assert sock.getsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE) == 1
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPIDLE) == 7
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPINTVL) == 2
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_KEEPCNT) == 3
        assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_USER_TIMEOUT) == 4500
    settings = await (
        await session.execute(
            "SELECT current_setting('tcp_keepalives_idle'), current_setting('tcp_keepalives_interval'),"
            " current_setting('tcp_keepalives_count'), current_setting('tcp_user_timeout')"
        )
    ).fetchone()
    assert settings == ("7", "2", "3", "4500")


async def test_killing_the_lock_session_loses_leadership_and_the_standby_takes_over(
    open_store: OpenStore, admin: Admin, pg_schema: str
) -> None:
    leader, standby = await open_store(), await open_store()
    lead = await leader.acquire()
    waiting = asyncio.create_task(standby.acquire())

    await terminate(admin, await lock_holder(admin, pg_schema))
    # No commit happens: the lock check alone notices.
    await asyncio.wait_for(lead.lost.wait(), WITHIN)
    assert lead.reason.startswith("lock session lost"), lead.reason
    assert (await asyncio.wait_for(waiting, WITHIN)).epoch == 2
    with pytest.raises(Fenced):
        await leader.commit(Batch([task(1)], [], max_id=1))


async def test_a_live_session_without_the_lock_is_not_leading(open_store: OpenStore) -> None:
    """The check asks whether the lock is held, not whether the session answers."""
    leader = await open_store()
    lead = await leader.acquire()
    session = leader._session  # the only way to drop the lock and keep the session
    assert session is not None
    await session.execute("SELECT pg_advisory_unlock_all()")
    await asyncio.wait_for(lead.lost.wait(), WITHIN)
    assert "no longer holds" in lead.reason


@contextlib.contextmanager
def stopped(pid: int) -> Iterator[None]:
    """SIGSTOP a backend for the duration of the block (it then neither answers nor lets go of locks)."""
    os.kill(pid, signal.SIGSTOP)
    try:
        yield
    finally:
        os.kill(pid, signal.SIGCONT)


async def test_an_unresponsive_lock_session_loses_leadership(
    open_store: OpenStore, admin: Admin, pg_schema: str, postgres_server: PostgresServer
) -> None:
    if not postgres_server.local:
        pytest.skip("needs a server whose backends this process can stop (not DATABASE_URL)")
    leader, standby = await open_store(session_timeout=0.5), await open_store()
    lead = await leader.acquire()
    pid = await lock_holder(admin, pg_schema)
    waiting = asyncio.create_task(standby.acquire())
    with stopped(pid):
        await asyncio.wait_for(lead.lost.wait(), WITHIN)
        assert "did not answer within 0.5 s" in lead.reason
    # Resumed, the backend finds its client gone and exits, which frees the lock.
    assert (await asyncio.wait_for(waiting, WITHIN)).epoch == 2


async def test_a_lock_check_given_up_on_does_not_crash_the_server_loop(
    postgres_url: str, pg_schema: str, postgres_server: PostgresServer
) -> None:
    """A leader paused while its lock check waits on a hung backend, on the server's own event loop in a
    process of its own. When it resumes, psycopg's poll timer and the check's bound are both due: the
    check, given up on, had just asked the loop to watch the socket again when the store closed that
    socket, and uvloop aborted the whole process (SIGABRT, found by ``make chaos`` in a leader resumed
    after a 10 s pause). The store must let the check end before it closes its connection."""
    if not postgres_server.local:
        pytest.skip("needs a server whose backends this process can stop (not DATABASE_URL)")
    child = await asyncio.create_subprocess_exec(
        sys.executable,
        "-m",
        "tests.integration.lock_session_proc",
        postgres_url,
        pg_schema,
        "0.5",
        stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    stdin, stdout = child.stdin, child.stdout
    assert stdin is not None and stdout is not None
    try:

        async def line(word: str) -> str:
            raw: bytes = await asyncio.wait_for(stdout.readline(), WITHIN)
            said, _, value = raw.decode().strip().partition(" ")
            assert said == word, (raw, await asyncio.wait_for(child.wait(), WITHIN))
            return value

        loop = await line("loop")
        assert await line("leading") == "1"
        with stopped(int(await line("holder"))):
            stdin.write(b"go\n")
            await line("paused")
            assert "did not answer within 0.5 s" in await line("lost")
        # Resumed, the old backend finds its client gone and exits; the same process takes the lock again.
        assert await line("leading") == "2"
        await line("holder")
        assert await asyncio.wait_for(child.wait(), WITHIN) == 0
    finally:
        if child.returncode is None:
            child.kill()
        errors = (await child.communicate())[1].decode()
    assert child.returncode == 0, errors
    if loop != "uvloop":
        pytest.skip("uvloop is not installed: the crash this guards against is uvloop's")


async def test_an_old_leader_is_fenced_after_a_takeover(
    open_store: OpenStore, admin: Admin, pg_schema: str
) -> None:
    """A leader that missed losing its lock (paused, or checking rarely) cannot write after a takeover."""
    old = await open_store(check_interval=3600.0)
    lead = await old.acquire()
    await old.commit(Batch([task(1)], [], max_id=1))
    await terminate(admin, await lock_holder(admin, pg_schema))
    new = await open_store()
    assert (await asyncio.wait_for(new.acquire(), WITHIN)).epoch == 2
    assert not lead.lost.is_set()

    with pytest.raises(Fenced):
        await old.commit(Batch([task(2)], [(1, b"late", "text/plain")], max_id=99))
    assert lead.lost.is_set() and lead.reason.startswith("fenced"), lead.reason
    assert await new.fetch(2) is None
    first = await new.fetch(1)
    assert first is not None and first.output is None
    assert (await new.recover(0.0)).max_id == 1


async def test_a_fenced_leader_lets_go_of_the_lock(
    open_store: OpenStore, admin: Admin, pg_schema: str
) -> None:
    """Fenced while its session still holds the lock (the epoch bumped by hand here), a leader must not
    keep the lock: the lock is re-entrant, so leading again must not leave it held twice."""
    leader, standby = await open_store(), await open_store()
    await leader.acquire()
    await rows(admin, "UPDATE {s}.cronoq_leader SET epoch = epoch + 1", pg_schema)
    with pytest.raises(Fenced):
        await leader.commit(Batch())
    again = await asyncio.wait_for(leader.acquire(), WITHIN)
    assert again.epoch == 3
    waiting = asyncio.create_task(standby.acquire())
    await leader.release()
    assert (await asyncio.wait_for(waiting, WITHIN)).epoch == 4


async def test_schemas_lead_independently(open_store: OpenStore, admin: Admin, pg_schema: str) -> None:
    one, other = await open_store(), await open_store(f"{pg_schema}_b")
    first, second = await asyncio.wait_for(asyncio.gather(one.acquire(), other.acquire()), WITHIN)
    assert (first.epoch, second.epoch) == (1, 1)
    assert await lock_holder(admin, pg_schema) != await lock_holder(admin, f"{pg_schema}_b")
    await one.commit(Batch([task(1)], [], max_id=1))
    assert await other.fetch(1) is None


@pytest.mark.parametrize("status", list(Status))
async def test_a_state_update_sets_the_terminal_flag_from_the_status(
    open_store: OpenStore, admin: Admin, pg_schema: str, status: Status
) -> None:
    # The row is this leadership's, so the change goes through the state update, which derives the
    # flag that recovery, pruning and the live-key index read.
    store = await leading(open_store)
    await store.commit(Batch([task(1, key="k")], [], max_id=1))
    changed = replace(task(1, key="k"), status=status, attempt=1, finished=NOW if status.terminal else None)
    await store.commit(Batch([changed], [], max_id=1))
    assert await rows(admin, "SELECT status, terminal FROM {s}.cronoq_tasks", pg_schema) == [
        (int(status), status.terminal)
    ]


async def test_pool_connections_find_rows_by_index_even_in_a_small_table(
    open_store: OpenStore, admin: Admin, pg_schema: str
) -> None:
    """The commit statement is prepared, and after a few runs planned once for all while the table is
    still small: a join of the updated rows with a scan of the whole table is the cheapest plan then,
    and it stays while the table grows (measured: commits of 26 updates took 6.5 ms instead of 3 ms at
    12,000 rows). Pool connections rule sequential scans out."""
    store = await leading(open_store)
    await store.commit(Batch([task(i) for i in range(1, 51)], [], max_id=50))
    join = sql.SQL(
        "EXPLAIN SELECT t.status FROM {s}.cronoq_tasks t JOIN unnest('{{1,2,3}}'::bigint[]) AS u(id) ON t.id = u.id"
    ).format(s=sql.Identifier(pg_schema))
    plan = " ".join(row[0] for row in await (await admin.execute(join)).fetchall())
    assert "Seq Scan on cronoq_tasks" in plan  # what a connection with the defaults would do
    async with store._require_pool().connection() as conn:
        plan = " ".join(row[0] for row in await (await conn.execute(join)).fetchall())
    assert "Seq Scan on cronoq_tasks" not in plan and "cronoq_tasks_pkey" in plan


async def test_the_commit_statement_is_planned_once_not_at_every_commit(open_store: OpenStore) -> None:
    """Left to Postgres (``plan_cache_mode = auto``), a one-task commit was planned anew every time: the
    generic plan looks dearer to it than a plan for one row, and planning cost more than running."""
    store = await leading(open_store)
    for i in range(1, 11):
        await store.commit(Batch([task(i)], [], max_id=i))
    async with store._require_pool().connection() as conn:  # the one connection the commits used
        plans = await (
            await conn.execute(
                "SELECT sum(generic_plans), sum(custom_plans) FROM pg_prepared_statements"
                " WHERE statement LIKE '%%cronoq_leader SET max_id%%'"
            )
        ).fetchone()
    assert plans == (10, 0)


async def test_a_state_update_of_a_row_deleted_by_hand_is_a_store_error(
    open_store: OpenStore, admin: Admin, pg_schema: str
) -> None:
    store = await leading(open_store)
    await store.commit(Batch([task(1), task(2)], [], max_id=2))
    await rows(admin, "DELETE FROM {s}.cronoq_tasks WHERE id = 1", pg_schema)
    running = [replace(task(i), status=Status.RUNNING, attempt=1, started=NOW) for i in (1, 2)]
    with pytest.raises(StoreError, match="1 of the 2 task rows this leader updated are missing"):
        await store.commit(Batch(running, [], max_id=2))
    assert await rows(admin, "SELECT id, status FROM {s}.cronoq_tasks", pg_schema) == [
        (2, int(Status.RUNNING))
    ]
