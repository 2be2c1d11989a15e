"""Library mode: ``cronoq.Scheduler`` runs tasks in this process, on the asyncio loop that starts it.

The scheduling rules are the engine's (:mod:`cronoq.engine`), the same ones the server applies to remote
workers; here each pool's capacity is in-process and its executor is called for every attempt.
"""

from cronoq.engine import Priority  # the public cronoq.Priority is the engine's own class
from cronoq.errors import CronoqError, Permanent, Retryable

from .context import TaskContext
from .errors import EventsLagged, SchedulerError, SubmitError, TaskFailed
from .events import EventStream, StatusEvent
from .handle import TaskHandle
from .options import AutoscaleConfig, Dep, Resource, RetryPolicy
from .pool import Pool
from .scheduler import Scheduler
from .snapshot import PoolSnapshot, Snapshot
from .task import Task, TaskOptions

__all__ = [
    "AutoscaleConfig",
    "CronoqError",
    "Dep",
    "EventStream",
    "EventsLagged",
    "Permanent",
    "Pool",
    "PoolSnapshot",
    "Priority",
    "Resource",
    "RetryPolicy",
    "Retryable",
    "Scheduler",
    "SchedulerError",
    "Snapshot",
    "StatusEvent",
    "SubmitError",
    "Task",
    "TaskContext",
    "TaskFailed",
    "TaskHandle",
    "TaskOptions",
]
