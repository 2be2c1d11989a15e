"""Pool bounds: max_pending with overflow wait, reject, shed_lowest and shed_oldest."""

from __future__ import annotations

import pytest

from cronoq.engine import AdmissionError, Engine, Overflow, PoolConfig, Priority, Status

from .helpers import FIXED, drain, make_engine, only_dispatch, spec, task_of

C, H, N, L = Priority.CRITICAL, Priority.HIGH, Priority.NORMAL, Priority.LOW


def bounded(overflow: Overflow, limit: int = 3) -> Engine:
    return make_engine(PoolConfig("p", max_pending=limit, overflow=overflow, retry=FIXED))


def refused_code(engine: Engine, priority: Priority) -> str:
    with pytest.raises(AdmissionError) as err:
        engine.submit([spec(priority=priority)], 1.0)
    return err.value.code


def test_wait_answers_full_so_the_server_parks_the_submission() -> None:
    engine = bounded(Overflow.WAIT, 2)
    engine.submit([spec(), spec()], 0.0)
    with pytest.raises(AdmissionError) as err:
        engine.submit([spec(), spec()], 1.0)
    assert (err.value.code, err.value.index, err.value.limit) == ("full", 0, "max_pending")
    assert engine.pending_count("p") == 2


def test_running_tasks_do_not_count_as_pending() -> None:
    engine = bounded(Overflow.WAIT, 1)
    engine.submit([spec()], 0.0)
    engine.add_worker(1, "p", 1, {}, 0.0)
    assert engine.pending_count("p") == 0
    engine.submit([spec()], 0.0)
    assert refused_code(engine, N) == "full"


def test_unbounded_pool_accepts_any_number() -> None:
    engine = make_engine(PoolConfig("p", max_pending=None))
    engine.submit([spec() for _ in range(1000)], 0.0)
    assert engine.pending_count("p") == 1000


def test_reject_answers_overloaded() -> None:
    engine = bounded(Overflow.REJECT, 1)
    engine.submit([spec()], 0.0)
    with pytest.raises(AdmissionError) as err:
        engine.submit([spec(priority=C)], 1.0)
    assert (err.value.code, err.value.limit) == ("overloaded", "max_pending")


def test_shed_lowest_evicts_the_newest_pending_task_of_the_lowest_class_below() -> None:
    engine = bounded(Overflow.SHED_LOWEST, 4)
    old_low, new_low, normal, _ = engine.submit([spec(priority=p) for p in (L, L, N, H)], 0.0)
    drain(engine)
    [high] = engine.submit([spec(priority=H)], 1.0)
    events = drain(engine).events
    assert (events[0].id, events[0].status, events[0].message) == (
        new_low.id,
        Status.SHED,
        "shed under overload",
    )
    assert task_of(engine, old_low.id).status is Status.READY
    [_] = engine.submit([spec(priority=N)], 2.0)  # the other Low goes next
    assert task_of(engine, old_low.id).status is Status.SHED
    [_] = engine.submit([spec(priority=H)], 3.0)  # no Low left: the newest Normal
    assert task_of(engine, normal.id).status is Status.READY
    assert task_of(engine, high.id).status is Status.READY
    assert engine.snapshot(3.0).totals.shed == 3
    assert engine.pending_count("p") == 4


def test_shed_lowest_never_sheds_the_same_or_a_higher_class() -> None:
    engine = bounded(Overflow.SHED_LOWEST, 2)
    engine.submit([spec(priority=N), spec(priority=H)], 0.0)
    assert refused_code(engine, N) == "overloaded"
    assert refused_code(engine, L) == "overloaded"
    assert engine.snapshot(1.0).totals.shed == 0


def test_shed_oldest_evicts_the_oldest_pending_low_task_whatever_comes_in() -> None:
    engine = bounded(Overflow.SHED_OLDEST, 3)
    first, second, _ = engine.submit([spec(priority=L), spec(priority=L), spec(priority=N)], 0.0)
    engine.submit([spec(priority=L)], 1.0)
    assert task_of(engine, first.id).status is Status.SHED
    engine.submit([spec(priority=H)], 2.0)
    assert task_of(engine, second.id).status is Status.SHED


