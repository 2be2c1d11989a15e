"""The store that keeps a local SQLite file, with a lease row so that a second process can stand by.

SQLite blocks, so every call runs on one dedicated thread that owns the only connection (sqlite3
connections must stay on the thread that uses them, and one thread also serializes the store's work
in submission order). The file is opened in WAL mode so that readers never wait for the writer, with
``synchronous=FULL`` by default so that a commit the runtime acknowledged survives a power cut.

Leadership is a lease: the row ``cronoq_leader(id=1)`` names its ``holder`` and when the lease
``expires``. A standby takes it when it is free or expired, or when its holder is a process of this host
that no longer runs (:mod:`.holder`), in a ``BEGIN IMMEDIATE`` transaction (the write lock makes two
standbys race safely), and bumps the epoch in the same transaction. The leader renews it in the
background; every commit checks the epoch, so a leader that was paused past its lease and came back can
never write over its successor's work.

A leader stopped inside a commit keeps SQLite's write lock, and a takeover is a write. So a standby
reads the lease without a write transaction (WAL readers never wait for the writer), waits for the lock
only briefly, and when the lease has run out while its holder, a process of this host, still holds the
lock, ends that process (SIGKILL): the lock goes with it, SQLite ignores its half-written commit, and it
never wakes to write. A holder this process cannot see (another host or PID namespace) is waited for.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import json
import os
import secrets
import socket
import sqlite3
import time
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Final, TypeVar

from cronoq.engine.model import Status, Task
from cronoq.logs import get_logger

from .base import Batch, Fenced, Leadership, Recovered, SchemaTooNew, StoredTask, StoreError, StoreUnavailable
from .holder import Holder, Presence, kill, presence, this_process, write_lock_owner
from .rows import (
    COLUMNS,
    SCHEDULE_COLUMNS,
    SELECT_COLUMNS,
    SELECT_SCHEDULE_COLUMNS,
    STATE_COLUMNS,
    LiveRows,
    Row,
    columns_added_in_v2,
    dep_targets,
    ns,
    recurring_from_row,
    row_of,
    schedule_changes,
    state_of,
    task_from_row,
    text,
    totals_from_text,
    totals_text,
)

log = get_logger("cronoq.store")

T = TypeVar("T")

# Migration n brings the schema from version n-1 to n. Applied in one transaction under the write
# lock, so replicas that start together migrate once.
_MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        """CREATE TABLE cronoq_leader (
            id INTEGER PRIMARY KEY CHECK (id = 1),
            epoch INTEGER NOT NULL,
            max_id INTEGER NOT NULL,
            holder TEXT,
            expires_unix_ns INTEGER NOT NULL
        )""",
        "INSERT INTO cronoq_leader (id, epoch, max_id, holder, expires_unix_ns) VALUES (1, 0, 0, NULL, 0)",
        """CREATE TABLE cronoq_tasks (
            id INTEGER PRIMARY KEY,
            seq INTEGER NOT NULL,
            pool TEXT NOT NULL,
            kind TEXT NOT NULL,
            priority INTEGER NOT NULL,
            key TEXT,
            payload BLOB,
            content_type TEXT NOT NULL,
            deadline_ns INTEGER,
            duration_hint_s REAL,
            timeout_s REAL,
            retry TEXT,
            tags TEXT NOT NULL,
            labels TEXT NOT NULL,
            tenant TEXT NOT NULL,
            created_ns INTEGER NOT NULL,
            status INTEGER NOT NULL,
            terminal INTEGER NOT NULL,
            attempt INTEGER NOT NULL,
            max_attempts INTEGER NOT NULL,
            ready_ns INTEGER,
            started_ns INTEGER,
            finished_ns INTEGER,
            message TEXT NOT NULL,
            output BLOB NULL,
            output_type TEXT NOT NULL DEFAULT ''
        )""",
        "CREATE INDEX cronoq_tasks_finished ON cronoq_tasks (terminal, finished_ns)",
        # The engine keeps keys unique among live tasks; the index makes the database agree.
        "CREATE UNIQUE INDEX cronoq_tasks_live_key ON cronoq_tasks (key) WHERE key IS NOT NULL AND NOT terminal",
        # fetch(key) looks for the newest task with a key, finished ones included.
        "CREATE INDEX cronoq_tasks_key ON cronoq_tasks (key, id) WHERE key IS NOT NULL",
        """CREATE TABLE cronoq_recurring (
            name TEXT PRIMARY KEY,
            spec TEXT,
            template_payload BLOB,
            next_unix_ns INTEGER,
            last_task_id INTEGER
        )""",
    ),
    # Fixed starts, dependencies and resources. cronoq_recurring already has the columns schedules need.
    tuple(
        f"ALTER TABLE cronoq_tasks {clause}"
        for clause in columns_added_in_v2(
            {
                "start_ns": "INTEGER",
                "tolerance_s": "REAL",
                "on_miss": "TEXT",
                "deps": "TEXT",
                "resources": "TEXT",
            }
        )
    ),
    # The engine's totals as of the last commit, for the next leader to count on from.
    ("ALTER TABLE cronoq_leader ADD COLUMN totals TEXT",),
)
SCHEMA_VERSION = len(_MIGRATIONS)

_UPSERT = (
    f"INSERT INTO cronoq_tasks ({SELECT_COLUMNS}) VALUES ({', '.join('?' * len(COLUMNS))}) "
    f"ON CONFLICT (id) DO UPDATE SET {', '.join(f'{c} = excluded.{c}' for c in STATE_COLUMNS)}"
)
# The state changes of tasks that have a row, with their new outputs, as one statement per chunk of up
# to UPDATE_CHUNK rows (UPDATE ... FROM VALUES), not one statement per row: sqlite3 lets go of the GIL
# around each statement's step and must take it back after, and while the event loop is busy each take
# waits. With executemany a commit of about 20 rows spent 630 us on the store's thread for 240 us of CPU.
UPDATE_CHUNK: Final = 1024  # rows of 11 parameters: far below SQLite's 32,766 parameters a statement
_STATE_PARAMS: Final = ("id", *STATE_COLUMNS, "output", "output_type")
_NO_OUTPUT: Final = (None, None)  # the output and output_type of a row with no new output


@functools.cache
def _update_states(rows: int) -> str:
    """The update of ``rows`` tasks' states (``rows`` a power of two: a chunk is padded with rows whose
    id is NULL, which match nothing, so that the statement cache holds a dozen statements, not one per
    batch size). A row's output is written when it has one (not NULL: an empty output is b'')."""
    column = {name: f"v.column{i + 1}" for i, name in enumerate(_STATE_PARAMS)}
    sets = ", ".join(f"{c} = {column[c]}" for c in STATE_COLUMNS)
    values = ", ".join([f"({', '.join('?' * len(_STATE_PARAMS))})"] * rows)
    output, output_type = column["output"], column["output_type"]
    return (
        f"UPDATE cronoq_tasks SET {sets}, output = coalesce({output}, output), output_type = CASE WHEN"
        f" {output} IS NULL THEN output_type ELSE {output_type} END FROM (VALUES {values}) AS v"
        f" WHERE cronoq_tasks.id = {column['id']}"
    )


