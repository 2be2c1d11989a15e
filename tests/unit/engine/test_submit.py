"""Submission: events, ids, atomic batches, key dedup and retention, lookups and listing."""

from __future__ import annotations

import pytest

from cronoq.engine import AdmissionError, EngineLimits, PoolConfig, Priority, RetryRule, Status

from .helpers import drain, make_engine, spec, task_of


def test_every_task_emits_blocked_then_ready_with_attempt_zero() -> None:
    engine = make_engine()
    [sub] = engine.submit([spec()], 5.0)
    events = drain(engine).events
    assert [(e.status, e.attempt, e.at) for e in events] == [(Status.BLOCKED, 0, 5.0), (Status.READY, 0, 5.0)]
    task = task_of(engine, sub.id)
    assert task.status is Status.READY and task.created == 5.0 and task.ready_at == 5.0


def test_ids_start_at_first_id_and_ascend_in_batch_order() -> None:
    engine = make_engine()
    engine_ids = [s.id for s in engine.submit([spec(), spec(), spec()], 0.0)]
    assert engine_ids == [1, 2, 3]
    other = type(engine)([PoolConfig("p")], first_id=1000)
    assert [s.id for s in other.submit([spec(), spec()], 0.0)] == [1000, 1001]


def test_max_attempts_comes_from_task_policy_else_pool_policy() -> None:
    engine = make_engine(PoolConfig("p", retry=RetryRule(max_attempts=7)))
    own, pooled = engine.submit([spec(retry=RetryRule(max_attempts=2)), spec()], 0.0)
    assert task_of(engine, own.id).max_attempts == 2
    assert task_of(engine, pooled.id).max_attempts == 7


def test_unknown_pool_names_the_pool_and_the_index() -> None:
    engine = make_engine()
    with pytest.raises(AdmissionError) as err:
        engine.submit([spec(), spec("nope")], 0.0)
    assert (err.value.code, err.value.message, err.value.index) == ("unknown_pool", "unknown pool 'nope'", 1)


def test_a_refused_batch_inserts_nothing_and_emits_nothing() -> None:
    engine = make_engine()
    with pytest.raises(AdmissionError):
        engine.submit([spec(key="a"), spec(), spec("nope")], 0.0)
    assert engine.take_actions() == []
    assert engine.get("a") is None and engine.get(1) is None
    assert engine.pending_count("p") == 0
    assert engine.snapshot(0.0).totals.submitted == 0
    # ids are not consumed by a refused batch
    assert engine.submit([spec()], 0.0)[0].id == 1


def test_duplicate_key_within_a_batch_is_refused() -> None:
    engine = make_engine()
    with pytest.raises(AdmissionError) as err:
        engine.submit([spec(key="k"), spec(key="other"), spec(key="k")], 0.0)
    assert (err.value.code, err.value.index) == ("duplicate_key_in_batch", 2)
    assert engine.get("k") is None


def test_key_of_a_live_task_returns_the_existing_task_and_ignores_the_new_spec() -> None:
    engine = make_engine()
    [first] = engine.submit([spec(key="k", priority=Priority.LOW)], 0.0)
    drain(engine)
    again = engine.submit([spec(key="k", priority=Priority.CRITICAL), spec()], 1.0)
    assert (again[0].id, again[0].duplicate) == (first.id, True)
    assert again[1].duplicate is False
    assert task_of(engine, "k").spec.priority is Priority.LOW
    assert {e.id for e in drain(engine).events} == {again[1].id}
    assert engine.snapshot(1.0).totals.submitted == 2


def test_key_of_a_retained_finished_task_is_a_duplicate_until_retention_ends() -> None:
    engine = make_engine(limits=EngineLimits(key_retention=100.0))
    [first] = engine.submit([spec(key="k")], 0.0)
    engine.cancel("k", 10.0)
    [dup] = engine.submit([spec(key="k")], 109.0)
    assert (dup.id, dup.duplicate) == (first.id, True)
    assert engine.next_wakeup() == 110.0
    engine.tick(110.0)
    assert engine.get("k") is None and engine.get(first.id) is None
    [fresh] = engine.submit([spec(key="k")], 111.0)
    assert fresh.duplicate is False and fresh.id != first.id
    assert task_of(engine, "k").id == fresh.id


def test_retention_keeps_at_most_key_retention_max_finished_tasks_oldest_out() -> None:
    engine = make_engine(limits=EngineLimits(key_retention_max=2))
    ids = [s.id for s in engine.submit([spec(key=f"k{i}") for i in range(3)], 0.0)]
    for i, task_id in enumerate(ids):
        engine.cancel(task_id, float(i))
    assert engine.get(ids[0]) is None and engine.get("k0") is None
    assert engine.get(ids[1]) is not None and engine.get("k2") is not None
    assert engine.submit([spec(key="k0")], 5.0)[0].duplicate is False
    assert engine.submit([spec(key="k1")], 5.0)[0].duplicate is True


