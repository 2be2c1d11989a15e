"""The scheduling engine: a deterministic, sans-IO state machine shared by the server and library mode.

Inputs (submit, cancel, worker capacity, attempt outcomes, heartbeats, ``tick(now)``) go in; actions
(dispatch a lease, abort a lease, status events) come out of ``take_actions()``. Nothing here does I/O
or reads a clock, so every rule is tested in microseconds with injected time.
"""

from .engine import Engine
from .model import (
    Abort,
    Action,
    AutoscaleConfig,
    Dep,
    DepOn,
    Dispatch,
    EngineLimits,
    MissPolicy,
    Overflow,
    Overlap,
    PoolConfig,
    Priority,
    Recurring,
    RecurringSpec,
    ResourceConfig,
    RetryPolicy,
    Scale,
    ScheduleChanged,
    Semaphore,
    Status,
    StatusEvent,
    SubmitError,
    Submitted,
    Task,
    TaskSpec,
    TokenBucket,
    UnknownDependency,
)
from .snapshot import GroupStats, PoolStats, Snapshot, Totals, WorkerView

__all__ = [
    "Abort",
    "Action",
    "AutoscaleConfig",
    "Dep",
    "DepOn",
    "Dispatch",
    "Engine",
    "EngineLimits",
    "GroupStats",
    "MissPolicy",
    "Overflow",
    "Overlap",
    "PoolConfig",
    "PoolStats",
    "Priority",
    "Recurring",
    "RecurringSpec",
    "ResourceConfig",
    "RetryPolicy",
    "Scale",
    "ScheduleChanged",
    "Semaphore",
    "Snapshot",
    "Status",
    "StatusEvent",
    "SubmitError",
    "Submitted",
    "Task",
    "TaskSpec",
    "TokenBucket",
    "Totals",
    "UnknownDependency",
    "WorkerView",
]