def _chunked_params(rows: Sequence[Row]) -> Iterator[tuple[str, list[Any]]]:
    """``rows`` (in _STATE_PARAMS order) as (statement, flat parameters) per chunk, in order."""
    padding = (None,) * len(_STATE_PARAMS)
    for start in range(0, len(rows), UPDATE_CHUNK):
        chunk = rows[start : start + UPDATE_CHUNK]
        size = 1 << (len(chunk) - 1).bit_length()
        params = [value for row in chunk for value in row]
        params.extend(padding * (size - len(chunk)))
        yield _update_states(size), params


_UPSERT_SCHEDULE = (
    f"INSERT INTO cronoq_recurring ({SELECT_SCHEDULE_COLUMNS}) VALUES ({', '.join('?' * len(SCHEDULE_COLUMNS))}) "
    f"ON CONFLICT (name) DO UPDATE SET {', '.join(f'{c} = excluded.{c}' for c in SCHEDULE_COLUMNS[1:])}"
)
_RECOVER = f"SELECT {SELECT_COLUMNS} FROM cronoq_tasks WHERE NOT terminal OR finished_ns >= ? ORDER BY id"
# Finished tasks that finished before the cutoff, except those a live task still depends on (by id, or
# as the newest task holding a key): recovery must find them, however old (deps are stored as JSON
# [[target, condition], ...], a target being an id or a key).
_LIVE_EDGES = (
    "SELECT json_extract(d.value, '$[0]') AS target, json_type(d.value, '$[0]') AS kind"
    " FROM cronoq_tasks l, json_each(l.deps) d WHERE NOT l.terminal AND l.deps <> '[]'"
)
# (No WITH clause: Python's sqlite3 then reports no rowcount for the DELETE.)
_PRUNE = (
    "DELETE FROM cronoq_tasks WHERE terminal AND finished_ns < ?"
    f" AND id NOT IN (SELECT target FROM ({_LIVE_EDGES}) WHERE kind = 'integer')"
    " AND id NOT IN (SELECT max(id) FROM cronoq_tasks"
    f" WHERE key IN (SELECT target FROM ({_LIVE_EDGES}) WHERE kind = 'text') GROUP BY key)"
)
# The dependency targets (ids, and the newest task of each key) that _RECOVER with the same cutoff did
# not load: those finished before it. Ids and keys come as JSON arrays, so that their number is never
# bounded by SQLite's limit on parameters.
_RECOVER_TARGETS = (
    f"SELECT {SELECT_COLUMNS} FROM cronoq_tasks WHERE id IN (SELECT value FROM json_each(?) UNION ALL"
    " SELECT max(id) FROM cronoq_tasks WHERE key IN (SELECT value FROM json_each(?)) GROUP BY key)"
    " AND terminal AND (finished_ns < ? OR finished_ns IS NULL) ORDER BY id"
)
_QUARANTINE = (
    "UPDATE cronoq_tasks SET status = ?, terminal = 1, message = ?, "
    "finished_ns = CASE WHEN typeof(finished_ns) = 'integer' THEN finished_ns ELSE ? END WHERE id = ?"
)

