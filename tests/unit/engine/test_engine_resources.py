"""Resources in the engine: checked at submit, taken at dispatch, released when the attempt ends, shared
by all pools; a task waiting for a resource does not block others and keeps its place."""

from __future__ import annotations

import dataclasses

import pytest

from cronoq.engine import (
    AdmissionError,
    Engine,
    PoolConfig,
    Priority,
    ResourceStats,
    Semaphore,
    Status,
    TaskSpec,
    TokenBucket,
)

from .helpers import NO_RETRY, drain, spec, task_of


def needs(base: TaskSpec, **amounts: int) -> TaskSpec:
    return dataclasses.replace(base, resources=amounts)


def requeues(engine: Engine) -> int:
    """How many times a task waiting for a resource was put back in its pool's queue so far. (Counted
    by the engine itself: patching its methods would not see the compiled engine's calls.)"""
    return engine._parking.woken


def make(*pools: str) -> Engine:
    names = pools or ("p",)
    return Engine(
        [PoolConfig(name, retry=NO_RETRY) for name in names],
        resources=[Semaphore("gpu", 2), TokenBucket("api", rate=4.0, burst=2.0)],
    )


@pytest.mark.parametrize(
    ("amounts", "code", "message"),
    [
        ({"nope": 1}, "unknown_resource", "unknown resource 'nope'"),
        ({"gpu": 3}, "resource_exceeds_capacity", "requested amount exceeds capacity of resource 'gpu'"),
        ({"gpu": 0}, "invalid", "invalid task: resource amount must be > 0"),
    ],
)
def test_bad_amounts_are_refused_at_submit(amounts: dict[str, int], code: str, message: str) -> None:
    engine = make()
    with pytest.raises(AdmissionError) as err:
        engine.submit([spec(key="first"), needs(spec(), **amounts)], 0.0)
    assert (err.value.code, err.value.message, err.value.index) == (code, message, 1)
    assert engine.get("first") is None


def test_a_semaphore_bounds_running_attempts_across_pools_and_is_released() -> None:
    engine = make("p", "q")
    engine.add_worker(1, "p", 5, {}, 0.0)
    engine.add_worker(2, "q", 5, {}, 0.0)
    a, b = engine.submit([needs(spec("p"), gpu=1), needs(spec("p"), gpu=1)], 0.0)
    [c] = engine.submit([needs(spec("q"), gpu=1)], 0.0)
    running = drain(engine).dispatches
    assert [d.task.id for d in running] == [a.id, b.id]
    assert task_of(engine, c.id).status is Status.READY
    engine.complete(1, running[0].lease, 1.0)
    [d] = drain(engine).dispatches
    assert (d.task.id, d.worker_id) == (c.id, 2)


def test_a_task_waiting_for_a_resource_does_not_block_a_later_one() -> None:
    engine = make()
    engine.add_worker(1, "p", 5, {}, 0.0)
    engine.submit([needs(spec(), gpu=2)], 0.0)
    drain(engine)
    high, normal = engine.submit([needs(spec(priority=Priority.HIGH), gpu=1), spec()], 0.0)
    assert [d.task.id for d in drain(engine).dispatches] == [normal.id]
    assert task_of(engine, high.id).status is Status.READY
    assert engine.snapshot(0.0).pools[0].priority_adherence == 1.0


def test_woken_tasks_keep_their_original_order() -> None:
    engine = make()
    engine.add_worker(1, "p", 5, {}, 0.0)
    engine.submit([needs(spec(), gpu=2)], 0.0)
    lease = drain(engine).dispatches[0]
    first, second = engine.submit([needs(spec(), gpu=2), needs(spec(), gpu=2)], 0.0)
    engine.complete(1, lease.lease, 1.0)
    [d] = drain(engine).dispatches
    assert d.task.id == first.id
    assert task_of(engine, second.id).status is Status.READY


def test_a_woken_task_goes_before_a_later_one_that_queued_for_a_slot() -> None:
    """Woken at its original place: ahead of a task submitted after it that waited for a slot."""
    engine = make()
    engine.add_worker(1, "p", 2, {}, 0.0)
    engine.submit([needs(spec(), gpu=2)], 0.0)
    [holder] = drain(engine).dispatches
    [first] = engine.submit([needs(spec(), gpu=2)], 0.0)  # parks: the gpu is taken
    engine.submit([spec()], 0.0)  # takes the second slot
    drain(engine)
    [later] = engine.submit([spec()], 0.0)  # queued: no slot free
    assert drain(engine).dispatches == []
    engine.complete(1, holder.lease, 1.0)  # a slot and the gpu free: first goes back, in front
    [d] = drain(engine).dispatches
    assert d.task.id == first.id
    assert task_of(engine, later.id).status is Status.READY


