"""Snapshot numbers: state, windowed counters, wait percentiles, utilization, cost, totals."""

from __future__ import annotations

import dataclasses
import math
import random

import pytest

from cronoq.engine import DepEdge, Engine, EngineLimits, PoolConfig, Priority, Semaphore, Status
from cronoq.engine.stats import BINS, WindowStats, bin_all, bin_value, duration_bin, quantile

from .helpers import FIXED, drain, make_engine, only_dispatch, run_one_at_a_time, spec, task_of

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
    assert (pool.retried, pool.wait_mean, pool.run_p50, pool.run_p99) == (0, 0.0, 0.0, 0.0)
    assert pool.cost == pytest.approx(2 * 100.0 * 0.5)
    assert pool.worker_seconds == pytest.approx(2 * 100.0)
    assert engine.snapshot(100.0).totals.succeeded == 1


def test_cost_follows_capacity_changes() -> None:
    engine = make_engine(POOL)
    engine.add_worker(1, "p", 4, {}, 10.0)
    engine.set_worker_slots(1, 1, 20.0)
    engine.add_worker(2, "p", 2, {}, 30.0)
    engine.remove_worker(1, 40.0)
    worker_seconds = 4 * 10 + 1 * 10 + 3 * 10 + 2 * 10
    pool = engine.snapshot(50.0).pools[0]
    assert pool.worker_seconds == pytest.approx(worker_seconds)
    assert pool.cost == pytest.approx(worker_seconds * 0.5)


def test_worker_seconds_accumulate_since_start_without_a_price() -> None:
    engine = make_engine(PoolConfig("p"))  # cost_per_worker_second 0: cost stays 0, not the integral
    engine.add_worker(1, "p", 4, {}, 10.0)
    assert engine.snapshot(100.0).pools[0].worker_seconds == pytest.approx(360.0)
    pool = engine.snapshot(1_000.0).pools[0]  # far past the window: not windowed
    assert pool.worker_seconds == pytest.approx(3_960.0) and pool.cost == 0.0


def gpu_engine() -> Engine:
    return Engine([PoolConfig("p", retry=FIXED)], resources=[Semaphore("gpu", 1)], rng=random.Random(0))


def test_ready_counts_queued_due_and_parked_tasks_only() -> None:
    engine = gpu_engine()
    start = dataclasses.replace(spec(key="fixed"), start=10.0)
    behind = dataclasses.replace(spec(), deps=(DepEdge("a"),))
    engine.submit([spec(key="a"), spec(), start, behind], 0.0)  # no worker yet
    pool = engine.snapshot(0.0).pools[0]
    assert (pool.ready, sum(pool.pending_by_class)) == (2, 4)  # the fixed start and its dependent wait
    engine.tick(10.0)
    assert engine.snapshot(10.0).pools[0].ready == 3  # the fixed start is due
    gpu = dataclasses.replace(spec(), resources={"gpu": 1})
    other = gpu_engine()
    other.submit([gpu, gpu], 0.0)
    other.add_worker(1, "p", 2, {}, 0.0)  # one runs; the other finds a free slot but no permit: parked
    pool = other.snapshot(0.0).pools[0]
    assert (pool.busy, pool.ready) == (1, 1)
    other.fail(1, only_dispatch(other).lease, "boom", False, 5.0, 1.0)  # RETRYING is not ready
    pool = other.snapshot(1.0).pools[0]
    assert (pool.busy, pool.ready, sum(pool.pending_by_class)) == (1, 0, 1)


def test_wait_percentiles_follow_the_distribution() -> None:
    engine = make_engine(PoolConfig("p", max=100))
    for i in range(100):
        engine.submit([spec()], float(i) * 0.1)  # waits 0.1 .. 10 s at dispatch time 10
    engine.add_worker(1, "p", 100, {}, 10.0)
    pool = engine.snapshot(10.0).pools[0]
    assert pool.wait_p50 == pytest.approx(5.0, rel=0.07)
    assert pool.wait_p90 == pytest.approx(9.0, rel=0.07)
    assert pool.wait_p99 == pytest.approx(9.9, rel=0.07)
    assert pool.wait_mean == pytest.approx(5.05)  # exact, not from the histogram


