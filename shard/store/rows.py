"""Tasks and recurring schedules as table rows, shared by the stores so that they hold the same columns.

Times are stored as integer Unix nanoseconds (what the wire uses), structured fields (retry policy, tags,
labels, dependencies, resources) as compact JSON text, and NUL characters in strings as U+FFFD because
Postgres text cannot hold NUL. A row that no longer decodes (hand-edited, or written by a future version)
is reported, not guessed at: :func:`task_from_row` and :func:`recurring_from_row` raise ``ValueError``.

A task's spec (all but its payload) is encoded field by field into JSON values once, by
:func:`_spec_fields`: a task row holds them as columns, and a schedule's template holds the very same
values as one JSON object, so that a template and a task spec cannot drift apart.
"""

from __future__ import annotations

import dataclasses
import json
import operator
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, Final, TypeVar

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
from cronoq.logs import get_logger

log = get_logger("cronoq.store")

# Insert order of the columns; the spec columns are written once, the state columns on every change.
# A column is only ever appended to either list (and added to the schema by a migration).
SPEC_COLUMNS = (
    "id",
    "seq",
    "pool",
    "kind",
    "priority",
    "key",
    "payload",
    "content_type",
    "deadline_ns",
    "duration_hint_s",
    "timeout_s",
    "retry",
    "tags",
    "labels",
    "tenant",
    "created_ns",
    "start_ns",
    "tolerance_s",
    "on_miss",
    "deps",
    "resources",
)
STATE_COLUMNS = (
    "status",
    "terminal",
    "attempt",
    "max_attempts",
    "ready_ns",
    "started_ns",
    "finished_ns",
    "message",
)
COLUMNS = SPEC_COLUMNS + STATE_COLUMNS
# What recovery and fetch read back (payload included; outputs are read separately).
SELECT_COLUMNS = ", ".join(COLUMNS)

# The spec columns that schema version 2 added to cronoq_tasks, each with the SQL default that gives the
# rows version 1 wrote what they meant: no fixed start, no dependencies, no resources (None: nullable,
# no default). The SQL stores build their ADD COLUMN clauses with :func:`columns_added_in_v2`.
ADDED_IN_V2: Final[Mapping[str, str | None]] = {
    "start_ns": None,
    "tolerance_s": "1.0",
    "on_miss": "'run_late'",
    "deps": "'[]'",
    "resources": "'{}'",
}

# A schedule's row: the schedule spec and its template spec as one JSON document (:func:`schedule_row`),
# the template's payload apart as bytes, the next occurrence and the last task it created.
SCHEDULE_COLUMNS = ("name", "spec", "template_payload", "next_unix_ns", "last_task_id")
SELECT_SCHEDULE_COLUMNS = ", ".join(SCHEDULE_COLUMNS)

# The columns that hold a spec field as JSON text: in a template they are plain JSON values instead.
_JSON_COLUMNS: Final = ("retry", "tags", "labels", "deps", "resources")

Row = tuple[Any, ...]
T = TypeVar("T")


def ns(seconds: float | None) -> int | None:
    return None if seconds is None else round(seconds * 1e9)


def seconds(value: int | None) -> float | None:
    return None if value is None else value / 1e9


def text(value: str) -> str:
    return value.replace("\x00", "\ufffd") if "\x00" in value else value


def columns_added_in_v2(types: Mapping[str, str]) -> list[str]:
    """The ``ADD COLUMN`` clauses of migration 2, given a store's SQL type for each column."""
    return [
        f"ADD COLUMN {column} {types[column]}" + ("" if default is None else f" NOT NULL DEFAULT {default}")
        for column, default in ADDED_IN_V2.items()
    ]


# One encoder for every row: json.dumps with separators would build a new one per call.
_json = json.JSONEncoder(separators=(",", ":")).encode
# Most maps and lists in a row are empty; these skip the JSON codec, which is most of its cost for them.
_EMPTY_TEXT: Final = {"{}": dict, "[]": list}


