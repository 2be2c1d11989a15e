"""Taking over from a previous leader: ``Engine.restore`` with tasks as a store returns them."""

from __future__ import annotations

import copy
import dataclasses
import random

from cronoq.engine import (
    DepEdge,
    Engine,
    EngineLimits,
    PoolConfig,
    RetryRule,
    Semaphore,
    Status,
    Task,
    Totals,
)

from .helpers import FIXED, drain, spec, task_of

EPOCH2 = (2 << 48) + 1  # the first id a leader of epoch 2 issues


def left_behind() -> list[Task]:
    """Tasks as an old leader (epoch 1) left them: ready, running on attempt 1 and on its last attempt,
    retrying, succeeded with a key, and one of a pool that is gone."""
    first = (1 << 48) + 1
    old = Engine([PoolConfig("p", retry=FIXED), PoolConfig("gone")], rng=random.Random(0), first_id=first)
    old.submit([spec(key="a"), spec(key="b"), spec(key="c", retry=RetryRule(max_attempts=1))], 0.0)
    old.add_worker(1, "p", 3, {}, 1.0)  # a, b and c start
    leases = {d.task.spec.key: d for d in drain(old).dispatches}
    old.complete(1, leases["a"].lease, 2.0)
    old.fail(1, leases["b"].lease, "boom", False, None, 2.0)  # b: RETRYING until 3.0
    old.set_worker_slots(1, 0, 2.0)  # draining: d and e stay READY
    old.submit([spec(key="d"), spec("gone", key="e")], 2.5)
    drain(old)
    tasks = [copy.deepcopy(t) for t in old.list_tasks(pools=None, statuses=None, after=0, limit=100)[0]]
    assert [t.status for t in tasks] == [
        Status.SUCCEEDED,
        Status.RETRYING,
        Status.RUNNING,
        Status.READY,
        Status.READY,
    ]
    for task in tasks:  # what a row keeps: no lease
        task.lease = task.worker = 0
    return tasks


def new_leader() -> Engine:
    return Engine([PoolConfig("p", retry=FIXED)], rng=random.Random(1), first_id=EPOCH2)


def test_restore_requeues_pending_retries_running_and_keeps_finished() -> None:
    engine = new_leader()
    engine.restore(left_behind(), 10.0)
    events = drain(engine).events
    assert task_of(engine, "a").status is Status.SUCCEEDED  # retained: its key still dedups
    [dup] = engine.submit([spec(key="a")], 10.0)
    assert dup.duplicate and dup.id == task_of(engine, "a").id
    b = task_of(engine, "b")
    assert (b.status, b.attempt) == (Status.READY, 1)  # its backoff timer died with the old leader
    c = task_of(engine, "c")  # was running its only attempt
    assert (c.status, c.message) == (Status.DEAD_LETTERED, "attempt lost in failover; retries exhausted")
    assert task_of(engine, "d").status is Status.READY
    e = task_of(engine, "e")
    assert (e.status, e.message) == (Status.FAILED, "pool 'gone' is no longer configured")
    # Every change restore made is an event, so a durable runtime commits it.
    assert {(ev.task.spec.key, ev.status) for ev in events} == {
        ("b", Status.READY),
        ("c", Status.DEAD_LETTERED),
        ("e", Status.FAILED),
    }
    assert engine.pending_count("p") == 2


def test_a_retry_whose_backoff_has_not_ended_waits_it_out_after_a_takeover() -> None:
    """The end of a backoff (a worker's retry_after included) is kept on the task, and so in the store:
    a new leader taking over before it resumes the wait rather than retry at once."""
    engine = new_leader()
    engine.restore(left_behind(), 2.5)  # b's backoff ends at 3.0
    b = task_of(engine, "b")
    assert (b.status, b.attempt, b.ready_at) == (Status.RETRYING, 1, 3.0)
    assert engine.next_wakeup() == 3.0
    engine.tick(3.0)
    assert task_of(engine, "b").status is Status.READY


def test_running_attempt_with_retries_left_is_retried_and_counted() -> None:
    tasks = left_behind()
    running = next(t for t in tasks if t.spec.key == "c")
    running.max_attempts = 3
    engine = new_leader()
    engine.restore(tasks, 10.0)
    c = task_of(engine, "c")
    assert (c.status, c.attempt, c.message) == (Status.RETRYING, 1, "attempt lost in failover")
    wake = engine.next_wakeup()
    assert wake is not None and wake > 10.0  # the usual backoff applies
    engine.add_worker(9, "p", 5, {}, wake)
    engine.tick(wake)
    assert {d.task.spec.key: d.attempt for d in drain(engine).dispatches}["c"] == 2


def test_restored_ready_tasks_dispatch_before_new_ones_and_ids_continue_in_the_new_epoch() -> None:
    engine = new_leader()
    engine.restore(left_behind(), 10.0)
    [new] = engine.submit([spec(key="z")], 10.0)
    assert new.id == EPOCH2
    engine.add_worker(5, "p", 1, {}, 10.0)
    [first] = drain(engine).dispatches
    assert first.task.spec.key in {"b", "d"}  # older work first, never the new "z"