def test_run_percentiles_cover_attempts_that_ended_whatever_the_outcome() -> None:
    engine = make_engine(PoolConfig("p", max=100, retry=FIXED))
    engine.add_worker(1, "p", 100, {}, 0.0)
    engine.submit([spec() for _ in range(100)], 0.0)
    leases = drain(engine).dispatches
    for i, lease in enumerate(leases):  # runs of 0.1 .. 10 s; every other attempt fails, retryably
        if i % 2:
            engine.complete(1, lease.lease, (i + 1) * 0.1)
        else:
            engine.fail(1, lease.lease, "boom", False, 100.0, (i + 1) * 0.1)
    pool = engine.snapshot(10.0).pools[0]
    assert pool.run_p50 == pytest.approx(5.0, rel=0.07)
    assert pool.run_p99 == pytest.approx(9.9, rel=0.07)
    assert (pool.failed, pool.retried, pool.wait_mean) == (50, 50, 0.0)
    assert make_engine().snapshot(10.0).pools[0].run_p50 == 0.0  # no attempt ended


def test_retried_counts_failures_that_got_another_attempt_not_the_last_one() -> None:
    engine = make_engine(PoolConfig("p", retry=FIXED))  # 3 attempts, backoff 1 s then 2 s
    engine.add_worker(1, "p", 1, {}, 0.0)
    [task] = engine.submit([spec()], 0.0)
    engine.fail(1, only_dispatch(engine).lease, "boom", False, None, 1.0)  # again at 2
    engine.tick(2.0)
    engine.fail(1, only_dispatch(engine).lease, "boom", False, None, 3.0)  # again at 5
    engine.tick(5.0)
    engine.fail(1, only_dispatch(engine).lease, "boom", False, None, 6.0)  # the last attempt
    assert task_of(engine, task.id).status is Status.DEAD_LETTERED
    pool = engine.snapshot(6.0).pools[0]
    assert (pool.failed, pool.retried) == (3, 2)
    assert engine.snapshot(6.0).totals.retries == 2


def test_utilization_is_one_when_every_slot_ran_all_window_and_efficiency_excludes_failures() -> None:
    engine = make_engine(PoolConfig("p", retry=FIXED))
    engine.add_worker(1, "p", 1, {}, 0.0)
    engine.submit([spec(), spec()], 0.0)
    ok = drain(engine).dispatches[0]
    engine.complete(1, ok.lease, 30.0)
    bad = drain(engine).dispatches[0]
    engine.fail(1, bad.lease, "x", False, None, 60.0)
    pool = engine.snapshot(60.0).pools[0]
    # The window is the 60 one-second slices up to now's (1 to 60, the last still empty): 59 s of
    # capacity, of which the success ran 29 s and the failure 30 s.
    assert pool.utilization == pytest.approx(1.0)
    assert pool.schedule_efficiency == pytest.approx(29 / 59)


def test_an_attempt_still_running_counts_its_time_in_the_window() -> None:
    """One of two slots busy since 0: half the capacity is used, not none until the attempt ends."""
    engine = make_engine(PoolConfig("p", retry=FIXED))
    engine.add_worker(1, "p", 2, {}, 0.0)
    engine.submit([spec()], 0.0)
    drain(engine)
    pool = engine.snapshot(59.0).pools[0]
    assert pool.utilization == pytest.approx(0.5)
    assert pool.schedule_efficiency == 0.0  # nothing succeeded yet
    assert engine.snapshot(300.0).pools[0].utilization == pytest.approx(0.5)  # long after the window began


