"""The engine's state for one pool: configuration, ready queue, workers, pending counts and metrics."""

from __future__ import annotations

from .lanes import FairPoolQueue, PoolQueue
from .model import Overflow, PoolConfig, Priority, Task
from .overflow import ShedIndex
from .stats import WindowStats
from .workers import PoolWorkers


class PoolState:
    """Everything the engine tracks per pool. ``pending[c]`` counts class c's BLOCKED, SCHEDULED, READY
    and RETRYING tasks (what ``max_pending`` bounds)."""

    __slots__ = ("config", "hold_wanted", "name", "pending", "queue", "shed", "stats", "workers")

    def __init__(self, config: PoolConfig, metrics_window: float) -> None:
        self.config = config
        self.name = config.name
        self.queue = (
            FairPoolQueue(config.default_duration, config.tenant_weights)
            if config.fair_share
            else PoolQueue(config.default_duration)
        )
        self.workers = PoolWorkers()
        self.stats = WindowStats(metrics_window)
        self.pending = [0 for _ in Priority]
        # SCHEDULED tasks that want a worker held for their start but found no slot free yet, by id.
        self.hold_wanted: dict[int, Task] = {}
        self.shed = (
            ShedIndex(config.overflow)
            if config.overflow in (Overflow.SHED_LOWEST, Overflow.SHED_OLDEST)
            else None
        )
