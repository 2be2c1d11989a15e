"""What only the SQLite store does: the file it creates, its error mapping, its lease, and real
processes on one file (a standby takes over at once on a clean release and from a killed leader, ends a
leader stopped with the write lock once its lease ran out, and fences one stopped without it). The
shared contract is in ``test_store_contract.py``."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import queue
import signal
import sqlite3
import stat
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from cronoq.engine.model import Status, Task, TaskSpec
from shard.store import Batch, Fenced, StoreError, StoreUnavailable
from shard.store.holder import Holder, this_process
from shard.store.rows import ADDED_IN_V2, COLUMNS
from shard.store.sqlite import (
    LEASE_RAN_OUT,
    LEASE_TAKEN_OVER,
    SCHEMA_VERSION,
    TAKEOVER_WAITS,
    UNSEEN_HOLDER,
    SqliteStore,
)
from tests.holderkit import exited_pid, running_holder

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


def execute(path: Path, sql: str, params: tuple[object, ...] = ()) -> None:
    with contextlib.closing(sqlite3.connect(path, isolation_level=None)) as conn:
        conn.execute(sql, params)


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


HERE = this_process("test")
ELSEWHERE = {
    # Where the pid, if looked up here, would name no process: a holder judged by it would be gone.
    "another host": lambda: Holder("other", "other-host/other-boot", HERE.namespaces, exited_pid(), 1).text(),
    "another namespace": lambda: Holder("other", HERE.host, "pid:[1] time:[1]", exited_pid(), 1).text(),
    "an older cronoq's row": lambda: "other-host:1234:abcd",
}


@pytest.mark.parametrize("holder", ELSEWHERE.values(), ids=ELSEWHERE.keys())
async def test_a_holder_that_cannot_be_seen_from_here_is_waited_out(
    stores: list[SqliteStore], path: Path, holder: Callable[[], str]
) -> None:
    """A holder on another host or in another PID namespace, or one the row does not locate, is never
    judged gone: its lease must run out first."""
    store = await opened(stores, path)
    expires = time.time_ns() + 300_000_000
    execute(path, "UPDATE cronoq_leader SET holder = ?, expires_unix_ns = ?", (holder(), expires))
    await asyncio.wait_for(store.acquire(), 10)
    assert time.time_ns() > expires


async def test_a_holder_whose_pid_now_names_another_process_is_gone(
    stores: list[SqliteStore], path: Path
) -> None:
    """The holder's pid was given to another process (here: this one, which started at another time):
    the holder is gone, and its lease is taken at once."""
    store = await opened(stores, path)
    reused = Holder("other", HERE.host, HERE.namespaces, os.getpid(), HERE.start - 1)
    expires = time.time_ns() + 30_000_000_000
    execute(path, "UPDATE cronoq_leader SET holder = ?, expires_unix_ns = ?", (reused.text(), expires))
    lead = await asyncio.wait_for(store.acquire(), 10)
    assert lead.epoch == 1 and time.time_ns() < expires


async def reasons_to_wait_while_write_locked(store: SqliteStore, path: Path, holder: Holder) -> list[str]:
    """Let the lease of ``holder`` run out, hold the file's write lock (from this process) until the
    store says why its takeover waits, then let go; the reasons it logged. The store leads after."""
    execute(path, "UPDATE cronoq_leader SET holder = ?, expires_unix_ns = 1", (holder.text(),))
    with capture_logs() as logs:
        with write_locked(path):
            standby = asyncio.create_task(store.acquire())
            deadline = time.monotonic() + 10
            while not any(entry["event"] == TAKEOVER_WAITS for entry in logs):
                assert time.monotonic() < deadline and not standby.done(), logs
                await asyncio.sleep(POLL)
        await asyncio.wait_for(standby, 10)
    return [entry["reason"] for entry in logs if entry["event"] == TAKEOVER_WAITS]


async def test_a_live_holder_is_never_ended_for_a_write_lock_another_process_holds(
    stores: list[SqliteStore], path: Path
) -> None:
    """A holder past its lease is ended only when it is what holds the write lock: one held by another
    process (this test's transaction) is waited for, and the wait says why, once."""
    store = await opened(stores, path)
    with running_holder() as (proc, holder):
        reasons = await reasons_to_wait_while_write_locked(store, path, holder)
        assert proc.poll() is None
    assert reasons == [f"the store's write lock is held by pid {os.getpid()}, not by the lease's holder"]


async def test_a_holder_that_cannot_be_seen_is_never_ended(stores: list[SqliteStore], path: Path) -> None:
    """A holder on another host: its pid (here this very process, which holds the lock) means nothing
    here, so the takeover waits for the write lock and says why."""
    store = await opened(stores, path)
    elsewhere = Holder("other", "other-host/other-boot", HERE.namespaces, HERE.pid, HERE.start)
    assert await reasons_to_wait_while_write_locked(store, path, elsewhere) == [UNSEEN_HOLDER]


# ------------------------------------------------------------------------------- two processes

LEADER_SCRIPT = """
import asyncio, json, sys
from cronoq.engine.model import Status, Task, TaskSpec
from cronoq.logs import configure
from cronoq.shard.store import Batch, Fenced, StoreUnavailable
from cronoq.shard.store.sqlite import SqliteStore

PAYLOAD = b"x" * 4096

async def commit_until_fenced(store, epoch, size, pace):
    # Batches of `size` new tasks (ids from epoch << 32), each acknowledged on a line of its own once
    # committed; a batch the file was too busy for is sent again.
    base = epoch << 32
    done = 0
    while True:
        ids = range(base + done + 1, base + done + size + 1)
        tasks = [Task(id=i, spec=TaskSpec(pool="default", payload=PAYLOAD), seq=i, status=Status.READY,
                      created=1.0) for i in ids]
        try:
            await store.commit(Batch(tasks, max_id=ids[-1]))
        except StoreUnavailable:
            continue
        except Fenced as err:
            print(f"fenced {err}", flush=True)
            return
        done += size
        print(f"committed {ids[0]} {ids[-1]}", flush=True)
        await asyncio.sleep(pace)

async def main(options):
    store = SqliteStore(options["path"], lease_ttl=options["ttl"], lease_renew=options["renew"],
                        lock_poll=0.02, holder=options["holder"])
    await store.open()
    print("standby", flush=True)
    lead = await store.acquire()
    print(f"leading {lead.epoch}", flush=True)
    if options["commit"]:
        await commit_until_fenced(store, lead.epoch, options["commit"], options["pace"])
    else:
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    await store.close()
    print("released", flush=True)

configure(stream=sys.stderr)
asyncio.run(main(json.loads(sys.argv[1])))
"""


class LeaderProcess:
    """A process that opens the store, says ``standby``, acquires, says ``leading <epoch>``, and
    releases (closes) when told on stdin; or, with ``commit`` tasks a batch, commits batches (one
    ``committed <first id> <last id>`` line each, ``pace`` seconds apart) until it is fenced
    (``fenced <reason>``)."""

    def __init__(
        self,
        path: Path,
        lease_ttl: float,
        lease_renew: float,
        *,
        holder: str | None = None,
        commit: int = 0,
        pace: float = 0.0,
    ) -> None:
        options = {
            "path": str(path),
            "ttl": lease_ttl,
            "renew": lease_renew,
            "holder": holder,
            "commit": commit,
            "pace": pace,
        }
        self.proc = subprocess.Popen(
            [sys.executable, "-c", LEADER_SCRIPT, json.dumps(options)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        # A thread owns the pipe, so that a wait for a line can time out.
        self.lines: queue.Queue[str] = queue.Queue()
        self.acknowledged: set[int] = set()  # the ids of every batch it said it committed
        self._pump_thread = threading.Thread(target=self._pump, daemon=True)
        self._pump_thread.start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.strip())

    def expect(self, timeout: float = 10.0) -> str:
        """The next line other than a commit's acknowledgement (those are collected)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                line = self.lines.get(timeout=max(0.0, deadline - time.monotonic()))
            except queue.Empty:
                raise AssertionError(f"no line within {timeout} s") from None
            if not line.startswith("committed "):
                return line
            first, last = map(int, line.split()[1:])
            self.acknowledged.update(range(first, last + 1))

    def committed(self, timeout: float = 10.0) -> None:
        """Wait for the next acknowledged commit."""
        try:
            line = self.lines.get(timeout=timeout)
        except queue.Empty:
            raise AssertionError(f"no commit within {timeout} s") from None
        assert line.startswith("committed "), line
        first, last = map(int, line.split()[1:])
        self.acknowledged.update(range(first, last + 1))

    def ended(self, timeout: float = 10.0) -> int:
        """Wait for the process to end and collect the commits it acknowledged; its exit status."""
        status = self.proc.wait(timeout)
        self._pump_thread.join(timeout)
        while not self.lines.empty():
            self.committed()
        return status

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
            self.proc.send_signal(signal.SIGCONT)  # a stopped process ends on SIGKILL too, but be plain
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


def leader_and_standby(
    processes: list[LeaderProcess], path: Path, lease_ttl: float, lease_renew: float, **leader: Any
) -> tuple[LeaderProcess, LeaderProcess]:
    """A process leading the file (with ``leader``'s options), and one standing by."""
    first = LeaderProcess(path, lease_ttl, lease_renew, **leader)
    processes.append(first)
    assert first.expect() == "standby"
    assert first.expect() == "leading 1"
    second = LeaderProcess(path, lease_ttl, lease_renew)
    processes.append(second)
    assert second.expect() == "standby"
    return first, second


def write_lock_is_free(path: Path) -> bool:
    """Whether a write transaction can start on the file within 0.1 s (and then ends it unused)."""
    with contextlib.closing(sqlite3.connect(path, timeout=0.1, isolation_level=None)) as conn:
        try:
            conn.execute("BEGIN IMMEDIATE")
        except sqlite3.OperationalError as err:
            assert "locked" in str(err), err
            return False
        conn.execute("ROLLBACK")
        return True


def stop_when(leader: LeaderProcess, path: Path, *, holding_the_lock: bool) -> None:
    """SIGSTOP the committing ``leader`` at a moment it holds the file's write lock (or does not),
    as the file shows while it is stopped: a stopped process can neither take nor release the lock."""
    for _ in range(200):
        leader.committed()
        leader.proc.send_signal(signal.SIGSTOP)
        if write_lock_is_free(path) != holding_the_lock:
            return
        leader.proc.send_signal(signal.SIGCONT)
    raise AssertionError(f"the leader was never stopped {'with' if holding_the_lock else 'without'} the lock")


def tasks_in(path: Path, epoch: int) -> set[int]:
    """The ids of the tasks in the file that the leader of ``epoch`` wrote (LEADER_SCRIPT's ids)."""
    with contextlib.closing(sqlite3.connect(path)) as conn:
        rows = conn.execute("SELECT id FROM cronoq_tasks WHERE id >> 32 = ?", (epoch,)).fetchall()
    return {task_id for (task_id,) in rows}


def test_a_standby_process_takes_over_at_once_after_a_clean_release(
    processes: list[LeaderProcess], path: Path
) -> None:
    # A 30 s lease: only the release can explain a takeover within seconds.
    first, second = leader_and_standby(processes, path, 30.0, 1.0)
    assert second.silent_for(0.5)  # 25 polls, and the lead stays with the first

    released = time.monotonic()
    first.release()
    assert first.expect() == "released"
    assert second.expect(timeout=5.0) == "leading 2"
    assert time.monotonic() - released < 5.0
    assert first.proc.wait(10) == 0


def test_a_standby_process_takes_over_at_once_from_a_killed_leader(
    processes: list[LeaderProcess], path: Path
) -> None:
    """The lease names the holder's process: one that no longer runs holds nothing, whatever the
    lease's expiry says. A 30 s lease: only that explains a takeover within seconds."""
    first, second = leader_and_standby(processes, path, 30.0, 1.0)
    assert second.silent_for(0.5)  # the live leader keeps the lead
    first.kill()
    assert second.expect(timeout=10.0) == "leading 2"


@pytest.mark.parametrize("holder", [None, "cronoq-a"], ids=["default holder", "explicit holder"])
def test_a_restarted_process_takes_its_killed_predecessors_lease_at_once(
    processes: list[LeaderProcess], path: Path, holder: str | None
) -> None:
    first = LeaderProcess(path, 30.0, 1.0, holder=holder)
    processes.append(first)
    assert (first.expect(), first.expect()) == ("standby", "leading 1")
    first.kill()
    again = LeaderProcess(path, 30.0, 1.0, holder=holder)
    processes.append(again)
    assert again.expect() == "standby"
    assert again.expect(timeout=10.0) == "leading 2"


def test_a_leader_stopped_while_it_holds_the_write_lock_is_ended_and_the_standby_takes_over(
    processes: list[LeaderProcess], path: Path
) -> None:
    """A leader stopped inside a commit keeps SQLite's write lock, which a takeover needs. Once its
    lease has run out the standby ends it (SIGKILL): the lock goes with the process, its half-done
    commit is discarded, and it never wakes to write."""
    ttl = 1.0
    first, second = leader_and_standby(processes, path, ttl, 0.2, commit=200)
    stop_when(first, path, holding_the_lock=True)
    # It stays stopped: only ending it frees the lock.
    assert second.expect(timeout=ttl + 10.0) == "leading 2"
    assert first.ended() == -signal.SIGKILL
    assert first.acknowledged and tasks_in(path, 1) == first.acknowledged
    assert write_lock_is_free(path)


def test_a_leader_stopped_past_its_lease_without_the_lock_is_fenced_when_it_wakes(
    processes: list[LeaderProcess], path: Path
) -> None:
    """A leader stopped between commits blocks nobody: the standby takes over when its lease runs
    out and leaves it alone. Woken, it writes nothing more (the epoch in every commit fences it)."""
    ttl = 1.0
    first, second = leader_and_standby(processes, path, ttl, 0.2, commit=10, pace=0.05)
    stop_when(first, path, holding_the_lock=False)
    assert second.expect(timeout=ttl + 10.0) == "leading 2"
    assert first.proc.poll() is None  # still there, stopped
    first.proc.send_signal(signal.SIGCONT)
    assert first.expect().startswith("fenced ")
    assert first.expect() == "released" and first.ended() == 0
    assert first.acknowledged and tasks_in(path, 1) == first.acknowledged
