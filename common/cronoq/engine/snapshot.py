"""Read-only views the engine hands out: the snapshot (mirroring the wire SnapshotResponse) and workers.

Field names follow the wire messages (PoolSnapshot, WorkerGroup, Totals, SnapshotResponse, WorkerInfo)
so the server converts them field by field. Windowed fields cover the last ``limits.metrics_window``
seconds; totals count on from those the previous leader left in the store (``Engine.restore``), so they
never go back across a failover (with the memory store: since the server started).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from .model import Rebuilt


@dataclass(slots=True)
class GroupStats:
    """The workers of a pool sharing one exact label set."""

    labels: dict[str, str]
    capacity: int
    busy: int


@dataclass(slots=True)
class PoolStats:
    """One pool. ``pending_by_class`` is indexed by Priority (critical, high, normal, low)."""

    name: str
    capacity: int
    busy: int
    held: int
    desired: int
    pending_by_class: list[int]
    reservations: int
    dispatched: int  # attempts started in the window
    succeeded: int  # tasks that succeeded in the window
    failed: int  # attempts that failed in the window, retried or not
    priority_adherence: float
    fixed_start_hit_rate: float
    utilization: float
    schedule_efficiency: float
    wait_p50: float  # seconds from READY to dispatch
    wait_p90: float
    wait_p99: float
    cost: float  # worker-seconds since start x cost_per_worker_second
    workers_connected: int
    groups: list[GroupStats] = field(default_factory=list)
    # Library mode reports these; the wire snapshot has no fields for them. They come last, with
    # defaults, so that constructions by position stay valid.
    ready: int = 0  # READY tasks: queued (a fixed start that is due among them), or parked for a resource
    retried: int = 0  # retryable failures that got another attempt, in the window
    worker_seconds: float = 0.0  # capacity integrated over time since start
    wait_mean: float = 0.0  # mean of the waits behind wait_p50..wait_p99
    run_p50: float = 0.0  # run seconds of attempts that ended in the window (any outcome)
    run_p99: float = 0.0


@dataclass(slots=True)
class Totals:
    """Counters since the store's first leader (see the module docstring)."""

    submitted: int = 0
    dispatched: int = 0
    succeeded: int = 0
    failed: int = 0
    dead_lettered: int = 0
    cancelled: int = 0
    skipped: int = 0
    missed: int = 0
    shed: int = 0
    retries: int = 0
    timeouts: int = 0
    lease_expiries: int = 0
    stale_completions: int = 0
    recurring_conflicts: int = 0  # occurrences not created: no reservation left for them
    recurring_invalid: int = 0  # occurrences or schedules that could not be created or restored
    recurring_skipped: int = 0  # late schedules that went on from the present, skipping passed starts


@dataclass(slots=True, frozen=True)
class ResourceStats(Rebuilt):
    """One ``[[resources]]`` entry: ``capacity`` (permits, or burst), ``available`` (what a dispatch
    could take now: free permits, or tokens) and ``waiting`` (READY tasks parked until it has room).
    Not on the wire; ``/metrics`` shows it."""

    name: str
    kind: str  # "semaphore" or "token_bucket"
    capacity: float
    available: float
    waiting: int


@dataclass(slots=True)
class EngineSnapshot:
    """The engine as a whole; ``pools`` and ``resources`` in configuration order."""

    pools: list[PoolStats]
    live_tasks: int
    running: int
    pending: int
    totals: Totals
    workers_connected: int
    resources: list[ResourceStats] = field(default_factory=list)

    def pool(self, name: str) -> PoolStats | None:
        return next((p for p in self.pools if p.name == name), None)


@dataclass(slots=True)
class WorkerView:
    """One connected worker: granted slots and leases held."""

    id: int
    pool: str
    labels: dict[str, str]
    slots: int
    busy: int
