"""What only the SQLite store does: the file it creates, its error mapping, its lease, and two real
processes on one file (a standby takes over on a clean release at once, after a SIGKILL when the
lease runs out). The shared contract is in ``test_store_contract.py``."""

from __future__ import annotations

import asyncio
import contextlib
import os
import queue
import signal
import sqlite3
import stat
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from cronoq.engine.model import Status, Task, TaskSpec
from shard.store import Batch, Fenced, StoreError, StoreUnavailable
from shard.store.rows import ADDED_IN_V2, COLUMNS
from shard.store.sqlite import LEASE_RAN_OUT, LEASE_TAKEN_OVER, SCHEMA_VERSION, SqliteStore

POLL = 0.02
LOST_TIMEOUT = 3.0  # upper bound for a leader to notice it lost its lease; met in well under a second


def a_task(task_id: int) -> Task:
    return Task(id=task_id, spec=TaskSpec(pool="default"), seq=task_id, status=Status.READY, created=1.0)


@pytest.fixture
def path(tmp_path: Path) -> Path:
    return tmp_path / "cronoq.db"


@pytest.fixture
async def stores() -> AsyncIterator[list[SqliteStore]]:
    """Stores a test made; closed when it ends, whatever happened."""
    made: list[SqliteStore] = []
    yield made
    for store in made:
        await store.close()


async def opened(
    stores: list[SqliteStore],
    path: Path,
    *,
    lease_ttl: float = 10.0,
    lease_renew: float = 2.0,
    busy_timeout: float = 5.0,
) -> SqliteStore:
    store = SqliteStore(
        path, lease_ttl=lease_ttl, lease_renew=lease_renew, lock_poll=POLL, busy_timeout=busy_timeout
    )
    stores.append(store)
    await store.open()
    return store


@contextlib.contextmanager
def write_locked(path: Path) -> Iterator[None]:
    """Another process's long write transaction, as far as the store can tell."""
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute("BEGIN IMMEDIATE")
        yield
        conn.execute("ROLLBACK")
    finally:
        conn.close()


def execute(path: Path, sql: str) -> None:
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute(sql)


# ------------------------------------------------------------------------------------------ file


async def test_file_and_its_wal_companions_are_private_and_in_wal_mode(
    stores: list[SqliteStore], path: Path
) -> None:
    old_umask = os.umask(0o022)  # what SQLite would otherwise create the file with: 0644
    try:
        store = await opened(stores, path)
    finally:
        os.umask(old_umask)
    await store.acquire()
    await store.commit(Batch([a_task(1)], max_id=1))
    for name in ("cronoq.db", "cronoq.db-wal", "cronoq.db-shm"):
        assert stat.S_IMODE((path.parent / name).stat().st_mode) == 0o600, name
    with contextlib.closing(sqlite3.connect(path)) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"


