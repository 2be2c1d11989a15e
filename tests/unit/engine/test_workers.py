"""Workers: granted slots, labels, spreading, draining, disconnects, groups."""

from __future__ import annotations

from collections import Counter

import pytest

from cronoq.engine import PoolConfig, Status

from .helpers import FIXED, NO_RETRY, drain, make_engine, spec, task_of


@pytest.mark.parametrize(
    ("requested", "pool_max", "per_worker", "granted"),
    [(4, 10, None, 4), (40, 10, None, 10), (40, 10, 3, 3), (2, 10, 3, 2), (-5, 10, None, 0)],
)
def test_granted_slots_are_capped_by_pool_max_and_max_slots_per_worker(
    requested: int, pool_max: int, per_worker: int | None, granted: int
) -> None:
    engine = make_engine(PoolConfig("p", max=pool_max, max_slots_per_worker=per_worker))
    assert engine.add_worker(1, "p", requested, {}, 0.0) == granted
    assert engine.set_worker_slots(1, requested, 0.0) == granted
    assert engine.snapshot(0.0).pools[0].capacity == granted


def test_a_worker_never_gets_more_leases_than_its_slots() -> None:
    engine = make_engine()
    engine.submit([spec() for _ in range(10)], 0.0)
    engine.add_worker(1, "p", 3, {}, 0.0)
    assert len(drain(engine).dispatches) == 3
    assert engine.workers()[0].busy == 3
    engine.submit([spec()], 0.0)
    assert drain(engine).dispatches == []


def test_capacity_is_the_sum_of_the_pools_workers_slots() -> None:
    engine = make_engine(PoolConfig("p"), PoolConfig("q"))
    engine.add_worker(1, "p", 2, {}, 0.0)
    engine.add_worker(2, "p", 3, {"zone": "a"}, 0.0)
    engine.add_worker(3, "q", 4, {}, 0.0)
    pools = engine.snapshot(0.0).pools
    assert [(p.capacity, p.workers_connected) for p in pools] == [(5, 2), (4, 1)]
    assert engine.snapshot(0.0).workers_connected == 3


def test_tasks_are_spread_round_robin_over_workers_with_free_slots() -> None:
    engine = make_engine()
    for wid in (1, 2, 3):
        engine.add_worker(wid, "p", 4, {}, 0.0)
    engine.submit([spec() for _ in range(9)], 0.0)
    per_worker = Counter(d.worker_id for d in drain(engine).dispatches)
    assert per_worker == {1: 3, 2: 3, 3: 3}


def test_labelled_tasks_go_only_to_workers_having_all_their_labels() -> None:
    engine = make_engine()
    engine.add_worker(1, "p", 5, {"gpu": "a100"}, 0.0)
    engine.add_worker(2, "p", 5, {"gpu": "a100", "zone": "eu"}, 0.0)
    engine.add_worker(3, "p", 5, {"zone": "eu"}, 0.0)
    engine.submit([spec(labels={"gpu": "a100", "zone": "eu"}) for _ in range(3)], 0.0)
    engine.submit([spec(labels={"gpu": "a100"}) for _ in range(4)], 0.0)
    engine.submit([spec(labels={"gpu": "h100"})], 0.0)
    dispatches = drain(engine).dispatches
    both = [d.worker_id for d in dispatches if len(d.task.spec.labels) == 2]
    gpu = [d.worker_id for d in dispatches if d.task.spec.labels == {"gpu": "a100"}]
    assert set(both) == {2} and len(both) == 3
    assert set(gpu) <= {1, 2} and len(gpu) == 4
    assert not any(d.task.spec.labels == {"gpu": "h100"} for d in dispatches)


def test_unlabelled_tasks_go_to_any_worker() -> None:
    engine = make_engine()
    engine.add_worker(1, "p", 1, {"gpu": "a100"}, 0.0)
    engine.submit([spec()], 0.0)
    assert [d.worker_id for d in drain(engine).dispatches] == [1]


def test_a_labelled_task_waits_for_a_matching_worker() -> None:
    engine = make_engine()
    engine.add_worker(1, "p", 1, {}, 0.0)
    [gpu] = engine.submit([spec(labels={"gpu": "1"})], 0.0)
    assert drain(engine).dispatches == []
    engine.add_worker(2, "p", 1, {"gpu": "1", "mem": "high"}, 1.0)
    [lease] = drain(engine).dispatches
    assert (lease.task.id, lease.worker_id) == (gpu.id, 2)


