"""The engine's vocabulary: statuses, classes, task specs, tasks, leases, actions and errors.

These are plain data (``slots=True`` dataclasses, int enums) so that the engine stays free of I/O and
the server can turn them into protobuf messages without a lookup table. Times are Unix seconds as
floats, injected by the caller (the engine never reads a clock).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import TYPE_CHECKING, Any, TypeAlias, cast

from .readonly import NO_RESOURCES

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


class Rebuilt:
    """Base of the dataclasses that copies and pickles must rebuild through their constructor.

    The engine is compiled with mypyc (``setup.py``), which breaks the usual way for two kinds: a
    compiled frozen dataclass restores its state field by field through the frozen ``__setattr__``
    (``FrozenInstanceError``), and a compiled class with a hand-written ``__init__`` runs it from
    ``__new__`` (a missing argument), so ``copy.deepcopy`` and ``pickle`` of one, or of a task holding
    one, would raise. Every field of these classes is an ``__init__`` argument, in order, so the
    constructor rebuilds them exactly, compiled or not.
    """

    __slots__ = ()

    def __reduce__(self) -> tuple[type[Rebuilt], tuple[object, ...]]:
        instance = cast("DataclassInstance", self)
        return type(self), tuple(getattr(self, f.name) for f in fields(instance))


class Status(enum.IntEnum):
    """Task statuses; the numbers are the wire ``TaskStatus`` values."""

    BLOCKED = 1
    SCHEDULED = 2
    READY = 3
    RUNNING = 4
    RETRYING = 5
    SUCCEEDED = 6
    FAILED = 7
    DEAD_LETTERED = 8
    CANCELLED = 9
    SKIPPED = 10
    MISSED = 11
    SHED = 12

    @property
    def label(self) -> str:
        """Lower-case name used by the HTTP API, the CLI and metrics (``dead_lettered``)."""
        return self.name.lower()

    @property
    def terminal(self) -> bool:
        return self >= Status.SUCCEEDED


TERMINAL = frozenset(s for s in Status if s.terminal)
PENDING = frozenset({Status.BLOCKED, Status.SCHEDULED, Status.READY, Status.RETRYING})
WAITING = frozenset({Status.BLOCKED, Status.SCHEDULED})  # pending, not yet eligible to run


class Priority(enum.IntEnum):
    """The four priority classes; a lower value is more important. The public ``cronoq.Priority``
    (library mode) is this class; the wire enum is this value + 1."""

    CRITICAL = 0
    HIGH = 1
    NORMAL = 2
    LOW = 3

    def __repr__(self) -> str:
        return f"Priority.{self.name}"

    @property
    def label(self) -> str:
        return self.name.lower()


class Overflow(enum.Enum):
    """What a pool does when a submission would exceed ``max_pending``."""

    WAIT = "wait"
    REJECT = "reject"
    SHED_LOWEST = "shed_lowest"
    SHED_OLDEST = "shed_oldest"


class MissPolicy(enum.Enum):
    """What happens to a fixed-start task not dispatched by start + tolerance."""

    RUN_LATE = "run_late"  # stays READY and runs when a worker frees (a non-hit)
    SKIP = "skip"  # MISSED
    FAIL = "fail"  # FAILED ("fixed start missed")


class DepOn(enum.Enum):
    """The outcome of its target that meets a dependency edge."""

    SUCCESS = "success"  # succeeded
    FAILURE = "failure"  # failed or dead_lettered
    COMPLETE = "complete"  # any terminal status


class UnknownDependency(enum.Enum):
    """What a pool does with a dependency on a key no task has (yet)."""

    REJECT = "reject"  # AdmissionError('unknown_dependency')
    AWAIT = "await"  # stay BLOCKED until a task with that key arrives (or ``await_timeout``)


class Overlap(enum.Enum):
    """What a recurring schedule does when an occurrence starts while the previous one still runs."""

    SKIP = "skip"  # the new occurrence ends SKIPPED ("previous occurrence still running")
    ALLOW = "allow"  # both run
    QUEUE = "queue"  # the new one waits for the previous one to finish (a complete edge)
    QUEUE_ON_SUCCESS = "queue_on_success"  # ... to succeed (a success edge)


@dataclass(slots=True, frozen=True)
class DepEdge(Rebuilt):
    """A dependency edge: the task waits until ``target`` (a task id, or a key) ends as ``on`` says."""

    target: int | str
    on: DepOn = DepOn.SUCCESS


@dataclass(slots=True, frozen=True)
class Semaphore(Rebuilt):
    """A resource of which running attempts hold at most ``permits`` units at once."""

    name: str
    permits: int


@dataclass(slots=True, frozen=True)
class TokenBucket(Rebuilt):
    """A resource refilled at ``rate`` units per second up to ``burst``; each dispatch takes its amount."""

    name: str
    rate: float
    burst: float


ResourceConfig = Semaphore | TokenBucket


@dataclass(slots=True, frozen=True)
class AutoscaleRule(Rebuilt):
    """How a pool's desired capacity follows queue pressure (engine-behaviour §6); ``slo`` maps a class
    to the seconds within which its backlog should drain."""

    interval: float = 1.0
    target_utilization: float = 0.75
    drain_time: float = 30.0
    slo: Mapping[Priority, float] = field(default_factory=dict)
    reservation_horizon: float = 60.0
    stabilization_window: float = 60.0
    cooldown: float = 30.0
    max_step_up_abs: int = 4
    max_step_up_ratio: float = 1.0
    max_step_down: int = 1
    ewma_alpha: float = 0.3


@dataclass(slots=True, frozen=True)
class RetryRule(Rebuilt):
    """Attempts and backoff; delay after attempt k is min(max, initial * multiplier**(k-1))."""

    max_attempts: int = 3
    initial_backoff: float = 1.0
    multiplier: float = 2.0
    max_backoff: float = 60.0
    jitter: bool = True


@dataclass(slots=True)
class PoolConfig:
    """One pool as the engine sees it (the server builds it from ``[[pools]]``)."""

    name: str
    max: int = 10
    min: int = 1
    lease_ttl: float | None = None
    max_pending: int | None = None
    overflow: Overflow = Overflow.WAIT
    retry: RetryRule = field(default_factory=RetryRule)
    default_duration: float = 1.0
    max_slots_per_worker: int | None = None
    cost_per_worker_second: float = 0.0
    autoscale: AutoscaleRule | None = None  # None: desired = capacity
    unknown_dependency: UnknownDependency = UnknownDependency.REJECT
    await_timeout: float | None = None  # with AWAIT: skip after this long; None: wait for ever
    reservable_fraction: float = 0.5  # overlapping fixed-start reservations <= max(1, max x this)
    fair_share: bool = False
    tenant_weights: Mapping[str, float] = field(default_factory=dict)  # unnamed tenants weigh 1
    # The capacity a caller that sets it itself (library mode) starts the pool with: the autoscaler's
    # first target moves from there. None: ``min`` (the server, whose workers connect when they will).
    initial: int | None = None


@dataclass(slots=True)
class EngineLimits:
    """Engine-wide bounds (from ``[limits]``)."""

    max_pending_total: int = 1_000_000
    key_retention: float = 86_400.0
    key_retention_max: int = 100_000
    metrics_window: float = 60.0
    # How long, and how many, finished tasks stay known for lookups (None: as long as their keys). At
    # least the key bounds: a key never outlives its task's record.
    record_retention: float | None = None
    record_max: int | None = None


# The classes made once per task (TaskSpec, Task, Submitted, Dispatch) write their own __init__
# (init=False): compiled with mypyc (setup.py) a hand-written __init__ is native code, while the one the
# dataclass decorator generates stays interpreted bytecode that sets each field through a descriptor,
# about 7x as slow. Each takes the fields in order, with the same defaults; repr, eq and fields() are
# still the dataclass's.


@dataclass(slots=True, init=False)
class TaskSpec(Rebuilt):
    """A validated submission. Validation (field names in messages) happens before the engine."""

    pool: str
    payload: Any = b""
    content_type: str = ""
    kind: str = "default"
    priority: Priority = Priority.NORMAL
    key: str = ""
    deadline: float | None = None  # absolute, Unix seconds; soft
    duration_hint: float | None = None
    timeout: float | None = None  # per attempt, seconds
    retry: RetryRule | None = None  # None: the pool's policy
    tags: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    tenant: str = ""
    start: float | None = None  # fixed start, absolute Unix seconds
    tolerance: float = 1.0  # allowed lateness of the fixed start
    on_miss: MissPolicy = MissPolicy.RUN_LATE
    deps: tuple[DepEdge, ...] = ()
    resources: dict[str, int] = NO_RESOURCES  # resource name -> amount (> 0)

    def __init__(
        self,
        pool: str,
        payload: Any = b"",
        content_type: str = "",
        kind: str = "default",
        priority: Priority = Priority.NORMAL,
        key: str = "",
        deadline: float | None = None,
        duration_hint: float | None = None,
        timeout: float | None = None,
        retry: RetryRule | None = None,
        tags: dict[str, str] | None = None,  # None: a new empty dict
        labels: dict[str, str] | None = None,  # None: a new empty dict
        tenant: str = "",
        start: float | None = None,
        tolerance: float = 1.0,
        on_miss: MissPolicy = MissPolicy.RUN_LATE,
        deps: tuple[DepEdge, ...] = (),
        resources: dict[str, int] = NO_RESOURCES,
    ) -> None:
        self.pool = pool
        self.payload = payload
        self.content_type = content_type
        self.kind = kind
        self.priority = priority
        self.key = key
        self.deadline = deadline
        self.duration_hint = duration_hint
        self.timeout = timeout
        self.retry = retry
        self.tags = {} if tags is None else tags
        self.labels = {} if labels is None else labels
        self.tenant = tenant
        self.start = start
        self.tolerance = tolerance
        self.on_miss = on_miss
        self.deps = deps
        self.resources = resources


@dataclass(slots=True)
class RecurringSpec:
    """A cron schedule whose occurrences are fixed-start tasks built from ``template``.

    The template has no fixed start, no dependencies and no absolute deadline; ``deadline_in`` is
    relative to each occurrence's start, and ``template.key`` (if any) prefixes occurrence keys as
    ``{key}@{UTC start}``.
    """

    name: str
    cron: str
    template: TaskSpec
    tz: str = "UTC"
    overlap: Overlap = Overlap.SKIP
    deadline_in: float | None = None


@dataclass(slots=True)
class Recurring:
    """A schedule as the engine runs it: its next occurrence's start and the last task it created."""

    spec: RecurringSpec
    next_start: float | None = None
    last_task_id: int = 0