def _dump(value: Any) -> str | None:
    if value is None:
        return None
    if not value:
        return "{}" if isinstance(value, dict) else "[]"
    return _json(value)


def _load(value: str | None) -> Any:
    if value is None:
        return None
    empty = _EMPTY_TEXT.get(value)
    return empty() if empty is not None else json.loads(value)


def _spec_fields(spec: TaskSpec) -> dict[str, Any]:
    """Every field of ``spec`` but the payload, as JSON values keyed by column name."""
    retry = spec.retry
    return {
        "pool": spec.pool,
        "kind": text(spec.kind),
        "priority": int(spec.priority),
        "key": text(spec.key) or None,
        "content_type": text(spec.content_type),
        "deadline_ns": ns(spec.deadline),
        "duration_hint_s": spec.duration_hint,
        "timeout_s": spec.timeout,
        "retry": None
        if retry is None
        else [retry.max_attempts, retry.initial_backoff, retry.multiplier, retry.max_backoff, retry.jitter],
        "tags": {text(k): text(v) for k, v in spec.tags.items()},
        "labels": {text(k): text(v) for k, v in spec.labels.items()},
        "tenant": text(spec.tenant),
        "start_ns": ns(spec.start),
        "tolerance_s": spec.tolerance,
        "on_miss": spec.on_miss.value,
        # A target keeps its JSON type: a number is a task id, a string a key.
        "deps": [[d.target if isinstance(d.target, int) else text(d.target), d.on.value] for d in spec.deps],
        "resources": {text(name): amount for name, amount in spec.resources.items()},
    }


def _spec_from_fields(fields: Mapping[str, Any], payload: Any) -> TaskSpec:
    """The inverse of :func:`_spec_fields`. Raises ValueError, TypeError or KeyError when a field does
    not decode."""
    retry = fields["retry"]
    retry_policy = None
    if retry is not None:
        attempts, initial, multiplier, max_backoff, jitter = retry
        retry_policy = RetryRule(
            int(attempts), float(initial), float(multiplier), float(max_backoff), bool(jitter)
        )
    key = fields["key"]
    return TaskSpec(
        pool=str(fields["pool"]),
        payload=bytes(payload) if payload is not None else None,
        content_type=str(fields["content_type"]),
        kind=str(fields["kind"]),
        priority=Priority(int(fields["priority"])),
        key=str(key) if key is not None else "",
        deadline=seconds(fields["deadline_ns"]),
        duration_hint=_float(fields["duration_hint_s"]),
        timeout=_float(fields["timeout_s"]),
        retry=retry_policy,
        tags=_strings(fields["tags"]),
        labels=_strings(fields["labels"]),
        tenant=str(fields["tenant"]),
        start=seconds(fields["start_ns"]),
        tolerance=float(fields["tolerance_s"]),
        on_miss=MissPolicy(fields["on_miss"]),
        deps=tuple(_dep(value) for value in _of(list, fields["deps"])),
        resources={str(name): _integer(amount) for name, amount in _of(dict, fields["resources"]).items()},
    )


def state_of(task: Task) -> Row:
    """The state columns of ``task``, in STATE_COLUMNS order."""
    status = task.status
    return (
        int(status),
        status.terminal,
        task.attempt,
        task.max_attempts,
        ns(task.ready_at),
        ns(task.started),
        ns(task.finished),
        text(task.message),
    )


def row_of(task: Task) -> Row:
    """Every column of ``task``, in COLUMNS order."""
    columns = _spec_fields(task.spec)
    for column in _JSON_COLUMNS:
        columns[column] = _dump(columns[column])
    payload = task.spec.payload
    columns["id"] = task.id
    columns["seq"] = task.seq
    columns["payload"] = bytes(payload) if payload is not None else None
    columns["created_ns"] = ns(task.created)
    return (*(columns[c] for c in SPEC_COLUMNS), *state_of(task))


