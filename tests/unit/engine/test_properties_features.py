"""Stateful property tests with every scheduling feature on: dependencies (by key and id, all edge
conditions, awaited keys), fixed starts with holds and misses, semaphores and token buckets shared by
two pools, and fair share.

It extends the core machine (test_properties.py): the same workers, outcomes, ticks and lease model,
with a richer submit rule and invariants of its own: resources are never over-committed, BLOCKED tasks
are exactly those with an edge still open, held slots stay within capacity.
"""

from __future__ import annotations

import random

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import invariant, rule

from cronoq.engine import (
    AdmissionError,
    DepEdge,
    DepOn,
    Engine,
    MissPolicy,
    Priority,
    ResourceConfig,
    Semaphore,
    Status,
    Task,
    TaskSpec,
    TokenBucket,
)
from cronoq.engine.deps import edge_met

from .helpers import FEATURE_POOLS
from .test_properties import EngineMachine

S = Status
NEXT: dict[Status, set[Status]] = {
    S.BLOCKED: {S.READY, S.SCHEDULED, S.SKIPPED, S.CANCELLED, S.SHED, S.MISSED, S.FAILED},
    S.SCHEDULED: {S.READY, S.SKIPPED, S.CANCELLED, S.SHED, S.MISSED, S.FAILED},
    S.READY: {S.RUNNING, S.CANCELLED, S.SHED, S.MISSED, S.FAILED},
    S.RUNNING: {S.SUCCEEDED, S.FAILED, S.DEAD_LETTERED, S.CANCELLED, S.RETRYING},
    S.RETRYING: {S.READY, S.CANCELLED, S.SHED},
}
GPU_PERMITS = 2
RESOURCES: list[ResourceConfig] = [Semaphore("gpu", GPU_PERMITS), TokenBucket("api", rate=2.0, burst=2.0)]
KEYS = ["", "", "k1", "k2", "k3", "k4"]


class FeatureMachine(EngineMachine):
    transitions = NEXT

    def __init__(self) -> None:
        super().__init__()
        self.engine = Engine(FEATURE_POOLS, rng=random.Random(0), resources=RESOURCES)

    def may_wait(self, task: Task) -> bool:
        # It may wait for a resource without room for it (permits held by running tasks, tokens not yet
        # refilled); and a slot held for a fixed start looks free in the worker views.
        snap = self.engine.snapshot(self.now)
        available = {r.name: r.available for r in snap.resources}
        if any(amount > available[name] for name, amount in task.spec.resources.items()):
            return True
        return any(p.held for p in snap.pools if p.name == task.spec.pool)

    @rule(
        pool=st.sampled_from(["a", "b"]),
        items=st.lists(
            st.fixed_dictionaries(
                {
                    "priority": st.sampled_from(list(Priority)),
                    "key": st.sampled_from(KEYS),
                    "tenant": st.sampled_from(["", "t1", "t2"]),
                    "deps": st.lists(
                        st.tuples(
                            st.sampled_from([*KEYS[2:], "missing", 1, 2, 3]), st.sampled_from(list(DepOn))
                        ),
                        max_size=2,
                    ),
                    "start": st.one_of(st.none(), st.floats(-3.0, 15.0)),
                    "on_miss": st.sampled_from(list(MissPolicy)),
                    "resources": st.sampled_from(
                        [{}, {}, {"gpu": 1}, {"gpu": 2}, {"api": 1}, {"gpu": 1, "api": 1}]
                    ),
                    "timeout": st.one_of(st.none(), st.floats(0.0, 4.0)),
                }
            ),
            min_size=1,
            max_size=4,
        ),
    )
    def submit(self, pool: str, items: list[dict[str, object]]) -> None:
        specs = []
        for item in items:
            start = item["start"]
            specs.append(
                TaskSpec(
                    pool,
                    priority=item["priority"],  # type: ignore[arg-type]
                    key=item["key"],  # type: ignore[arg-type]
                    tenant=item["tenant"],  # type: ignore[arg-type]
                    deps=tuple(DepEdge(t, on) for t, on in item["deps"]),  # type: ignore[attr-defined]
                    start=None if start is None else self.now + start,  # type: ignore[operator]
                    on_miss=item["on_miss"],  # type: ignore[arg-type]
                    resources=dict(item["resources"]),  # type: ignore[call-overload]
                    timeout=item["timeout"],  # type: ignore[arg-type]
                )
            )
        try:
            submitted = self.engine.submit(specs, self.now)
        except AdmissionError as err:
            assert err.code in {
                "cycle",
                "unknown_dependency",
                "reservation_conflict",
                "resource_exceeds_capacity",
                "overloaded",
                "duplicate_key_in_batch",
            }, err
            assert self.engine.take_actions() == []
            return
        self.accepted += sum(not s.duplicate for s in submitted)
        self.take()

    # The core machine's counters ignore statuses only these features produce; check them here.
    @invariant()
    def counters_add_up(self) -> None:
        snap = self.engine.snapshot(self.now)
        t = snap.totals
        ended = sum(1 for s in self.status.values() if s.terminal)
        assert t.succeeded + t.failed + t.dead_lettered + t.cancelled + t.shed + t.skipped + t.missed == ended
        assert t.submitted == self.accepted == len(self.status)
        assert snap.running == len(self.leases)
        assert snap.pending == sum(
            1 for s in self.status.values() if s in {S.BLOCKED, S.SCHEDULED, S.READY, S.RETRYING}
        )
        assert snap.pending == sum(sum(p.pending_by_class) for p in snap.pools)

    @invariant()
    def resources_never_over_committed(self) -> None:
        running = [self.engine.get(t) for _, t in self.leases.values()]
        gpu = sum(task.spec.resources.get("gpu", 0) for task in running if task is not None)
        assert gpu <= GPU_PERMITS

    @invariant()
    def blocked_exactly_while_an_edge_is_open(self) -> None:
        for task_id, status in self.status.items():
            if status is not S.BLOCKED:
                continue
            task = self.engine.get(task_id)
            assert task is not None
            states: list[bool | None] = []
            for dep in task.spec.deps:
                target = self.engine.get(dep.target)
                if target is None or not target.status.terminal:
                    states.append(None)  # open
                else:
                    states.append(edge_met(dep.on, target.status))
            assert False not in states, "should have been skipped"
            assert None in states, "should have been unblocked"

    @invariant()
    def held_slots_fit_capacity(self) -> None:
        for pool in self.engine.snapshot(self.now).pools:
            assert pool.held >= 0 and pool.busy >= 0
            assert pool.held <= pool.capacity + pool.busy  # lowering slots may leave leases over capacity


# Fewer examples than the core machine: each step here checks more (every BLOCKED task's edges).
FeatureMachine.TestCase.settings = settings(
    max_examples=80, stateful_step_count=50, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestFeatureMachine = FeatureMachine.TestCase
