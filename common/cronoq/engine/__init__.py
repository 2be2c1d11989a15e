"""The scheduling engine: a deterministic, sans-IO state machine shared by the server and library mode.

Inputs (submit, cancel, worker capacity, attempt outcomes, heartbeats, ``tick(now)``) go in; actions
(dispatch a lease, abort a lease, status events) come out of ``take_actions()``. Nothing here does I/O
or reads a clock, so every rule is tested in microseconds with injected time.

The modules: ``engine`` (``Engine``, the public inputs and views) over ``core`` (``EngineCore``: the
state, admission, dispatch, the lease life cycle and timers); a collaborator per optional feature, owning
its state and rules (``deps``, ``fixed``, ``recurring``, ``resources`` with the parked tasks,
``autoscale``); and the structures they use (``admission``, ``lanes``, ``pool``, ``workers``, ``table``,
``timers``, ``stats``, ``overflow``, ``retry``, ``cron``), with the vocabulary in ``model`` and the views
in ``snapshot``.

Installed from source on CPython, the modules of this package (all but this one and ``readonly``) are
compiled to C with mypyc (``setup.py``); ``compiled()`` says whether this process runs that build.
"""

from importlib.machinery import EXTENSION_SUFFIXES

from . import engine as _engine_module
from .engine import Engine
from .model import (
    Abort,
    Action,
    AdmissionError,
    AutoscaleRule,
    DepEdge,
    DepOn,
    Dispatch,
    EngineLimits,
    MissPolicy,
    Overflow,
    Overlap,
    PoolConfig,
    Priority,
    Recurring,
    RecurringError,
    RecurringSpec,
    ResourceConfig,
    RetryRule,
    Scale,
    ScheduleChanged,
    Semaphore,
    Status,
    StatusChange,
    Submitted,
    Task,
    TaskSpec,
    TokenBucket,
    UnknownDependency,
)
from .snapshot import EngineSnapshot, GroupStats, PoolStats, ResourceStats, Totals, WorkerView


def compiled() -> bool:
    """Whether the engine runs from its mypyc-compiled extension modules rather than its Python sources
    (a build without a C compiler, or with ``CRONOQ_COMPILE=0``, runs the sources: same rules, about
    half the speed)."""
    return (_engine_module.__file__ or "").endswith(tuple(EXTENSION_SUFFIXES))


__all__ = [
    "Abort",
    "Action",
    "AdmissionError",
    "AutoscaleRule",
    "DepEdge",
    "DepOn",
    "Dispatch",
    "Engine",
    "EngineLimits",
    "EngineSnapshot",
    "GroupStats",
    "MissPolicy",
    "Overflow",
    "Overlap",
    "PoolConfig",
    "PoolStats",
    "Priority",
    "Recurring",
    "RecurringError",
    "RecurringSpec",
    "ResourceConfig",
    "ResourceStats",
    "RetryRule",
    "Scale",
    "ScheduleChanged",
    "Semaphore",
    "Status",
    "StatusChange",
    "Submitted",
    "Task",
    "TaskSpec",
    "TokenBucket",
    "Totals",
    "UnknownDependency",
    "WorkerView",
    "compiled",
]
