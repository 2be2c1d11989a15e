"""Fair share between tenants within a class: weighted fair queueing of the FIFO part of each lane.

Tasks are named by their keys; a name's first letter is its tenant, except "x", which is untenanted
(tenant "").
"""

from __future__ import annotations

import random
from collections.abc import Mapping
from fractions import Fraction

import pytest

from cronoq.engine import Engine, PoolConfig, Priority, Semaphore, Status, Task, TaskSpec
from cronoq.engine.lanes import FairLane, FairPoolQueue, PoolQueue

from .helpers import FIXED, drain, make_engine, only_dispatch, run_one_at_a_time

N, H = Priority.NORMAL, Priority.HIGH


def fair_engine(weights: Mapping[str, float] | None = None, *, fair: bool = True) -> Engine:
    return make_engine(PoolConfig("p", retry=FIXED, fair_share=fair, tenant_weights=weights or {}))


def submit(
    engine: Engine,
    names: list[str],
    now: float,
    *,
    priority: Priority = N,
    deadline: float | None = None,
    labels: dict[str, str] | None = None,
) -> list[int]:
    """Submit one task per name, each in its own submission, in this order; returns their ids."""
    ids = []
    for name in names:
        tenant = "" if name[0] == "x" else name[0]
        spec = TaskSpec(
            "p",
            key=name,
            tenant=tenant,
            priority=priority,
            deadline=deadline,
            labels=labels or {},
        )
        [submitted] = engine.submit([spec], now)
        ids.append(submitted.id)
    return ids


def name_of(engine: Engine, task_id: int) -> str:
    task = engine.get(task_id)
    assert task is not None
    return task.spec.key


def finish_all(engine: Engine, worker_id: int, now: float) -> list[str]:
    """Names of the tasks the worker's pending and following leases run, completing each in turn."""
    return [name_of(engine, task_id) for task_id in run_one_at_a_time(engine, worker_id, now)]


def run(engine: Engine, worker_id: int, now: float) -> list[str]:
    """Names of the tasks a 1-slot worker connecting at ``now`` runs, completing each in turn."""
    engine.add_worker(worker_id, "p", 1, {}, now)
    return finish_all(engine, worker_id, now)


def serve(engine: Engine, worker_id: int, count: int, now: float) -> list[str]:
    """Complete the running lease and the ones that follow, ``count`` in all (the next one is then
    running); returns their names."""
    names = []
    lease = only_dispatch(engine)
    for done in range(count):
        names.append(name_of(engine, lease.task.id))
        assert engine.complete(worker_id, lease.lease, now)
        if done + 1 < count:
            lease = only_dispatch(engine)
    return names


def reference_order(weights: Mapping[str, float] | None) -> list[str]:
    """The reference's experiment: an untenanted task has run (so that group's clock stands at 1); then
    8 tasks each for a and b and 2 untenanted ones are submitted while no worker is connected, and a
    1-slot worker runs them one at a time."""
    engine = fair_engine(weights)
    submit(engine, ["x-first"], 0.0)
    assert run(engine, 1, 0.0) == ["x-first"]
    engine.remove_worker(1, 0.0)
    submit(engine, [f"a{i}" for i in range(8)] + [f"b{i}" for i in range(8)] + ["x0", "x1"], 1.0)
    return run(engine, 2, 1.0)


def test_unweighted_tenants_alternate_as_observed() -> None:
    order = reference_order(None)
    assert order[:10] == ["a0", "b0", "a1", "b1", "x0", "a2", "b2", "x1", "a3", "b3"]
    assert order[10:] == ["a4", "b4", "a5", "b5", "a6", "b6", "a7", "b7"]


def test_weighted_tenants_share_three_to_one_as_observed() -> None:
    order = reference_order({"a": 3.0, "b": 1.0})
    observed = ["a0", "b0", "a1", "a2", "a3", "b1", "x0", "a4", "a5", "a6", "b2", "x1", "a7", "b3", "b4"]
    assert order[:15] == observed
    assert order[15:] == ["b5", "b6", "b7"]


def test_a_fresh_untenanted_group_would_take_the_third_turn() -> None:
    engine = fair_engine()
    submit(engine, ["a0", "a1", "b0", "b1", "x0", "x1"], 0.0)
    assert run(engine, 1, 0.0) == ["a0", "b0", "x0", "a1", "b1", "x1"]