@dataclass(slots=True, init=False)  # __init__ below: see the note above TaskSpec
class Task(Rebuilt):
    """A task the engine knows, live or retained after it finished."""

    id: int
    spec: TaskSpec
    seq: int
    status: Status
    created: float
    attempt: int = 0
    max_attempts: int = 1
    ready_at: float | None = None
    started: float | None = None
    finished: float | None = None
    message: str = ""
    lease: int = 0  # current lease id while RUNNING, else 0
    worker: int = 0  # id of the worker holding that lease while RUNNING, else 0

    def __init__(
        self,
        id: int,
        spec: TaskSpec,
        seq: int,
        status: Status,
        created: float,
        attempt: int = 0,
        max_attempts: int = 1,
        ready_at: float | None = None,
        started: float | None = None,
        finished: float | None = None,
        message: str = "",
        lease: int = 0,
        worker: int = 0,
    ) -> None:
        self.id = id
        self.spec = spec
        self.seq = seq
        self.status = status
        self.created = created
        self.attempt = attempt
        self.max_attempts = max_attempts
        self.ready_at = ready_at
        self.started = started
        self.finished = finished
        self.message = message
        self.lease = lease
        self.worker = worker


@dataclass(slots=True, init=False)  # not frozen: one per submitted task, see the note on actions below
class Submitted(Rebuilt):
    """The answer to one submitted spec: its id, and whether the key named an existing task."""

    id: int
    duplicate: bool

    def __init__(self, id: int, duplicate: bool) -> None:  # see the note above TaskSpec
        self.id = id
        self.duplicate = duplicate


