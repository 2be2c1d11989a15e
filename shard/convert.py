"""Validation and conversion between wire messages and engine objects.

Every check names the field it refused (``task.kind: ...``, ``tasks[3].timeout_s: ...``) so a producer
can fix its request without reading server logs. Nothing here touches engine state: a request is
converted completely before the engine sees any of it, which is what keeps bad input from changing
anything.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass

from cronoq.engine.model import Priority, RetryPolicy, Status, Task, TaskSpec
from cronoq.errors import InvalidArgument, NotFound, Unimplemented
from cronoq.v1 import cronoq_pb2 as pb

HUNDRED_YEARS_S = 100 * 365 * 86_400.0
MAX_CONTENT_TYPE = 128
MAX_WORKER_MESSAGE = 8192
NS = 1_000_000_000


@dataclass(slots=True, frozen=True)
class SpecLimits:
    """The subset of ``[limits]`` that bounds one task spec."""

    max_key_len: int
    max_kind_len: int
    max_tags: int
    max_tag_len: int


def check_text(field: str, value: str, max_len: int) -> str:
    if "\x00" in value:
        raise InvalidArgument(f"{field}: must not contain NUL characters")
    if len(value) > max_len:
        raise InvalidArgument(f"{field}: longer than {max_len} characters ({len(value)})")
    return value


def check_duration(field: str, value: float) -> float:
    if not math.isfinite(value) or value < 0 or value > HUNDRED_YEARS_S:
        raise InvalidArgument(
            f"{field}: invalid duration {value!r}: must be a finite number of seconds between 0 and 100 years"
        )
    return value


def check_map(field: str, values: Mapping[str, str], limits: SpecLimits) -> dict[str, str]:
    if len(values) > limits.max_tags:
        raise InvalidArgument(f"{field}: more than {limits.max_tags} entries ({len(values)})")
    out: dict[str, str] = {}
    for k, v in values.items():
        check_text(f"{field} key {k[:40]!r}", k, limits.max_tag_len)
        check_text(f"{field}[{k[:40]!r}]", v, limits.max_tag_len)
        if not k:
            raise InvalidArgument(f"{field}: keys must not be empty")
        out[k] = v
    return out


def priority_from_wire(field: str, value: int) -> Priority:
    if value == pb.PRIORITY_UNSPECIFIED:
        return Priority.NORMAL
    if pb.PRIORITY_CRITICAL <= value <= pb.PRIORITY_LOW:
        return Priority(value - 1)
    raise InvalidArgument(f"{field}: unknown priority value {value}")


def priority_to_wire(priority: Priority) -> int:
    return int(priority) + 1


def spec_from_wire(
    field: str,
    msg: pb.TaskSpec,
    *,
    default_pool: str,
    pools: Mapping[str, RetryPolicy],
    limits: SpecLimits,
    now: float,
) -> TaskSpec:
    """A validated engine spec from a wire TaskSpec; ``pools`` maps known pool names to their retry policy."""
    pool = msg.pool or default_pool
    check_text(f"{field}.pool", pool, 64)
    if pool not in pools:
        raise NotFound(f"{field}.pool: unknown pool '{pool}'")
    for name, what in (
        ("start_in_s", "fixed starts"),
        ("start_unix_ns", "fixed starts"),
        ("tolerance_s", "fixed-start tolerances"),
    ):
        if msg.HasField(name):
            raise Unimplemented(f"{field}.{name}: {what} are not supported by this server version")
    if msg.on_miss != pb.MISS_POLICY_UNSPECIFIED:
        raise Unimplemented(f"{field}.on_miss: fixed starts are not supported by this server version")
    if msg.deps:
        raise Unimplemented(f"{field}.deps: dependencies are not supported by this server version")
    if msg.resources:
        raise NotFound(f"{field}.resources: unknown resource '{next(iter(msg.resources))}'")
    if msg.HasField("deadline_in_s") and msg.HasField("deadline_unix_ns"):
        raise InvalidArgument(f"{field}: use either deadline_in_s or deadline_unix_ns, not both")
    deadline: float | None = None
    if msg.HasField("deadline_in_s"):
        deadline = now + check_duration(f"{field}.deadline_in_s", msg.deadline_in_s)
    elif msg.HasField("deadline_unix_ns"):
        deadline = msg.deadline_unix_ns / NS
    content_type = check_text(f"{field}.content_type", msg.content_type, MAX_CONTENT_TYPE)
    retry: RetryPolicy | None = None
    if msg.HasField("retry"):
        retry = retry_from_wire(f"{field}.retry", msg.retry, pools[pool])
    return TaskSpec(
        pool=pool,
        payload=msg.payload,
        content_type=content_type,
        kind=check_text(f"{field}.kind", msg.kind, limits.max_kind_len) or "default",
        priority=priority_from_wire(f"{field}.priority", msg.priority),
        key=check_text(f"{field}.key", msg.key, limits.max_key_len),
        deadline=deadline,
        duration_hint=(
            check_duration(f"{field}.duration_hint_s", msg.duration_hint_s)
            if msg.HasField("duration_hint_s")
            else None
        ),
        timeout=check_duration(f"{field}.timeout_s", msg.timeout_s) if msg.HasField("timeout_s") else None,
        retry=retry,
        tags=check_map(f"{field}.tags", msg.tags, limits),
        labels=check_map(f"{field}.labels", msg.labels, limits),
        tenant=check_text(f"{field}.tenant", msg.tenant, limits.max_key_len),
    )


def retry_from_wire(field: str, msg: pb.RetryPolicy, pool_default: RetryPolicy) -> RetryPolicy:
    """Zero means "the pool's value" for max_attempts, multiplier and max_backoff_s (clients send unset
    fields as 0); initial_backoff_s = 0 is a real value (retry at once)."""
    initial = check_duration(f"{field}.initial_backoff_s", msg.initial_backoff_s)
    max_backoff = check_duration(f"{field}.max_backoff_s", msg.max_backoff_s) or pool_default.max_backoff
    multiplier = msg.multiplier or pool_default.multiplier
    if not math.isfinite(multiplier) or multiplier < 1:
        raise InvalidArgument(f"{field}.multiplier: must be a finite number >= 1 (got {msg.multiplier!r})")
    return RetryPolicy(
        max_attempts=msg.max_attempts or pool_default.max_attempts,
        initial_backoff=initial,
        multiplier=multiplier,
        max_backoff=max_backoff,
        jitter=msg.jitter,
    )


def ns(seconds: float | None) -> int | None:
    return None if seconds is None else int(seconds * NS)


def task_info(task: Task, output_available: bool) -> pb.TaskInfo:
    spec = task.spec
    info = pb.TaskInfo(
        id=task.id,
        status=int(task.status),
        pool=spec.pool,
        key=spec.key,
        kind=spec.kind,
        attempt=task.attempt,
        max_attempts=task.max_attempts,
        created_unix_ns=ns(task.created),
        message=task.message,
        output_available=output_available,
        tenant=spec.tenant,
        priority=priority_to_wire(spec.priority),
    )
    if task.started is not None:
        info.started_unix_ns = ns(task.started)
    if task.finished is not None:
        info.finished_unix_ns = ns(task.finished)
    return info


def status_from_wire(field: str, value: int) -> Status:
    try:
        return Status(value)
    except ValueError:
        raise InvalidArgument(f"{field}: unknown task status value {value}") from None