def test_a_pool_without_fair_share_stays_fifo() -> None:
    engine = fair_engine({"a": 3.0}, fair=False)
    names = ["a0", "a1", "a2", "b0", "b1", "x0"]
    submit(engine, names, 0.0)
    assert run(engine, 1, 0.0) == names


def test_classes_still_dominate_tenants() -> None:
    engine = fair_engine()
    submit(engine, ["b0", "b1"], 0.0)
    submit(engine, ["a0", "a1", "a2"], 0.0, priority=H)
    assert run(engine, 1, 0.0) == ["a0", "a1", "a2", "b0", "b1"]


def test_unnamed_tenants_weigh_one() -> None:
    engine = fair_engine({"a": 2.0})
    submit(engine, ["a0", "a1", "a2", "a3", "b0", "b1", "c0", "c1"], 0.0)
    assert run(engine, 1, 0.0) == ["a0", "b0", "c0", "a1", "a2", "b1", "c1", "a3"]


def test_a_tenant_back_from_idle_rejoins_the_current_round_instead_of_monopolising() -> None:
    engine = fair_engine()
    submit(engine, ["b0"] + [f"a{i}" for i in range(10)], 0.0)
    engine.add_worker(1, "p", 1, {}, 0.0)
    # b0 and a0 at clock 0, then a alone; a6, now running, was served at clock 6.
    assert serve(engine, 1, 7, 0.0) == ["b0", "a0", "a1", "a2", "a3", "a4", "a5"]
    submit(engine, ["b1", "b2", "b3", "b4"], 1.0)
    # b comes back at max(1, 6) = 6 with a at 7: one turn ahead, then they alternate. Had b kept its
    # clock of 1, b1..b4 would all have run before a7.
    assert finish_all(engine, 1, 1.0) == ["a6", "b1", "a7", "b2", "a8", "b3", "a9", "b4"]


def test_a_tenant_seen_for_the_first_time_starts_at_the_current_round() -> None:
    engine = fair_engine()
    submit(engine, [f"a{i}" for i in range(6)], 0.0)
    engine.add_worker(1, "p", 1, {}, 0.0)
    assert serve(engine, 1, 3, 0.0) == ["a0", "a1", "a2"]  # a3, now running, was served at clock 3
    submit(engine, ["b0", "b1", "b2"], 0.0)
    # b starts at 3 with a at 4: b0 first, then level, the earlier submission first.
    assert finish_all(engine, 1, 0.0) == ["a3", "b0", "a4", "b1", "a5", "b2"]


def test_a_retried_task_goes_back_at_its_place_in_its_tenant_and_costs_a_turn() -> None:
    engine = fair_engine()
    submit(engine, ["a0", "a1", "b0", "b1"], 0.0)
    engine.add_worker(1, "p", 1, {}, 0.0)
    first = only_dispatch(engine)
    assert name_of(engine, first.task.id) == "a0"
    assert engine.fail(1, first.lease, "again", False, None, 0.0)  # READY again at 1.0; a is at 1
    second = only_dispatch(engine)
    assert name_of(engine, second.task.id) == "b0"
    engine.tick(1.0)
    assert engine.complete(1, second.lease, 1.0)
    retried = only_dispatch(engine)
    # a and b both at 1: a0 keeps its original place, the earliest submission.
    assert (name_of(engine, retried.task.id), retried.attempt) == ("a0", 2)
    assert engine.complete(1, retried.lease, 1.0)
    assert finish_all(engine, 1, 1.0) == ["b1", "a1"]  # a0's second run moved a to 2


def test_deadline_tasks_keep_their_urgency_and_do_not_advance_their_tenants_clock() -> None:
    engine = fair_engine()
    submit(engine, ["a0", "a1"], 0.0)
    submit(engine, ["b-overdue"], 0.0, deadline=0.0)
    submit(engine, ["b1"], 0.0)
    # b is still at 0 after its overdue task, so b1 comes right after a0.
    assert run(engine, 1, 0.0) == ["b-overdue", "a0", "b1", "a1"]