class LiveRows:
    """The ids of live tasks that have a row in the store (recovered, or written by a commit of this
    leadership), so that a commit writes their changes as state updates instead of rebinding the whole
    spec and payload (``row_of`` is most of a row's cost; a task is written about three times).

    A new leadership knows no rows until ``recover`` says which exist: until then every task is written
    whole, which an upsert accepts whether or not its row exists.
    """

    __slots__ = ("_ids",)

    def __init__(self) -> None:
        self._ids: set[int] = set()

    def reset(self, tasks: Iterable[Task] = ()) -> None:
        """Start over knowing the rows of ``tasks`` (those recovered): the live ones."""
        self._ids = {task.id for task in tasks if not task.status.terminal}

    def split(self, tasks: Sequence[Task], *, one_statement: bool) -> tuple[list[Task], list[Task]]:
        """``tasks`` (of one commit, each once) as (those whose row gets a state update, those written
        whole). A store that writes every row in ``one_statement`` cannot order its updates before its
        inserts, so there a task whose key a new row of the commit reuses is written whole too: both
        are then written in id order, and the key is never held by two live rows at once."""
        ids = self._ids
        known = [task for task in tasks if task.id in ids]
        whole = [task for task in tasks if task.id not in ids]
        if one_statement and known and whole:
            reused = {task.spec.key for task in whole if task.spec.key}
            if reused:
                whole += [task for task in known if task.spec.key in reused]
                known = [task for task in known if task.spec.key not in reused]
        return known, whole

    def committed(self, tasks: Iterable[Task]) -> None:
        """``tasks`` were written: the live ones have a row now, finished ones are no longer live."""
        ids = self._ids
        for task in tasks:
            if task.status.terminal:
                ids.discard(task.id)
            else:
                ids.add(task.id)


def task_from_row(row: Row) -> Task:
    """Rebuild a task from a row in COLUMNS order. Raises ValueError when the row does not decode."""
    if len(row) != len(COLUMNS):
        raise ValueError(f"expected {len(COLUMNS)} columns, got {len(row)}")
    columns = dict(zip(COLUMNS, row, strict=True))
    task_id = columns["id"]
    try:
        for column in _JSON_COLUMNS:
            columns[column] = _load(columns[column])
        created = seconds(columns["created_ns"])
        if created is None:
            raise ValueError("created_ns is NULL")
        return Task(
            id=int(task_id),
            spec=_spec_from_fields(columns, columns["payload"]),
            seq=int(columns["seq"]),
            status=Status(int(columns["status"])),
            created=created,
            attempt=int(columns["attempt"]),
            max_attempts=int(columns["max_attempts"]),
            ready_at=seconds(columns["ready_ns"]),
            started=seconds(columns["started_ns"]),
            finished=seconds(columns["finished_ns"]),
            message=str(columns["message"]),
        )
    except (TypeError, KeyError, ValueError) as err:
        raise ValueError(f"task {task_id}: {err}") from err


def dep_targets(tasks: Iterable[Task]) -> tuple[set[int], set[str]]:
    """The task ids and the keys (as stored) that the live tasks among ``tasks`` depend on. Recovery
    loads those targets too, however long ago they finished: the engine needs their outcome to decide
    the edges still waiting on them."""
    ids: set[int] = set()
    keys: set[str] = set()
    for task in tasks:
        if task.status.terminal:
            continue
        for dep in task.spec.deps:
            if isinstance(dep.target, int):
                ids.add(dep.target)
            else:
                keys.add(text(dep.target))
    return ids, keys


# ------------------------------------------------------------------------------------------ schedules


def schedule_row(name: str, recurring: Recurring) -> Row:
    """The row of schedule ``name``, in SCHEDULE_COLUMNS order."""
    spec = recurring.spec
    payload = spec.template.payload
    document = {
        "cron": text(spec.cron),
        "tz": text(spec.tz),
        "overlap": spec.overlap.value,
        "deadline_in_s": spec.deadline_in,
        "template": _spec_fields(spec.template),
    }
    return (
        text(name),
        _json(document),
        bytes(payload) if payload is not None else None,
        ns(recurring.next_start),
        recurring.last_task_id,
    )