# ------------------------------------------------------------------------------------------- actions
# Actions are built on the hot path (a Dispatch per attempt, besides the status events), so they are not
# frozen: a frozen dataclass's __init__ goes through object.__setattr__ per field and costs about 8x as
# much. Treat them as read-only all the same.


@dataclass(slots=True, init=False)
class Dispatch(Rebuilt):
    """Send this lease to this worker."""

    worker_id: int
    lease: int
    task: Task
    attempt: int
    lease_ttl: float | None

    def __init__(  # see the note above TaskSpec
        self, worker_id: int, lease: int, task: Task, attempt: int, lease_ttl: float | None
    ) -> None:
        self.worker_id = worker_id
        self.lease = lease
        self.task = task
        self.attempt = attempt
        self.lease_ttl = lease_ttl


@dataclass(slots=True)
class Abort:
    """Tell this worker to stop this lease; its slot is already free."""

    worker_id: int
    lease: int
    reason: str


StatusChange: TypeAlias = tuple[Status, int, float, str, Task]
"""A status change, for Watch and for waiters: ``(status, attempt, at, message, task)``. ``task`` is
the task itself (its state may have moved on by the time the event is handled; its ``id`` and
``spec.pool``/``spec.key`` never change), which is how a durable runtime learns what to commit.

A plain tuple, not a dataclass, because every task emits four or more: in CPython 3.11 building a tuple
costs a quarter of calling a class, which was a tenth of the engine's time per task. Consumers tell it
from the other actions by ``type(action) is tuple`` and unpack it."""


