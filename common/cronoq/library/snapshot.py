"""``Snapshot`` and ``PoolSnapshot``: the engine's snapshot in library-mode shape.

Windowed fields (dispatched, succeeded, failed, retried, the ratios, the wait mean and the wait and run
percentiles) cover the last ``window`` seconds; ``worker_seconds``, ``cost`` and ``totals`` count since the
scheduler started. The server-only parts of the engine's snapshot (connected workers, per-label groups)
are left out.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from cronoq.engine import EngineSnapshot, PoolStats


@dataclass(slots=True, repr=False)
class PoolSnapshot:
    """One pool. ``pending_by_class`` counts blocked, scheduled, ready and retrying tasks per class
    (critical, high, normal, low), ``ready`` those queued or due; ``held`` is capacity set aside for fixed
    starts; ``desired`` the autoscaler's target (the capacity, without autoscaling). ``failed`` counts
    failed attempts, ``retried`` those that got another attempt; waits run from ready to dispatch, run
    times are those of attempts that ended, whatever their outcome."""

    name: str
    capacity: int
    busy: int
    held: int
    desired: int
    pending_by_class: list[int]
    ready: int
    reservations: int
    window: float
    dispatched: int
    succeeded: int
    failed: int
    retried: int
    priority_adherence: float
    fixed_start_hit_rate: float
    utilization: float
    schedule_efficiency: float
    wait_mean: float
    wait_p50: float
    wait_p90: float
    wait_p99: float
    run_p50: float
    run_p99: float
    worker_seconds: float
    cost: float

    @property
    def pending(self) -> int:
        return sum(self.pending_by_class)

    def __repr__(self) -> str:
        return (
            f'PoolSnapshot(name="{self.name}", capacity={self.capacity}, busy={self.busy}, '
            f"pending={self.pending}, utilization={self.utilization:.3f}, "
            f"priority_adherence={self.priority_adherence:.3f})"
        )


@dataclass(slots=True, repr=False)
class Snapshot:
    """The scheduler as a whole: ``pools`` in configuration order, ``live_tasks`` not yet finished,
    ``running`` attempts, ``pending`` tasks not running, ``totals`` counters by name."""

    pools: list[PoolSnapshot]
    live_tasks: int
    running: int
    pending: int
    totals: dict[str, int]

    def pool(self, name: str) -> PoolSnapshot | None:
        return next((p for p in self.pools if p.name == name), None)

    def __repr__(self) -> str:
        return f"Snapshot(live_tasks={self.live_tasks}, running={self.running}, pending={self.pending})"


def _pool(stats: PoolStats, window: float) -> PoolSnapshot:
    return PoolSnapshot(
        name=stats.name,
        capacity=stats.capacity,
        busy=stats.busy,
        held=stats.held,
        desired=stats.desired,
        pending_by_class=list(stats.pending_by_class),
        ready=stats.ready,
        reservations=stats.reservations,
        window=window,
        dispatched=stats.dispatched,
        succeeded=stats.succeeded,
        failed=stats.failed,
        retried=stats.retried,
        priority_adherence=stats.priority_adherence,
        fixed_start_hit_rate=stats.fixed_start_hit_rate,
        utilization=stats.utilization,
        schedule_efficiency=stats.schedule_efficiency,
        wait_mean=stats.wait_mean,
        wait_p50=stats.wait_p50,
        wait_p90=stats.wait_p90,
        wait_p99=stats.wait_p99,
        run_p50=stats.run_p50,
        run_p99=stats.run_p99,
        worker_seconds=stats.worker_seconds,
        cost=stats.cost,
    )


def from_engine(snapshot: EngineSnapshot, window: float) -> Snapshot:
    totals = snapshot.totals
    return Snapshot(
        pools=[_pool(stats, window) for stats in snapshot.pools],
        live_tasks=snapshot.live_tasks,
        running=snapshot.running,
        pending=snapshot.pending,
        totals={f.name: getattr(totals, f.name) for f in dataclasses.fields(totals)},
    )
