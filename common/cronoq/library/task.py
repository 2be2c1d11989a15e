"""Task options: their keyword arguments, their checks, and ``Task`` for ``submit_batch``.

Options are checked once, into a :class:`TaskTemplate`, and each submission turns the template into an
engine ``TaskSpec`` at the time it is submitted (relative deadlines and starts count from then, and the
scheduler's default pool fills in a missing pool). A submission without options skips all of this: see
``Scheduler.enqueue``.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, TypedDict, Unpack

from cronoq.engine import DepEdge, DepOn, MissPolicy, Priority, RetryRule, TaskSpec

from . import validate
from .errors import SubmitError
from .options import Dep, RetryPolicy, parse_priority, parse_retry, task_ref


class TaskOptions(TypedDict, total=False):
    """Keyword options of ``submit``, ``enqueue`` and ``Task``; ``None`` (or leaving one out) means the
    default. Times are seconds; ``*_at`` take a datetime (naive means local time) or Unix seconds."""

    priority: Priority | int | str | None
    pool: str | None
    kind: str | None
    key: str | None
    deadline_in: float | None
    deadline_at: datetime | float | None
    start_in: float | None
    start_at: datetime | float | None
    tolerance: float | None
    on_miss: str | None
    duration_hint: float | None
    timeout: float | None
    retry: RetryPolicy | None
    after: int | str | Iterable[int | str] | None
    deps: Iterable[Dep] | None
    resources: Mapping[str, int] | None
    tags: Mapping[str, object] | None
    labels: Mapping[str, object] | None
    tenant: str | None


class RecurringOptions(TypedDict, total=False):
    """Keyword options of ``add_recurring`` besides ``tz`` and ``overlap``: those of a task except the
    ones a schedule sets per occurrence (absolute deadline, start) or cannot have (dependencies)."""

    tolerance: float | None
    on_miss: str | None
    priority: Priority | int | str | None
    pool: str | None
    kind: str | None
    key: str | None
    deadline_in: float | None
    duration_hint: float | None
    timeout: float | None
    retry: RetryPolicy | None
    resources: Mapping[str, int] | None
    tags: Mapping[str, object] | None
    labels: Mapping[str, object] | None
    tenant: str | None


TASK_OPTIONS = frozenset(TaskOptions.__optional_keys__)
RECURRING_OPTIONS = frozenset(RecurringOptions.__optional_keys__)


@dataclass(slots=True)
class TaskTemplate:
    """Checked task options, not yet tied to a submission time."""

    pool: str | None = None  # None: the scheduler's default pool
    kind: str = "default"
    priority: Priority = Priority.NORMAL
    key: str = ""
    deadline_in: float | None = None
    deadline_at: float | None = None
    start_in: float | None = None
    start_at: float | None = None
    tolerance: float = 1.0
    on_miss: MissPolicy = MissPolicy.RUN_LATE
    duration_hint: float | None = None
    timeout: float | None = None
    retry: RetryRule | None = None
    deps: tuple[DepEdge, ...] = ()
    resources: dict[str, int] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    tenant: str = ""

    def base(self, payload: Any, default_pool: str) -> TaskSpec:
        """The spec without a deadline or start: a recurring schedule's template."""
        return TaskSpec(
            pool=self.pool or default_pool,
            payload=payload,
            kind=self.kind,
            priority=self.priority,
            key=self.key,
            duration_hint=self.duration_hint,
            timeout=self.timeout,
            retry=self.retry,
            tags=self.tags,
            labels=self.labels,
            tenant=self.tenant,
            tolerance=self.tolerance,
            on_miss=self.on_miss,
            deps=self.deps,
            resources=self.resources,
        )

    def spec(self, payload: Any, default_pool: str, now: float) -> TaskSpec:
        """The spec of a submission at ``now``."""
        spec = self.base(payload, default_pool)
        spec.deadline = self.deadline_at if self.deadline_in is None else now + self.deadline_in
        spec.start = self.start_at if self.start_in is None else now + self.start_in
        return spec


