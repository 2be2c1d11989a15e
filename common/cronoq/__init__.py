"""cronoq: a task scheduler, in-process (``cronoq.Scheduler``) or as a server with remote workers.

``import cronoq`` stays cheap: library mode (``cronoq.Scheduler`` and friends, which pull in asyncio and
the engine) loads on first use of one of its names, and the gRPC SDK (``cronoq.client``, which pulls in
grpc) on first access, so a handler module can raise ``cronoq.Retryable`` without paying for either.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

from cronoq.errors import CronoqError, Permanent, Retryable

if TYPE_CHECKING:
    from cronoq.library import (
        AutoscaleConfig,
        Dep,
        EventsLagged,
        EventStream,
        Pool,
        PoolSnapshot,
        Priority,
        Resource,
        RetryPolicy,
        Scheduler,
        SchedulerError,
        Snapshot,
        StatusEvent,
        SubmitError,
        Task,
        TaskContext,
        TaskFailed,
        TaskHandle,
    )

__version__ = "0.1.0"

# ``client`` is left out so that ``from cronoq import *`` does not import grpc.
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
    "__version__",
]

# Library mode's names: everything exported but the few defined by the time this module is imported.
_LIBRARY = frozenset(__all__) - {"CronoqError", "Permanent", "Retryable", "__version__"}
_LAZY_SUBMODULES = frozenset({"client"})


def __getattr__(name: str) -> Any:
    if name in _LIBRARY:
        value = getattr(importlib.import_module("cronoq.library"), name)
        globals()[name] = value  # later lookups skip this hook
        return value
    if name in _LAZY_SUBMODULES:
        return importlib.import_module(f"cronoq.{name}")
    raise AttributeError(f"module 'cronoq' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | _LAZY_SUBMODULES | _LIBRARY)