def recurring_from_row(row: Row) -> Recurring:
    """Rebuild a schedule from a row in SCHEDULE_COLUMNS order. Raises ValueError when it does not
    decode."""
    if len(row) != len(SCHEDULE_COLUMNS):
        raise ValueError(f"expected {len(SCHEDULE_COLUMNS)} columns, got {len(row)}")
    name, document, payload, next_ns, last_task_id = row
    try:
        spec = _of(dict, json.loads(document))
        return Recurring(
            spec=RecurringSpec(
                name=str(name),
                cron=str(spec["cron"]),
                template=_spec_from_fields(_of(dict, spec["template"]), payload),
                tz=str(spec["tz"]),
                overlap=Overlap(spec["overlap"]),
                deadline_in=_float(spec["deadline_in_s"]),
            ),
            next_start=seconds(next_ns),
            last_task_id=_integer(last_task_id),
        )
    except (TypeError, KeyError, ValueError) as err:
        raise ValueError(f"schedule {name!r}: {err}") from err


def schedule_changes(schedules: Sequence[tuple[str, Recurring | None]]) -> tuple[list[Row], list[str]]:
    """The net effect of a batch's schedule writes: rows to upsert and (stored) names to delete, each
    name in at most one of them, where the last write for a name wins. A store can then apply both
    lists in any order, or in one statement."""
    final = {text(name): (name, recurring) for name, recurring in schedules}
    upserts = [schedule_row(name, r) for name, r in final.values() if r is not None]
    deletes = [stored for stored, (_, r) in final.items() if r is None]
    return upserts, deletes


_TOTALS: Final = tuple(f.name for f in dataclasses.fields(Totals))
_totals_of = operator.attrgetter(*_TOTALS)


def totals_text(totals: Totals) -> str:
    """The engine's counters as a commit keeps them: a JSON object by counter name. Every commit
    writes them: read field by field, not with ``dataclasses.asdict``, which copies deeply (16 µs a
    commit, against 4)."""
    return _json(dict(zip(_TOTALS, _totals_of(totals), strict=True)))


def totals_from_text(value: str | None) -> Totals | None:
    """The counters a commit kept: None when none were, or when they no longer decode (logged; the
    counters then start at zero, which is all they cost). A counter this version does not know is left
    out and one it does not find starts at 0, so versions that count more or fewer read each other's."""
    if value is None:
        return None
    known = {f.name for f in dataclasses.fields(Totals)}
    try:
        stored = _of(dict, json.loads(value))
        return Totals(**{name: _integer(count) for name, count in stored.items() if name in known})
    except ValueError as err:
        log.warning("totals_undecodable", error=str(err))
        return None


# ------------------------------------------------------------------------------------- type checks


def _of(kind: type[T], value: object) -> T:
    if not isinstance(value, kind):
        raise ValueError(f"expected a JSON {kind.__name__}, got {type(value).__name__}")
    return value


def _integer(value: object) -> int:
    """``value`` when it is an integer: not a bool, which ``isinstance(value, int)`` lets pass, and
    not a string, which would turn a key into a task id."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise ValueError(f"expected an integer, got {value!r}")
    return value


def _float(value: Any) -> float | None:
    return None if value is None else float(value)


def _strings(value: object) -> dict[str, str]:
    mapping = _of(dict, value)
    if not all(isinstance(k, str) and isinstance(v, str) for k, v in mapping.items()):
        raise ValueError("expected a JSON object of strings")
    return mapping


def _dep(value: object) -> DepEdge:
    target, on = _of(list, value)
    if not isinstance(target, str):
        target = _integer(target)
    return DepEdge(target, DepOn(on))
