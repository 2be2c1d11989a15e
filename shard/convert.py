"""Validation and conversion between wire messages and engine objects.

Every check names the field it refused (``task.kind: ...``, ``tasks[3].timeout_s: ...``) so a producer
can fix its request without reading server logs. Nothing here touches engine state: a request is
converted completely before the engine sees any of it, which is what keeps bad input from changing
anything.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Literal, TypeVar, overload

from cronoq.checks import MAX_POOL_LEN, check_key, check_text
from cronoq.config.model import MAX_KEY_BYTES
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
from cronoq.engine.readonly import NO_RESOURCES
from cronoq.errors import InvalidArgument, NotFound
from cronoq.limit_hits import exceeded
from cronoq.tracecontext import TraceContext, with_context
from cronoq.v1 import cronoq_pb2 as pb

HUNDRED_YEARS_S = 100 * 365 * 86_400.0
MAX_CONTENT_TYPE = 128
MAX_RESOURCE_NAME = 64  # resource names follow the pool-name rule of the configuration
NS = 1_000_000_000
# A lease on the wire beyond its payload and strings: ids, numbers, field tags and lengths (generous).
LEASE_OVERHEAD = 128
LEASE_FIELD_OVERHEAD = 6  # tag and length prefix of one string field
LEASE_TAG_OVERHEAD = 18  # one map entry: its own tag and length, its key's and its value's
K = TypeVar("K", bound=int)
V = TypeVar("V")

_ON_MISS = {
    pb.MISS_POLICY_UNSPECIFIED: MissPolicy.RUN_LATE,
    pb.MISS_POLICY_RUN_LATE: MissPolicy.RUN_LATE,
    pb.MISS_POLICY_SKIP: MissPolicy.SKIP,
    pb.MISS_POLICY_FAIL: MissPolicy.FAIL,
}
_DEP_ON = {
    pb.EDGE_COND_UNSPECIFIED: DepOn.SUCCESS,
    pb.EDGE_COND_ON_SUCCESS: DepOn.SUCCESS,
    pb.EDGE_COND_ON_COMPLETE: DepOn.COMPLETE,
    pb.EDGE_COND_ON_FAILURE: DepOn.FAILURE,
}
_OVERLAP = {
    pb.OVERLAP_UNSPECIFIED: Overlap.SKIP,
    pb.OVERLAP_SKIP: Overlap.SKIP,
    pb.OVERLAP_ALLOW: Overlap.ALLOW,
    pb.OVERLAP_QUEUE: Overlap.QUEUE,
    pb.OVERLAP_QUEUE_ON_SUCCESS: Overlap.QUEUE_ON_SUCCESS,
}
_OVERLAP_WIRE = {
    Overlap.SKIP: pb.OVERLAP_SKIP,
    Overlap.ALLOW: pb.OVERLAP_ALLOW,
    Overlap.QUEUE: pb.OVERLAP_QUEUE,
    Overlap.QUEUE_ON_SUCCESS: pb.OVERLAP_QUEUE_ON_SUCCESS,
}


@dataclass(slots=True, frozen=True)
class SpecLimits:
    """The subset of ``[limits]`` that bounds one task spec (and a recurring schedule's name)."""

    max_key_len: int
    max_kind_len: int
    max_tags: int
    max_tag_len: int
    max_deps: int = 100
    max_resources: int = 8
    max_message_bytes: int = 4 * 1024 * 1024


def check_duration(field: str, value: float) -> float:
    if not math.isfinite(value) or value < 0 or value > HUNDRED_YEARS_S:
        raise InvalidArgument(
            f"{field}: invalid duration {value!r}: must be a finite number of seconds between 0 and 100 years"
        )
    return value


def check_map(field: str, values: Mapping[str, str], limits: SpecLimits) -> dict[str, str]:
    if len(values) > limits.max_tags:
        raise exceeded(
            "max_tags",
            InvalidArgument(
                f"{field}: more than limits.max_tags ({limits.max_tags}) entries ({len(values)})"
            ),
        )
    out: dict[str, str] = {}
    for k, v in values.items():
        check_text(f"{field} key {k[:40]!r}", k, limits.max_tag_len, "max_tag_len")
        check_text(f"{field}[{k[:40]!r}]", v, limits.max_tag_len, "max_tag_len")
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


# Indexed by the engine's Priority (0..3): the wire enum is that value + 1.
_PRIORITY_WIRE = (pb.PRIORITY_CRITICAL, pb.PRIORITY_HIGH, pb.PRIORITY_NORMAL, pb.PRIORITY_LOW)


def priority_to_wire(priority: Priority) -> pb.Priority.ValueType:
    return _PRIORITY_WIRE[priority]


def status_to_wire(status: Status) -> pb.TaskStatus.ValueType:
    """The wire value of an engine status: the same number (see :class:`Status`), typed as the wire's."""
    return pb.TaskStatus.ValueType(status)


def _enum(field: str, value: K, table: Mapping[K, V], what: str) -> V:
    try:
        return table[value]
    except KeyError:
        raise InvalidArgument(f"{field}: unknown {what} value {value}") from None


def spec_from_wire(
    field: str,
    msg: pb.TaskSpec,
    *,
    default_pool: str,
    pools: Mapping[str, RetryRule],
    limits: SpecLimits,
    now: float,
    template: bool = False,
) -> TaskSpec:
    """A validated engine spec from a wire TaskSpec; ``pools`` maps known pool names to their retry policy.

    With ``template`` the spec is a recurring schedule's template: its cron sets each occurrence's
    start, so a fixed start, dependencies and an absolute deadline are refused, and ``deadline_in_s``
    is left for the caller (it is relative to each occurrence, see :func:`recurring_from_wire`).

    Every submitted task passes here, so the valid path is kept cheap: field names are formatted only
    for an error, each optional field is tested once, empty repeated fields are not converted, and the
    spec is built positionally (keyword arguments cost more than the rest of a plain task's checks).
    """
    pool = msg.pool or default_pool
    if pool not in pools:  # configured names are valid (config rules), so only an unknown one is checked
        check_text(f"{field}.pool", pool, MAX_POOL_LEN)
        raise NotFound(f"{field}.pool: unknown pool '{pool}'")
    if template:
        _refuse_in_template(field, msg)
    has = msg.HasField
    deadline_in = has("deadline_in_s")
    deadline_ns = has("deadline_unix_ns")
    if deadline_in and deadline_ns:
        raise InvalidArgument(f"{field}: use either deadline_in_s or deadline_unix_ns, not both")
    deadline: float | None = None
    if deadline_in:
        in_s = _duration(field, "deadline_in_s", msg.deadline_in_s)
        deadline = None if template else now + in_s
    elif deadline_ns:
        deadline = msg.deadline_unix_ns / NS
    start = _start(field, msg, now) if has("start_in_s") or has("start_unix_ns") else None
    fixed = start is not None or template
    tolerance = 1.0
    if has("tolerance_s"):
        if not fixed:
            raise InvalidArgument(
                f"{field}.tolerance_s: only meaningful with a fixed start (start_in_s or start_unix_ns)"
            )
        tolerance = _duration(field, "tolerance_s", msg.tolerance_s)
    on_miss = MissPolicy.RUN_LATE
    if msg.on_miss != pb.MISS_POLICY_UNSPECIFIED:
        on_miss = _enum(f"{field}.on_miss", msg.on_miss, _ON_MISS, "on_miss")
        if not fixed:
            raise InvalidArgument(
                f"{field}.on_miss: only meaningful with a fixed start (start_in_s or start_unix_ns)"
            )
    # Checked in the order of the fields, so that of several bad fields the first is named.
    content_type = _text(field, "content_type", msg.content_type, MAX_CONTENT_TYPE, None)
    retry = retry_from_wire(f"{field}.retry", msg.retry, pools[pool]) if has("retry") else None
    kind = _text(field, "kind", msg.kind, limits.max_kind_len, "max_kind_len") or "default"
    priority = priority_from_wire(f"{field}.priority", msg.priority) if msg.priority else Priority.NORMAL
    key = _key(field, msg.key, limits.max_key_len)
    payload = msg.payload
    tags = msg.tags
    labels = msg.labels
    deps = msg.deps
    resources = msg.resources
    # Positional, in TaskSpec's field order: pool, payload, content_type, kind, priority, key, deadline,
    # duration_hint, timeout, retry, tags, labels, tenant, start, tolerance, on_miss, deps, resources.
    spec = TaskSpec(
        pool,
        payload,
        content_type,
        kind,
        priority,
        key,
        deadline,
        _duration(field, "duration_hint_s", msg.duration_hint_s) if has("duration_hint_s") else None,
        _duration(field, "timeout_s", msg.timeout_s) if has("timeout_s") else None,
        retry,
        check_map(f"{field}.tags", tags, limits) if tags else {},
        check_map(f"{field}.labels", labels, limits) if labels else {},
        _text(field, "tenant", msg.tenant, limits.max_key_len, "max_key_len"),
        start,
        tolerance,
        on_miss,
        deps_from_wire(f"{field}.deps", deps, limits) if deps else (),
        resources_from_wire(f"{field}.resources", resources, limits) if resources else NO_RESOURCES,
    )
    if spec.tags or lease_size_bound(spec) > limits.max_message_bytes:
        check_lease_size(field, spec, limits)
    return spec


def check_lease_size(field: str, spec: TaskSpec, limits: SpecLimits) -> None:
    """Refuse a task whose lease could never be sent to a worker (see :func:`lease_size`)."""
    size = lease_size(spec)
    if size > limits.max_message_bytes:
        raise exceeded(
            "max_message_bytes",
            InvalidArgument(
                f"{field}.payload: {len(spec.payload)} bytes; the lease sent to a worker would take {size} "
                f"bytes, more than limits.max_message_bytes ({limits.max_message_bytes})"
            ),
        )


def carry_trace(field: str, spec: TaskSpec, context: TraceContext, limits: SpecLimits) -> None:
    """Keep the caller's trace context with the task, as its ``traceparent``/``tracestate`` tags (unless
    it set a ``traceparent`` tag itself). Those tags are the server's: not counted against
    ``max_tags``/``max_tag_len`` (the context is bounded, :data:`~cronoq.tracecontext.MAX_TRACESTATE`),
    but the lease that carries them must still fit ``max_message_bytes``."""
    tags = with_context(spec.tags, context)
    if tags is not spec.tags:
        spec.tags = tags
        check_lease_size(field, spec, limits)


def _text(field: str, name: str, value: str, max_len: int, limit: str | None) -> str:
    """:func:`check_text` of ``{field}.{name}``, with the name formatted only when the value is bad."""
    if len(value) <= max_len and "\x00" not in value:
        return value
    return check_text(f"{field}.{name}", value, max_len, limit)


def _key(field: str, value: str, max_len: int) -> str:
    """:func:`check_key` of ``{field}.key``, with the name formatted only when the value may be bad."""
    if len(value) <= max_len and len(value) * 4 <= MAX_KEY_BYTES and "\x00" not in value:
        return value
    return check_key(f"{field}.key", value, max_len)


def _duration(field: str, name: str, value: float) -> float:
    """:func:`check_duration` of ``{field}.{name}``, with the name formatted only when the value is bad."""
    if 0 <= value <= HUNDRED_YEARS_S:  # false for NaN; infinities are out of range
        return value
    return check_duration(f"{field}.{name}", value)


def lease_size_bound(spec: TaskSpec) -> int:
    """An upper bound of :func:`lease_size` for a spec without tags, without encoding its strings (a
    character takes at most 4 bytes in UTF-8): when it fits, the exact size does."""
    chars = len(spec.content_type) + len(spec.kind) + len(spec.key) + len(spec.pool)
    return LEASE_OVERHEAD + len(spec.payload) + 5 * LEASE_FIELD_OVERHEAD + 4 * chars


def lease_size(spec: TaskSpec) -> int:
    """At most how many bytes a lease of this task takes on the wire (a ServerMessage): its payload,
    content type, kind, key, pool and tags with their framing, plus numbers. A task whose lease would
    exceed ``limits.max_message_bytes`` could never be sent to a worker, so it is refused at submission
    (over HTTP, where bodies may be larger than gRPC messages, or with many tags)."""
    strings = (spec.content_type, spec.kind, spec.key, spec.pool)
    return (
        LEASE_OVERHEAD
        + len(spec.payload)
        + LEASE_FIELD_OVERHEAD
        + sum(len(s.encode()) + LEASE_FIELD_OVERHEAD for s in strings)
        + sum(len(k.encode()) + len(v.encode()) + LEASE_TAG_OVERHEAD for k, v in spec.tags.items())
    )


# The TaskSpec fields a recurring template refuses, and why.
_NOT_IN_TEMPLATE: tuple[tuple[Literal["start_in_s", "start_unix_ns", "deadline_unix_ns"], str], ...] = (
    ("start_in_s", "a recurring template cannot have a fixed start (the cron sets it)"),
    ("start_unix_ns", "a recurring template cannot have a fixed start (the cron sets it)"),
    (
        "deadline_unix_ns",
        "a recurring template cannot have an absolute deadline; use deadline_in_s "
        "(relative to each occurrence's start)",
    ),
)


def _refuse_in_template(field: str, msg: pb.TaskSpec) -> None:
    for name, why in _NOT_IN_TEMPLATE:
        if msg.HasField(name):
            raise InvalidArgument(f"{field}.{name}: {why}")
    if msg.deps:
        raise InvalidArgument(
            f"{field}.deps: a recurring template cannot have dependencies "
            "(use overlap = queue to chain occurrences)"
        )


def _start(field: str, msg: pb.TaskSpec, now: float) -> float | None:
    """The fixed start in absolute Unix seconds, from ``start_in_s`` or ``start_unix_ns`` (not both)."""
    if msg.HasField("start_in_s") and msg.HasField("start_unix_ns"):
        raise InvalidArgument(f"{field}: use either start_in_s or start_unix_ns, not both")
    if msg.HasField("start_in_s"):
        return now + check_duration(f"{field}.start_in_s", msg.start_in_s)
    if msg.HasField("start_unix_ns"):
        start: float = msg.start_unix_ns / NS
        if msg.start_unix_ns < 0 or start > now + HUNDRED_YEARS_S:
            raise InvalidArgument(
                f"{field}.start_unix_ns: {msg.start_unix_ns} is not a usable start: "
                "it must lie between 1970 and 100 years from now"
            )
        return start
    return None


def deps_from_wire(field: str, deps: Sequence[pb.Dep], limits: SpecLimits) -> tuple[DepEdge, ...]:
    """Dependency edges, each naming its target by id or key (``deps[0].key``, as in the HTTP API)."""
    if len(deps) > limits.max_deps:
        raise exceeded(
            "max_deps",
            InvalidArgument(
                f"{field}: more than limits.max_deps ({limits.max_deps}) dependencies ({len(deps)})"
            ),
        )
    out: list[DepEdge] = []
    for i, dep in enumerate(deps):
        where = f"{field}[{i}]"
        which = dep.target.WhichOneof("target")
        on = _enum(f"{where}.cond", dep.cond, _DEP_ON, "dependency condition")
        if which == "id":
            if dep.target.id == 0:
                raise InvalidArgument(f"{where}.id: task ids start at 1")
            out.append(DepEdge(dep.target.id, on))
        elif which == "key":
            if not dep.target.key:
                raise InvalidArgument(f"{where}.key: must not be empty")
            out.append(DepEdge(check_key(f"{where}.key", dep.target.key, limits.max_key_len), on))
        else:
            raise InvalidArgument(f"{where}: name the task it waits for by id or key")
    return tuple(out)


def resources_from_wire(field: str, resources: Mapping[str, int], limits: SpecLimits) -> dict[str, int]:
    """Resource name -> amount; whether the resource exists is the engine's to say (NOT_FOUND)."""
    if len(resources) > limits.max_resources:
        raise exceeded(
            "max_resources",
            InvalidArgument(
                f"{field}: more than limits.max_resources ({limits.max_resources}) entries ({len(resources)})"
            ),
        )
    out: dict[str, int] = {}
    for name, amount in resources.items():
        if not name:
            raise InvalidArgument(f"{field}: resource names must not be empty")
        check_text(f"{field} key {name[:40]!r}", name, MAX_RESOURCE_NAME)
        if amount <= 0:
            raise InvalidArgument(f"{field}[{name!r}]: amount must be > 0")
        out[name] = amount
    return out


def retry_from_wire(field: str, msg: pb.RetryPolicy, pool_default: RetryRule) -> RetryRule:
    """Zero means "the pool's value" for max_attempts, initial_backoff_s, multiplier and max_backoff_s:
    the fields have no presence and clients send unset ones as 0, and a policy that names only
    max_attempts must not turn into retries at once that hammer what just failed. (Retries at once are
    the pool's ``retry`` to configure.)"""
    initial = (
        check_duration(f"{field}.initial_backoff_s", msg.initial_backoff_s) or pool_default.initial_backoff
    )
    max_backoff = check_duration(f"{field}.max_backoff_s", msg.max_backoff_s) or pool_default.max_backoff
    multiplier = msg.multiplier or pool_default.multiplier
    if not math.isfinite(multiplier) or multiplier < 1:
        raise InvalidArgument(f"{field}.multiplier: must be a finite number >= 1 (got {msg.multiplier!r})")
    return RetryRule(
        max_attempts=msg.max_attempts or pool_default.max_attempts,
        initial_backoff=initial,
        multiplier=multiplier,
        max_backoff=max_backoff,
        jitter=msg.jitter,
    )


@overload
def ns(seconds: float) -> int: ...
@overload
def ns(seconds: float | None) -> int | None: ...
def ns(seconds: float | None) -> int | None:
    return None if seconds is None else int(seconds * NS)


def task_info(task: Task, output_available: bool) -> pb.TaskInfo:
    spec = task.spec
    info = pb.TaskInfo(
        id=task.id,
        status=status_to_wire(task.status),
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


def recurring_from_wire(
    msg: pb.RecurringRequest,
    *,
    default_pool: str,
    pools: Mapping[str, RetryRule],
    limits: SpecLimits,
    now: float,
) -> RecurringSpec:
    """A validated schedule from an AddRecurring request; the engine still checks ``cron`` and ``tz``
    (its ValueErrors name them)."""
    if not msg.name:
        raise InvalidArgument("name: required: schedules are added, replaced and removed by name")
    check_key("name", msg.name, limits.max_key_len)
    if not msg.cron.strip():
        raise InvalidArgument("cron: required: 5 fields, or 6 with a leading seconds field")
    tz = check_text("tz", msg.tz, 128) or "UTC"
    overlap = _enum("overlap", msg.overlap, _OVERLAP, "overlap")
    template = spec_from_wire(
        "template",
        msg.template,
        default_pool=default_pool,
        pools=pools,
        limits=limits,
        now=now,
        template=True,
    )
    deadline_in = msg.template.deadline_in_s if msg.template.HasField("deadline_in_s") else None
    return RecurringSpec(
        name=msg.name, cron=msg.cron, template=template, tz=tz, overlap=overlap, deadline_in=deadline_in
    )


def recurring_info(recurring: Recurring) -> pb.RecurringInfo:
    spec = recurring.spec
    info = pb.RecurringInfo(
        name=spec.name,
        cron=spec.cron,
        tz=spec.tz,
        pool=spec.template.pool,
        kind=spec.template.kind,
        overlap=_OVERLAP_WIRE[spec.overlap],
    )
    if recurring.next_start is not None:
        info.next_unix_ns = round(recurring.next_start * NS)
    if recurring.last_task_id:
        info.last_task_id = recurring.last_task_id
    return info