async def test_replicas_opening_together_migrate_once_to_the_shared_schema(
    stores: list[SqliteStore], path: Path
) -> None:
    """Four instances (four threads, four connections) open a fresh file at once: the write lock
    serializes the migration, so none trips over another's half-made tables."""
    await asyncio.gather(*(opened(stores, path) for _ in range(4)))
    with contextlib.closing(sqlite3.connect(path)) as conn:
        assert conn.execute("SELECT version FROM cronoq_schema_version").fetchall() == [(SCHEMA_VERSION,)]
        columns = [row[1] for row in conn.execute("PRAGMA table_info(cronoq_tasks)")]
        # Migration 2 appended its columns after version 1's, outputs included.
        v1 = [c for c in COLUMNS if c not in ADDED_IN_V2]
        assert columns == [*v1, "output", "output_type", *ADDED_IN_V2]
        indexes = {row[1]: row[2] for row in conn.execute("PRAGMA index_list(cronoq_tasks)")}
        assert indexes["cronoq_tasks_finished"] == 0 and indexes["cronoq_tasks_live_key"] == 1
        [(epoch, max_id, holder, expires)] = conn.execute(
            "SELECT epoch, max_id, holder, expires_unix_ns FROM cronoq_leader WHERE id = 1"
        ).fetchall()
        assert (epoch, max_id, holder, expires) == (0, 0, None, 0)
        tables = {row[0] for row in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
        assert {"cronoq_schema_version", "cronoq_leader", "cronoq_tasks", "cronoq_recurring"} <= tables


@pytest.mark.parametrize(("full_sync", "level"), [(True, 2), (False, 1)])
async def test_full_sync_fsyncs_every_commit(
    stores: list[SqliteStore], path: Path, full_sync: bool, level: int
) -> None:
    """synchronous is a per-connection setting, so it is read on the store's own connection."""
    store = SqliteStore(path, full_sync=full_sync)
    stores.append(store)
    await store.open()
    assert await store._run(lambda: store._db.execute("PRAGMA synchronous").fetchone()[0]) == level


@pytest.fixture
def not_a_database(path: Path) -> Path:
    path.write_bytes(b"this is not a database\n" * 100)
    return path


async def test_a_file_that_is_not_a_database_is_a_store_error_naming_it(
    stores: list[SqliteStore], not_a_database: Path
) -> None:
    with pytest.raises(StoreError) as refused:
        await opened(stores, not_a_database)
    assert not isinstance(refused.value, StoreUnavailable)
    assert str(not_a_database) in str(refused.value)


async def test_a_path_that_cannot_be_created_is_a_store_error_naming_it(
    stores: list[SqliteStore], tmp_path: Path
) -> None:
    missing = tmp_path / "missing" / "cronoq.db"
    with pytest.raises(StoreError) as refused:
        await opened(stores, missing)
    assert str(missing) in str(refused.value)


# --------------------------------------------------------------------------------------- writes


async def traced(store: SqliteStore) -> list[str]:
    """The SQL statements the store's connection runs from now on (run on the store's own thread)."""
    statements: list[str] = []
    await store._run(lambda: store._db.set_trace_callback(statements.append))
    return statements


def task_writes(statements: list[str]) -> list[str]:
    """How each statement touched cronoq_tasks: "insert" (a whole row), "update" (state only) or
    "output" (a result)."""
    kinds = {
        "INSERT INTO cronoq_tasks": "insert",
        "UPDATE cronoq_tasks SET status": "update",
        "UPDATE cronoq_tasks SET output": "output",
    }
    return [kind for sql in statements for prefix, kind in kinds.items() if sql.startswith(prefix)]


async def test_a_task_with_a_row_gets_state_updates_and_its_spec_is_written_once(
    stores: list[SqliteStore], path: Path
) -> None:
    """A task's whole row (spec and payload) is bound once; its later changes, in this leadership or
    after a takeover, update the state columns only (and the output, in the same statement). A task
    that ends and a new one reusing its key share a commit without tripping the live-key index; the
    output of a task written whole in its commit (no row yet) follows its insert."""
    store = await opened(stores, path)
    await store.acquire()
    await store.recover(0)
    statements = await traced(store)
    first = Task(1, TaskSpec("default", payload=b"p" * 100, key="k"), 1, Status.READY, 1.0)
    await store.commit(Batch([first], max_id=1))
    assert task_writes(statements) == ["insert"]

    statements.clear()
    first.status, first.attempt, first.started = Status.RUNNING, 1, 2.0
    await store.commit(Batch([first], max_id=1))
    assert task_writes(statements) == ["update"]

    statements.clear()
    first.status, first.finished = Status.SUCCEEDED, 3.0
    first.spec.payload = None  # as the engine's retention drops it; the stored payload stays
    second = Task(2, TaskSpec("default", payload=b"q", key="k"), 2, Status.READY, 3.0)
    await store.commit(Batch([second, first], outputs=[(1, b"out", "text/plain")], max_id=2))
    assert task_writes(statements) == ["update", "insert"]  # the output rides in the state update
    done = await store.fetch(1)
    assert done is not None and done.task.status is Status.SUCCEEDED and done.output == b"out"
    assert done.task.spec.payload == b"p" * 100
    held = await store.fetch("k")
    assert held is not None and held.task.id == 2
    await store.release()

    successor = await opened(stores, path)
    await successor.acquire()
    [recovered] = [t for t in (await successor.recover(0)).tasks if t.id == 2]
    statements = await traced(successor)
    recovered.status, recovered.attempt, recovered.started = Status.RUNNING, 1, 4.0
    await successor.commit(Batch([recovered], max_id=2))
    assert task_writes(statements) == ["update"]
    again = await successor.fetch(2)
    assert again is not None and again.task.status is Status.RUNNING and again.task.spec.payload == b"q"

    statements.clear()
    third = Task(3, TaskSpec("default", payload=b"r"), 3, Status.SUCCEEDED, 5.0, attempt=1, finished=5.0)
    await successor.commit(Batch([third], outputs=[(3, b"", "text/plain")], max_id=3))
    assert task_writes(statements) == ["insert", "output"]
    empty = await successor.fetch(3)
    assert empty is not None and (empty.output, empty.output_type) == (b"", "text/plain")


# ------------------------------------------------------------------------------ errors, fencing


async def test_a_write_lock_held_too_long_makes_the_commit_unavailable_and_writes_nothing(
    stores: list[SqliteStore], path: Path
) -> None:
    store = await opened(stores, path, busy_timeout=0.05)
    await store.acquire()
    with write_locked(path), pytest.raises(StoreUnavailable):
        await store.commit(Batch([a_task(1)], max_id=1))
    assert (await store.recover(0)).tasks == []
    await store.commit(Batch([a_task(2)], max_id=2))  # the next batch goes through
    assert [t.id for t in (await store.recover(0)).tasks] == [2]


async def test_commit_is_fenced_by_a_newer_epoch_in_the_file(stores: list[SqliteStore], path: Path) -> None:
    """The epoch check in the commit's transaction fences a leader that still believes it leads (its
    renewal has not run yet: a paused process)."""
    store = await opened(stores, path, lease_renew=60.0)
    lead = await store.acquire()
    execute(path, "UPDATE cronoq_leader SET epoch = epoch + 1, holder = 'intruder'")
    with pytest.raises(Fenced):
        await store.commit(Batch([a_task(1)], max_id=1))
    assert lead.lost.is_set() and lead.reason.startswith("fenced: ")
    assert (await store.recover(0)).tasks == []


# --------------------------------------------------------------------------------------- lease


async def test_the_lease_is_renewed_so_a_standby_keeps_waiting(stores: list[SqliteStore], path: Path) -> None:
    first = await opened(stores, path, lease_ttl=0.3, lease_renew=0.05)
    lead = await first.acquire()
    second = await opened(stores, path)
    standby = asyncio.create_task(second.acquire())
    try:
        done, _ = await asyncio.wait({standby}, timeout=1.0)  # more than three lease lifetimes
    finally:
        standby.cancel()
    assert not done and not lead.lost.is_set()
    await first.commit(Batch([a_task(1)], max_id=1))


async def test_renewal_notices_a_takeover(stores: list[SqliteStore], path: Path) -> None:
    store = await opened(stores, path, lease_renew=0.05)
    lead = await store.acquire()
    execute(path, "UPDATE cronoq_leader SET epoch = epoch + 1, holder = 'intruder'")
    await asyncio.wait_for(lead.lost.wait(), LOST_TIMEOUT)
    assert lead.reason == LEASE_TAKEN_OVER
    with pytest.raises(Fenced):
        await store.commit(Batch())


async def test_a_lease_that_cannot_be_renewed_in_time_is_given_up(
    stores: list[SqliteStore], path: Path
) -> None:
    store = await opened(stores, path, lease_ttl=0.4, lease_renew=0.1, busy_timeout=0.05)
    lead = await store.acquire()
    with write_locked(path):
        await asyncio.wait_for(lead.lost.wait(), LOST_TIMEOUT)
    assert lead.reason == LEASE_RAN_OUT
    with pytest.raises(Fenced):
        await store.commit(Batch())


# ------------------------------------------------------------------------------- two processes

LEADER_SCRIPT = """
import asyncio, sys
from cronoq.logs import configure
from cronoq.shard.store.sqlite import SqliteStore

async def main(path, ttl, renew):
    store = SqliteStore(path, lease_ttl=ttl, lease_renew=renew, lock_poll=0.02)
    await store.open()
    print("standby", flush=True)
    lead = await store.acquire()
    print(f"leading {lead.epoch}", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    await store.close()
    print("released", flush=True)

configure(stream=sys.stderr)
asyncio.run(main(sys.argv[1], float(sys.argv[2]), float(sys.argv[3])))
"""


class LeaderProcess:
    """A process that opens the store, says ``standby``, acquires, says ``leading <epoch>``, and
    releases (closes) when told on stdin."""

    def __init__(self, path: Path, lease_ttl: float, lease_renew: float) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", LEADER_SCRIPT, str(path), str(lease_ttl), str(lease_renew)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        # A thread owns the pipe, so that a wait for a line can time out.
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())

    def expect(self, timeout: float = 10.0) -> str:
        try:
            return self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no line within {timeout} s") from None

    def silent_for(self, window: float) -> bool:
        with contextlib.suppress(queue.Empty):
            line = self.lines.get(timeout=window)
            raise AssertionError(f"expected silence, got {line!r}")
        return True

    def release(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("release\n")
        self.proc.stdin.flush()

    def kill(self) -> None:
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.kill()
        for pipe in (self.proc.stdin, self.proc.stdout):
            if pipe is not None:
                pipe.close()


@pytest.fixture
def processes() -> Iterator[list[LeaderProcess]]:
    started: list[LeaderProcess] = []
    yield started
    for proc in started:
        proc.stop()


def test_a_standby_process_takes_over_at_once_after_a_clean_release(
    processes: list[LeaderProcess], path: Path
) -> None:
    # A 30 s lease: only the release can explain a takeover within seconds.
    first = LeaderProcess(path, lease_ttl=30.0, lease_renew=1.0)
    processes.append(first)
    assert first.expect() == "standby"
    assert first.expect() == "leading 1"
    second = LeaderProcess(path, lease_ttl=30.0, lease_renew=1.0)
    processes.append(second)
    assert second.expect() == "standby"
    assert second.silent_for(0.5)  # 25 polls, and the lead stays with the first

    released = time.monotonic()
    first.release()
    assert first.expect() == "released"
    assert second.expect(timeout=5.0) == "leading 2"
    assert time.monotonic() - released < 5.0
    assert first.proc.wait(10) == 0


def test_a_standby_process_takes_over_when_a_killed_leaders_lease_runs_out(
    processes: list[LeaderProcess], path: Path
) -> None:
    ttl, renew = 1.0, 0.2
    first = LeaderProcess(path, lease_ttl=ttl, lease_renew=renew)
    processes.append(first)
    assert first.expect() == "standby"
    assert first.expect() == "leading 1"
    second = LeaderProcess(path, lease_ttl=ttl, lease_renew=renew)
    processes.append(second)
    assert second.expect() == "standby"
    assert second.silent_for(1.5 * ttl)  # the live leader renews: its lease outlasts its ttl

    killed = time.monotonic()
    first.kill()
    assert second.expect(timeout=5.0) == "leading 2"
    # The lease was renewed at most `renew` before the kill, so it ran out no sooner than this.
    assert time.monotonic() - killed >= ttl - renew - 0.1