def test_a_token_bucket_paces_dispatches() -> None:
    engine = make()
    engine.add_worker(1, "p", 10, {}, 0.0)
    engine.submit([needs(spec(), api=1) for _ in range(5)], 0.0)
    times = [0.0] * len(drain(engine).dispatches)
    assert len(times) == 2  # the burst
    while len(times) < 5:
        wake = engine.next_wakeup()
        assert wake is not None
        engine.tick(wake)
        times += [wake] * len(drain(engine).dispatches)
    assert times == [0.0, 0.0, 0.25, 0.5, 0.75]


def test_cancelling_a_task_waiting_for_a_resource() -> None:
    engine = make()
    engine.add_worker(1, "p", 5, {}, 0.0)
    engine.submit([needs(spec(), gpu=2)], 0.0)
    lease = drain(engine).dispatches[0]
    [waiting] = engine.submit([needs(spec(), gpu=1)], 0.0)
    assert engine.cancel(waiting.id, 0.5)
    engine.complete(1, lease.lease, 1.0)
    assert drain(engine).dispatches == []
    snap = engine.snapshot(1.0)
    assert snap.pending == 0 and snap.pools[0].pending_by_class == [0, 0, 0, 0]


def test_specs_without_resources_share_one_read_only_empty_mapping() -> None:
    a, b = TaskSpec("p"), TaskSpec("p")
    assert a.resources is b.resources and not a.resources
    with pytest.raises(TypeError, match="cannot be changed"):
        a.resources["gpu"] = 1
    assert not b.resources


def test_a_release_wakes_the_best_waiting_task_first() -> None:
    engine = make()
    engine.add_worker(1, "p", 10, {}, 0.0)
    engine.submit([needs(spec(), gpu=2)], 0.0)
    lease = drain(engine).dispatches[0]
    low, high = engine.submit(
        [needs(spec(priority=Priority.LOW), gpu=2), needs(spec(priority=Priority.HIGH), gpu=2)], 0.0
    )
    engine.complete(1, lease.lease, 1.0)
    [d] = drain(engine).dispatches
    assert d.task.id == high.id
    assert task_of(engine, low.id).status is Status.READY


def test_a_task_needing_more_than_is_free_is_passed_over_for_a_smaller_one() -> None:
    engine = make()
    engine.add_worker(1, "p", 10, {}, 0.0)
    engine.submit([needs(spec(), gpu=1), needs(spec(), gpu=1)], 0.0)
    first, second = drain(engine).dispatches
    big, small = engine.submit([needs(spec(), gpu=2), needs(spec(), gpu=1)], 0.0)
    assert drain(engine).dispatches == []
    engine.complete(1, first.lease, 1.0)  # one permit free: the big task cannot use it
    [d] = drain(engine).dispatches
    assert d.task.id == small.id
    assert task_of(engine, big.id).status is Status.READY
    engine.complete(1, second.lease, 2.0)
    engine.complete(1, d.lease, 2.0)
    [d] = drain(engine).dispatches
    assert d.task.id == big.id


def test_a_task_short_of_two_resources_waits_for_each_in_turn() -> None:
    engine = Engine([PoolConfig("p", retry=NO_RETRY)], resources=[Semaphore("gpu", 1), Semaphore("disk", 1)])
    engine.add_worker(1, "p", 10, {}, 0.0)
    engine.submit([needs(spec(), gpu=1), needs(spec(), disk=1)], 0.0)
    gpu_holder, disk_holder = drain(engine).dispatches
    [both] = engine.submit([needs(spec(), gpu=1, disk=1)], 0.0)
    engine.complete(1, gpu_holder.lease, 1.0)  # woken, then short of disk: waits again
    assert drain(engine).dispatches == []
    engine.complete(1, disk_holder.lease, 2.0)
    [d] = drain(engine).dispatches
    assert d.task.id == both.id


def test_cancelled_waiting_tasks_do_not_take_a_released_permit() -> None:
    engine = Engine([PoolConfig("p", retry=NO_RETRY)], resources=[Semaphore("db", 1)])
    engine.add_worker(1, "p", 10, {}, 0.0)
    engine.submit([needs(spec(), db=1)], 0.0)
    holder = drain(engine).dispatches[0]
    waiting = engine.submit([needs(spec(), db=1) for _ in range(400)], 0.0)
    for submitted in waiting[:-1]:
        assert engine.cancel(submitted.id, 0.5)
    drain(engine)
    engine.complete(1, holder.lease, 1.0)
    [d] = drain(engine).dispatches
    assert d.task.id == waiting[-1].id


def test_a_backlog_behind_a_one_permit_semaphore_is_requeued_once_per_release() -> None:
    """Each release wakes only what its freed permit can serve: n tasks are queued O(n) times in all,
    not O(n²) as when every release put the whole backlog back in the queue to park it again."""
    engine = Engine([PoolConfig("p", retry=NO_RETRY)], resources=[Semaphore("db", 1)])
    engine.add_worker(1, "p", 100, {}, 0.0)
    n = 300
    engine.submit([needs(spec(), db=1) for _ in range(n)], 0.0)
    queued = requeues(engine)
    ran = 0
    leases = [d.lease for d in drain(engine).dispatches]
    now = 0.0
    while leases:
        now += 1.0
        engine.complete(1, leases.pop(), now)
        ran += 1
        leases += [d.lease for d in drain(engine).dispatches]
    assert ran == n
    assert requeues(engine) - queued <= n