def test_listing_pages_across_the_epoch_gap() -> None:
    engine = new_leader()
    engine.restore(left_behind(), 10.0)
    engine.submit([spec(key=f"n{i}") for i in range(3)], 10.0)
    seen: list[int] = []
    after = 0
    while True:
        page, after = engine.list_tasks(pools=None, statuses=None, after=after, limit=2)
        seen += [t.id for t in page]
        if after == 0:
            break
    assert seen == sorted(seen) and len(seen) == 8
    assert seen[-3:] == [EPOCH2, EPOCH2 + 1, EPOCH2 + 2]


def test_restored_blocked_task_whose_met_target_was_pruned_waits_for_the_rest() -> None:
    old = Engine([PoolConfig("p", retry=FIXED)])
    old.add_worker(1, "p", 1, {}, 0.0)
    [a] = old.submit([spec(key="a")], 0.0)
    [b] = old.submit([spec(key="b", labels={"gpu": "1"})], 0.0)  # no worker can run it yet
    [c] = old.submit([dataclasses.replace(spec(key="c"), deps=(DepEdge(a.id), DepEdge("b")))], 0.0)
    lease = next(d for d in drain(old).dispatches if d.task.id == a.id)
    old.complete(1, lease.lease, 1.0)
    # The store pruned a; b and c survive.
    survivors = [copy.deepcopy(task_of(old, ref)) for ref in (b.id, c.id)]
    new = Engine([PoolConfig("p", retry=FIXED)], first_id=100)
    new.restore(survivors, 2.0)
    assert task_of(new, c.id).status is Status.BLOCKED
    new.add_worker(1, "p", 1, {"gpu": "1"}, 2.0)
    lease_b = next(d for d in drain(new).dispatches if d.task.id == b.id)
    new.complete(1, lease_b.lease, 3.0)
    assert task_of(new, c.id).status is Status.RUNNING


def test_a_task_whose_resource_is_no_longer_configured_fails_instead_of_breaking_dispatch() -> None:
    old = Engine([PoolConfig("p", retry=FIXED)], resources=[Semaphore("gpu", 2), Semaphore("db", 1)])
    gpu = dataclasses.replace(spec(key="ready"), resources={"gpu": 1})
    db = dataclasses.replace(spec(key="db"), resources={"db": 1})
    old.add_worker(1, "p", 1, {}, 0.0)
    old.submit([dataclasses.replace(gpu, key="running"), gpu, db], 0.0)
    drain(old)
    left = [copy.deepcopy(t) for t in old.list_tasks(pools=None, statuses=None, after=0, limit=10)[0]]
    assert [t.status for t in left] == [Status.RUNNING, Status.READY, Status.READY]
    for task in left:
        task.lease = task.worker = 0
    new = Engine([PoolConfig("p", retry=FIXED)], first_id=100, resources=[Semaphore("db", 1)])
    new.restore(left, 10.0)
    for key in ("running", "ready"):
        task = task_of(new, key)
        assert (task.status, task.message) == (
            Status.FAILED,
            "unknown resource 'gpu': it is no longer configured",
        )
    new.add_worker(2, "p", 2, {}, 10.0)  # dispatch goes on: the task that can still run does
    assert [d.task.spec.key for d in drain(new).dispatches] == ["db"]
    assert new.pending_count("p") == 0 and new.snapshot(10.0).totals.failed == 2


def test_restored_finished_tasks_are_retained_from_when_they_finished() -> None:
    old = Engine([PoolConfig("p", retry=FIXED)])
    old.add_worker(1, "p", 2, {}, 0.0)
    old.submit([spec(key="early"), spec(key="late")], 0.0)
    leases = {d.task.spec.key: d.lease for d in drain(old).dispatches}
    old.complete(1, leases["late"], 50.0)
    old.complete(1, leases["early"], 10.0)  # finish order is not id order
    finished = [copy.deepcopy(task_of(old, key)) for key in ("early", "late")]
    new = Engine([PoolConfig("p", retry=FIXED)], first_id=100, limits=EngineLimits(key_retention=100.0))
    new.restore(finished, 90.0)
    assert new.next_wakeup() == 110.0  # when "early" expires, not 190
    new.tick(110.0)
    assert new.get("early") is None and task_of(new, "late").status is Status.SUCCEEDED
    new.tick(150.0)
    assert new.get("late") is None


def test_totals_count_on_from_the_previous_leaders() -> None:
    """A new leader's totals start where the previous leader's last commit left them, so a snapshot
    never goes back across a failover; what restoring counts itself (a lost attempt, a task of a pool
    that is gone) comes on top, and counting goes on from there."""
    before = Totals(
        submitted=35, dispatched=30, succeeded=20, failed=3, dead_lettered=1, cancelled=2, skipped=1,
        missed=1, shed=1, retries=4, timeouts=1, lease_expiries=2, stale_completions=3,
        recurring_conflicts=1, recurring_invalid=1, recurring_skipped=2,
    )  # fmt: skip
    alone = new_leader()
    alone.restore(left_behind(), 10.0)
    engine = new_leader()
    engine.restore(left_behind(), 10.0, totals=before)
    restored = alone.totals()
    assert restored.dead_lettered == 1 and restored.failed == 1  # c's attempt was lost; e's pool is gone
    assert engine.totals() == Totals(
        **{f.name: getattr(before, f.name) + getattr(restored, f.name) for f in dataclasses.fields(Totals)}
    )
    engine.submit([spec(key="z")], 10.0)
    assert engine.snapshot(10.0).totals.submitted == 36