def test_the_edf_example_holds_in_a_fair_pool() -> None:
    engine = fair_engine()
    submit(engine, ["a-plain"], 0.0)
    submit(engine, ["b-dl100"], 0.0, deadline=100.0)
    submit(engine, ["a-dl50"], 0.0, deadline=50.0)
    submit(engine, ["b-plain"], 0.0)
    assert run(engine, 1, 0.0) == ["a-plain", "a-dl50", "b-dl100", "b-plain"]


def test_cancelled_tasks_are_skipped_and_a_tenant_left_with_none_holds_up_nobody() -> None:
    engine = fair_engine()
    ids = submit(engine, ["a0", "a1", "b0", "b1", "c0", "c1"], 0.0)
    for i in (0, 2, 3):
        assert engine.cancel(ids[i], 0.0)
    assert run(engine, 1, 0.0) == ["a1", "c0", "c1"]


def test_labelled_lanes_are_fair_too() -> None:
    engine = fair_engine()
    submit(engine, ["a0", "a1", "b0", "b1"], 0.0, labels={"gpu": "1"})
    engine.add_worker(1, "p", 1, {"gpu": "1"}, 0.0)
    assert finish_all(engine, 1, 0.0) == ["a0", "b0", "a1", "b1"]


# ------------------------------------------------------------------------------- the queue on its own


def queued(queue: PoolQueue, tenants: list[str], *, labels: dict[str, str] | None = None) -> list[Task]:
    """Push one READY Normal task per entry of ``tenants``, with sequence numbers from 1."""
    tasks = [
        Task(i + 1, TaskSpec("p", tenant=tenant, labels=labels or {}), i + 1, Status.READY, 0.0, ready_at=0.0)
        for i, tenant in enumerate(tenants)
    ]
    for task in tasks:
        queue.push(task, 0.0)
    return tasks


def pop_all(queue: PoolQueue) -> list[Task]:
    out = []
    while (best := queue.pop_best(0.0, lambda _: True)) is not None:
        out.append(best[0])
    return out


def test_shares_that_are_equal_in_exact_arithmetic_tie_exactly() -> None:
    # 33 turns of 1/3 summed in floats come to 11.000000000000002, which would hand a's tie with b at
    # 11 to b; kept as served / weight, every tie goes to the earlier submission, a's.
    queue = FairPoolQueue(1.0, {"a": 3.0})
    queued(queue, ["a"] * 40 + ["b"] * 14)
    expected = [1, 41]
    for k in range(13):
        expected += [2 + 3 * k, 3 + 3 * k, 4 + 3 * k, 42 + k]
    assert [task.seq for task in pop_all(queue)] == expected


def test_a_task_parked_for_a_resource_gets_its_turn_back_and_its_place() -> None:
    queue = FairPoolQueue(1.0, {})
    a0, a1, b0 = queued(queue, ["a", "a", "b"])
    best = queue.pop_best(0.0, lambda _: True)
    assert best is not None and best[0] is a0
    queue.refund(a0)  # it was not dispatched: a resource it needs is taken
    queue.push(a0, 0.0, requeue=True)  # the resource came free
    assert pop_all(queue) == [a0, b0, a1]


def test_a_tenant_whose_tasks_wait_for_a_resource_keeps_its_share_of_the_rest() -> None:
    """Tenant a's first tasks need a semaphore another pool holds: they wait without costing a their
    turns, so a's runnable tasks still alternate with b's (each parked task once cost a a turn, and b
    ran three times in a row first)."""
    engine = Engine(
        [PoolConfig("p", retry=FIXED, fair_share=True), PoolConfig("other")],
        resources=[Semaphore("s", 1)],
        rng=random.Random(0),
    )
    engine.add_worker(9, "other", 1, {}, 0.0)
    engine.submit([TaskSpec("other", key="holder", resources={"s": 1})], 0.0)
    assert len(drain(engine).dispatches) == 1  # the holder runs, and keeps the permit
    for i in range(3):
        engine.submit([TaskSpec("p", key=f"a-waits{i}", tenant="a", resources={"s": 1})], 0.0)
    submit(engine, ["a0", "b0", "a1", "b1", "a2", "b2"], 0.0)
    assert run(engine, 1, 0.0) == ["a0", "b0", "a1", "b1", "a2", "b2"]