def test_a_task_short_of_a_permit_and_of_tokens_runs_once_the_permit_is_back() -> None:
    # Parked on the bucket (named first), with no refill timer while the permit was out, it would wait
    # for ever: only the release can help, so it must wait for the release.
    engine = make()
    engine.add_worker(1, "p", 5, {}, 0.0)
    engine.submit([needs(spec(), gpu=2), needs(spec(), api=2)], 0.0)
    holder = drain(engine).dispatches[0]
    assert holder.task.spec.resources == {"gpu": 2}
    [both] = engine.submit([needs(spec(), api=1, gpu=1)], 0.0)
    assert drain(engine).dispatches == []
    engine.complete(1, holder.lease, 1.0)  # the bucket refilled at 0.5
    [d] = drain(engine).dispatches
    assert d.task.id == both.id


def test_a_backlog_behind_a_token_bucket_is_woken_one_refill_at_a_time() -> None:
    """Each refill wakes what its tokens can serve: n tasks are queued O(n) times in all and the engine
    asks to be ticked once per refill, not once per waiting task at every refill."""
    engine = Engine([PoolConfig("p", retry=NO_RETRY)], resources=[TokenBucket("api", rate=10.0, burst=1.0)])
    engine.add_worker(1, "p", 100, {}, 0.0)
    n = 300
    engine.submit([needs(spec(), api=1) for _ in range(n)], 0.0)
    queued = requeues(engine)
    times: list[float] = []

    def run_dispatched(now: float) -> None:
        for d in drain(engine).dispatches:
            times.append(now)
            engine.complete(1, d.lease, now)

    run_dispatched(0.0)
    ticks = 0
    while len(times) < n:
        wake = engine.next_wakeup()
        assert wake is not None and wake > times[-1]
        engine.tick(wake)
        ticks += 1
        run_dispatched(wake)
    assert times == pytest.approx([i / 10 for i in range(n)])
    assert ticks == n - 1
    assert requeues(engine) - queued <= n


def test_tokens_a_woken_task_cannot_use_go_to_a_waiting_task_of_another_pool() -> None:
    engine = Engine(
        [PoolConfig("p", retry=NO_RETRY), PoolConfig("q", retry=NO_RETRY)],
        resources=[TokenBucket("api", rate=1.0, burst=1.0)],
    )
    engine.add_worker(1, "p", 2, {}, 0.0)
    engine.add_worker(2, "q", 1, {}, 0.0)
    engine.submit([needs(spec(), api=1)], 0.0)  # takes the token
    [first] = engine.submit([needs(spec(), api=1)], 0.0)  # waits for it, best placed
    engine.submit([spec()], 0.0)  # fills p's other slot
    [other] = engine.submit([needs(spec("q"), api=1)], 0.0)
    assert len(drain(engine).dispatches) == 2
    engine.tick(1.0)  # one token: woken first, ``first`` finds p full and takes nothing
    [d] = drain(engine).dispatches
    assert (d.task.id, d.worker_id) == (other.id, 2)
    assert task_of(engine, first.id).status is Status.READY


def test_a_permit_a_woken_task_cannot_use_goes_to_a_waiting_task_of_another_pool() -> None:
    engine = Engine(
        [PoolConfig("a", retry=NO_RETRY), PoolConfig("b", retry=NO_RETRY)], resources=[Semaphore("gpu", 1)]
    )
    engine.add_worker(1, "a", 1, {}, 0.0)
    engine.add_worker(2, "b", 2, {}, 0.0)
    [holder] = engine.submit([needs(spec("b"), gpu=1)], 0.0)
    [first] = engine.submit([needs(spec("a"), gpu=1)], 0.0)  # waits for the permit, best placed
    [other] = engine.submit([needs(spec("b"), gpu=1)], 0.0)
    engine.submit([spec("a")], 0.0)  # fills a's only slot
    lease = {d.task.id: d.lease for d in drain(engine).dispatches}
    engine.complete(2, lease[holder.id], 1.0)  # woken first, ``first`` finds a full and takes nothing
    [d] = drain(engine).dispatches
    assert (d.task.id, d.worker_id) == (other.id, 2)
    assert task_of(engine, first.id).status is Status.READY


def test_the_snapshot_shows_each_resource_with_its_room_and_waiting_tasks() -> None:
    engine = make()
    engine.add_worker(1, "p", 5, {}, 0.0)
    engine.submit([needs(spec(), gpu=2), needs(spec(), api=2)], 0.0)
    waiting = engine.submit([needs(spec(), gpu=1) for _ in range(3)], 0.0)
    assert engine.cancel(waiting[0].id, 0.0)  # a task cancelled while it waited is not counted
    assert engine.snapshot(0.125).resources == [
        ResourceStats("gpu", "semaphore", 2.0, 0.0, 2),
        ResourceStats("api", "token_bucket", 2.0, 0.5, 0),
    ]
