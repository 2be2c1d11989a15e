"""Dependencies: the edge table, the skip cascade, unknown targets (reject / await), cycles and atomic
batches whose tasks depend on each other."""

from __future__ import annotations

import dataclasses

import pytest

from cronoq.engine import (
    AdmissionError,
    DepEdge,
    DepOn,
    Engine,
    Overflow,
    PoolConfig,
    Priority,
    Status,
    TaskSpec,
    UnknownDependency,
)

from .helpers import FIXED, NO_RETRY, drain, make_engine, spec, task_of


def with_deps(base: TaskSpec, *deps: DepEdge) -> TaskSpec:
    return dataclasses.replace(base, deps=tuple(deps))


def end_as(engine: Engine, task_id: int, status: Status, now: float = 1.0) -> None:
    """Drive ``task_id`` (running on worker 1) to ``status``."""
    lease = next(d for d in drain(engine).dispatches if d.task.id == task_id)
    if status is Status.SUCCEEDED:
        engine.complete(1, lease.lease, now)
    elif status is Status.FAILED:
        engine.fail(1, lease.lease, "no", True, None, now)
    elif status is Status.DEAD_LETTERED:
        engine.fail(1, lease.lease, "no", False, None, now)
    elif status is Status.CANCELLED:
        engine.cancelled(1, lease.lease, now)
    else:
        raise AssertionError(status)


EDGE_TABLE = [
    # target ends as, edge, dependent becomes
    (Status.SUCCEEDED, DepOn.SUCCESS, Status.READY),
    (Status.SUCCEEDED, DepOn.FAILURE, Status.SKIPPED),
    (Status.SUCCEEDED, DepOn.COMPLETE, Status.READY),
    (Status.FAILED, DepOn.SUCCESS, Status.SKIPPED),
    (Status.FAILED, DepOn.FAILURE, Status.READY),
    (Status.FAILED, DepOn.COMPLETE, Status.READY),
    (Status.DEAD_LETTERED, DepOn.SUCCESS, Status.SKIPPED),
    (Status.DEAD_LETTERED, DepOn.FAILURE, Status.READY),
    (Status.DEAD_LETTERED, DepOn.COMPLETE, Status.READY),
    (Status.CANCELLED, DepOn.SUCCESS, Status.SKIPPED),
    (Status.CANCELLED, DepOn.FAILURE, Status.SKIPPED),
    (Status.CANCELLED, DepOn.COMPLETE, Status.READY),
]


@pytest.mark.parametrize(("target_end", "on", "expected"), EDGE_TABLE)
def test_edge_table_for_a_live_target(target_end: Status, on: DepOn, expected: Status) -> None:
    engine = make_engine(PoolConfig("p", retry=NO_RETRY))
    engine.add_worker(1, "p", 1, {}, 0.0)
    [a] = engine.submit([spec(key="a")], 0.0)
    [b] = engine.submit([with_deps(spec(), DepEdge("a", on))], 0.0)
    assert task_of(engine, b.id).status is Status.BLOCKED
    end_as(engine, a.id, target_end)
    dependent = task_of(engine, b.id)
    if expected is Status.READY:  # READY, then dispatched on the worker the target freed
        assert dependent.status is Status.RUNNING
    else:
        assert dependent.status is expected
        assert dependent.message == f"dependency {a.id} ended as {target_end.label}"


@pytest.mark.parametrize(("target_end", "on", "expected"), EDGE_TABLE)
def test_edge_table_for_a_target_already_ended_at_submit(
    target_end: Status, on: DepOn, expected: Status
) -> None:
    engine = make_engine(PoolConfig("p", retry=NO_RETRY))
    engine.add_worker(1, "p", 1, {}, 0.0)
    [a] = engine.submit([spec(key="a")], 0.0)
    end_as(engine, a.id, target_end)
    drain(engine)
    [b] = engine.submit([with_deps(spec(), DepEdge(a.id, on))], 2.0)
    dependent = task_of(engine, b.id)
    if expected is Status.READY:
        assert dependent.status is Status.RUNNING
    else:
        assert dependent.status is expected
        assert dependent.message == f"dependency ended as {target_end.label}"


