"""The Postgres store: one schema per leader group, any number of standbys on other hosts.

Leadership is a session-level advisory lock held by one dedicated connection, the *lock session*. The
lock alone is not enough, because a leader can lose it without noticing (its session killed, the network
cut, the process paused): so every acquisition also bumps ``cronoq_leader.epoch``, and every commit checks
in the same statement that the epoch is still its own. A leader that resumes after another took over is
fenced by that check, whatever it believes. While leading, a background check asks the server whether
this session still holds the lock (``pg_locks``, not ``SELECT 1``: a live session is not proof of the lock)
and gives leadership up as soon as the answer is no, an error, or nothing for ``session_timeout``.

A standby waits for the lock rather than asking for it now and then: ``pg_advisory_lock`` on its lock
session, so Postgres grants it the moment the leader's session ends or unlocks (a killed leader's
backend ends as soon as its socket closes). Each wait is bounded by ``lock_timeout`` (``lock_wait``)
and issued again: the answer every few seconds proves the standby's own session alive, and the
statement's snapshot, which holds back vacuum's horizon while it runs, never lives longer than that.
TCP keepalives on the lock session, set on both ends, bound how long a vanished machine's session
lingers (:class:`Keepalives`).

Commits run on a small connection pool, never on the lock session, so a slow commit cannot delay the
lock check. A commit is a single statement: the fence, then the whole batch upserted from binary
arrays (``unnest``) with the outputs, so it costs one round trip and one fsync. For 1,000 tasks that
measured faster than ``executemany`` in pipeline mode (about 60 against 75 ms median, and less client
CPU); text-format arrays would cost five times the client CPU of binary ones. The tasks go as arrays
of rows of two composite types (:data:`TASK_ROW`, :data:`TASK_STATE`) rather than an array per
column, which Postgres unnests at less cost, encoded here (:mod:`.pgarrays`) at less CPU than psycopg
spends on lists; and there is one statement per shape of batch, so that a commit carries only the
parts it needs. A commit given up
on after ``commit_timeout`` is abandoned, not awaited; a per-leader sequence number checked in the
fence keeps it from landing after a later commit if it reaches the server late.

Tables are always named with the schema (quoted by :mod:`psycopg.sql`), never through ``search_path``,
which would be per-connection state that a pooler or a stray ``SET`` could change under us.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import operator
import os
import re
import socket
import time
import zlib
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from dataclasses import dataclass
from typing import Any, Final, TypeVar

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict
from psycopg.rows import TupleRow
from psycopg_pool import AsyncConnectionPool

from cronoq.engine.model import Status, Task
from cronoq.logs import get_logger

from .base import (
    Batch,
    Fenced,
    Leadership,
    Recovered,
    SchemaTooNew,
    StoredTask,
    StoreError,
    StoreUnavailable,
)
from .pgarrays import RecordArrays, register
from .rows import (
    ADDED_IN_V2,
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

SCHEMA_VERSION: Final = 4

# Advisory lock classes (first key of the two-int form): "cqld" and "cqmg" in ASCII, both below 2**31.
LEADER_LOCK_CLASS: Final = 0x63716C64
MIGRATION_LOCK_CLASS: Final = 0x63716D67

# Column types of cronoq_tasks, in rows.COLUMNS order (a column added there fails here, loudly).
_TYPES: Final = {
    "id": "BIGINT",
    "seq": "BIGINT",
    "pool": "TEXT",
    "kind": "TEXT",
    "priority": "SMALLINT",
    "key": "TEXT",
    "payload": "BYTEA",
    "content_type": "TEXT",
    "deadline_ns": "BIGINT",
    "duration_hint_s": "DOUBLE PRECISION",
    "timeout_s": "DOUBLE PRECISION",
    "retry": "TEXT",
    "tags": "TEXT",
    "labels": "TEXT",
    "tenant": "TEXT",
    "created_ns": "BIGINT",
    "status": "SMALLINT",
    "terminal": "BOOLEAN",
    "attempt": "INTEGER",
    "max_attempts": "INTEGER",
    "ready_ns": "BIGINT",
    "started_ns": "BIGINT",
    "finished_ns": "BIGINT",
    "message": "TEXT",
    "start_ns": "BIGINT",
    "tolerance_s": "DOUBLE PRECISION",
    "on_miss": "TEXT",
    "deps": "TEXT",
    "resources": "TEXT",
}
_NULLABLE: Final = frozenset(
    {
        "key",
        "payload",
        "deadline_ns",
        "duration_hint_s",
        "timeout_s",
        "retry",
        "ready_ns",
        "started_ns",
        "finished_ns",
        "start_ns",
    }
)
_SCHEDULE_TYPES: Final = {
    "name": "TEXT",
    "spec": "TEXT",
    "template_payload": "BYTEA",
    "next_unix_ns": "BIGINT",
    "last_task_id": "BIGINT",
}
# The state columns a task's later writes change (its terminal flag follows from the status), and how
# to pick them from a rows.state_of() tuple.
_CHANGING: Final = ("status", "attempt", "ready_ns", "started_ns", "finished_ns", "message")
_changing = operator.itemgetter(*(STATE_COLUMNS.index(c) for c in _CHANGING))
# The composite types a commit sends its rows as (schema version 4, see pgarrays): a task written whole
# (every column, then its output), and a task's state update or new output (the fields that change;
# only id and the output for an output alone). A column added to cronoq_tasks later must be added to
# TASK_ROW too (ALTER TYPE ... ADD ATTRIBUTE, in the same migration), or its value is never written.
TASK_ROW: Final = "cronoq_task_row"
TASK_STATE: Final = "cronoq_task_state"
_ROW_FIELDS: Final = {**{c: _TYPES[c] for c in COLUMNS}, "output": "BYTEA", "output_type": "TEXT"}
_STATE_FIELDS: Final = {c: _ROW_FIELDS[c] for c in ("id", *_CHANGING, "output", "output_type")}
_ROWS: Final = RecordArrays(list(_ROW_FIELDS.values()))
_STATES: Final = RecordArrays(list(_STATE_FIELDS.values()))

# The slowest rate at which a commit is still expected to write its payloads and outputs: its timeout
# is commit_timeout plus its bytes at this rate. A burst of large payloads (hundreds of MiB held for
# one group commit) can take longer than commit_timeout alone, and with a fixed bound the same batch
# timed out on every retry, stalling every commit behind it.
COMMIT_BYTES_PER_S: Final = 8 * 1024 * 1024
LOCK_SESSION_NAME: Final = "cronoq-lock"
PRUNE_CHUNK: Final = 10_000  # rows per DELETE, so pruning a large backlog never holds locks for long

Conn = psycopg.AsyncConnection[TupleRow]
# Which parts a commit statement has: rows written whole, rows updated by state, outputs of other rows.
Shape = tuple[bool, bool, bool]
_SHAPES: Final[tuple[Shape, ...]] = tuple(
    (w, k, o) for w in (False, True) for k in (False, True) for o in (False, True)
)
# Failures worth retrying: connection loss, timeouts, serialization failures and deadlocks (all
# OperationalError), and a primary that became a read-only replica during a failover.
_TRANSIENT: Final = (psycopg.OperationalError, psycopg.errors.ReadOnlySqlTransaction)
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class Keepalives:
    """TCP keepalive settings of the store's connections (``[store] keepalives_*``, ``tcp_user_timeout_s``).

    They are set on the client side of every connection (libpq's ``keepalives_*`` and
    ``tcp_user_timeout``: cronoq notices a Postgres that vanished) and on the server side of the lock
    session (the ``tcp_keepalives_*`` and ``tcp_user_timeout`` settings: Postgres notices a cronoq
    machine that vanished and ends its session, which frees the leader lock). A connection idle for
    ``idle_s`` is probed every ``interval_s`` and given up after ``count`` unanswered probes; data left
    unacknowledged for ``user_timeout_s`` (0: the system's default) ends it too. The defaults give up
    within 10 s, as ``idle_session_timeout`` does for a lock session that stopped asking."""

    idle_s: int = 5
    interval_s: int = 1
    count: int = 5
    user_timeout_s: float = 10.0

    def client(self) -> dict[str, int]:
        """The libpq connection parameters."""
        return {
            "keepalives": 1,
            "keepalives_idle": self.idle_s,
            "keepalives_interval": self.interval_s,
            "keepalives_count": self.count,
            "tcp_user_timeout": round(self.user_timeout_s * 1000),
        }


def lock_key(schema: str) -> tuple[int, int]:
    """The two-int advisory lock key of ``schema``'s leader group: a fixed class and the CRC-32 of the
    name as a signed 32-bit int (stable across processes and versions, unlike ``hash()``). Operators find
    the leader's backend with ``SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND objsubid = 2
    AND classid = <class> AND objid = <crc32 unsigned>``."""
    crc = zlib.crc32(schema.encode("utf-8"))
    return LEADER_LOCK_CLASS, crc - (1 << 32) if crc >= 1 << 31 else crc


@dataclass(frozen=True, slots=True)
class _Statements:
    """Every statement, composed once with the schema-qualified table names."""

    create_schema: sql.Composed
    create_version_table: sql.Composed
    read_version: sql.Composed
    record_version: sql.Composed
    migrations: dict[int, tuple[sql.Composed, ...]]
    bump_epoch: sql.Composed
    read_epoch: sql.Composed
    commits: dict[Shape, sql.Composed]
    schedule: sql.Composed
    unschedule: sql.Composed
    recover: sql.Composed
    recover_targets: sql.Composed
    recover_schedules: sql.Composed
    recover_marks: sql.Composed
    quarantine: sql.Composed
    fetch_id: sql.Composed
    fetch_key: sql.Composed
    prune: sql.Composed


def _statements(schema: str) -> _Statements:
    def q(template: str) -> sql.Composed:
        return sql.SQL(template).format(s=sql.Identifier(schema))

    definitions = ",\n".join(
        f"{c} {_TYPES[c]}{'' if c in _NULLABLE else ' NOT NULL'}" for c in COLUMNS if c not in ADDED_IN_V2
    )
    fenced = "EXISTS (SELECT 1 FROM {s}.cronoq_leader WHERE id = 1 AND epoch = %(epoch)s AND commit_seq = %(commit_seq)s)"
    schedule_arrays = ", ".join(f"%(schedule_{c})b::{t}[]" for c, t in _SCHEDULE_TYPES.items())
    schedule_updates = ", ".join(f"{c} = EXCLUDED.{c}" for c in SCHEDULE_COLUMNS[1:])
    v1 = (
        q(
            "CREATE TABLE {s}.cronoq_leader (id INTEGER PRIMARY KEY CHECK (id = 1), epoch BIGINT NOT NULL,"
            " max_id BIGINT NOT NULL, holder TEXT NOT NULL, expires_unix_ns BIGINT,"
            " commit_seq BIGINT NOT NULL DEFAULT 0)"
        ),
        q("INSERT INTO {s}.cronoq_leader (id, epoch, max_id, holder) VALUES (1, 0, 0, '')"),
        q(
            f"CREATE TABLE {{s}}.cronoq_tasks ({definitions},\n"
            "output BYTEA, output_type TEXT NOT NULL DEFAULT '', PRIMARY KEY (id))"
        ),
        q("CREATE INDEX cronoq_tasks_finished ON {s}.cronoq_tasks (terminal, finished_ns)"),
        q(
            "CREATE UNIQUE INDEX cronoq_tasks_live_key ON {s}.cronoq_tasks (key)"
            " WHERE key IS NOT NULL AND NOT terminal"
        ),
        # fetch(key) of finished tasks: without it every lookup of an old key would scan the table.
        q("CREATE INDEX cronoq_tasks_key ON {s}.cronoq_tasks (key, id) WHERE key IS NOT NULL"),
        q(
            "CREATE TABLE {s}.cronoq_recurring (name TEXT PRIMARY KEY, spec TEXT NOT NULL,"
            " template_payload BYTEA, next_unix_ns BIGINT, last_task_id BIGINT)"
        ),
    )
    # Fixed starts, dependencies and resources. cronoq_recurring already has the columns schedules need.
    # The clauses are composed, not formatted: their defaults hold braces ('{}').
    v2 = tuple(q("ALTER TABLE {s}.cronoq_tasks ") + sql.SQL(c) for c in columns_added_in_v2(_TYPES))
    # The engine's totals as of the last commit, for the next leader to count on from.
    v3 = (q("ALTER TABLE {s}.cronoq_leader ADD COLUMN totals TEXT"),)
    # The types commits send their rows as: the statement reads the tasks of a batch from one array of
    # rows, rather than from an array per column (see pgarrays). Nothing else changes.
    v4 = tuple(
        q(f"CREATE TYPE {{s}}.{name} AS ({', '.join(f'{c} {t}' for c, t in fields.items())})")
        for name, fields in ((TASK_ROW, _ROW_FIELDS), (TASK_STATE, _STATE_FIELDS))
    )
    return _Statements(
        create_schema=sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(sql.Identifier(schema)),
        create_version_table=q(
            "CREATE TABLE IF NOT EXISTS {s}.cronoq_schema_version (version INTEGER NOT NULL)"
        ),
        read_version=q("SELECT COALESCE(max(version), 0) FROM {s}.cronoq_schema_version"),
        record_version=q("INSERT INTO {s}.cronoq_schema_version (version) VALUES (%s)"),
        migrations={1: v1, 2: v2, 3: v3, 4: v4},
        bump_epoch=q(
            "UPDATE {s}.cronoq_leader SET epoch = epoch + 1, commit_seq = 0, holder = %s,"
            " expires_unix_ns = NULL WHERE id = 1 RETURNING epoch"
        ),
        read_epoch=q("SELECT epoch FROM {s}.cronoq_leader WHERE id = 1"),
        # One statement, one round trip. The fence locks the leader row and matches only while the epoch
        # is ours and no later commit of ours was applied (commit_seq: a commit given up on after its
        # timeout must not land after its retry); every write below is gated on it, so a stale leader
        # or a stale commit writes nothing. Locking the row also makes acquire()'s epoch bump wait for a
        # commit in flight. Tasks whose row this leadership knows get their state columns (and output, when
        # the batch carries one) updated; the others are upserted whole: their spec is written on insert
        # only, conflicts update the state and output. Outputs of tasks not in the batch update their rows.
        # The three sets of rows are disjoint (a statement may not change a row twice). A task's terminal
        # flag follows from its status. Schedule changes are rare: a commit that has some writes them
        # with two more statements in its transaction, so that the common statement stays within the
        # size and parameter count that psycopg caches its parsing for (50 parameters: parsing it again
        # at every commit cost 0.7 ms). One statement per shape (which of the three sets the batch has):
        # an absent set costs neither its empty arrays nor its part of the plan (a lone new task, the
        # commit of a lone Submit, took 0.75 ms with all three parts, 0.5 ms with its own).
        commits={shape: _commit_statement(q, shape) for shape in _SHAPES},
        # In the commit's transaction, after the commit statement applied it: gated on the fence row
        # saying that this very commit holds it.
        schedule=q(
            f"INSERT INTO {{s}}.cronoq_recurring ({SELECT_SCHEDULE_COLUMNS})"
            f" SELECT * FROM unnest({schedule_arrays}) WHERE {fenced}"
            f" ON CONFLICT (name) DO UPDATE SET {schedule_updates}"
        ),
        unschedule=q(
            f"DELETE FROM {{s}}.cronoq_recurring WHERE name = ANY(%(unscheduled)b::TEXT[]) AND {fenced}"
        ),
        # "terminal AND" lets the planner use the (terminal, finished_ns) index for the second branch.
        recover=q(
            f"SELECT {SELECT_COLUMNS} FROM {{s}}.cronoq_tasks"
            " WHERE NOT terminal OR (terminal AND finished_ns >= %s) ORDER BY id"
        ),
        # The dependency targets (ids, and the newest task of each key) that recover with the same cutoff
        # did not load: those finished before it. One array of ids, so that both are primary key lookups.
        recover_targets=q(
            f"SELECT {SELECT_COLUMNS} FROM {{s}}.cronoq_tasks WHERE id = ANY(%(ids)s::BIGINT[] || ARRAY("
            "SELECT max(id) FROM {s}.cronoq_tasks WHERE key = ANY(%(keys)s::TEXT[]) GROUP BY key))"
            " AND terminal AND (finished_ns < %(since)s OR finished_ns IS NULL) ORDER BY id"
        ),
        recover_schedules=q(f"SELECT {SELECT_SCHEDULE_COLUMNS} FROM {{s}}.cronoq_recurring ORDER BY name"),
        recover_marks=q(
            "SELECT GREATEST(max_id, (SELECT COALESCE(max(id), 0) FROM {s}.cronoq_tasks)), totals"
            " FROM {s}.cronoq_leader WHERE id = 1"
        ),
        quarantine=q(
            "UPDATE {s}.cronoq_tasks SET status = %s, terminal = TRUE,"
            " finished_ns = COALESCE(finished_ns, %s), message = %s WHERE id = %s"
        ),
        fetch_id=q(f"SELECT {SELECT_COLUMNS}, output, output_type FROM {{s}}.cronoq_tasks WHERE id = %s"),
        fetch_key=q(
            f"SELECT {SELECT_COLUMNS}, output, output_type FROM {{s}}.cronoq_tasks"
            " WHERE key = %s ORDER BY id DESC LIMIT 1"
        ),
        # Finished before the cutoff, except what a live task still depends on (by id, or as the newest
        # task holding a key): recovery must find those, however old. deps is JSON text
        # [[target, condition], ...], a target being an id or a key.
        prune=q(
            "WITH edges AS (SELECT e->0 AS target FROM {s}.cronoq_tasks l,"
            " jsonb_array_elements(l.deps::jsonb) e WHERE NOT l.terminal AND l.deps <> '[]')"
            " DELETE FROM {s}.cronoq_tasks WHERE id IN (SELECT id FROM {s}.cronoq_tasks"
            " WHERE terminal AND finished_ns < %s"
            " AND id NOT IN (SELECT (target #>> '{{}}')::bigint FROM edges WHERE jsonb_typeof(target) = 'number')"
            " AND id NOT IN (SELECT max(id) FROM {s}.cronoq_tasks WHERE key IN"
            " (SELECT target #>> '{{}}' FROM edges WHERE jsonb_typeof(target) = 'string') GROUP BY key)"
            " LIMIT %s)"
        ),
    )


def _commit_statement(q: Callable[[str], sql.Composed], shape: Shape) -> sql.Composed:
    """The commit statement of a batch of ``shape`` (see ``_Statements.commits``): the fence, then
    the parts the batch needs; it answers the epoch the fence found (NULL: not ours), then how many
    rows were upserted whole, got an output of their own, and got a state update."""
    whole, known, other = shape
    # An array literal, its braces doubled for sql.SQL.format().
    terminal = "{{" + ",".join(str(int(status)) for status in Status if status.terminal) + "}}"
    state_sets = ", ".join(f"{c} = u.{c}" for c in _CHANGING) + f", terminal = u.status = ANY('{terminal}')"
    parts = [
        "fence AS (UPDATE {s}.cronoq_leader SET max_id = GREATEST(max_id, %(max_id)s),"
        " totals = COALESCE(%(totals)s::TEXT, totals),"
        " commit_seq = %(commit_seq)s WHERE id = 1 AND epoch = %(epoch)s AND commit_seq < %(commit_seq)s RETURNING epoch)"
    ]
    if known:
        parts.append(
            f"updated AS (UPDATE {{s}}.cronoq_tasks AS t SET {state_sets},"
            " output = COALESCE(u.output, t.output),"
            " output_type = CASE WHEN u.output IS NULL THEN t.output_type ELSE u.output_type END"
            f" FROM unnest(%(states)b::{{s}}.{TASK_STATE}[]) AS u WHERE t.id = u.id AND EXISTS (SELECT 1 FROM fence) RETURNING 1)"
        )
    if whole:
        parts.append(
            f"upserted AS (INSERT INTO {{s}}.cronoq_tasks AS t ({', '.join(COLUMNS)}, output, output_type)"
            f" SELECT * FROM unnest(%(rows)b::{{s}}.{TASK_ROW}[]) WHERE EXISTS (SELECT 1 FROM fence)"
            f" ON CONFLICT (id) DO UPDATE SET {', '.join(f'{c} = EXCLUDED.{c}' for c in STATE_COLUMNS)},"
            " output = COALESCE(EXCLUDED.output, t.output),"
            " output_type = CASE WHEN EXCLUDED.output IS NULL THEN t.output_type ELSE EXCLUDED.output_type END"
            " RETURNING 1)"
        )
    if other:
        parts.append(
            "outputs AS (UPDATE {s}.cronoq_tasks AS t SET output = o.output, output_type = o.output_type"
            f" FROM unnest(%(outputs)b::{{s}}.{TASK_STATE}[]) AS o WHERE t.id = o.id AND EXISTS (SELECT 1 FROM fence) RETURNING 1)"
        )
    counted = (("upserted", whole), ("outputs", other), ("updated", known))
    counts = ", ".join(f"(SELECT count(*) FROM {name})" if present else "0" for name, present in counted)
    return q(f"WITH {', '.join(parts)} SELECT (SELECT epoch FROM fence), {counts}")


_FIND_SCHEMA = "SELECT 1 FROM pg_namespace WHERE nspname = %s"
_HOLDS_LOCK = (
    "SELECT EXISTS (SELECT 1 FROM pg_locks WHERE locktype = 'advisory' AND granted"
    " AND pid = pg_backend_pid() AND classid = %s::bigint::oid AND objid = %s::bigint::oid AND objsubid = 2"
    " AND database = (SELECT oid FROM pg_database WHERE datname = current_database()))"
)


@dataclass(frozen=True, slots=True)
class _CommitParams:
    """What a commit runs: the shape of its batch (which commit statement), that statement's
    parameters, the schedule statements' (None: no schedule changed), and how many task rows the
    statement updates by state (each must exist)."""

    shape: Shape
    params: dict[str, Any]
    schedules: dict[str, Any] | None
    known: int


@dataclass(frozen=True, slots=True)
class _TypeOids:
    """The OIDs of this schema's TASK_ROW and TASK_STATE types, which the commit's arrays name."""

    row: int
    state: int


def _commit_params(batch: Batch, live: LiveRows, epoch: int, seq: int, types: _TypeOids) -> _CommitParams:
    """The commit statement's parameters: the tasks to upsert whole as an array of TASK_ROW, the state
    changes of those whose row ``live`` knows, and the outputs of tasks that are in neither, as arrays
    of TASK_STATE (each only when the batch has some); then, if the batch changes schedules, the
    schedule statements' parameters (one array per column of the schedules to upsert, and the names
    of those to delete). Tasks are de-duplicated (the last state wins: Postgres refuses to update a row
    twice in one statement); whole rows are sorted by id, so a task that finished and a newer one
    reusing its key are written in that order and the live-key index never sees both live. Raises
    ValueError for a value that does not fit its column."""
    known, whole = live.split(list({t.id: t for t in batch.tasks}.values()), one_statement=True)
    whole.sort(key=lambda t: t.id)
    outputs = {task_id: (data, text(kind)) for task_id, data, kind in batch.outputs}
    params: dict[str, Any] = {
        "max_id": batch.max_id,
        "totals": None if batch.totals is None else totals_text(batch.totals),
        "epoch": epoch,
        "commit_seq": seq,
    }
    if whole:
        rows = [(*row_of(t), *outputs.pop(t.id, _NO_OUTPUT)) for t in whole]
        params["rows"] = _ROWS.encode(types.row, rows)
    if known:
        states = [(t.id, *_changing(state_of(t)), *outputs.pop(t.id, _NO_OUTPUT)) for t in known]
        params["states"] = _STATES.encode(types.state, states)
    if outputs:
        alone = [(task_id, *_NO_STATE, data, kind) for task_id, (data, kind) in outputs.items()]
        params["outputs"] = _STATES.encode(types.state, alone)
    shape = (bool(whole), bool(known), bool(outputs))
    if not batch.schedules:
        return _CommitParams(shape, params, None, len(known))
    upserts, deletes = schedule_changes(batch.schedules)
    schedules: dict[str, Any] = {"epoch": epoch, "commit_seq": seq, "unscheduled": deletes}
    columns_of = zip(*upserts, strict=True) if upserts else ([] for _ in SCHEDULE_COLUMNS)
    for column, values in zip(SCHEDULE_COLUMNS, columns_of, strict=True):
        schedules[f"schedule_{column}"] = list(values)
    return _CommitParams(shape, params, schedules, len(known))


_NO_OUTPUT: Final = (None, "")  # a task written without an output: the row keeps the one it has
_NO_STATE: Final = (None,) * len(_CHANGING)  # an output alone: its state columns are not written


def _decode(rows: Sequence[Row], broken: list[tuple[int, str]]) -> list[Task]:
    """The tasks of ``rows``; a row that does not decode is listed in ``broken`` (to be quarantined)."""
    tasks = []
    for row in rows:
        try:
            tasks.append(task_from_row(row))
        except ValueError as err:
            broken.append((int(row[0]), str(err)))
    return tasks


def commit_timeout(batch: Batch, base: float) -> float:
    """How long ``batch`` may take to commit: ``base`` (``commit_timeout``), plus its payloads and
    outputs at :data:`COMMIT_BYTES_PER_S` once they come to a second's worth (payloads counted whether
    or not this commit writes them: erring long). Smaller batches keep ``base`` and the one-statement
    commit; a longer bound costs the commit a transaction and a statement more."""
    payloads = sum(len(task.spec.payload or b"") for task in batch.tasks)  # (None once a task finished)
    size = payloads + sum(len(out) for _, out, _ in batch.outputs)
    return base + size / COMMIT_BYTES_PER_S if size >= COMMIT_BYTES_PER_S else base


async def _bounded(work: Awaitable[T], timeout: float) -> T:
    """Await ``work`` for at most ``timeout`` seconds, else cancel it and raise TimeoutError. The work
    runs in a task of its own so that giving up never waits for it: psycopg's cancellation of a query
    to a server that no longer answers can take ten more seconds. Its late outcome is discarded."""
    job = asyncio.ensure_future(work)
    job.add_done_callback(_discard)
    try:
        done, _ = await asyncio.wait({job}, timeout=timeout)
    finally:
        if not job.done():
            job.cancel()
    if not done:
        raise TimeoutError
    return job.result()


def _shut_down(conn: Conn) -> None:
    """End both directions of ``conn``'s socket without closing its descriptor (see
    :meth:`PostgresStore._drop_session`)."""
    with contextlib.suppress(OSError, psycopg.Error):
        fd = conn.pgconn.socket
        with socket.socket(fileno=os.dup(fd)) as sock:  # closing the duplicate leaves the original open
            sock.shutdown(socket.SHUT_RDWR)


def _discard(task: asyncio.Future[Any]) -> None:
    """Retrieve the outcome of a task nobody awaits any more, so asyncio does not report it."""
    if not task.cancelled():
        task.exception()


class PostgresStore:
    """See the module docstring. ``url`` is a libpq URL or key/value string; it is never logged and is
    scrubbed from error messages. Timeouts are in seconds: ``lock_wait`` is how long one wait of a
    standby for the lock lasts before it is issued again, ``retry_interval`` how long a standby whose
    lock session failed waits before it connects again."""

    def __init__(
        self,
        url: str,
        *,
        schema: str = "public",
        lock_wait: float = 5.0,
        retry_interval: float = 0.5,
        check_interval: float = 1.0,
        session_timeout: float = 10.0,
        commit_timeout: float = 5.0,
        max_connections: int = 4,
        keepalives: Keepalives = Keepalives(),
    ) -> None:
        self._url = url
        self._schema = schema
        self._lock_wait = lock_wait
        self._retry_interval = retry_interval
        self._keepalives = keepalives
        self._check_interval = check_interval
        self._session_timeout = session_timeout
        self._commit_timeout = commit_timeout
        self._max_connections = max_connections
        self._key = lock_key(schema)
        self._q = _statements(schema)
        self._holder = f"{socket.gethostname()}:{os.getpid()}"
        self._secrets = _secrets_of(url)
        self._connect_kwargs: dict[str, Any] = {"autocommit": True}
        self._pool: AsyncConnectionPool[Conn] | None = None
        self._session: Conn | None = None
        self._leadership: Leadership | None = None
        self._watcher: asyncio.Task[None] | None = None
        self._waiting: asyncio.Task[bool] | None = None  # a standby's wait for the lock, while it runs
        self._session_work: asyncio.Future[Any] | None = None  # the last work started on the lock session
        self._closing: set[asyncio.Task[None]] = set()  # lock sessions to close once their work ended
        self._commit_seq = 0  # per leadership: orders this leader's commits (see the commit statement)
        self._live_rows = LiveRows()
        self._types = _TypeOids(0, 0)  # read by open()
        self._closed = False

    @property
    def durable(self) -> bool:
        return True

    # ------------------------------------------------------------------------------------- open/close

    async def open(self) -> None:
        if self._closed:
            raise StoreError("the Postgres store is closed")
        if self._pool is not None:
            return
        try:
            params = conninfo_to_dict(self._url)
        except psycopg.Error as err:
            raise StoreError(f"invalid Postgres URL: {self._redact(err)}") from None
        where = _describe(params)
        if "connect_timeout" not in params:
            self._connect_kwargs["connect_timeout"] = max(2, math.ceil(self._session_timeout))
        if "application_name" not in params:
            self._connect_kwargs["application_name"] = "cronoq"
        # The URL's own keepalive parameters, if it has any, win over [store]'s.
        self._connect_kwargs |= {k: v for k, v in self._keepalives.client().items() if k not in params}
        pool: AsyncConnectionPool[Conn] = AsyncConnectionPool(
            self._url,
            min_size=1,
            max_size=self._max_connections,
            kwargs=self._connect_kwargs,
            configure=self._configure,
            open=False,
            name=f"cronoq:{self._schema}",
        )
        try:
            self._session = await self._connect_session()
            await self._migrate(self._session)
            self._types = await self._type_oids(self._session)
            await pool.open(wait=True, timeout=max(2.0, self._session_timeout))
            self._pool = pool
        except BaseException as err:
            await self._drop_session()
            await pool.close()
            if isinstance(err, StoreError):
                raise
            if isinstance(err, _TRANSIENT):  # down, restarting, unreachable, refusing this role for now
                raise StoreUnavailable(f"cannot use Postgres at {where}: {self._redact(err)}") from None
            if isinstance(err, psycopg.Error):
                raise StoreError(f"cannot use Postgres at {where}: {self._redact(err)}") from None
            raise
        log.info("store.opened", kind="postgres", at=where, schema=self._schema, version=SCHEMA_VERSION)

    async def _type_oids(self, conn: Conn) -> _TypeOids:
        """The OIDs of the types a commit sends its rows as (they differ from database to database)."""
        names = [sql.Identifier(self._schema, name).as_string(conn) for name in (TASK_ROW, TASK_STATE)]
        row = await (await conn.execute("SELECT to_regtype(%s)::oid, to_regtype(%s)::oid", names)).fetchone()
        if row is None or None in row:
            raise StoreError(
                f"schema {self._schema!r} lacks the type {TASK_ROW} or {TASK_STATE}: dropped by hand?"
            )
        return _TypeOids(int(row[0]), int(row[1]))

    async def _connect_session(self) -> Conn:
        """A new lock session; named (unless the URL names every connection) so that operators can tell
        it apart from the pool's connections in ``pg_stat_activity``."""
        kwargs = self._connect_kwargs
        if "application_name" in kwargs:
            kwargs = {**kwargs, "application_name": LOCK_SESSION_NAME}
        conn = await psycopg.AsyncConnection.connect(self._url, **kwargs)
        # The leader's checks keep this session busy every check_interval. If they stop for longer
        # than session_timeout (the process is paused, or cut off from the database), Postgres itself
        # ends the session, which frees the lock for a standby: a leader that cannot be reached must not
        # keep its lock for ever. The check itself notices within session_timeout and steps down.
        # The server's keepalives end it when the machine at the other end vanished (see Keepalives).
        timeout = f"{max(1, round(self._session_timeout * 1000))}ms"
        alive = self._keepalives
        try:
            await conn.execute(
                "SELECT set_config('idle_session_timeout', %s, false),"
                " set_config('tcp_keepalives_idle', %s, false),"
                " set_config('tcp_keepalives_interval', %s, false),"
                " set_config('tcp_keepalives_count', %s, false),"
                " set_config('tcp_user_timeout', %s, false)",
                (
                    timeout,
                    str(alive.idle_s),
                    str(alive.interval_s),
                    str(alive.count),
                    str(round(alive.user_timeout_s * 1000)),
                ),
            )
        except BaseException:
            await conn.close()
            raise
        return conn

    async def _configure(self, conn: Conn) -> None:
        """Server-side bounds for pool connections, as a backstop for the client-side commit timeout: a
        statement never runs, and a transaction never idles, longer than ``commit_timeout``.

        Prepared statements are planned once, generically (``plan_cache_mode``), not for each run's
        parameters: left to itself, Postgres planned the commit statement anew at every small commit
        (a generic plan cannot see that the arrays hold one row, so it looks dearer), and planning it
        cost more than running it: a one-task commit took 0.86 ms with a plan of its own, 0.55 ms
        with the generic plan.

        Sequential scans are also ruled out. Every statement here finds its rows through an index, but
        a generic plan made while the table is still small (a leader's first few commits) joins the
        updated rows with a scan of the whole table, the cheapest plan then. That plan stays cached
        while the table grows: measured, it doubled the commit latency (3 to 7 ms for 26 updated rows
        in a table of 12,000).

        The connection also learns to send the commit's arrays, encoded by :mod:`.pgarrays`."""
        register(conn.adapters)
        limit = f"{max(1, round(self._commit_timeout * 1000))}ms"
        await conn.execute(
            "SELECT set_config('statement_timeout', %s, false),"
            " set_config('idle_in_transaction_session_timeout', %s, false),"
            " set_config('enable_seqscan', 'off', false),"
            " set_config('plan_cache_mode', 'force_generic_plan', false)",
            (limit, limit),
        )

    async def _migrate(self, conn: Conn) -> None:
        """Create the schema and bring it to SCHEMA_VERSION, under a transaction-level advisory lock so
        that replicas starting together migrate once (the others wait, then find nothing to do)."""
        async with conn.transaction():
            await conn.execute("SELECT pg_advisory_xact_lock(%s, %s)", (MIGRATION_LOCK_CLASS, self._key[1]))
            # Only create what is missing: CREATE SCHEMA checks the privilege before IF NOT EXISTS.
            if await (await conn.execute(_FIND_SCHEMA, (self._schema,))).fetchone() is None:
                await conn.execute(self._q.create_schema)
            await conn.execute(self._q.create_version_table)
            row = await (await conn.execute(self._q.read_version)).fetchone()
            current = int(row[0]) if row else 0
            if current > SCHEMA_VERSION:
                raise SchemaTooNew(
                    f"schema {self._schema!r} is at version {current}, newer than version {SCHEMA_VERSION}"
                    " that this cronoq knows: upgrade cronoq"
                )
            for version in range(current + 1, SCHEMA_VERSION + 1):
                for statement in self._q.migrations[version]:
                    await conn.execute(statement)
                await conn.execute(self._q.record_version, (version,))
        if current < SCHEMA_VERSION:
            log.info("store.migrated", schema=self._schema, from_version=current, to_version=SCHEMA_VERSION)

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        if self._waiting is not None:
            await self._end_wait(self._waiting)
        await self._stop_watch()
        if self._leadership is not None:
            self._step_down(self._leadership, "store closed", planned=True)
        await self._drop_session()  # ends the backend, which releases the lock
        if self._closing:  # psycopg bounds what they wait for (a query's cancellation) to 10 s
            await asyncio.wait(self._closing)
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.close()

    # ------------------------------------------------------------------------------------- leadership

    async def acquire(self) -> Leadership:
        self._require_pool()
        if self._leadership is not None:
            await self.release()
        standing_by = failing = False
        while True:
            if self._closed:
                raise StoreError("the Postgres store was closed while standing by")
            epoch = None
            try:
                if self._session is None:
                    self._session = await self._connect_session()
                if await self._wait_for_lock():
                    epoch = await self._on_session(self._bump_epoch)
                failing = False
            except (*_TRANSIENT, TimeoutError) as err:
                await self._drop_session()
                if not failing:
                    log.warning("store.lock_session_failed", schema=self._schema, error=self._redact(err))
                failing = True
                await asyncio.sleep(self._retry_interval)
            except psycopg.Error as err:
                await self._drop_session()
                raise StoreError(f"cannot take the leader lock: {self._redact(err)}") from None
            except BaseException:
                await self._drop_session()  # a lock taken before the failure goes with the session
                raise
            if epoch is not None:
                break
            if not standing_by:
                log.info("store.standing_by", schema=self._schema)
                standing_by = True
        leadership = Leadership(epoch)
        self._leadership = leadership
        self._commit_seq = 0
        self._live_rows.reset()  # until recover() says which rows hold live tasks: whole rows only
        self._watcher = asyncio.create_task(self._watch(leadership), name=f"cronoq-lock-check:{self._schema}")
        log.info("store.leading", schema=self._schema, epoch=epoch)
        return leadership

    async def _wait_for_lock(self) -> bool:
        """Wait on the lock session up to ``lock_wait`` for the lock; True once it holds it. The server
        is given ``session_timeout`` more to answer, else the session is dropped.

        The wait runs as a task of its own so that cancelling it (close(), or the caller cancelled)
        goes through psycopg, which cancels the query on the server: closing the connection alone
        would leave its backend queued for the lock, to take it and hold it until it noticed."""
        session = self._session
        if session is None or session.closed:
            raise psycopg.OperationalError("the lock session is closed")
        job = self._start_on_session(self._lock_within(session))
        self._waiting = job
        bound = self._lock_wait + self._session_timeout
        try:
            done, _ = await asyncio.wait({job}, timeout=bound)
        finally:
            self._waiting = None
            await self._end_wait(job)
        if not done:
            await self._drop_session(session)
            raise TimeoutError(f"the lock session did not answer within {bound:g} s")
        return not job.cancelled() and job.result()  # cancelled: by close(), which the loop then sees

    async def _lock_within(self, conn: Conn) -> bool:
        """``pg_advisory_lock`` bounded by ``lock_timeout``; False when that ran out. The bound is local
        to this transaction so that it never cuts the epoch bump short (which waits for the row lock
        of a commit the old leader may still have running), and ``statement_timeout`` is lifted in it
        in case the role sets one shorter than ``lock_wait``. A session lock taken in a transaction
        outlives it."""
        try:
            async with conn.transaction():
                await conn.execute(
                    "SELECT set_config('lock_timeout', %s, true), set_config('statement_timeout', '0', true)",
                    (f"{max(1, round(self._lock_wait * 1000))}ms",),
                )
                await conn.execute("SELECT pg_advisory_lock(%s::integer, %s::integer)", self._key)
        except psycopg.errors.LockNotAvailable:
            return False
        return True

    async def _end_wait(self, job: asyncio.Task[bool]) -> None:
        """Cancel a wait for the lock and give it ``session_timeout`` to end (psycopg cancels the query
        on the server and reads its answer)."""
        if not job.done():
            job.cancel()
            await asyncio.wait({job}, timeout=self._session_timeout)

    async def _bump_epoch(self, conn: Conn) -> int:
        """Fence every earlier leader: the epoch this leadership commits under."""
        row = await (await conn.execute(self._q.bump_epoch, (self._holder,))).fetchone()
        if row is None:
            raise StoreError(f"schema {self._schema!r} has no cronoq_leader row: it was edited by hand")
        return int(row[0])

    async def _holds_lock(self, conn: Conn) -> bool:
        cls, key = self._key
        row = await (await conn.execute(_HOLDS_LOCK, (cls, key & 0xFFFFFFFF))).fetchone()
        return bool(row and row[0])

    async def _unlock(self, conn: Conn) -> None:
        await conn.execute("SELECT pg_advisory_unlock(%s::integer, %s::integer)", self._key)

    async def _watch(self, leadership: Leadership) -> None:
        """Prove every ``check_interval`` that the lock session still holds the lock; step down on the
        first answer that is not yes. Leadership lost otherwise (a fenced commit) ends the session at once
        too, so that the lock goes to a standby rather than staying with an instance that cannot write."""
        while True:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(leadership.lost.wait(), self._check_interval)
            if leadership.lost.is_set():
                await self._drop_session()
                return
            try:
                if await self._on_session(self._holds_lock):
                    continue
                reason = "the lock session no longer holds the advisory lock"
            except TimeoutError as err:
                reason = str(err)
            except psycopg.Error as err:
                reason = f"lock session lost: {self._redact(err)}"
            except Exception as err:  # a check that cannot run proves nothing: stop leading all the same
                reason = f"lock check failed: {err!r}"
            self._step_down(leadership, reason)
            await self._drop_session()
            return

    async def _on_session(self, work: Callable[[Conn], Coroutine[Any, Any, T]]) -> T:
        """Run ``work`` on the lock session for at most ``session_timeout``; a session that does not
        answer in time is dropped (which releases the lock once the server notices)."""
        session = self._session
        if session is None or session.closed:
            raise psycopg.OperationalError("the lock session is closed")
        try:
            return await _bounded(self._start_on_session(work(session)), self._session_timeout)
        except TimeoutError:
            await self._drop_session(session)
            raise TimeoutError(
                f"the lock session did not answer within {self._session_timeout:g} s"
            ) from None

    def _start_on_session(self, work: Coroutine[Any, Any, T]) -> asyncio.Task[T]:
        """Run ``work`` (which uses the lock session) as a task of its own, remembered until the session
        is dropped: see :meth:`_drop_session`."""
        job = asyncio.ensure_future(work)
        job.add_done_callback(_discard)
        self._session_work = job
        return job

    async def _drop_session(self, session: Conn | None = None) -> None:
        """Close the lock session (``session``: only if it is still the current one); the server then
        releases any lock it held.

        Work given up on may still run on the session: psycopg, told to cancel it, cancels the query on
        the server and goes on watching the socket for the answer. Closing the connection under it frees
        the socket's descriptor while the event loop is asked to watch it, which uvloop answers by
        aborting the whole process. Such a session is shut down instead (the backend ends, freeing the
        lock, as soon as it reads from the socket; psycopg reads the end too and gives up) and closed
        once the work has ended."""
        current = self._session
        if current is None or (session is not None and session is not current):
            return
        self._session = None
        work, self._session_work = self._session_work, None
        if work is None or work.done():
            await self._close_session(current)
            return
        _shut_down(current)
        closing = asyncio.create_task(
            self._close_after(work, current), name=f"cronoq-lock-close:{self._schema}"
        )
        self._closing.add(closing)
        closing.add_done_callback(self._closing.discard)

    async def _close_after(self, work: asyncio.Future[Any], session: Conn) -> None:
        await asyncio.wait({work})
        await self._close_session(session)

    async def _close_session(self, session: Conn) -> None:
        try:
            await session.close()
        except psycopg.Error as err:
            log.debug("store.lock_session_close_failed", error=self._redact(err))

    async def _stop_watch(self) -> None:
        watcher, self._watcher = self._watcher, None
        if watcher is not None and watcher is not asyncio.current_task():
            watcher.cancel()
            await asyncio.wait({watcher})

    def _step_down(self, leadership: Leadership, reason: str, *, planned: bool = False) -> None:
        if leadership.lost.is_set():
            return
        leadership.lose(reason)
        emit = log.info if planned else log.warning
        emit("store.stepped_down", schema=self._schema, epoch=leadership.epoch, reason=reason)

    async def release(self) -> None:
        leadership, self._leadership = self._leadership, None
        await self._stop_watch()
        if leadership is None:
            return
        if leadership.lost.is_set():
            # Whatever ended it (a fenced commit), the lock must not outlive the leadership: a session
            # lock is re-entrant, so the next acquire() would otherwise hold it twice and unlock once.
            await self._drop_session()
            return
        self._step_down(leadership, "released", planned=True)
        try:
            await self._on_session(self._unlock)
        except (psycopg.Error, TimeoutError):
            await self._drop_session()  # ending the session releases the lock just the same

    def _leading(self) -> Leadership:
        leadership = self._leadership
        if leadership is None:
            raise Fenced("this store does not lead: acquire() first")
        if leadership.lost.is_set():
            raise Fenced(f"leadership of epoch {leadership.epoch} was lost: {leadership.reason}")
        return leadership

    # ------------------------------------------------------------------------------------------- data

    async def commit(self, batch: Batch) -> None:
        leadership = self._leading()
        self._commit_seq += 1
        try:
            work = _commit_params(batch, self._live_rows, leadership.epoch, self._commit_seq, self._types)
        except ValueError as err:  # the same batch would fail the same way at every retry
            raise StoreError(f"commit failed: {err}") from None
        timeout = commit_timeout(batch, self._commit_timeout)
        longer = timeout if timeout > self._commit_timeout else None
        try:
            epoch = await _bounded(self._commit(work, longer), timeout)
        except TimeoutError:
            raise StoreUnavailable(f"commit did not finish within {timeout:g} s") from None
        except psycopg.errors.ProgramLimitExceeded as err:
            # An OperationalError, but the same batch fails the same way on every retry (an index entry
            # too large, say): retrying would stall every commit behind it for good.
            raise StoreError(f"commit failed: {self._redact(err)}") from None
        except _TRANSIENT as err:
            raise StoreUnavailable(f"commit failed: {self._redact(err)}") from None
        except psycopg.Error as err:
            raise StoreError(f"commit failed: {self._redact(err)}") from None
        if epoch == leadership.epoch:
            self._live_rows.committed(batch.tasks)
            return
        if epoch is None:
            raise StoreUnavailable("a later commit of this leader was applied first; nothing written")
        reason = f"fenced: epoch is now {epoch}, this leader has {leadership.epoch}"
        self._step_down(leadership, reason)
        raise Fenced(reason)

    async def _commit(self, work: _CommitParams, longer: float | None) -> int | None:
        """Run the commit statement (and the schedule statements, in one transaction with it): our epoch
        when it was applied, else the current epoch when another leader bumped it, else None (the epoch
        is ours but a later commit got there first). ``longer``: this commit's server-side bound, when
        its size makes it longer than the connection's."""
        statement, params, schedules = self._q.commits[work.shape], work.params, work.schedules
        async with self._require_pool().connection() as conn:
            if schedules is None and longer is None:
                row = await (await conn.execute(statement, params, prepare=True)).fetchone()
            else:
                async with conn.transaction():
                    if longer is not None:
                        limit = f"{round(longer * 1000)}ms"
                        await conn.execute(
                            "SELECT set_config('statement_timeout', %s, true),"
                            " set_config('idle_in_transaction_session_timeout', %s, true)",
                            (limit, limit),
                        )
                    row = await (await conn.execute(statement, params, prepare=True)).fetchone()
                    if row is not None and schedules is not None and row[0] is not None:
                        await conn.execute(self._q.schedule, schedules)
                        await conn.execute(self._q.unschedule, schedules)
            if row is not None and row[0] is not None:
                known = work.known
                if row[3] != known:  # not a race: only this leader writes, so rows went behind its back
                    raise StoreError(
                        f"{known - row[3]} of the {known} task rows this leader updated are missing from "
                        f"{self._schema}.cronoq_tasks (deleted by hand?); the commit wrote everything else"
                    )
                return int(row[0])
            row = await (await conn.execute(self._q.read_epoch)).fetchone()
        epoch = int(row[0]) if row else -1
        return None if epoch == params["epoch"] else epoch

    async def recover(self, finished_since: float) -> Recovered:
        pool = self._require_pool()
        broken: list[tuple[int, str]] = []
        schedules = []
        try:
            async with pool.connection() as conn, conn.transaction():
                await conn.execute("SET LOCAL statement_timeout = 0")  # proportional to the data kept
                await conn.execute("SET LOCAL enable_seqscan = on")  # it may read most of the table
                cur = conn.cursor(binary=True)
                since = ns(finished_since)
                await cur.execute(self._q.recover, (since,))
                tasks = _decode(await cur.fetchall(), broken)
                target_ids, target_keys = dep_targets(tasks)
                if target_ids or target_keys:
                    targets = {"since": since, "ids": sorted(target_ids), "keys": sorted(target_keys)}
                    await cur.execute(self._q.recover_targets, targets)
                    tasks += _decode(await cur.fetchall(), broken)
                    tasks.sort(key=lambda task: task.id)
                marks = await (await conn.execute(self._q.recover_marks)).fetchone()
                max_id, totals = (int(marks[0]), marks[1]) if marks else (0, None)
                await cur.execute(self._q.recover_schedules)
                for row in await cur.fetchall():
                    try:
                        schedules.append(recurring_from_row(row))
                    except ValueError as err:
                        log.error(
                            "store.schedule_undecodable", schema=self._schema, name=row[0], error=str(err)
                        )
                if broken:
                    await self._quarantine(conn, broken)
        except _TRANSIENT as err:
            raise StoreUnavailable(f"recovery failed: {self._redact(err)}") from None
        except psycopg.Error as err:
            raise StoreError(f"recovery failed: {self._redact(err)}") from None
        log.info(
            "store.recovered",
            schema=self._schema,
            tasks=len(tasks),
            schedules=len(schedules),
            quarantined=len(broken),
            max_id=max_id,
        )
        self._live_rows.reset(tasks)
        return Recovered(tasks, max_id, schedules, totals_from_text(totals))

    async def _quarantine(self, conn: Conn, broken: Sequence[tuple[int, str]]) -> None:
        """Mark rows that do not decode as failed, so they stop being live, and say so in the log."""
        now = time.time_ns()
        rows = []
        for task_id, error in broken:
            log.error("store.quarantined", schema=self._schema, id=task_id, error=error)
            message = f"quarantined: row could not be decoded ({error})"
            rows.append((int(Status.FAILED), now, text(message), task_id))
        async with conn.cursor() as cur:
            await cur.executemany(self._q.quarantine, rows)

    async def fetch(self, ref: int | str) -> StoredTask | None:
        pool = self._require_pool()
        query, param = (self._q.fetch_key, text(ref)) if isinstance(ref, str) else (self._q.fetch_id, ref)
        if param == "":
            return None
        try:
            async with pool.connection() as conn:
                cur = conn.cursor(binary=True)
                row = await (await cur.execute(query, (param,))).fetchone()
        except _TRANSIENT as err:
            raise StoreUnavailable(f"fetch failed: {self._redact(err)}") from None
        except psycopg.Error as err:
            raise StoreError(f"fetch failed: {self._redact(err)}") from None
        if row is None:
            return None
        try:
            task = task_from_row(row[: len(COLUMNS)])
        except ValueError as err:
            log.error("store.undecodable", schema=self._schema, id=row[0], error=str(err))
            return None
        output = row[len(COLUMNS)]
        return StoredTask(task, bytes(output) if output is not None else None, row[len(COLUMNS) + 1])

    async def prune(self, finished_before: float) -> int:
        pool = self._require_pool()
        cutoff = ns(finished_before)
        deleted = 0
        try:
            async with pool.connection() as conn:
                while True:
                    cur = await conn.execute(self._q.prune, (cutoff, PRUNE_CHUNK))
                    deleted += cur.rowcount
                    if cur.rowcount < PRUNE_CHUNK:
                        break
        except _TRANSIENT as err:
            raise StoreUnavailable(f"prune failed: {self._redact(err)}") from None
        except psycopg.Error as err:
            raise StoreError(f"prune failed: {self._redact(err)}") from None
        return deleted

    # -------------------------------------------------------------------------------------- plumbing

    def _require_pool(self) -> AsyncConnectionPool[Conn]:
        if self._pool is None:
            raise StoreError("the Postgres store is not open")
        return self._pool

    def _redact(self, err: BaseException) -> str:
        message = str(err).strip()
        for secret in self._secrets:
            message = message.replace(secret, "***")
        return message


def _secrets_of(url: str) -> tuple[str, ...]:
    """Every spelling of the password in ``url`` (decoded, and as written), longest first, so that
    error messages can be scrubbed even when the URL does not parse."""
    found: set[str] = set()
    try:
        password = conninfo_to_dict(url).get("password")
    except psycopg.Error:
        password = None
    if password:
        found.add(str(password))
    for pattern in (r"^[A-Za-z][A-Za-z0-9+.-]*://[^:/@]*:(.+)@", r"password\s*=\s*('(?:\\.|[^'])*'|\S+)"):
        match = re.search(pattern, url, re.DOTALL)
        if match:
            found.add(match.group(1))
    return tuple(sorted((s for s in found if s), key=len, reverse=True))


def _describe(params: dict[str, Any]) -> str:
    """Where the URL points, without the password: ``user@host:port/dbname``."""
    host = params.get("host") or params.get("hostaddr") or "localhost"
    port = params.get("port") or "5432"
    user = params.get("user") or "(default user)"
    return f"{user}@{host}:{port}/{params.get('dbname') or user}"
