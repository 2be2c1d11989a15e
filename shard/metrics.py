"""The metric families of a shard's state, for ``/metrics`` (:mod:`cronoq.prometheus` serves them).

Built at scrape time from the engine snapshot plus the outcome counters the runtime keeps, so scraping
costs one snapshot and no background work. ``cronoq_pool_desired_workers`` is the number autoscalers
(KEDA, HPA, the operator) read.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping

from prometheus_client.metrics_core import Metric

from cronoq.engine.model import Priority, Status
from cronoq.engine.snapshot import EngineSnapshot
from cronoq.engine.stats import WaitTotals, edge_bin
from cronoq.histogram import Series, cumulative, histogram_family
from cronoq.prometheus import Sample, family

from .runtime import CommitFailures, CommitStats

OUTCOMES = (
    Status.SUCCEEDED,
    Status.FAILED,
    Status.DEAD_LETTERED,
    Status.CANCELLED,
    Status.SKIPPED,
    Status.MISSED,
    Status.SHED,
)


def commit_failures(failures: CommitFailures) -> Metric:
    """The store's failed commits (durable stores), on a leader's page and a standby's alike: the
    failure that made a leader step down is counted by the process that now stands by."""
    return family(
        "cronoq_store_commit_failures_total",
        "counter",
        "Commits that failed: retried after a passing failure, or fatal (the leader stepped down).",
        [({"kind": "retried"}, float(failures.retried)), ({"kind": "fatal"}, float(failures.fatal))],
    )


# The dispatch-wait histogram's buckets: powers of two from 1 ms to 2^18 ms (about 4.4 minutes), which
# are edges of the engine's own bins, so each bucket is exact (a wait equal to a bound, measured in
# floating point, falls in the bucket above it).
WAIT_BOUNDS = tuple(0.001 * 2**k for k in range(19))
_WAIT_EDGES = [edge_bin(bound) for bound in WAIT_BOUNDS]
_WAIT_FROM = [0, *_WAIT_EDGES[:-1]]  # where each bucket's bins begin


def _wait_series(waits: Mapping[str, WaitTotals]) -> Iterator[Series]:
    """A series per pool and priority class that has dispatched anything since start."""
    for pool in sorted(waits):
        totals = waits[pool]
        for prio in Priority:
            if not totals.dispatched[prio]:
                continue
            bins = totals.counts[prio]
            counts = [sum(bins[lo:hi]) for lo, hi in zip(_WAIT_FROM, _WAIT_EDGES, strict=True)]
            counts.append(totals.dispatched[prio] - sum(counts))
            yield {"pool": pool, "priority": prio.label}, cumulative(WAIT_BOUNDS, counts), totals.sums[prio]


def leader(shard: str, leading: bool) -> Metric:
    """``cronoq_leader``: a standby has no engine to report and says only that it is not the leader."""
    return family(
        "cronoq_leader",
        "gauge",
        "1 while this process is the serving leader of its shard.",
        [({"shard": shard}, 1.0 if leading else 0.0)],
    )


def families(
    snap: EngineSnapshot,
    outcomes: Mapping[tuple[str, Status], int],
    *,
    shard: str,
    watch_streams: int,
    waits: Mapping[str, WaitTotals],
    store: str,
    commits: CommitStats | None = None,
) -> Iterator[Metric]:
    """A leader's families. ``outcomes`` counts terminal statuses per (pool, status) since start;
    ``waits`` are the engine's dispatch waits since start (``Engine.dispatch_waits``); ``commits`` is
    given with a durable store (of kind ``store``)."""
    pools = snap.pools

    def per_pool(attr: str) -> list[Sample]:
        return [({"pool": p.name}, float(getattr(p, attr))) for p in pools]

    yield family(
        "cronoq_pool_desired_workers",
        "gauge",
        "Desired capacity in worker slots (queue pressure, wait objectives, reservations; smoothed).",
        per_pool("desired"),
    )
    yield family("cronoq_pool_capacity", "gauge", "Worker slots connected to the pool.", per_pool("capacity"))
    yield family("cronoq_pool_busy", "gauge", "Slots running an attempt.", per_pool("busy"))
    yield family(
        "cronoq_pool_ready",
        "gauge",
        "Tasks ready to run now, waiting for a slot (or for a resource): pending minus those that wait "
        "for a start, their dependencies or a retry's backoff.",
        per_pool("ready"),
    )
    yield family("cronoq_pool_held", "gauge", "Slots held for upcoming fixed starts.", per_pool("held"))
    yield family(
        "cronoq_pool_reservations",
        "gauge",
        "Fixed-start reservations active now.",
        per_pool("reservations"),
    )
    yield family(
        "cronoq_pool_pending",
        "gauge",
        "Tasks not yet running, by priority class.",
        [
            ({"pool": p.name, "priority": prio.label}, float(p.pending_by_class[prio]))
            for p in pools
            for prio in Priority
        ],
    )
    yield family(
        "cronoq_pool_workers_connected",
        "gauge",
        "Worker streams connected to the pool.",
        per_pool("workers_connected"),
    )
    yield family(
        "cronoq_pool_wait_seconds",
        "gauge",
        "Ready-to-dispatch wait over the metrics window.",
        [
            ({"pool": p.name, "quantile": q}, v)
            for p in pools
            for q, v in (("0.5", p.wait_p50), ("0.9", p.wait_p90), ("0.99", p.wait_p99))
        ],
    )
    yield histogram_family(
        "cronoq_pool_dispatch_wait_seconds",
        "Ready-to-dispatch wait of every attempt started since this leader began, by priority class.",
        ("pool", "priority"),
        _wait_series(waits),
    )
    yield family(
        "cronoq_pool_utilization",
        "gauge",
        "Busy slot-seconds / capacity slot-seconds over the window.",
        per_pool("utilization"),
    )
    yield family(
        "cronoq_tasks_total",
        "counter",
        "Tasks that ended, by outcome.",
        [
            ({"pool": p.name, "outcome": s.label}, float(outcomes.get((p.name, s), 0)))
            for p in pools
            for s in OUTCOMES
        ],
    )
    yield family(
        "cronoq_dead_letters_total",
        "counter",
        "Tasks dead-lettered after using up their attempts.",
        [({"pool": p.name}, float(outcomes.get((p.name, Status.DEAD_LETTERED), 0))) for p in pools],
    )
    t = snap.totals
    for name, value, help_text in (
        ("cronoq_submitted_total", t.submitted, "Tasks accepted."),
        ("cronoq_dispatched_total", t.dispatched, "Attempts started."),
        ("cronoq_retries_total", t.retries, "Attempts that failed and were scheduled again."),
        ("cronoq_timeouts_total", t.timeouts, "Attempts aborted by their timeout."),
        ("cronoq_lease_expiries_total", t.lease_expiries, "Leases lost for want of a heartbeat."),
        ("cronoq_stale_reports_total", t.stale_completions, "Worker reports for leases they did not hold."),
        (
            "cronoq_recurring_conflicts_total",
            t.recurring_conflicts,
            "Recurring occurrences not created: no fixed-start reservation left for them.",
        ),
        (
            "cronoq_recurring_invalid_total",
            t.recurring_invalid,
            "Recurring occurrences or schedules that could not be created or restored.",
        ),
        (
            "cronoq_recurring_skipped_total",
            t.recurring_skipped,
            "Late recurring schedules that went on from the present, skipping starts that had passed.",
        ),
    ):
        yield family(name, "counter", help_text, [({}, float(value))])
    yield family("cronoq_live_tasks", "gauge", "Tasks not yet finished.", [({}, float(snap.live_tasks))])
    yield family(
        "cronoq_workers_connected",
        "gauge",
        "Worker streams connected.",
        [({}, float(snap.workers_connected))],
    )
    yield family(
        "cronoq_watch_streams",
        "gauge",
        "Open Watch subscriptions (gRPC and HTTP).",
        [({}, float(watch_streams))],
    )
    if snap.resources:
        labels = [{"resource": r.name, "kind": r.kind} for r in snap.resources]
        yield family(
            "cronoq_resource_capacity",
            "gauge",
            "Permits of a semaphore, or burst of a token bucket ([[resources]]).",
            [(lab, r.capacity) for lab, r in zip(labels, snap.resources, strict=True)],
        )
        yield family(
            "cronoq_resource_available",
            "gauge",
            "What a dispatch could take now: free permits, or tokens.",
            [(lab, r.available) for lab, r in zip(labels, snap.resources, strict=True)],
        )
        yield family(
            "cronoq_resource_waiting",
            "gauge",
            "READY tasks set aside until the resource has room for them.",
            [(lab, float(r.waiting)) for lab, r in zip(labels, snap.resources, strict=True)],
        )
    yield leader(shard, True)
    if commits is not None:
        yield family(
            "cronoq_store_commits_total", "counter", "Group commits.", [({}, float(commits.commits))]
        )
        yield family(
            "cronoq_store_committed_tasks_total",
            "counter",
            "Task rows written by group commits (a task changed several times in one batch counts once).",
            [({}, float(commits.tasks))],
        )
        yield histogram_family(
            "cronoq_store_commit_duration_seconds",
            "Store commit latency of every group commit since this leader began.",
            ("store",),
            [({"store": store}, commits.latency.cumulative(), commits.latency.total)],
        )
        seconds = sorted(commits.recent_seconds)
        yield family(
            "cronoq_store_commit_seconds",
            "summary",
            "Store commit latency over the most recent commits (up to 4096).",
            [
                (
                    {"quantile": q},
                    seconds[min(len(seconds) - 1, int(float(q) * len(seconds)))] if seconds else math.nan,
                )
                for q in ("0.5", "0.9", "0.99")
            ],
        )