def test_set_worker_slots_zero_drains_running_leases_continue() -> None:
    engine = make_engine()
    engine.add_worker(1, "p", 2, {}, 0.0)
    engine.submit([spec() for _ in range(4)], 0.0)
    running = drain(engine).dispatches
    assert engine.set_worker_slots(1, 0, 1.0) == 0
    assert engine.complete(1, running[0].lease, 1.0)
    assert drain(engine).dispatches == []
    assert engine.workers()[0].busy == 1
    assert engine.snapshot(1.0).pools[0].capacity == 0
    engine.set_worker_slots(1, 2, 2.0)
    assert len(drain(engine).dispatches) == 1  # one slot still busy


def test_lowering_slots_below_busy_gives_no_new_leases_until_below() -> None:
    engine = make_engine()
    engine.add_worker(1, "p", 3, {}, 0.0)
    engine.submit([spec() for _ in range(6)], 0.0)
    running = drain(engine).dispatches
    engine.set_worker_slots(1, 1, 0.0)
    engine.complete(1, running[0].lease, 0.0)
    engine.complete(1, running[1].lease, 0.0)
    assert drain(engine).dispatches == []
    engine.complete(1, running[2].lease, 0.0)
    assert len(drain(engine).dispatches) == 1


def test_remove_worker_fails_its_leases_as_retryable_and_retries_them_elsewhere() -> None:
    engine = make_engine(PoolConfig("p", retry=FIXED))
    engine.add_worker(1, "p", 1, {}, 0.0)
    [sub] = engine.submit([spec()], 0.0)
    [lease] = drain(engine).dispatches
    engine.add_worker(2, "p", 1, {}, 0.0)
    engine.remove_worker(1, 5.0)
    task = task_of(engine, sub.id)
    assert (task.status, task.message) == (Status.RETRYING, "worker disconnected")
    assert not drain(engine).aborts  # the stream is gone: nothing to tell it
    assert not engine.complete(1, lease.lease, 5.0)
    engine.tick(6.0)
    [retry] = drain(engine).dispatches
    assert (retry.worker_id, retry.attempt, retry.task.id) == (2, 2, sub.id)
    assert [w.id for w in engine.workers()] == [2]
    engine.remove_worker(1, 7.0)  # a second close is harmless


def test_remove_worker_on_the_last_attempt_dead_letters() -> None:
    engine = make_engine()
    engine.add_worker(1, "p", 1, {}, 0.0)
    [sub] = engine.submit([spec(retry=NO_RETRY)], 0.0)
    engine.remove_worker(1, 1.0)
    task = task_of(engine, sub.id)
    assert (task.status, task.message) == (Status.DEAD_LETTERED, "worker disconnected")


def test_worker_ids_are_unique_and_pools_must_exist() -> None:
    engine = make_engine()
    engine.add_worker(1, "p", 1, {}, 0.0)
    with pytest.raises(ValueError):
        engine.add_worker(1, "p", 1, {}, 0.0)
    with pytest.raises(ValueError):
        engine.add_worker(2, "nope", 1, {}, 0.0)
    with pytest.raises(KeyError):
        engine.set_worker_slots(9, 1, 0.0)


def test_groups_by_exact_label_set_in_snapshot_and_views() -> None:
    engine = make_engine()
    engine.add_worker(1, "p", 2, {"zone": "a"}, 0.0)
    engine.add_worker(2, "p", 3, {"zone": "a"}, 0.0)
    engine.add_worker(3, "p", 4, {}, 0.0)
    engine.submit([spec(labels={"zone": "a"})], 0.0)
    groups = engine.snapshot(0.0).pools[0].groups
    assert [(g.labels, g.capacity, g.busy) for g in groups] == [({"zone": "a"}, 5, 1), ({}, 4, 0)]
    views = engine.workers()
    assert [(v.id, v.pool, v.labels, v.slots) for v in views] == [
        (1, "p", {"zone": "a"}, 2),
        (2, "p", {"zone": "a"}, 3),
        (3, "p", {}, 4),
    ]
    assert sum(v.busy for v in views) == 1
    engine.remove_worker(3, 1.0)
    assert [g.labels for g in engine.snapshot(1.0).pools[0].groups] == [{"zone": "a"}]
