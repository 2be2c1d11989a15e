"""Fixed starts: SCHEDULED until the start, reservations and their limit, workers held ahead of the
start, misses under each on_miss policy, and the hit rate."""

from __future__ import annotations

import dataclasses

import pytest

from cronoq.engine import AdmissionError, DepEdge, Engine, MissPolicy, PoolConfig, Status, TaskSpec

from .helpers import NO_RETRY, drain, spec, task_of


def fixed(
    start: float,
    *,
    tolerance: float = 1.0,
    duration: float | None = None,
    on_miss: MissPolicy = MissPolicy.RUN_LATE,
    key: str = "",
    labels: dict[str, str] | None = None,
) -> TaskSpec:
    return dataclasses.replace(
        spec(key=key, labels=labels),
        start=start,
        tolerance=tolerance,
        duration_hint=duration,
        on_miss=on_miss,
    )


def engine(max_workers: int = 10) -> Engine:
    return Engine([PoolConfig("p", max=max_workers, retry=NO_RETRY)])


def test_scheduled_until_the_start_then_ready_and_dispatched_exactly_then() -> None:
    e = engine()
    e.add_worker(1, "p", 1, {}, 0.0)
    [t] = e.submit([fixed(10.0)], 0.0)
    assert drain(e).statuses(t.id) == [Status.BLOCKED, Status.SCHEDULED]
    e.tick(9.999)
    assert task_of(e, t.id).status is Status.SCHEDULED
    assert e.next_wakeup() == 10.0
    e.tick(10.0)
    actions = drain(e)
    assert actions.statuses(t.id) == [Status.READY, Status.RUNNING]
    assert actions.dispatches[0].task.started == 10.0


@pytest.mark.parametrize(("max_workers", "limit"), [(2, 1), (4, 2), (1, 1), (10, 5)])
def test_reservation_limit_is_half_of_max_at_least_one(max_workers: int, limit: int) -> None:
    e = engine(max_workers)
    e.submit([fixed(100.0, key=f"r{i}") for i in range(limit)], 0.0)
    with pytest.raises(AdmissionError) as err:
        e.submit([fixed(100.0)], 0.0)
    assert (err.value.code, err.value.message) == ("reservation_conflict", "fixed-start reservation conflict")


def test_reservation_windows_as_observed() -> None:
    e = engine(2)  # one reservation at a time
    e.submit([fixed(1.0, duration=0.2)], 0.0)  # [0, 2.2]
    with pytest.raises(AdmissionError):
        e.submit([fixed(2.25, duration=0.2)], 0.0)  # [1.25, 3.45] overlaps
    e.submit([fixed(3.25, duration=0.2)], 0.0)  # [2.25, 4.45] does not
    assert e.snapshot(0.0).pools[0].reservations == 2


def test_a_conflicting_batch_inserts_nothing() -> None:
    e = engine(2)
    with pytest.raises(AdmissionError) as err:
        e.submit([spec(key="plain"), fixed(5.0), fixed(5.5)], 0.0)
    assert err.value.index == 2
    assert e.get("plain") is None and e.snapshot(0.0).pools[0].reservations == 0


def test_cancelling_frees_the_reservation() -> None:
    e = engine(2)
    [t] = e.submit([fixed(5.0)], 0.0)
    assert e.cancel(t.id, 1.0)
    e.submit([fixed(5.0)], 1.0)


@pytest.mark.parametrize(("tolerance", "ahead"), [(0.1, 1.0), (3.0, 3.0)])
def test_a_worker_is_held_ahead_of_the_start(tolerance: float, ahead: float) -> None:
    e = engine()
    e.add_worker(1, "p", 2, {}, 0.0)
    e.submit([fixed(100.0, tolerance=tolerance)], 0.0)
    e.tick(100.0 - ahead - 0.001)
    assert e.snapshot(100.0 - ahead - 0.001).pools[0].held == 0
    e.tick(100.0 - ahead)
    pool = e.snapshot(100.0 - ahead).pools[0]
    assert (pool.held, pool.busy) == (1, 0)
    e.tick(100.0)
    pool = e.snapshot(100.0).pools[0]
    assert (pool.held, pool.busy) == (0, 1)


def test_held_slots_are_not_given_to_other_work() -> None:
    e = engine(2)
    e.add_worker(1, "p", 2, {}, 0.0)
    [f] = e.submit([fixed(10.0)], 0.0)
    e.tick(9.0)  # one slot held
    a, b = e.submit([spec(), spec()], 9.0)
    first = drain(e).dispatches
    assert [d.task.id for d in first] == [a.id]  # b waits: the other slot is held
    e.tick(10.0)
    assert [d.task.id for d in drain(e).dispatches] == [f.id]
    e.complete(1, first[0].lease, 11.0)
    assert [d.task.id for d in drain(e).dispatches] == [b.id]


def test_a_hold_waits_for_a_slot_and_is_served_before_queued_work() -> None:
    e = engine()
    e.add_worker(1, "p", 1, {}, 0.0)
    e.submit([spec()], 0.0)
    lease = drain(e).dispatches[0]
    [f] = e.submit([fixed(5.0)], 0.0)
    [queued] = e.submit([spec()], 0.0)
    e.tick(4.0)  # the hold is due but the only slot is busy
    e.complete(1, lease.lease, 4.5)
    assert drain(e).dispatches == []  # the freed slot went to the hold, not to the queued task
    assert e.snapshot(4.5).pools[0].held == 1
    e.tick(5.0)
    assert [d.task.id for d in drain(e).dispatches] == [f.id]
    assert task_of(e, queued.id).status is Status.READY