# Failures that may pass by themselves: another process holds the write lock longer than busy_timeout,
# or the disk hiccups or fills up.
_TRANSIENT = frozenset(
    {sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED, sqlite3.SQLITE_IOERR, sqlite3.SQLITE_FULL}
)

LEASE_TAKEN_OVER = "cronoq leader lease was taken over; stepping down"
LEASE_RAN_OUT = "cronoq leader lease could not be renewed before it ran out; stepping down"
TAKEOVER_WAITS = "cronoq takeover waits: the lease ran out, but the store's write lock stays held"
# Why (the log's ``reason``).
UNSEEN_HOLDER = (
    "it runs on another host or in another PID namespace (or the row does not say where), so cronoq "
    "cannot end it: the takeover waits until it lets go of the store's write lock"
)
KILL_FAILED = "cronoq cannot end it ({error}): the takeover waits until it lets go of the store's write lock"


def _busy(err: sqlite3.Error) -> bool:
    """Whether ``err`` says that another connection holds a lock this one waited for in vain."""
    return (getattr(err, "sqlite_errorcode", 0) & 0xFF) in (sqlite3.SQLITE_BUSY, sqlite3.SQLITE_LOCKED)


@dataclasses.dataclass(frozen=True, slots=True)
class _Lease:
    """The lease row: ``holder`` None when nobody holds it (released, or never taken)."""

    epoch: int
    holder: Holder | None
    expires_ns: int


@dataclasses.dataclass(frozen=True, slots=True)
class _Taken:
    """A lease this instance took: its epoch, why it could (``free``, ``ours``, ``expired`` or
    ``holder gone``), and the holder it was taken from."""

    epoch: int
    why: str
    previous: Holder | None