def test_every_task_emits_blocked_first_and_waits_for_all_edges() -> None:
    engine = make_engine()
    engine.add_worker(1, "p", 2, {}, 0.0)
    [a, b] = engine.submit([spec(key="a"), spec(key="b")], 0.0)
    [c] = engine.submit([with_deps(spec(key="c"), DepEdge("a"), DepEdge(b.id))], 0.0)
    actions = drain(engine)
    assert actions.statuses(c.id) == [Status.BLOCKED]
    leases = {d.task.id: d.lease for d in actions.dispatches}
    engine.complete(1, leases[a.id], 1.0)
    assert task_of(engine, c.id).status is Status.BLOCKED  # b has not ended yet
    engine.complete(1, leases[b.id], 2.0)
    assert drain(engine).statuses(c.id) == [Status.READY, Status.RUNNING]


def test_skips_cascade_through_a_long_chain_without_recursion() -> None:
    engine = make_engine(PoolConfig("p", retry=NO_RETRY))
    specs = [spec(key="k0")] + [with_deps(spec(key=f"k{i}"), DepEdge(f"k{i - 1}")) for i in range(1, 3000)]
    submitted = engine.submit(specs, 0.0)
    assert engine.cancel("k0", 1.0)
    tasks = [task_of(engine, s.id) for s in submitted]
    assert tasks[0].status is Status.CANCELLED
    assert all(t.status is Status.SKIPPED for t in tasks[1:])
    assert tasks[2].message == f"dependency {submitted[1].id} ended as skipped"
    assert engine.snapshot(1.0).pending == 0


def test_complete_edges_run_after_a_skipped_target() -> None:
    engine = make_engine(PoolConfig("p", retry=NO_RETRY))
    engine.add_worker(1, "p", 1, {}, 0.0)
    [a] = engine.submit([spec(key="a")], 0.0)
    [b, c] = engine.submit(
        [
            with_deps(spec(key="b"), DepEdge("a", DepOn.SUCCESS)),
            with_deps(spec(key="c"), DepEdge("b", DepOn.COMPLETE)),
        ],
        0.0,
    )
    end_as(engine, a.id, Status.FAILED)
    assert task_of(engine, b.id).status is Status.SKIPPED
    assert task_of(engine, c.id).status is Status.RUNNING


def test_cancelling_a_blocked_task_releases_nothing_else() -> None:
    engine = make_engine()
    engine.add_worker(1, "p", 1, {}, 0.0)
    [a] = engine.submit([spec(key="a")], 0.0)
    [b] = engine.submit([with_deps(spec(key="b"), DepEdge("a"))], 0.0)
    assert engine.cancel(b.id, 0.5)
    assert task_of(engine, b.id).status is Status.CANCELLED
    end_as(engine, a.id, Status.SUCCEEDED)
    assert task_of(engine, b.id).status is Status.CANCELLED
    snap = engine.snapshot(2.0)
    assert snap.pending == 0 and snap.pools[0].pending_by_class == [0, 0, 0, 0]


def test_unknown_dependency_is_rejected_by_default_naming_it() -> None:
    engine = make_engine()
    with pytest.raises(AdmissionError) as err:
        engine.submit([spec(key="ok"), with_deps(spec(), DepEdge("nope"))], 0.0)
    assert (err.value.code, err.value.message, err.value.index, err.value.field) == (
        "unknown_dependency",
        "unknown dependency 'nope'",
        1,
        ".deps[0].key",
    )
    with pytest.raises(AdmissionError) as by_id:
        engine.submit([with_deps(spec(), DepEdge(12345))], 0.0)
    assert (by_id.value.code, by_id.value.field) == ("unknown_dependency", ".deps[0].id")
    assert engine.get("ok") is None and engine.snapshot(0.0).live_tasks == 0


def test_the_refused_edge_is_named_when_an_awaited_key_comes_first() -> None:
    """An unknown key may be awaited; the unknown id after it is the edge refused, and named so."""
    engine = make_engine(PoolConfig("p", retry=FIXED, unknown_dependency=UnknownDependency.AWAIT))
    with pytest.raises(AdmissionError) as err:
        engine.submit([with_deps(spec(), DepEdge("later"), DepEdge(999))], 0.0)
    assert (err.value.code, err.value.index, err.value.field) == ("unknown_dependency", 0, ".deps[1].id")