def test_a_hold_moves_when_its_worker_leaves() -> None:
    e = engine()
    e.add_worker(1, "p", 1, {}, 0.0)
    [f] = e.submit([fixed(5.0)], 0.0)
    e.tick(4.0)
    assert e.snapshot(4.0).pools[0].held == 1
    e.remove_worker(1, 4.1)
    e.add_worker(2, "p", 1, {}, 4.2)
    assert e.snapshot(4.2).pools[0].held == 1
    e.tick(5.0)
    [d] = drain(e).dispatches
    assert (d.task.id, d.worker_id) == (f.id, 2)


def test_on_miss_skip_misses_at_exactly_start_plus_tolerance() -> None:
    e = engine()
    [t] = e.submit([fixed(10.0, tolerance=2.0, on_miss=MissPolicy.SKIP)], 0.0)
    e.tick(11.999)
    assert task_of(e, t.id).status is Status.READY
    e.tick(12.0)
    task = task_of(e, t.id)
    assert (task.status, task.message, task.finished) == (Status.MISSED, "fixed start missed", 12.0)
    snap = e.snapshot(12.0)
    assert snap.totals.missed == 1 and snap.pending == 0 and snap.pools[0].reservations == 0


def test_a_start_whose_slot_frees_in_the_tick_that_would_miss_it_runs() -> None:
    # The only slot is busy when the worker would be held; at the start (zero tolerance) the busy
    # attempt times out in the same tick: the start runs, it is not judged missed first.
    e = engine()
    e.add_worker(1, "p", 1, {}, 0.0)
    [busy] = e.submit([dataclasses.replace(spec(), timeout=10.0)], 0.0)
    [t] = e.submit([fixed(10.0, tolerance=0.0, on_miss=MissPolicy.SKIP)], 0.0)
    e.tick(9.0)
    e.tick(10.0)
    assert task_of(e, busy.id).status is Status.DEAD_LETTERED
    assert task_of(e, t.id).status is Status.RUNNING


def test_on_miss_fail_fails() -> None:
    e = engine()
    [t] = e.submit([fixed(10.0, on_miss=MissPolicy.FAIL)], 0.0)
    e.tick(11.0)
    task = task_of(e, t.id)
    assert (task.status, task.message) == (Status.FAILED, "fixed start missed")


def test_run_late_runs_when_a_worker_frees_and_counts_as_a_non_hit() -> None:
    e = engine()
    e.submit([fixed(10.0, key="a")], 0.0)
    e.add_worker(1, "p", 1, {}, 0.0)
    e.tick(10.0)
    lease = drain(e).dispatches[0]
    [late] = e.submit([fixed(11.0, key="b")], 0.0)  # its window [10, 13] overlaps a's [9, 12] at max 10
    e.tick(20.0)
    assert task_of(e, late.id).status is Status.READY
    e.complete(1, lease.lease, 20.0)
    assert [d.task.id for d in drain(e).dispatches] == [late.id]
    assert e.snapshot(20.0).pools[0].fixed_start_hit_rate == 0.5


def test_a_start_already_past_at_submit() -> None:
    e = engine()
    e.add_worker(1, "p", 1, {}, 0.0)
    [run] = e.submit([fixed(10.0)], 50.0)
    assert task_of(e, run.id).status is Status.RUNNING
    [skip] = e.submit([fixed(10.0, on_miss=MissPolicy.SKIP)], 50.0)
    assert task_of(e, skip.id).status is Status.MISSED
    assert e.snapshot(50.0).pools[0].fixed_start_hit_rate == 0.0


def test_start_within_tolerance_at_submit_runs_at_once_and_is_a_hit() -> None:
    e = engine()
    e.add_worker(1, "p", 1, {}, 0.0)
    [t] = e.submit([fixed(10.0, tolerance=1.0)], 10.5)
    assert task_of(e, t.id).status is Status.RUNNING
    assert e.snapshot(10.5).pools[0].fixed_start_hit_rate == 1.0


def test_fixed_start_behind_a_dependency() -> None:
    e = engine()
    e.add_worker(1, "p", 1, {}, 0.0)
    e.submit([spec(key="a")], 0.0)
    lease = drain(e).dispatches[0]
    [t] = e.submit([dataclasses.replace(fixed(10.0), deps=(DepEdge("a"),))], 0.0)
    assert task_of(e, t.id).status is Status.BLOCKED
    e.complete(1, lease.lease, 3.0)
    assert task_of(e, t.id).status is Status.SCHEDULED
    e.tick(10.0)
    assert task_of(e, t.id).status is Status.RUNNING


def test_labelled_fixed_start_holds_a_matching_worker() -> None:
    e = engine()
    e.add_worker(1, "p", 1, {}, 0.0)
    e.add_worker(2, "p", 1, {"gpu": "a100"}, 0.0)
    e.submit([fixed(5.0, labels={"gpu": "a100"})], 0.0)
    e.tick(4.0)
    e.tick(5.0)
    [d] = drain(e).dispatches
    assert d.worker_id == 2


def test_reservations_use_the_learned_run_time_of_the_kind() -> None:
    e = engine(2)  # one reservation at a time
    e.add_worker(1, "p", 1, {}, 0.0)
    e.submit([dataclasses.replace(spec(), kind="render")], 0.0)
    e.complete(1, drain(e).dispatches[0].lease, 10.0)  # render takes 10 s
    e.submit([dataclasses.replace(fixed(100.0), kind="render")], 10.0)  # [99, 111]
    e.submit([fixed(97.0)], 10.0)  # other kinds still use default_duration: [96, 99] touches only
    with pytest.raises(AdmissionError):
        e.submit([dataclasses.replace(fixed(109.0), kind="other")], 10.0)  # [108, 111] overlaps