def test_shed_oldest_without_a_pending_low_task_is_overloaded() -> None:
    engine = bounded(Overflow.SHED_OLDEST, 2)
    engine.submit([spec(priority=N), spec(priority=H)], 0.0)
    assert refused_code(engine, C) == "overloaded"


def test_a_retrying_task_is_pending_and_can_be_shed() -> None:
    engine = bounded(Overflow.SHED_LOWEST, 1)
    [low] = engine.submit([spec(priority=L)], 0.0)
    engine.add_worker(1, "p", 1, {}, 0.0)
    lease = only_dispatch(engine)
    engine.remove_worker(1, 1.0)
    assert task_of(engine, low.id).status is Status.RETRYING
    engine.submit([spec(priority=N)], 1.0)
    assert task_of(engine, low.id).status is Status.SHED
    engine.tick(100.0)  # its retry timer no longer applies
    assert task_of(engine, low.id).status is Status.SHED
    assert lease.attempt == 1


def test_a_batch_may_shed_its_own_earlier_tasks_as_one_by_one_submission_would() -> None:
    engine = bounded(Overflow.SHED_OLDEST, 2)
    subs = engine.submit([spec(priority=L) for _ in range(5)], 0.0)
    statuses = [task_of(engine, s.id).status for s in subs]
    assert statuses == [Status.SHED] * 3 + [Status.READY] * 2
    events = drain(engine).statuses(subs[0].id)
    assert events == [Status.BLOCKED, Status.READY, Status.SHED]


def test_shed_lowest_in_a_batch_takes_the_batch_low_task_as_the_newest() -> None:
    engine = bounded(Overflow.SHED_LOWEST, 2)
    [existing] = engine.submit([spec(priority=L)], 0.0)
    own_low, high = engine.submit([spec(priority=L), spec(priority=H)], 1.0)
    assert task_of(engine, own_low.id).status is Status.SHED
    assert task_of(engine, existing.id).status is Status.READY
    assert task_of(engine, high.id).status is Status.READY


def test_a_refused_batch_sheds_nothing_and_later_batches_still_find_the_victims() -> None:
    engine = bounded(Overflow.SHED_LOWEST, 2)
    low1, low2 = engine.submit([spec(priority=L), spec(priority=L)], 0.0)
    drain(engine)
    with pytest.raises(AdmissionError) as err:
        engine.submit([spec(priority=H), spec(priority=H), spec(priority=H)], 1.0)
    assert (err.value.code, err.value.index) == ("overloaded", 2)
    assert engine.take_actions() == []
    assert task_of(engine, low1.id).status is Status.READY
    assert task_of(engine, low2.id).status is Status.READY
    engine.submit([spec(priority=H), spec(priority=H)], 2.0)
    assert task_of(engine, low1.id).status is Status.SHED
    assert task_of(engine, low2.id).status is Status.SHED


def test_shed_tasks_are_never_dispatched() -> None:
    engine = bounded(Overflow.SHED_LOWEST, 1)
    [low] = engine.submit([spec(priority=L)], 0.0)
    [normal] = engine.submit([spec(priority=N)], 0.0)
    engine.add_worker(1, "p", 5, {}, 0.0)
    assert drain(engine).dispatched_ids() == [normal.id]
    assert task_of(engine, low.id).status is Status.SHED


def test_the_shed_index_stays_bounded_under_churn() -> None:
    engine = bounded(Overflow.SHED_LOWEST, 10)
    engine.add_worker(1, "p", 1, {}, 0.0)
    for i in range(2000):
        engine.submit([spec(priority=L)], float(i))
        lease = only_dispatch(engine)
        engine.complete(1, lease.lease, float(i))
    index = engine._pools["p"].shed
    assert index is not None
    assert max(len(heap) for heap in index._heaps) < 200