def test_a_record_outlives_its_key_up_to_its_own_retention() -> None:
    """``[outputs] info_entries`` and ``keep_finished_s`` keep finished tasks known for lookups after their
    keys stop deduplicating (key_retention_s is shorter)."""
    limits = EngineLimits(key_retention=100.0, record_retention=1000.0)
    engine = make_engine(limits=limits)
    [first] = engine.submit([spec(key="k")], 0.0)
    engine.cancel("k", 10.0)
    assert engine.next_wakeup() == 110.0  # the key goes first
    engine.tick(110.0)
    assert engine.get("k") is None and task_of(engine, first.id).status is Status.CANCELLED
    [fresh] = engine.submit([spec(key="k")], 111.0)
    assert fresh.duplicate is False and task_of(engine, "k").id == fresh.id
    listed, _ = engine.list_tasks(pools=None, statuses=None, after=0, limit=10)
    assert [t.id for t in listed] == [first.id, fresh.id]
    assert engine.next_wakeup() == 1010.0
    engine.tick(1010.0)
    assert engine.get(first.id) is None and task_of(engine, "k").id == fresh.id


def test_records_beyond_record_max_go_oldest_first_and_take_their_keys() -> None:
    engine = make_engine(limits=EngineLimits(key_retention_max=1, record_max=2))
    ids = [s.id for s in engine.submit([spec(key=f"k{i}") for i in range(3)], 0.0)]
    for i, task_id in enumerate(ids):
        engine.cancel(task_id, float(i))
    assert engine.get(ids[0]) is None  # beyond record_max
    assert engine.get(ids[1]) is not None and engine.get("k1") is None  # record kept, key gone
    assert engine.get("k2") is not None
    assert engine.submit([spec(key="k1")], 5.0)[0].duplicate is False
    assert engine.submit([spec(key="k2")], 5.0)[0].duplicate is True


def test_finished_tasks_drop_their_payload() -> None:
    engine = make_engine()
    [sub] = engine.submit([spec(payload=b"big" * 100)], 0.0)
    assert task_of(engine, sub.id).spec.payload == b"big" * 100
    engine.cancel(sub.id, 1.0)
    assert task_of(engine, sub.id).spec.payload is None


def test_global_bound_on_pending_tasks_is_overloaded() -> None:
    engine = make_engine(PoolConfig("a"), PoolConfig("b"), limits=EngineLimits(max_pending_total=3))
    engine.submit([spec("a"), spec("b")], 0.0)
    with pytest.raises(AdmissionError) as err:
        engine.submit([spec("a"), spec("b")], 0.0)
    assert (err.value.code, err.value.index, err.value.limit) == ("overloaded", 1, "max_pending_total")
    assert engine.pending_count("a") + engine.pending_count("b") == 2
    engine.submit([spec("b")], 0.0)


def test_duplicates_do_not_count_against_bounds() -> None:
    engine = make_engine(PoolConfig("p", max_pending=1))
    engine.submit([spec(key="k")], 0.0)
    assert engine.submit([spec(key="k")], 0.0)[0].duplicate is True


def test_get_by_key_and_by_id() -> None:
    engine = make_engine()
    [sub] = engine.submit([spec(key="named")], 0.0)
    assert engine.get("named") is engine.get(sub.id)
    assert engine.get("missing") is None and engine.get(999) is None


def test_list_tasks_pages_in_id_order_with_filters() -> None:
    engine = make_engine(PoolConfig("a"), PoolConfig("b"))
    subs = engine.submit([spec("a" if i % 2 else "b") for i in range(7)], 0.0)
    ids = [s.id for s in subs]
    engine.cancel(ids[1], 0.0)
    page, nxt = engine.list_tasks(pools=None, statuses=None, after=0, limit=3)
    assert [t.id for t in page] == ids[:3] and nxt == ids[2]
    page, nxt = engine.list_tasks(pools=None, statuses=None, after=nxt, limit=3)
    assert [t.id for t in page] == ids[3:6] and nxt == ids[5]
    page, nxt = engine.list_tasks(pools=None, statuses=None, after=nxt, limit=3)
    assert [t.id for t in page] == ids[6:] and nxt == 0
    page, nxt = engine.list_tasks(pools=["a"], statuses=[Status.READY], after=0, limit=10)
    assert [t.id for t in page] == [ids[3], ids[5]] and nxt == 0
    page, nxt = engine.list_tasks(pools=["a"], statuses=None, after=0, limit=3)
    assert [t.id for t in page] == [ids[1], ids[3], ids[5]] and nxt == 0  # exactly full: last page


def test_list_tasks_skips_pruned_tasks_and_rejects_bad_limits() -> None:
    engine = make_engine(limits=EngineLimits(key_retention_max=1))
    ids = [s.id for s in engine.submit([spec() for _ in range(4)], 0.0)]
    for task_id in ids[:3]:
        engine.cancel(task_id, 0.0)
    page, _ = engine.list_tasks(pools=None, statuses=None, after=0, limit=10)
    assert [t.id for t in page] == ids[2:]
    with pytest.raises(ValueError):
        engine.list_tasks(pools=None, statuses=None, after=0, limit=0)


def test_pools_are_reported_in_configuration_order() -> None:
    engine = make_engine(PoolConfig("z"), PoolConfig("a"))
    assert engine.pool_names == ["z", "a"]
    assert engine.has_pool("a") and not engine.has_pool("b")
    assert engine.pool_config("a").name == "a"
    with pytest.raises(ValueError):
        make_engine(PoolConfig("a"), PoolConfig("a"))
    with pytest.raises(ValueError):
        type(engine)([])