def test_tenants_seen_once_are_forgotten_once_idle() -> None:
    queue = FairPoolQueue(1.0, {})
    for round_ in range(20):
        tasks = queued(queue, [f"t{round_}-{i}" for i in range(50)])
        assert pop_all(queue) == tasks
    queued(queue, ["last"])
    [lane] = queue.active
    assert isinstance(lane, FairLane)
    assert len(lane.tenants) < 200


def test_a_lane_nobody_serves_drops_the_tenants_tasks_that_left() -> None:
    queue = FairPoolQueue(1.0, {})
    tasks = queued(queue, ["a", "b", "c", "d"] * 250, labels={"gpu": "1"})
    for task in tasks[:990]:
        task.status = Status.CANCELLED
        queue.forget(task)
    [lane] = queue.active
    assert isinstance(lane, FairLane)
    assert lane.queued < 200
    assert queue.ready == 10
    assert [task.seq for task in pop_all(queue)] == list(range(991, 1001))


class Model:
    """The fair-share rule stated directly, in exact arithmetic, for one lane: clocks advance by 1/weight
    per dispatch, the lowest clock goes first (the earlier submission on a tie), and a tenant that
    becomes active starts from max(its clock, the clock the last task was served at)."""

    def __init__(self, weights: Mapping[str, float]) -> None:
        self.weights = {name: Fraction(weight) for name, weight in weights.items()}
        self.clock: dict[str, Fraction] = {}
        self.queued: dict[str, set[int]] = {}
        self.vtime = Fraction(0)

    def push(self, tenant: str, seq: int) -> None:
        queued = self.queued.setdefault(tenant, set())
        if not queued:
            self.clock[tenant] = max(self.clock.get(tenant, Fraction(0)), self.vtime)
        queued.add(seq)

    def refund(self, tenant: str) -> None:
        self.clock[tenant] -= 1 / self.weights.get(tenant, Fraction(1))

    def leave(self, tenant: str, seq: int) -> None:
        self.queued[tenant].discard(seq)

    def pop(self) -> int | None:
        heads = [(self.clock[t], min(seqs), t) for t, seqs in self.queued.items() if seqs]
        if not heads:
            return None
        clock, seq, tenant = min(heads)
        self.queued[tenant].discard(seq)
        self.vtime = clock
        self.clock[tenant] = clock + 1 / self.weights.get(tenant, Fraction(1))
        return seq


@pytest.mark.parametrize("seed", range(8))
def test_random_pushes_pops_cancels_and_requeues_follow_the_rule(seed: int) -> None:
    rng = random.Random(seed)
    weights = {"a": 2.0, "b": 0.5, "": 4.0}  # powers of two: the floats are exact, so ties are too
    queue = FairPoolQueue(1.0, weights)
    model = Model(weights)
    live: dict[int, Task] = {}
    taken: list[Task] = []
    seq = 0
    for _ in range(3000):
        op = rng.random()
        if op < 0.45:
            seq += 1
            task = Task(seq, TaskSpec("p", tenant=rng.choice(["a", "b", "c", ""])), seq, Status.READY, 0.0)
            task.ready_at = 0.0
            queue.push(task, 0.0)
            model.push(task.spec.tenant, seq)
            live[seq] = task
        elif op < 0.85:
            best = queue.pop_best(0.0, lambda _: True)
            expected = model.pop()
            assert (best[0].seq if best is not None else None) == expected
            if best is not None:
                taken.append(live.pop(best[0].seq))
                if rng.random() < 0.2:  # not dispatched after all: it waits for a resource
                    queue.refund(best[0])
                    model.refund(best[0].spec.tenant)
        elif op < 0.93 and live:
            task = live.pop(rng.choice(list(live)))
            task.status = Status.CANCELLED
            queue.forget(task)
            model.leave(task.spec.tenant, task.seq)
        elif taken:
            task = taken.pop(rng.randrange(len(taken)))  # back from a retry or a resource wait
            if rng.random() < 0.5:
                task.attempt += 1
                queue.push(task, 0.0)
            else:
                queue.push(task, 0.0, requeue=True)
            model.push(task.spec.tenant, task.seq)
            live[task.seq] = task
    assert queue.ready == len(live)
