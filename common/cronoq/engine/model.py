"""The engine's vocabulary: statuses, classes, task specs, tasks, leases, actions and errors.

These are plain data (``slots=True`` dataclasses, int enums) so that the engine stays free of I/O and
the server can turn them into protobuf messages without a lookup table. Times are Unix seconds as
floats, injected by the caller (the engine never reads a clock).
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, TypeAlias


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


class Priority(enum.IntEnum):
    """Priority classes; engine values are 0..3, the wire enum is this value + 1."""

    CRITICAL = 0
    HIGH = 1
    NORMAL = 2
    LOW = 3

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

    REJECT = "reject"  # SubmitError('unknown_dependency')
    AWAIT = "await"  # stay BLOCKED until a task with that key arrives (or ``await_timeout``)


class Overlap(enum.Enum):
    """What a recurring schedule does when an occurrence starts while the previous one still runs."""

    SKIP = "skip"  # the new occurrence ends SKIPPED ("previous occurrence still running")
    ALLOW = "allow"  # both run
    QUEUE = "queue"  # the new one waits for the previous one to finish (a complete edge)
    QUEUE_ON_SUCCESS = "queue_on_success"  # ... to succeed (a success edge)


@dataclass(slots=True, frozen=True)
class Dep:
    """A dependency edge: the task waits until ``target`` (a task id, or a key) ends as ``on`` says."""

    target: int | str
    on: DepOn = DepOn.SUCCESS


@dataclass(slots=True, frozen=True)
class Semaphore:
    """A resource of which running attempts hold at most ``permits`` units at once."""

    name: str
    permits: int


@dataclass(slots=True, frozen=True)
class TokenBucket:
    """A resource refilled at ``rate`` units per second up to ``burst``; each dispatch takes its amount."""

    name: str
    rate: float
    burst: float


ResourceConfig = Semaphore | TokenBucket


@dataclass(slots=True, frozen=True)
class AutoscaleConfig:
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
class RetryPolicy:
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
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    default_duration: float = 1.0
    max_slots_per_worker: int | None = None
    cost_per_worker_second: float = 0.0
    autoscale: AutoscaleConfig | None = None  # None: desired = capacity
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


class _NoResources(dict[str, int]):
    """The one empty, read-only ``resources`` every spec without resources shares.

    Almost no task names resources; a fresh empty dict per task would be one more object per task
    that the dispatch path touches (to see that it is empty), which measurably slows the engine. A dict
    subclass keeps the truth test and lookups at C speed; hashable so a dataclass accepts it as a
    default; every mutator refuses.
    """

    __slots__ = ()
    __hash__ = object.__hash__  # type: ignore[assignment]

    def _refuse(self, *args: object, **kwargs: object) -> None:
        raise TypeError("the shared empty resources of a TaskSpec cannot be changed; assign a new dict")

    __setitem__ = __delitem__ = update = setdefault = pop = popitem = clear = __ior__ = _refuse  # type: ignore[assignment]


NO_RESOURCES: dict[str, int] = _NoResources()


@dataclass(slots=True)
class TaskSpec:
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
    retry: RetryPolicy | None = None  # None: the pool's policy
    tags: dict[str, str] = field(default_factory=dict)
    labels: dict[str, str] = field(default_factory=dict)
    tenant: str = ""
    start: float | None = None  # fixed start, absolute Unix seconds
    tolerance: float = 1.0  # allowed lateness of the fixed start
    on_miss: MissPolicy = MissPolicy.RUN_LATE
    deps: tuple[Dep, ...] = ()
    resources: dict[str, int] = NO_RESOURCES  # resource name -> amount (> 0)


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


@dataclass(slots=True)
class Task:
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


@dataclass(slots=True)  # not frozen: one per submitted task, see the note on actions below
class Submitted:
    """The answer to one submitted spec: its id, and whether the key named an existing task."""

    id: int
    duplicate: bool


# ------------------------------------------------------------------------------------------- actions
# Actions are built on the hot path (a Dispatch per attempt, besides the status events), so they are not
# frozen: a frozen dataclass's __init__ goes through object.__setattr__ per field and costs about 8x as
# much. Treat them as read-only all the same.


@dataclass(slots=True)
class Dispatch:
    """Send this lease to this worker."""

    worker_id: int
    lease: int
    task: Task
    attempt: int
    lease_ttl: float | None


@dataclass(slots=True)
class Abort:
    """Tell this worker to stop this lease; its slot is already free."""

    worker_id: int
    lease: int
    reason: str


StatusEvent: TypeAlias = tuple[Status, int, float, str, Task]
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


Action = Dispatch | Abort | StatusEvent | Scale | ScheduleChanged


# -------------------------------------------------------------------------------------------- errors


class SubmitError(Exception):
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
    of SubmitError (``unknown_resource``, ``resource_exceeds_capacity``), for callers that map it to a
    status."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code