def test_awaited_key_unblocks_when_a_task_with_it_arrives() -> None:
    engine = make_engine(PoolConfig("p", retry=FIXED, unknown_dependency=UnknownDependency.AWAIT))
    engine.add_worker(1, "p", 1, {}, 0.0)
    [b] = engine.submit([with_deps(spec(key="b"), DepEdge("later"))], 0.0)
    assert task_of(engine, b.id).status is Status.BLOCKED
    [later] = engine.submit([spec(key="later")], 5.0)
    assert task_of(engine, b.id).status is Status.BLOCKED
    end_as(engine, later.id, Status.SUCCEEDED, 6.0)
    assert task_of(engine, b.id).status is Status.RUNNING


def test_an_awaited_key_shed_in_the_batch_that_brings_it_skips_its_dependents() -> None:
    """The task bringing an awaited key may be shed by a later spec of its own batch (overflow =
    shed_lowest): the edges linked to it then are judged at once, not left waiting on a task that has
    already ended."""
    pool = PoolConfig(
        "p",
        retry=FIXED,
        unknown_dependency=UnknownDependency.AWAIT,
        max_pending=2,
        overflow=Overflow.SHED_LOWEST,
    )
    engine = make_engine(pool)
    [b] = engine.submit([with_deps(spec(priority=Priority.CRITICAL), DepEdge("later"))], 0.0)
    late, other = engine.submit([spec(key="later", priority=Priority.LOW), spec(priority=Priority.HIGH)], 1.0)
    assert task_of(engine, late.id).status is Status.SHED
    task = task_of(engine, b.id)
    assert (task.status, task.message) == (Status.SKIPPED, f"dependency {late.id} ended as shed")
    assert task_of(engine, other.id).status is Status.READY


def test_awaiting_times_out_as_skipped() -> None:
    engine = make_engine(
        PoolConfig("p", retry=FIXED, unknown_dependency=UnknownDependency.AWAIT, await_timeout=10.0)
    )
    [b] = engine.submit([with_deps(spec(), DepEdge("never"))], 0.0)
    assert engine.next_wakeup() == 10.0
    engine.tick(9.9)
    assert task_of(engine, b.id).status is Status.BLOCKED
    engine.tick(10.0)
    task = task_of(engine, b.id)
    assert (task.status, task.message) == (Status.SKIPPED, "timed out awaiting unknown dependency")


def test_await_timeout_does_not_fire_once_the_key_arrived() -> None:
    engine = make_engine(
        PoolConfig("p", retry=FIXED, unknown_dependency=UnknownDependency.AWAIT, await_timeout=10.0)
    )
    [b] = engine.submit([with_deps(spec(), DepEdge("k"))], 0.0)
    engine.submit([spec(key="k")], 1.0)
    engine.tick(20.0)
    assert task_of(engine, b.id).status is Status.BLOCKED  # waits for k to end, not for the timeout


def test_self_dependency_is_a_cycle() -> None:
    engine = make_engine()
    with pytest.raises(AdmissionError) as err:
        engine.submit([with_deps(spec(key="me"), DepEdge("me"))], 0.0)
    assert (err.value.code, err.value.message) == ("cycle", "dependency cycle")


def test_cycle_inside_a_batch_rejects_the_whole_batch() -> None:
    engine = make_engine()
    batch = [
        spec(key="free"),
        with_deps(spec(key="a"), DepEdge("c")),
        with_deps(spec(key="b"), DepEdge("a")),
        with_deps(spec(key="c"), DepEdge("b")),
    ]
    with pytest.raises(AdmissionError) as err:
        engine.submit(batch, 0.0)
    assert err.value.code == "cycle"
    assert engine.snapshot(0.0).live_tasks == 0 and engine.get("free") is None


def test_cycle_through_an_awaited_key_is_refused() -> None:
    engine = make_engine(PoolConfig("p", retry=FIXED, unknown_dependency=UnknownDependency.AWAIT))
    engine.submit([with_deps(spec(key="x"), DepEdge("y"))], 0.0)  # x awaits y
    with pytest.raises(AdmissionError) as err:
        engine.submit([with_deps(spec(key="y"), DepEdge("x"))], 0.0)  # y would wait for x
    assert err.value.code == "cycle"
    assert engine.get("y") is None


