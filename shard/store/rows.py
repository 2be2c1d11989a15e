"""Tasks as table rows, shared by the SQL stores so that SQLite and Postgres hold the same columns.

Times are stored as integer Unix nanoseconds (what the wire uses), structured fields (retry policy, tags,
labels) as compact JSON text, and NUL characters in strings as U+FFFD because Postgres text cannot hold
NUL. A row that no longer decodes (hand-edited, or written by a future version) is reported, not
guessed at: :func:`task_from_row` raises ``ValueError`` and recovery quarantines it.
"""

from __future__ import annotations

import json
from typing import Any

from cronoq.engine.model import Priority, RetryPolicy, Status, Task, TaskSpec

# Insert order of the columns; the spec columns are written once, the state columns on every change.
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

Row = tuple[Any, ...]


def ns(seconds: float | None) -> int | None:
    return None if seconds is None else round(seconds * 1e9)


def seconds(value: int | None) -> float | None:
    return None if value is None else value / 1e9


def text(value: str) -> str:
    return value.replace("\x00", "\ufffd") if "\x00" in value else value


def _mapping(values: dict[str, str]) -> str:
    return json.dumps({text(k): text(v) for k, v in values.items()}, separators=(",", ":"))


def _retry(policy: RetryPolicy | None) -> str | None:
    if policy is None:
        return None
    return json.dumps(
        [policy.max_attempts, policy.initial_backoff, policy.multiplier, policy.max_backoff, policy.jitter],
        separators=(",", ":"),
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
    spec = task.spec
    payload = spec.payload
    return (
        task.id,
        task.seq,
        spec.pool,
        text(spec.kind),
        int(spec.priority),
        text(spec.key) or None,
        bytes(payload) if payload is not None else None,
        text(spec.content_type),
        ns(spec.deadline),
        spec.duration_hint,
        spec.timeout,
        _retry(spec.retry),
        _mapping(spec.tags),
        _mapping(spec.labels),
        text(spec.tenant),
        ns(task.created),
        *state_of(task),
    )


def task_from_row(row: Row) -> Task:
    """Rebuild a task from a row in COLUMNS order. Raises ValueError when the row does not decode."""
    if len(row) != len(COLUMNS):
        raise ValueError(f"expected {len(COLUMNS)} columns, got {len(row)}")
    (
        task_id,
        seq,
        pool,
        kind,
        priority,
        key,
        payload,
        content_type,
        deadline_ns,
        duration_hint,
        timeout,
        retry,
        tags,
        labels,
        tenant,
        created_ns,
        status,
        _terminal,
        attempt,
        max_attempts,
        ready_ns,
        started_ns,
        finished_ns,
        message,
    ) = row
    try:
        retry_policy = None
        if retry is not None:
            attempts, initial, multiplier, max_backoff, jitter = json.loads(retry)
            retry_policy = RetryPolicy(
                int(attempts), float(initial), float(multiplier), float(max_backoff), bool(jitter)
            )
        spec = TaskSpec(
            pool=str(pool),
            payload=bytes(payload) if payload is not None else None,
            content_type=str(content_type),
            kind=str(kind),
            priority=Priority(int(priority)),
            key=str(key) if key is not None else "",
            deadline=seconds(deadline_ns),
            duration_hint=None if duration_hint is None else float(duration_hint),
            timeout=None if timeout is None else float(timeout),
            retry=retry_policy,
            tags=_decode_mapping(tags),
            labels=_decode_mapping(labels),
            tenant=str(tenant),
        )
        created = seconds(created_ns)
        if created is None:
            raise ValueError("created_ns is NULL")
        return Task(
            id=int(task_id),
            spec=spec,
            seq=int(seq),
            status=Status(int(status)),
            created=created,
            attempt=int(attempt),
            max_attempts=int(max_attempts),
            ready_at=seconds(ready_ns),
            started=seconds(started_ns),
            finished=seconds(finished_ns),
            message=str(message),
        )
    except (TypeError, KeyError, json.JSONDecodeError) as err:
        raise ValueError(f"task {task_id}: {err}") from err


def _decode_mapping(value: str) -> dict[str, str]:
    decoded = json.loads(value)
    if not isinstance(decoded, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in decoded.items()
    ):
        raise ValueError("expected a JSON object of strings")
    return decoded