def parse(options: Mapping[str, object], allowed: frozenset[str] = TASK_OPTIONS) -> TaskTemplate:
    """Check keyword options (values of None mean "the default") into a template."""
    unknown = options.keys() - allowed
    if unknown:
        raise TypeError(f"unexpected keyword argument(s): {', '.join(sorted(unknown))}")
    get = options.get
    t = TaskTemplate()
    if (value := get("priority")) is not None:
        t.priority = parse_priority(value)
    if (value := get("pool")) is not None:
        t.pool = validate.name("pool", value)
    if (value := get("kind")) is not None:
        t.kind = validate.text("kind", value) or "default"
    if (value := get("key")) is not None:
        t.key = validate.text("key", value)
    for relative, absolute in (("deadline_in", "deadline_at"), ("start_in", "start_at")):
        if get(relative) is not None and get(absolute) is not None:
            raise ValueError(f"use either {relative} or {absolute}")
    if (value := get("deadline_in")) is not None:
        t.deadline_in = validate.seconds("deadline_in", value)
    if (value := get("deadline_at")) is not None:
        t.deadline_at = validate.unix_time("deadline_at", value)
    if (value := get("start_in")) is not None:
        t.start_in = validate.seconds("start_in", value)
    if (value := get("start_at")) is not None:
        t.start_at = validate.unix_time("start_at", value)
    if (value := get("tolerance")) is not None:
        t.tolerance = validate.seconds("tolerance", value)
    if (value := get("on_miss")) is not None:
        t.on_miss = validate.choice("on_miss", value, MissPolicy)
    if (value := get("duration_hint")) is not None:
        t.duration_hint = validate.seconds("duration_hint", value)
    if (value := get("timeout")) is not None:
        t.timeout = validate.seconds("timeout", value)
    if (value := get("retry")) is not None:
        t.retry = parse_retry(value)
    t.deps = _deps(get("after"), get("deps"))
    if (value := get("resources")) is not None:
        t.resources = _resources(value)
    if (value := get("tags")) is not None:
        t.tags = validate.strings("tags", value)
    if (value := get("labels")) is not None:
        t.labels = validate.strings("labels", value)
    if (value := get("tenant")) is not None:
        t.tenant = validate.text("tenant", value)
    return t


def _deps(after: object, deps: object) -> tuple[DepEdge, ...]:
    """``after`` (an id, a key, or several: success edges) followed by the ``deps`` edges."""
    edges: list[DepEdge] = []
    if after is not None:
        refs = [after] if isinstance(after, int | str) else _iterable("after", after)
        edges.extend(DepEdge(task_ref("after", ref), DepOn.SUCCESS) for ref in refs)
    if deps is not None:
        for dep in _iterable("deps", deps):
            if not isinstance(dep, Dep):
                raise TypeError(f"deps must hold Dep objects (got {type(dep).__name__})")
            edges.append(dep.to_engine())
    return tuple(edges)


def _iterable(field: str, value: object) -> list[object]:
    if not isinstance(value, Iterable) or isinstance(value, str | bytes | Mapping):
        raise TypeError(f"{field} must be a list or another iterable (got {type(value).__name__})")
    return list(value)


def _resources(value: object) -> dict[str, int]:
    if not isinstance(value, Mapping):
        raise TypeError(f"resources must be a mapping of name to amount (got {type(value).__name__})")
    out: dict[str, int] = {}
    for name, amount in value.items():
        checked = validate.name("resources key", name)
        if isinstance(amount, bool) or not isinstance(amount, int):
            raise TypeError(f"resources[{checked!r}] must be an int (got {type(amount).__name__})")
        if amount <= 0:
            raise SubmitError("invalid", "invalid task: resource amount must be > 0")
        out[checked] = amount
    return out


class Task:
    """One task of a ``submit_batch``: a payload and the same options as ``submit``, checked here."""

    __slots__ = ("payload", "template")

    def __init__(self, payload: Any = None, **options: Unpack[TaskOptions]) -> None:
        self.payload = payload
        self.template = parse(options)

    @property
    def key(self) -> str | None:
        return self.template.key or None

    def __repr__(self) -> str:
        return f"Task(payload={self.payload!r}, key={self.key!r})"