@dataclass(slots=True)
class Scale:
    """A pool's autoscaler target changed (emitted only on change): library mode sets its capacity to
    it, the server exports it and calls the pool's webhook scaler."""

    pool: str
    desired: int


@dataclass(slots=True)
class ScheduleChanged:
    """A recurring schedule was added, advanced to its next occurrence, or removed (``recurring`` None):
    what a durable runtime must write."""

    name: str
    recurring: Recurring | None


Action = Dispatch | Abort | StatusChange | Scale | ScheduleChanged


# -------------------------------------------------------------------------------------------- errors


class AdmissionError(Exception):
    """A submission the engine refuses; ``code`` is one of the reference engine's codes.

    unknown_pool, unknown_resource, resource_exceeds_capacity, reservation_conflict, cycle,
    unknown_dependency, full (overflow=wait: retry when space frees), overloaded,
    duplicate_key_in_batch, invalid. ``index`` is the position in a batch when known; ``field`` the
    part of that spec the refusal is about, when it is one (``.deps[1].key``, ``.resources``);
    ``limit`` the configured bound that refused it (``max_pending`` of the pool, or
    ``max_pending_total``), so that callers count and explain it without reading the message.
    """

    def __init__(
        self, code: str, message: str, index: int | None = None, field: str = "", limit: str = ""
    ) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.index = index
        self.field = field
        self.limit = limit


class RecurringError(ValueError):
    """A schedule ``add_recurring`` refuses. The message names the field (``cron: ...``,
    ``template.resources: ...``); ``code`` is ``invalid``, ``unknown_pool`` or one of the resource codes
    of AdmissionError (``unknown_resource``, ``resource_exceeds_capacity``), for callers that map it to a
    status."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
