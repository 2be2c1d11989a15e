"""Snapshot numbers: state, windowed counters, wait percentiles, utilization, cost, totals."""

from __future__ import annotations

import math

import pytest

from cronoq.engine import EngineLimits, PoolConfig, Priority, Status
from cronoq.engine.stats import BINS, WindowStats, bin_value, quantile, wait_bin

from .helpers import FIXED, drain, make_engine, run_one_at_a_time, spec, task_of

POOL = PoolConfig("p", retry=FIXED, cost_per_worker_second=0.5)


def test_pool_and_totals_numbers_after_one_success_and_one_retry() -> None:
    engine = make_engine(POOL)
    engine.submit([spec(), spec(priority=Priority.LOW)], 0.0)
    engine.add_worker(1, "p", 2, {}, 3.0)  # both waited 3 s
    ok, bad = drain(engine).dispatches
    engine.complete(1, ok.lease, 5.0)  # ran 2 s
    engine.fail(1, bad.lease, "boom", False, 100.0, 6.0)  # ran 3 s, retries at 106
    snap = engine.snapshot(10.0)
    [pool] = snap.pools
    assert (pool.name, pool.capacity, pool.busy, pool.held, pool.desired) == ("p", 2, 0, 0, 2)
    assert pool.pending_by_class == [0, 0, 0, 1]
    assert (pool.dispatched, pool.succeeded, pool.failed) == (2, 1, 1)
    assert (pool.reservations, pool.fixed_start_hit_rate, pool.workers_connected) == (0, 1.0, 1)
    assert pool.wait_p50 == pytest.approx(3.0, rel=0.07)
    assert pool.utilization == pytest.approx(5.0 / 14.0)  # 5 s run over 2 slots x 7 s
    assert pool.schedule_efficiency == pytest.approx(2.0 / 14.0)
    assert pool.cost == pytest.approx(14.0 * 0.5)
    assert (snap.live_tasks, snap.running, snap.pending, snap.workers_connected) == (1, 0, 1, 1)
    t = snap.totals
    assert (t.submitted, t.dispatched, t.succeeded, t.failed, t.retries, t.dead_lettered) == (
        2,
        2,
        1,
        0,
        1,
        0,
    )


def test_windowed_counters_forget_what_is_older_than_the_window_but_cost_accumulates() -> None:
    engine = make_engine(POOL, limits=EngineLimits(metrics_window=60.0))
    engine.add_worker(1, "p", 2, {}, 0.0)
    engine.submit([spec()], 0.0)
    [lease] = drain(engine).dispatches
    engine.complete(1, lease.lease, 1.0)
    assert engine.snapshot(30.0).pools[0].succeeded == 1
    pool = engine.snapshot(100.0).pools[0]
    assert (pool.dispatched, pool.succeeded, pool.failed, pool.utilization, pool.wait_p50) == (
        0,
        0,
        0,
        0.0,
        0.0,
    )
    assert pool.cost == pytest.approx(2 * 100.0 * 0.5)
    assert engine.snapshot(100.0).totals.succeeded == 1


def test_cost_follows_capacity_changes() -> None:
    engine = make_engine(POOL)
    engine.add_worker(1, "p", 4, {}, 10.0)
    engine.set_worker_slots(1, 1, 20.0)
    engine.add_worker(2, "p", 2, {}, 30.0)
    engine.remove_worker(1, 40.0)
    worker_seconds = 4 * 10 + 1 * 10 + 3 * 10 + 2 * 10
    assert engine.snapshot(50.0).pools[0].cost == pytest.approx(worker_seconds * 0.5)


def test_wait_percentiles_follow_the_distribution() -> None:
    engine = make_engine(PoolConfig("p", max=100))
    for i in range(100):
        engine.submit([spec()], float(i) * 0.1)  # waits 0.1 .. 10 s at dispatch time 10
    engine.add_worker(1, "p", 100, {}, 10.0)
    pool = engine.snapshot(10.0).pools[0]
    assert pool.wait_p50 == pytest.approx(5.0, rel=0.07)
    assert pool.wait_p90 == pytest.approx(9.0, rel=0.07)
    assert pool.wait_p99 == pytest.approx(9.9, rel=0.07)