class SqliteStore:
    """The :class:`.base.Store` contract on the SQLite file at ``path`` (created with mode 0600).

    ``lease_ttl`` is how long a lease lasts without renewal (how long a standby waits after the leader
    died), ``lease_renew`` how often the leader renews it, ``lock_poll`` how often a standby checks the
    lease, and ``busy_timeout`` how long a statement waits for another process's write lock before the
    call fails with :class:`StoreUnavailable`. ``full_sync=False`` trades durability against power loss
    (not against a crash of the process) for cheaper commits. ``holder`` names this instance in the
    lease row and must be unique among the processes sharing the file; an instance may take back a
    lease that still names it (a restart with the same explicit holder does not wait out its own
    lease). The default is ``hostname:pid:random``. The row also says which process holds it
    (:class:`.holder.Holder`), so that a standby on the same host takes over at once from a holder that
    no longer runs, whatever its name. A takeover waits at most ``lock_poll`` for the write lock
    before it looks at who holds it.
    """

    def __init__(
        self,
        path: str | os.PathLike[str],
        *,
        lease_ttl: float = 10.0,
        lease_renew: float = 2.0,
        lock_poll: float = 0.5,
        full_sync: bool = True,
        holder: str | None = None,
        busy_timeout: float = 5.0,
    ) -> None:
        self._path = os.fspath(path)
        self._lease_ttl = lease_ttl
        self._lease_renew = lease_renew
        self._lock_poll = lock_poll
        self._full_sync = full_sync
        self._holder = this_process(holder or f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(4)}")
        self._holder_text = self._holder.text()
        self._waiting_on: tuple[Holder, str] | None = None  # why a takeover last waited (logged once)
        self._busy_timeout = busy_timeout
        self._executor: ThreadPoolExecutor | None = ThreadPoolExecutor(1, thread_name_prefix="cronoq-sqlite")
        self._conn: sqlite3.Connection | None = None  # used on the executor's thread only
        self._leadership: Leadership | None = None
        self._stored_max_id = 0  # the id high-water mark as this leader last committed it
        self._live_rows = LiveRows()
        self._keeper: asyncio.Task[None] | None = None

    @property
    def durable(self) -> bool:
        return True

    # ------------------------------------------------------------------------------------ contract

    async def open(self) -> None:
        await self._run(self._open)

    async def acquire(self) -> Leadership:
        loop = asyncio.get_running_loop()
        while True:
            started = loop.time()
            try:
                taken = await self._run(self._try_acquire)
            except StoreUnavailable as err:
                # Another process holds the write lock for long: a standby just keeps polling.
                log.debug("cronoq leadership not available yet", error=str(err), path=self._path)
                taken = None
            if taken is not None:
                break
            await asyncio.sleep(self._lock_poll)
        await self._stop_keeper()
        self._live_rows.reset()
        self._stored_max_id = 0
        self._waiting_on = None
        leadership = self._leadership = Leadership(taken.epoch)
        self._keeper = asyncio.create_task(self._keep_lease(leadership, started + self._lease_ttl))
        previous = taken.previous
        log.info(
            "acquired cronoq leadership",
            epoch=taken.epoch,
            holder=self._holder.name,
            taken=taken.why,
            previous_holder=None if previous is None else previous.name,
            previous_pid=None if previous is None else previous.pid or None,
            path=self._path,
        )
        return leadership

    async def recover(self, finished_since: float) -> Recovered:
        recovered, quarantined, undecodable = await self._run(lambda: self._recover(ns(finished_since)))
        self._live_rows.reset(recovered.tasks)
        for task_id, error in quarantined:
            log.error("task_row_quarantined", task_id=task_id, error=error, path=self._path)
        for name, error in undecodable:
            log.error("schedule_row_undecodable", name=name, error=error, path=self._path)
        return recovered

    async def commit(self, batch: Batch) -> None:
        leadership = self._leadership
        if leadership is None or leadership.lost.is_set():
            raise Fenced("this cronoq instance does not lead")
        try:
            # Rows are built here, on the event loop that owns the tasks, so that the thread writes a
            # consistent snapshot of each. Tasks that have a row get their state updated first (none of
            # them becomes live, and those that finish free their keys); then new rows are inserted,
            # finished ones first: a task that ends and a new one that reuses its key can share a
            # batch, and the live-key index is checked row by row.
            known, whole = self._live_rows.split(batch.tasks, one_statement=False)
            new = {task_id: (bytes(output), text(kind)) for task_id, output, kind in batch.outputs}
            updates = [(task.id, *state_of(task), *new.pop(task.id, _NO_OUTPUT)) for task in known]
            rows = [row_of(task) for task in sorted(whole, key=lambda task: not task.status.terminal)]
            outputs = [(output, kind, task_id) for task_id, (output, kind) in new.items()]
            schedules = schedule_changes(batch.schedules)
            max_id = batch.max_id if batch.max_id > self._stored_max_id else None
            totals = None if batch.totals is None else totals_text(batch.totals)
            marks = (max_id, totals)
            await self._run(lambda: self._commit(updates, rows, outputs, schedules, marks, leadership.epoch))
            self._live_rows.committed(batch.tasks)
            if max_id is not None:
                self._stored_max_id = max_id
        except Fenced as err:
            leadership.lose(str(err))
            self._leadership = None
            await self._stop_keeper()
            log.warning("cronoq leader was fenced; stepping down", reason=str(err), path=self._path)
            raise

    async def fetch(self, ref: int | str) -> StoredTask | None:
        if isinstance(ref, int) and not -(2**63) <= ref < 2**63:
            return None  # not an SQLite integer, so not an id we ever stored
        row = await self._run(lambda: self._fetch(ref))
        if row is None:
            return None
        try:
            task = task_from_row(row[: len(COLUMNS)])
        except ValueError as err:
            log.warning("task_row_undecodable", task_id=row[0], error=str(err), path=self._path)
            return None
        output, output_type = row[len(COLUMNS) :]
        return StoredTask(task, None if output is None else bytes(output), str(output_type))

    async def prune(self, finished_before: float) -> int:
        return await self._run(lambda: self._prune(ns(finished_before)))

    async def release(self) -> None:
        """Stop renewing and free the lease. Also runs when this instance does not lead, so that a lease
        taken by an acquire() that was cancelled mid-flight is given back (the thread runs jobs in
        order, so this one runs after that attempt)."""
        self._leadership = None
        await self._stop_keeper()
        if self._conn is not None:
            await self._run(self._release)

    async def close(self) -> None:
        executor = self._executor
        if executor is None:
            return
        try:
            await self.release()
        except StoreError as err:
            log.warning("cronoq leader lease not released; it will expire", error=str(err), path=self._path)
        self._executor = None
        await asyncio.get_running_loop().run_in_executor(executor, self._close)
        executor.shutdown(wait=False)

    # ---------------------------------------------------------------------------------- lease keeper

    async def _keep_lease(self, leadership: Leadership, deadline: float) -> None:
        """Renew the lease every ``lease_renew`` seconds until released or lost (also when the server
        gave it up itself: a lease nobody serves should lapse). ``deadline`` is when the lease runs out
        by this process's monotonic clock, counted from before the write that set it, so this process
        gives up no later than a standby may take over."""
        loop = asyncio.get_running_loop()
        delay = self._lease_renew
        while True:
            await asyncio.sleep(max(0.0, min(delay, deadline - loop.time())))
            if leadership.lost.is_set():
                return
            remaining = deadline - loop.time()
            if remaining <= 0:
                self._lose(leadership, LEASE_RAN_OUT)
                return
            started = loop.time()
            try:
                # asyncio.timeout, not wait_for: on 3.11 wait_for can swallow a cancel (release) that
                # arrives as the renewal completes, and the keeper would then never stop.
                async with asyncio.timeout(remaining):
                    held = await self._run(lambda: self._renew(leadership.epoch))
            except (StoreError, TimeoutError) as err:
                log.warning(
                    "cronoq leader lease renewal failed", error=str(err) or "timeout", path=self._path
                )
                delay = self._lock_poll  # retry soon: the lease is running out
                continue
            if not held:
                self._lose(leadership, LEASE_TAKEN_OVER)
                return
            deadline = started + self._lease_ttl
            delay = self._lease_renew

    def _lose(self, leadership: Leadership, reason: str) -> None:
        log.warning(reason, epoch=leadership.epoch, holder=self._holder.name, path=self._path)
        leadership.lose(reason)
        if self._leadership is leadership:
            self._leadership = None

    async def _stop_keeper(self) -> None:
        keeper, self._keeper = self._keeper, None
        if keeper is not None and keeper is not asyncio.current_task():
            keeper.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keeper

    # ----------------------------------------------------------------- on the store's thread only

    async def _run(self, call: Callable[[], T]) -> T:
        """Run ``call`` on the store's thread, turning sqlite3 errors into store errors."""
        if self._executor is None:
            raise StoreError(f"the cronoq store {self._path} is closed")
        return await asyncio.get_running_loop().run_in_executor(self._executor, self._guarded, call)

    def _guarded(self, call: Callable[[], T]) -> T:
        try:
            return call()
        except sqlite3.Error as err:
            code = getattr(err, "sqlite_errorcode", None)
            primary = None if code is None else code & 0xFF
            message = str(err)
            if primary in _TRANSIENT:
                raise StoreUnavailable(f"cronoq store {self._path}: {message}") from err
            raise StoreError(f"cronoq store {self._path}: {message}") from err

    @property
    def _db(self) -> sqlite3.Connection:
        if self._conn is None:
            raise StoreError(f"the cronoq store {self._path} is not open")
        return self._conn

    @contextlib.contextmanager
    def _write(self) -> Iterator[sqlite3.Connection]:
        """One write transaction; it takes the write lock at once (waiting up to busy_timeout), so it
        cannot fail halfway on a lock upgrade, and rolls back on any error."""
        conn = self._db
        conn.execute("BEGIN IMMEDIATE")
        try:
            yield conn
            conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                with contextlib.suppress(sqlite3.Error):
                    conn.execute("ROLLBACK")
            raise

    def _open(self) -> None:
        if self._conn is not None:
            return
        # Create the file ourselves so that it never exists with a wider mode; SQLite gives the -wal
        # and -shm files it creates next to it the same mode as the database file.
        try:
            os.close(os.open(self._path, os.O_RDWR | os.O_CREAT, 0o600))
        except OSError as err:
            raise StoreError(f"cannot create the cronoq store {self._path}: {err.strerror}") from err
        conn = sqlite3.connect(self._path, timeout=self._busy_timeout, isolation_level=None)
        try:
            self._use_wal(conn)
            conn.execute(f"PRAGMA synchronous = {'FULL' if self._full_sync else 'NORMAL'}")
            self._conn = conn
            self._migrate()
        except BaseException:
            self._conn = None
            conn.close()
            raise

    def _use_wal(self, conn: sqlite3.Connection) -> None:
        """Switch the file to WAL. While another connection switches a fresh file at the same time,
        SQLite answers "database is locked" at once instead of waiting busy_timeout, so wait here."""
        deadline = time.monotonic() + self._busy_timeout
        while True:
            try:
                mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
                break
            except sqlite3.OperationalError as err:
                if not _busy(err) or time.monotonic() >= deadline:
                    raise
                time.sleep(0.01)
        if str(mode).lower() != "wal":
            raise StoreError(f"cronoq store {self._path}: cannot use WAL mode (journal mode is {mode})")

    def _migrate(self) -> None:
        with self._write() as conn:
            conn.execute("CREATE TABLE IF NOT EXISTS cronoq_schema_version (version INTEGER NOT NULL)")
            current = conn.execute("SELECT max(version) FROM cronoq_schema_version").fetchone()[0] or 0
            if current > SCHEMA_VERSION:
                raise SchemaTooNew(
                    f"cronoq store {self._path} has schema version {current}, but this cronoq knows "
                    f"version {SCHEMA_VERSION} at most: upgrade cronoq to use this database"
                )
            if current == SCHEMA_VERSION:
                return
            for migration in _MIGRATIONS[current:]:
                for statement in migration:
                    conn.execute(statement)
            conn.execute("DELETE FROM cronoq_schema_version")
            conn.execute("INSERT INTO cronoq_schema_version (version) VALUES (?)", (SCHEMA_VERSION,))
            log.info("cronoq store migrated", path=self._path, schema_from=current, schema_to=SCHEMA_VERSION)

    def _try_acquire(self) -> _Taken | None:
        """Take the lease when it can be taken (:meth:`_takeable`); None when it cannot yet.

        The lease is read first without a write transaction, so that a standby never queues on the
        write lock of a leader that is alive, and whatever holds that lock, it learns whether the lease
        can be taken. Only then does it write, waiting at most ``lock_poll`` for the lock, and checks
        the row again under it. A lock that stays held is either a commit of a live leader (keep
        polling) or a holder stuck past its lease (:meth:`_end_stuck_holder`), and then the takeover
        is tried once more at once.
        """
        if self._takeable(self._read_lease(self._db), time.time_ns()) is None:
            return None
        with self._lock_wait(self._lock_poll):
            try:
                return self._take()
            except sqlite3.OperationalError as err:
                if not _busy(err) or not self._end_stuck_holder():
                    raise
            return self._take()

    def _takeable(self, lease: _Lease, now_ns: int) -> str | None:
        """Why ``lease`` can be taken by this instance, or None when another instance holds it."""
        holder = lease.holder
        if holder is None:
            return "free"
        if holder.name == self._holder.name:
            return "ours"
        if lease.expires_ns < now_ns:
            return "expired"
        if presence(holder, self._holder) is Presence.GONE:
            return "holder gone"
        return None

    def _take(self) -> _Taken | None:
        with self._write() as conn:
            lease = self._read_lease(conn)
            now = time.time_ns()
            why = self._takeable(lease, now)
            if why is None:
                return None
            conn.execute(
                "UPDATE cronoq_leader SET epoch = ?, holder = ?, expires_unix_ns = ? WHERE id = 1",
                (lease.epoch + 1, self._holder_text, now + round(self._lease_ttl * 1e9)),
            )
            return _Taken(lease.epoch + 1, why, lease.holder)

    @staticmethod
    def _read_lease(conn: sqlite3.Connection) -> _Lease:
        epoch, holder, expires = conn.execute(
            "SELECT epoch, holder, expires_unix_ns FROM cronoq_leader WHERE id = 1"
        ).fetchone()
        return _Lease(int(epoch), Holder.parse(holder) if holder else None, int(expires))

    def _end_stuck_holder(self) -> bool:
        """The takeover could not have the write lock: when the lease ran out and its holder, a process
        on this host that still runs, is what holds the lock (stopped, or in a commit longer than its
        lease), end it and wait up to ``lock_poll`` for it to be gone. True when the holder is gone.
        When it cannot be ended, says why, once, and the takeover keeps polling."""
        lease = self._read_lease(self._db)
        holder = lease.holder
        if holder is None or lease.expires_ns >= time.time_ns():
            return False  # a live lease: a leader's commit, not a stuck holder
        seen = presence(holder, self._holder)
        if seen is Presence.GONE:
            return True
        if seen is Presence.UNSEEN:
            return self._wait_on(holder, UNSEEN_HOLDER)
        owner = write_lock_owner(self._path)
        if owner != holder.pid or owner == self._holder.pid:
            # Another process holds it (a standby's takeover, a tool): the holder is not what blocks.
            who = f"pid {owner}" if owner else "a process that cannot be seen from here"
            return self._wait_on(
                holder, f"the store's write lock is held by {who}, not by the lease's holder"
            )
        log.warning(
            "ending the cronoq leader that holds the store's write lock after its lease ran out",
            pid=holder.pid,
            holder=holder.name,
            lease_ran_out_s_ago=round((time.time_ns() - lease.expires_ns) / 1e9, 3),
            path=self._path,
        )
        try:
            return kill(holder, self._lock_poll)
        except OSError as err:  # not permitted to signal it; no pidfd on this kernel
            return self._wait_on(holder, KILL_FAILED.format(error=err.strerror or err))

    def _wait_on(self, holder: Holder, reason: str) -> bool:
        """Log (once while it lasts) why the takeover waits on ``holder``; False."""
        if self._waiting_on != (holder, reason):
            self._waiting_on = (holder, reason)
            log.warning(
                TAKEOVER_WAITS,
                reason=reason,
                pid=holder.pid or None,
                holder=holder.name,
                path=self._path,
            )
        return False

    @contextlib.contextmanager
    def _lock_wait(self, seconds: float) -> Iterator[None]:
        """Wait at most ``seconds`` for another process's lock inside, instead of busy_timeout."""
        conn = self._db
        conn.execute(f"PRAGMA busy_timeout = {round(seconds * 1000)}")
        try:
            yield
        finally:
            conn.execute(f"PRAGMA busy_timeout = {round(self._busy_timeout * 1000)}")

    def _renew(self, epoch: int) -> bool:
        """Extend the lease if it is still this leader's; False when another instance took it."""
        cursor = self._db.execute(
            "UPDATE cronoq_leader SET expires_unix_ns = ? WHERE id = 1 AND epoch = ? AND holder = ?",
            (time.time_ns() + round(self._lease_ttl * 1e9), epoch, self._holder_text),
        )
        return cursor.rowcount == 1

    def _release(self) -> None:
        self._db.execute(
            "UPDATE cronoq_leader SET holder = NULL, expires_unix_ns = 0 WHERE id = 1 AND holder = ?",
            (self._holder_text,),
        )

    def _commit(
        self,
        updates: list[Row],
        rows: list[Row],
        outputs: list[tuple[bytes, str, int]],
        schedules: tuple[list[Row], list[str]],
        marks: tuple[int | None, str | None],
        epoch: int,
    ) -> None:
        """One commit. Empty parts are skipped. The leader row keeps the id high-water mark, written only
        when it rose (None otherwise), and the engine's totals (None: unchanged), in one statement: each
        statement, and the leader row's page in the write-ahead log, cost every commit."""
        with self._write() as conn:
            current = conn.execute("SELECT epoch FROM cronoq_leader WHERE id = 1").fetchone()[0]
            if current != epoch:
                raise Fenced(f"fenced: the cronoq leader epoch is now {current}, this leader had {epoch}")
            upserts, deletes = schedules
            for statement, chunk in _chunked_params(updates):
                conn.execute(statement, chunk)
            for statement, params in (
                (_UPSERT, rows),
                ("UPDATE cronoq_tasks SET output = ?, output_type = ? WHERE id = ?", outputs),
                (_UPSERT_SCHEDULE, upserts),
                ("DELETE FROM cronoq_recurring WHERE name = ?", [(name,) for name in deletes]),
            ):
                if params:
                    conn.executemany(statement, params)
            max_id, totals = marks
            if max_id is not None or totals is not None:
                conn.execute(
                    "UPDATE cronoq_leader SET max_id = max(max_id, ?), totals = coalesce(?, totals) WHERE id = 1",
                    (max_id or 0, totals),
                )

    def _recover(
        self, since_ns: int | None
    ) -> tuple[Recovered, list[tuple[int, str]], list[tuple[str, str]]]:
        """Everything recovery returns, the rows it quarantined and the schedules it could not decode,
        all read in one transaction (the quarantine writes, so it is a write transaction)."""
        quarantined: list[tuple[int, str]] = []
        with self._write() as conn:
            tasks = self._decode(conn, conn.execute(_RECOVER, (since_ns,)).fetchall(), quarantined)
            target_ids, target_keys = dep_targets(tasks)
            if target_ids or target_keys:
                targets = (json.dumps(sorted(target_ids)), json.dumps(sorted(target_keys)), since_ns)
                tasks += self._decode(conn, conn.execute(_RECOVER_TARGETS, targets).fetchall(), quarantined)
                tasks.sort(key=lambda task: task.id)
            max_id, totals = conn.execute(
                "SELECT max(l.max_id, coalesce((SELECT max(id) FROM cronoq_tasks), 0)), l.totals"
                " FROM cronoq_leader l WHERE l.id = 1"
            ).fetchone()
            schedules = []
            undecodable: list[tuple[str, str]] = []
            for row in conn.execute(f"SELECT {SELECT_SCHEDULE_COLUMNS} FROM cronoq_recurring ORDER BY name"):
                try:
                    schedules.append(recurring_from_row(row))
                except ValueError as err:
                    undecodable.append((row[0], str(err)))
        return Recovered(tasks, int(max_id), schedules, totals_from_text(totals)), quarantined, undecodable

    def _decode(
        self, conn: sqlite3.Connection, rows: list[Row], quarantined: list[tuple[int, str]]
    ) -> list[Task]:
        """The tasks of ``rows``; a row that does not decode is quarantined instead, and listed in
        ``quarantined``."""
        tasks = []
        for row in rows:
            try:
                tasks.append(task_from_row(row))
            except ValueError as err:
                message = text(f"quarantined: row could not be decoded ({err})")
                conn.execute(_QUARANTINE, (int(Status.FAILED), message, time.time_ns(), row[0]))
                quarantined.append((row[0], str(err)))
        return tasks

    def _fetch(self, ref: int | str) -> Row | None:
        where = "id = ?" if isinstance(ref, int) else "key = ? ORDER BY id DESC LIMIT 1"
        value = ref if isinstance(ref, int) else text(ref)
        row: Row | None = self._db.execute(
            f"SELECT {SELECT_COLUMNS}, output, output_type FROM cronoq_tasks WHERE {where}", (value,)
        ).fetchone()
        return row

    def _prune(self, before_ns: int | None) -> int:
        with self._write() as conn:
            return conn.execute(_PRUNE, (before_ns,)).rowcount

    def _close(self) -> None:
        conn, self._conn = self._conn, None
        if conn is not None:
            conn.close()
