"""Dispatch order: class bases, aging, deadline urgency, EDF within a class, FIFO, retried tasks' place."""

from __future__ import annotations

import pytest

from cronoq.engine import Engine, PoolConfig, Priority, TaskSpec
from cronoq.engine.lanes import urgency

from .helpers import FIXED, make_engine, only_dispatch, run_one_at_a_time, spec

C, H, N, L = Priority.CRITICAL, Priority.HIGH, Priority.NORMAL, Priority.LOW


def first_of(engine: Engine, now: float) -> int:
    """Connect a 1-slot worker at ``now`` and return the id of the task it gets."""
    engine.add_worker(1, "p", 1, {}, now)
    return only_dispatch(engine).task.id


def test_classes_go_critical_high_normal_low_and_fifo_within_a_class() -> None:
    engine = make_engine()
    ids = [s.id for s in engine.submit([spec(priority=p) for p in (L, N, H, C, L, N, H, C)], 0.0)]
    engine.add_worker(1, "p", 1, {}, 0.0)
    assert run_one_at_a_time(engine, 1, 0.0) == [
        ids[3],
        ids[7],
        ids[2],
        ids[6],
        ids[1],
        ids[5],
        ids[0],
        ids[4],
    ]


def test_fifo_holds_for_many_tasks_of_one_class() -> None:
    engine = make_engine()
    ids = [s.id for s in engine.submit([spec() for _ in range(50)], 0.0)]
    engine.add_worker(1, "p", 1, {}, 0.0)
    assert run_one_at_a_time(engine, 1, 0.0) == ids


@pytest.mark.parametrize(("extra_wait", "low_wins"), [(43.0, False), (46.5, True)])
def test_a_low_task_overtakes_a_fresh_normal_after_about_45_seconds(
    extra_wait: float, low_wins: bool
) -> None:
    engine = make_engine()
    [low] = engine.submit([spec(priority=L)], 0.0)
    [normal] = engine.submit([spec(priority=N)], extra_wait)
    assert first_of(engine, extra_wait) == (low.id if low_wins else normal.id)


def test_an_aged_low_task_never_overtakes_a_fresh_high() -> None:
    engine = make_engine()
    [_] = engine.submit([spec(priority=L)], 0.0)
    [high] = engine.submit([spec(priority=H)], 100_000.0)
    assert first_of(engine, 100_000.0) == high.id


def test_an_aged_high_task_never_overtakes_a_fresh_critical_even_overdue() -> None:
    engine = make_engine()
    [_] = engine.submit([spec(priority=H, deadline=0.0)], 0.0)
    [critical] = engine.submit([spec(priority=C)], 10_000.0)
    assert first_of(engine, 10_000.0) == critical.id


def test_the_edf_example_from_the_reference() -> None:
    engine = make_engine()
    ids = [s.id for s in engine.submit([spec(), spec(deadline=100.0), spec(deadline=50.0), spec()], 0.0)]
    engine.add_worker(1, "p", 1, {}, 0.0)
    assert run_one_at_a_time(engine, 1, 0.0) == [ids[0], ids[2], ids[1], ids[3]]


def test_urgency_numbers() -> None:
    # window = max(5, estimate); slack = latest start - now
    assert urgency(10.0, 5.0) == 0.0
    assert urgency(5.0, 5.0) == 0.0
    assert urgency(2.5, 5.0) == pytest.approx(2500.0)
    assert urgency(0.0, 20.0) == pytest.approx(5000.0)
    assert urgency(-3.0, 5.0) == pytest.approx(5300.0)
    assert urgency(-1000.0, 5.0) == pytest.approx(8000.0)


def test_an_overdue_low_task_beats_a_fresh_high() -> None:
    engine = make_engine()
    [low] = engine.submit([spec(priority=L, deadline=5.0)], 0.0)
    [_] = engine.submit([spec(priority=H)], 10.0)
    assert first_of(engine, 10.0) == low.id


def test_a_far_deadline_does_not_raise_a_normal_task_above_high() -> None:
    engine = make_engine()
    [_] = engine.submit([spec(priority=N, deadline=100.0)], 0.0)
    [high] = engine.submit([spec(priority=H)], 0.0)
    assert first_of(engine, 0.0) == high.id


def test_urgency_uses_the_duration_hint_for_the_latest_start() -> None:
    engine = make_engine()
    hinted = TaskSpec("p", priority=N, deadline=100.0, duration_hint=99.0)  # latest start 1 s: urgent
    [plain, urgent] = engine.submit([spec(priority=H), hinted], 0.0)
    assert first_of(engine, 0.0) == urgent.id
    assert plain.id != urgent.id


def test_default_duration_sets_the_latest_start_without_a_hint() -> None:
    engine = make_engine(PoolConfig("p", default_duration=99.0))
    [_, urgent] = engine.submit([spec(priority=H), spec(priority=N, deadline=100.0)], 0.0)
    assert first_of(engine, 0.0) == urgent.id


def test_a_retried_task_goes_back_at_its_original_place() -> None:
    engine = make_engine(PoolConfig("p", retry=FIXED))
    first, second = engine.submit([spec(), spec()], 0.0)
    engine.add_worker(1, "p", 1, {}, 0.0)
    lease = only_dispatch(engine)
    assert lease.task.id == first.id
    engine.fail(1, lease.lease, "again", False, None, 0.0)  # first is RETRYING; second runs
    lease = only_dispatch(engine)
    assert lease.task.id == second.id
    [third] = engine.submit([spec()], 0.5)
    engine.tick(1.0)  # first is READY again, ahead of the later third
    engine.complete(1, lease.lease, 1.0)
    assert run_one_at_a_time(engine, 1, 1.0) == [first.id, third.id]


def test_labelled_head_waiting_for_its_worker_does_not_block_others() -> None:
    engine = make_engine()
    [_, plain] = engine.submit([spec(priority=H, labels={"gpu": "1"}), spec(priority=L)], 0.0)
    assert first_of(engine, 0.0) == plain.id


def test_priority_adherence_counts_dispatches_that_pass_over_a_higher_class() -> None:
    engine = make_engine()
    ids = [s.id for s in engine.submit([spec(priority=H) for _ in range(4)], 0.0)]
    [low] = engine.submit([spec(priority=L, deadline=0.0)], 0.0)  # overdue: jumps the High tasks
    engine.add_worker(1, "p", 1, {}, 0.0)
    assert run_one_at_a_time(engine, 1, 0.0) == [low.id, *ids]
    assert engine.snapshot(0.0).pools[0].priority_adherence == pytest.approx(0.8)


def test_priority_adherence_is_one_without_dispatches_and_without_inversions() -> None:
    engine = make_engine()
    assert engine.snapshot(0.0).pools[0].priority_adherence == 1.0
    engine.submit([spec(priority=p) for p in (L, N, H)], 0.0)
    engine.add_worker(1, "p", 1, {}, 0.0)
    run_one_at_a_time(engine, 1, 0.0)
    assert engine.snapshot(0.0).pools[0].priority_adherence == 1.0


def test_cancelled_tasks_in_the_queue_are_skipped() -> None:
    engine = make_engine()
    ids = [s.id for s in engine.submit([spec(), spec(deadline=1.0), spec(), spec(deadline=2.0)], 0.0)]
    engine.cancel(ids[0], 0.0)
    engine.cancel(ids[1], 0.0)
    engine.add_worker(1, "p", 1, {}, 0.0)
    assert run_one_at_a_time(engine, 1, 0.0) == [ids[3], ids[2]]  # the deadline makes ids[3] urgent
