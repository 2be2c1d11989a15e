"""The scheduling engine: a deterministic, sans-IO state machine shared by the server and library mode.

Inputs (submit, cancel, worker capacity, attempt outcomes, heartbeats, ``tick(now)``) go in; actions
(dispatch a lease, abort a lease, status events) come out of ``take_actions()``. Nothing here does I/O
or reads a clock, so every rule is tested in microseconds with injected time.
"""

from .engine import Engine
from .model import (
    Abort,
    Action,
    Dispatch,
    EngineLimits,
    Overflow,
    PoolConfig,
    Priority,
    RetryPolicy,
    Status,
    StatusEvent,
    SubmitError,
    Submitted,
    Task,
    TaskSpec,
)
from .snapshot import GroupStats, PoolStats, Snapshot, Totals, WorkerView

__all__ = [
    "Abort",
    "Action",
    "Dispatch",
    "Engine",
    "EngineLimits",
    "GroupStats",
    "Overflow",
    "PoolConfig",
    "PoolStats",
    "Priority",
    "RetryPolicy",
    "Snapshot",
    "Status",
    "StatusEvent",
    "SubmitError",
    "Submitted",
    "Task",
    "TaskSpec",
    "Totals",
    "WorkerView",
]