def test_utilization_is_one_when_every_slot_ran_all_window_and_efficiency_excludes_failures() -> None:
    engine = make_engine(PoolConfig("p", retry=FIXED))
    engine.add_worker(1, "p", 1, {}, 0.0)
    engine.submit([spec(), spec()], 0.0)
    ok = drain(engine).dispatches[0]
    engine.complete(1, ok.lease, 30.0)
    bad = drain(engine).dispatches[0]
    engine.fail(1, bad.lease, "x", False, None, 60.0)
    pool = engine.snapshot(60.0).pools[0]
    assert pool.utilization == pytest.approx(1.0)
    assert pool.schedule_efficiency == pytest.approx(0.5)


def test_running_and_pending_counts() -> None:
    engine = make_engine()
    engine.add_worker(1, "p", 2, {}, 0.0)
    engine.submit([spec(priority=p) for p in Priority] + [spec()], 0.0)
    snap = engine.snapshot(0.0)
    assert (snap.running, snap.pending, snap.live_tasks) == (2, 3, 5)
    assert snap.pools[0].busy == 2
    assert sum(snap.pools[0].pending_by_class) == 3
    assert snap.pool("p") is snap.pools[0] and snap.pool("x") is None


def test_counters_of_finished_statuses() -> None:
    engine = make_engine(PoolConfig("p", retry=FIXED))
    engine.add_worker(1, "p", 1, {}, 0.0)
    ids = [s.id for s in engine.submit([spec(), spec(), spec()], 0.0)]
    engine.cancel(ids[2], 0.0)
    run_one_at_a_time(engine, 1, 1.0)
    t = engine.snapshot(1.0).totals
    assert (t.submitted, t.dispatched, t.succeeded, t.cancelled) == (3, 2, 2, 1)
    assert (t.skipped, t.missed, t.shed, t.timeouts, t.lease_expiries) == (0, 0, 0, 0, 0)
    assert task_of(engine, ids[0]).status is Status.SUCCEEDED


def test_histogram_bins_are_ordered_and_within_one_sixteenth() -> None:
    values = [0.0, 0.0005, 0.001, 0.0015, 0.01, 0.37, 1.0, 2.9, 45.0, 3600.0, 86_400.0]
    bins = [wait_bin(v) for v in values]
    assert bins == sorted(bins)
    assert wait_bin(0.0009) == 0 and bin_value(0) == 0.0
    for v in values[2:]:
        assert math.isclose(bin_value(wait_bin(v)), v, rel_tol=1 / 16)
    assert wait_bin(1e12) == BINS - 1


def test_quantile_takes_the_bin_holding_the_rank() -> None:
    counts = [0] * BINS
    counts[wait_bin(1.0)] = 9
    counts[wait_bin(100.0)] = 1
    assert quantile(counts, 10, 0.5) == bin_value(wait_bin(1.0))
    assert quantile(counts, 10, 0.9) == bin_value(wait_bin(1.0))
    assert quantile(counts, 10, 0.99) == bin_value(wait_bin(100.0))
    assert quantile(counts, 0, 0.5) == 0.0


def test_window_buckets_follow_time_slices_and_a_late_caller_counts_in_the_newest() -> None:
    """``bucket`` skips the division while ``now`` is inside the current slice; crossing a slice edge,
    jumping several, and a caller with an older ``now`` all land where the slice arithmetic says."""
    stats = WindowStats(60.0)  # 1 s slices
    first = stats.bucket(100.25)
    assert stats.bucket(100.999) is first and first.index == 100
    second = stats.bucket(101.0)
    assert second is not first and second.index == 101
    assert stats.bucket(100.5) is second  # time never runs backwards here
    later = stats.bucket(107.5)
    assert later.index == 107 and stats.bucket(107.99) is later
    later.dispatch(0.5, False)
    assert later.dispatched == 1
    again = stats.bucket(167.5)  # a whole window on: the ring came round to the same slot, cleared
    assert again is later and again.index == 167 and again.dispatched == 0