def test_a_long_attempt_is_credited_only_for_the_part_it_ran_within_the_window() -> None:
    """An attempt that ran 200 s ends: the window (the last 60 s) saw one of two slots busy, so 0.5;
    crediting its whole run time in the slice where it ended made it 200 s over 120 (capped to 1)."""
    engine = make_engine(PoolConfig("p", retry=FIXED))
    engine.add_worker(1, "p", 2, {}, 0.0)
    engine.submit([spec()], 0.0)
    lease = only_dispatch(engine)
    engine.snapshot(59.0)  # integrates capacity up to 59: the window then moves over slices written
    assert engine.complete(1, lease.lease, 200.0)
    pool = engine.snapshot(200.0).pools[0]
    assert pool.utilization == pytest.approx(0.5)
    assert pool.schedule_efficiency == pytest.approx(0.5)
    # Ten seconds on, the window's first 50 s still saw the slot busy, its last 10 s nothing.
    assert engine.snapshot(210.0).pools[0].utilization == pytest.approx(49 / 118)


def test_window_stats_spread_a_long_run_over_the_slices_it_ran_in() -> None:
    stats = WindowStats(60.0)
    stats.advance(0.0, 1)
    stats.attempt(10.0, 70.5, Status.SUCCEEDED)
    view = stats.view(70.5)  # slices 11..70: the run covered 11..70.5, all of the window
    assert view.utilization == pytest.approx(1.0)
    assert view.schedule_efficiency == pytest.approx(1.0)
    assert sum(b.run_total for b in stats._ring) == pytest.approx(59.5)


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
    bins = [duration_bin(v) for v in values]
    assert bins == sorted(bins)
    assert duration_bin(0.0009) == 0 and bin_value(0) == 0.0
    for v in values[2:]:
        assert math.isclose(bin_value(duration_bin(v)), v, rel_tol=1 / 16)
    assert duration_bin(1e12) == BINS - 1


def test_each_bin_begins_at_its_octave_and_eighth() -> None:
    """Bin k >= 1 holds [2**octave x (1 + sub/8), the next such edge) milliseconds, k = 1 + 8 x octave + sub."""
    for index in range(1, BINS):
        octave, sub = divmod(index - 1, 8)
        edge = 2.0**octave * (1.0 + sub / 8)
        assert duration_bin(edge * 1e-3) == index
        assert duration_bin(math.nextafter(edge, 0.0) * 1e-3) == index - 1


def test_binning_samples_together_gives_each_the_bin_it_gets_alone() -> None:
    """``bin_all`` (what a slice does with its waits and run times) agrees with ``duration_bin`` (bin 0
    below 1 ms) on every sample: bin edges and the float just below each, sub-millisecond values,
    values past the last edge, and random spreads."""
    rng = random.Random(7)
    edges = [2.0**octave * (1.0 + sub / 8) * 1e-3 for octave in range(31) for sub in range(8)]
    cases = [
        edges + [math.nextafter(e, 0.0) for e in edges],
        [0.0, 0.0005, math.nextafter(1e-3, 0.0), 1e-3, 1e12, 1e12],
        [rng.uniform(0.0, 0.004) for _ in range(500)],
        [10 ** rng.uniform(-5.0, 7.0) for _ in range(2000)],
        [0.0123] * 50,
        [],
    ]
    for samples in cases:
        expected = [0] * BINS
        for value in samples:
            expected[0 if value < 1e-3 else duration_bin(value)] += 1
        counts = [0] * BINS
        bin_all(counts, list(samples))
        assert counts == expected


def test_quantile_takes_the_bin_holding_the_rank() -> None:
    counts = [0] * BINS
    counts[duration_bin(1.0)] = 9
    counts[duration_bin(100.0)] = 1
    assert quantile(counts, 10, 0.5) == bin_value(duration_bin(1.0))
    assert quantile(counts, 10, 0.9) == bin_value(duration_bin(1.0))
    assert quantile(counts, 10, 0.99) == bin_value(duration_bin(100.0))
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
    later.dispatch(0.5, False, Priority.NORMAL)
    assert later.dispatched == 1
    again = stats.bucket(167.5)  # a whole window on: the ring came round to the same slot, cleared
    assert again is later and again.index == 167 and again.dispatched == 0