def test_batch_tasks_may_depend_on_later_keys_of_the_same_batch() -> None:
    engine = make_engine()
    engine.add_worker(1, "p", 1, {}, 0.0)
    first, second = engine.submit([with_deps(spec(key="after"), DepEdge("before")), spec(key="before")], 0.0)
    assert task_of(engine, first.id).status is Status.BLOCKED
    assert task_of(engine, second.id).status is Status.RUNNING
    end_as(engine, second.id, Status.SUCCEEDED)
    assert task_of(engine, first.id).status is Status.RUNNING


def test_duplicate_key_in_a_batch_refuses_the_batch_and_an_existing_key_is_a_duplicate() -> None:
    engine = make_engine()
    [a] = engine.submit([spec(key="a")], 0.0)
    with pytest.raises(AdmissionError) as err:
        engine.submit([spec(key="z"), spec(key="z")], 0.0)
    assert err.value.code == "duplicate_key_in_batch"
    again, dependent = engine.submit([spec(key="a"), with_deps(spec(), DepEdge("a"))], 0.0)
    assert again.duplicate and again.id == a.id
    assert task_of(engine, dependent.id).status is Status.BLOCKED


def test_dependencies_across_pools() -> None:
    engine = Engine([PoolConfig("p", retry=NO_RETRY), PoolConfig("q", retry=NO_RETRY)])
    engine.add_worker(1, "p", 1, {}, 0.0)
    engine.add_worker(2, "q", 1, {}, 0.0)
    [a] = engine.submit([spec("p", key="a")], 0.0)
    [b] = engine.submit([with_deps(spec("q"), DepEdge("a"))], 0.0)
    end_as(engine, a.id, Status.SUCCEEDED)
    assert task_of(engine, b.id).status is Status.RUNNING


def test_a_batch_shedding_a_target_and_its_dependent_ends_each_once() -> None:
    engine = make_engine(PoolConfig("p", retry=NO_RETRY, max_pending=2, overflow=Overflow.SHED_OLDEST))
    [a] = engine.submit([spec(key="a", priority=Priority.LOW)], 0.0)
    [b] = engine.submit([with_deps(spec(priority=Priority.LOW), DepEdge("a"))], 0.0)
    drain(engine)
    engine.submit([spec(), spec()], 1.0)  # two victims, chosen up front: a, then b
    events = [(e.id, e.status) for e in drain(engine).events if e.id in (a.id, b.id)]
    assert events == [(a.id, Status.SHED), (b.id, Status.SKIPPED)]
    snap = engine.snapshot(1.0)
    assert (snap.totals.shed, snap.totals.skipped, snap.pending) == (1, 1, 2)


def test_dependents_unblocked_together_run_best_first_not_in_edge_order() -> None:
    # The engine dispatches once the ending is whole: a dependent made READY early in the cascade must
    # not take the freed slot before a better one made READY later in the same cascade.
    engine = make_engine()
    engine.add_worker(1, "p", 1, {}, 0.0)
    [a] = engine.submit([spec(key="a")], 0.0)
    [low, high] = engine.submit(
        [
            with_deps(spec(key="low", priority=Priority.LOW), DepEdge("a")),
            with_deps(spec(key="high", priority=Priority.HIGH), DepEdge("a")),
        ],
        0.0,
    )
    end_as(engine, a.id, Status.SUCCEEDED)
    assert task_of(engine, high.id).status is Status.RUNNING
    assert task_of(engine, low.id).status is Status.READY


def test_a_leaving_worker_gets_no_dependent_its_last_attempt_unblocked() -> None:
    # The worker's lease dead-letters its task as it leaves, which unblocks a dependent while the worker
    # still has a free slot on the books: it must wait for another worker.
    engine = make_engine(PoolConfig("p", retry=NO_RETRY))
    engine.add_worker(1, "p", 2, {}, 0.0)
    [a] = engine.submit([spec(key="a")], 0.0)
    [b] = engine.submit([with_deps(spec(key="b"), DepEdge("a", DepOn.COMPLETE))], 0.0)
    drain(engine)
    engine.remove_worker(1, 1.0)
    assert task_of(engine, a.id).status is Status.DEAD_LETTERED
    assert task_of(engine, b.id).status is Status.READY
    assert drain(engine).dispatches == []
    engine.add_worker(2, "p", 1, {}, 2.0)
    assert [(d.worker_id, d.task.id) for d in drain(engine).dispatches] == [(2, b.id)]
