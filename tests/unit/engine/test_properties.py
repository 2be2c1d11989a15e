"""Stateful property tests: random producers, workers and outcomes against invariants.

The machine keeps its own model of outstanding leases (from the Dispatch and Abort actions and its own
reports) and checks after every step that the engine agrees with it and with itself.
"""

from __future__ import annotations

import random
from collections import Counter

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule

from cronoq.engine import (
    Abort,
    AdmissionError,
    Dispatch,
    Engine,
    Overflow,
    PoolConfig,
    Priority,
    RetryRule,
    Status,
    StatusChange,
    TaskSpec,
)
from cronoq.engine.model import PENDING, Task

S = Status
WAITING = frozenset({S.BLOCKED, S.SCHEDULED})
NEXT: dict[Status, set[Status]] = {
    S.BLOCKED: {S.READY},
    S.READY: {S.RUNNING, S.CANCELLED, S.SHED},
    S.RUNNING: {S.SUCCEEDED, S.FAILED, S.DEAD_LETTERED, S.CANCELLED, S.RETRYING},
    S.RETRYING: {S.READY, S.CANCELLED, S.SHED},
}
POOLS = [
    PoolConfig(
        "a",
        max=4,
        lease_ttl=3.0,
        max_pending=6,
        overflow=Overflow.SHED_LOWEST,
        retry=RetryRule(max_attempts=3, initial_backoff=0.5, max_backoff=2.0),
    ),
    PoolConfig(
        "b",
        max=3,
        max_pending=5,
        overflow=Overflow.SHED_OLDEST,
        retry=RetryRule(max_attempts=2, initial_backoff=0.0, jitter=False),
    ),
]
LABELS = [{}, {"gpu": "1"}, {"gpu": "1", "zone": "eu"}, {"zone": "eu"}]


class EngineMachine(RuleBasedStateMachine):
    transitions = NEXT  # the status changes allowed; subclasses with more features allow more

    def __init__(self) -> None:
        super().__init__()
        self.engine = Engine(POOLS, rng=random.Random(0))
        self.now = 0.0
        self.next_worker = 1
        self.workers: dict[int, tuple[str, int]] = {}  # id -> (pool, granted slots)
        self.leases: dict[int, tuple[int, int]] = {}  # outstanding lease -> (worker, task)
        self.status: dict[int, Status] = {}
        self.attempts: Counter[int] = Counter()
        self.accepted = 0
        self.stale = 0

    @initialize()
    def start(self) -> None:
        self.take()

    # --------------------------------------------------------------------------------- inputs

    @rule(
        pool=st.sampled_from(["a", "b", "zzz"]),
        items=st.lists(
            st.tuples(
                st.sampled_from(list(Priority)),
                st.sampled_from(["", "", "k1", "k2", "k3"]),
                st.sampled_from(range(len(LABELS))),
                st.one_of(st.none(), st.floats(0.0, 20.0)),
                st.one_of(st.none(), st.floats(0.0, 4.0)),
            ),
            min_size=1,
            max_size=4,
        ),
    )
    def submit(self, pool: str, items: list[tuple[Priority, str, int, float | None, float | None]]) -> None:
        specs = [
            TaskSpec(pool, priority=p, key=k, labels=dict(LABELS[lab]), deadline=d, timeout=t)
            for p, k, lab, d, t in items
        ]
        before = self.engine.pending_count(pool) if self.engine.has_pool(pool) else 0
        try:
            submitted = self.engine.submit(specs, self.now)
        except AdmissionError:
            assert self.engine.take_actions() == []
            return
        assert len(submitted) == len(specs)
        # Admission never takes a pool past max_pending (retries, which are not admitted, may).
        limit = self.engine.pool_config(pool).max_pending
        assert limit is not None
        assert self.engine.pending_count(pool) <= max(limit, before)
        self.accepted += sum(not s.duplicate for s in submitted)
        for s in submitted:
            assert self.engine.get(s.id) is not None
        self.take()

    @rule(
        pool=st.sampled_from(["a", "b"]), slots=st.integers(0, 5), labels=st.sampled_from(range(len(LABELS)))
    )
    def add_worker(self, pool: str, slots: int, labels: int) -> None:
        wid = self.next_worker
        self.next_worker += 1
        granted = self.engine.add_worker(wid, pool, slots, LABELS[labels], self.now)
        assert granted == min(slots, self.engine.pool_config(pool).max)
        self.workers[wid] = (pool, granted)
        self.take()

    @precondition(lambda self: bool(self.workers))
    @rule(data=st.data(), slots=st.integers(0, 5))
    def set_slots(self, data: st.DataObject, slots: int) -> None:
        wid = data.draw(st.sampled_from(sorted(self.workers)))
        pool, _ = self.workers[wid]
        self.workers[wid] = (pool, self.engine.set_worker_slots(wid, slots, self.now))
        self.take()

    @precondition(lambda self: bool(self.workers))
    @rule(data=st.data())
    def remove_worker(self, data: st.DataObject) -> None:
        wid = data.draw(st.sampled_from(sorted(self.workers)))
        del self.workers[wid]
        self.engine.remove_worker(wid, self.now)
        self.leases = {lease: held for lease, held in self.leases.items() if held[0] != wid}
        self.take()

    @precondition(lambda self: bool(self.leases))
    @rule(
        data=st.data(),
        outcome=st.sampled_from(["complete", "retry", "permanent", "nack", "cancelled", "heartbeat"]),
    )
    def report(self, data: st.DataObject, outcome: str) -> None:
        lease = data.draw(st.sampled_from(sorted(self.leases)))
        wid, _ = self.leases[lease]
        e = self.engine
        if outcome == "heartbeat":
            assert e.heartbeat(wid, lease, self.now)
            return
        del self.leases[lease]
        if outcome == "complete":
            assert e.complete(wid, lease, self.now)
        elif outcome == "retry":
            assert e.fail(
                wid, lease, "boom", False, data.draw(st.one_of(st.none(), st.floats(0, 3))), self.now
            )
        elif outcome == "permanent":
            assert e.fail(wid, lease, "bad", True, None, self.now)
        elif outcome == "nack":
            assert e.nack(wid, lease, "no", self.now)
        else:
            assert e.cancelled(wid, lease, self.now)
        self.take()

    @rule(lease=st.integers(0, 50), wid=st.integers(0, 8))
    def stale_report(self, lease: int, wid: int) -> None:
        if self.leases.get(lease, (None,))[0] == wid:
            return
        assert not self.engine.complete(wid, lease, self.now)
        self.stale += 1
        assert self.engine.take_actions() == []

    @precondition(lambda self: bool(self.status))
    @rule(data=st.data())
    def cancel(self, data: st.DataObject) -> None:
        task_id = data.draw(st.sampled_from(sorted(self.status)))
        live = not self.status[task_id].terminal
        assert self.engine.cancel(task_id, self.now) == live
        self.take()

    @rule(dt=st.floats(0.0, 4.0))
    def tick(self, dt: float) -> None:
        self.now += dt
        wake = self.engine.next_wakeup()
        assert wake is None or wake >= 0.0
        self.engine.tick(self.now)
        self.take()

    # ------------------------------------------------------------------------------- the model

    def take(self) -> None:
        """Apply the engine's actions to the model, checking each against it."""
        for action in self.engine.take_actions():
            if isinstance(action, Dispatch):
                task_id = action.task.id
                assert action.lease not in self.leases
                assert task_id not in {t for _, t in self.leases.values()}, "task leased twice"
                assert action.worker_id in self.workers
                pool, slots = self.workers[action.worker_id]
                assert action.task.spec.pool == pool
                held = sum(1 for w, _ in self.leases.values() if w == action.worker_id)
                assert held < slots, "worker over its granted slots"
                worker_labels = next(v.labels for v in self.engine.workers() if v.id == action.worker_id)
                assert action.task.spec.labels.items() <= worker_labels.items()
                self.leases[action.lease] = (action.worker_id, task_id)
            elif isinstance(action, Abort):
                assert self.leases.pop(action.lease)[0] == action.worker_id
            elif type(action) is tuple:
                self.event(action)

    def event(self, event: StatusChange) -> None:
        status, attempt, _, _, task = event
        before = self.status.get(task.id)
        if before is None:
            assert status is S.BLOCKED and attempt == 0
        else:
            assert status in self.transitions.get(before, set()), (before, status)
        if status is S.RUNNING:
            self.attempts[task.id] += 1
            assert attempt == self.attempts[task.id]
        self.status[task.id] = status

    # ------------------------------------------------------------------------------ invariants

    @invariant()
    def tasks_agree_with_events_and_leases(self) -> None:
        running = {t for _, t in self.leases.values()}
        for task_id, status in self.status.items():
            task = self.engine.get(task_id)
            assert task is not None and task.status is status
            assert (status is S.RUNNING) == (task_id in running)
            assert (task.lease != 0) == (status is S.RUNNING)
            assert task.attempt <= task.max_attempts
            if status in PENDING:
                assert task.spec.payload is not None

    @invariant()
    def counters_add_up(self) -> None:
        snap = self.engine.snapshot(self.now)
        t = snap.totals
        by_status = Counter(self.status.values())
        live = sum(n for s, n in by_status.items() if not s.terminal)
        assert t.submitted == self.accepted == len(self.status)
        assert t.succeeded == by_status[S.SUCCEEDED] and t.failed == by_status[S.FAILED]
        assert t.dead_lettered == by_status[S.DEAD_LETTERED] and t.cancelled == by_status[S.CANCELLED]
        assert t.shed == by_status[S.SHED]
        assert t.submitted == live + t.succeeded + t.failed + t.dead_lettered + t.cancelled + t.shed
        assert t.dispatched == sum(self.attempts.values())
        assert t.stale_completions == self.stale
        assert snap.live_tasks == live
        assert snap.running == len(self.leases) == by_status[S.RUNNING]
        assert snap.pending == sum(n for s, n in by_status.items() if s in PENDING)
        assert snap.pending == sum(sum(p.pending_by_class) for p in snap.pools)
        for pool in snap.pools:
            assert pool.pending_by_class == [
                sum(1 for i, s in self.status.items() if s in PENDING and self.priority(i, pool.name) == c)
                for c in Priority
            ]
            assert 0.0 <= pool.priority_adherence <= 1.0
            assert 0.0 <= pool.schedule_efficiency <= pool.utilization <= 1.0

    @invariant()
    def waiting_counts_the_blocked_and_scheduled(self) -> None:
        """The engine's own count of tasks not yet eligible (kept apart from the backlog the autoscaler
        sees) matches their statuses, per pool and class; it cannot go negative."""
        for pool in self.engine.pool_names:
            assert self.engine._waiting[pool] == [
                sum(1 for i, s in self.status.items() if s in WAITING and self.priority(i, pool) == c)
                for c in Priority
            ]

    @invariant()
    def busy_within_capacity(self) -> None:
        views = self.engine.workers()
        assert {v.id for v in views} == set(self.workers)
        held = Counter(w for w, _ in self.leases.values())
        over = 0
        for v in views:
            assert v.busy == held[v.id] and v.slots == self.workers[v.id][1]
            over += max(0, v.busy - v.slots)  # only after slots were lowered under running leases
        snap = self.engine.snapshot(self.now)
        assert sum(p.busy for p in snap.pools) <= sum(p.capacity for p in snap.pools) + over
        for pool in snap.pools:
            assert sum(g.busy for g in pool.groups) == pool.busy
            assert sum(g.capacity for g in pool.groups) == pool.capacity

    @invariant()
    def no_ready_task_waits_beside_a_free_worker(self) -> None:
        """Every input ends with a dispatch of whatever it made runnable, in any pool: a READY task
        never waits while a worker of its pool, whose labels include its own, has a free slot."""
        free = [v for v in self.engine.workers() if v.busy < v.slots]
        for task_id, status in self.status.items():
            if status is not S.READY:
                continue
            task = self.engine.get(task_id)
            assert task is not None
            if self.may_wait(task):
                continue
            wanted = task.spec.labels.items()
            idle = [v.id for v in free if v.pool == task.spec.pool and wanted <= v.labels.items()]
            assert not idle, f"task {task_id} waits while workers {idle} have a free slot"

    def may_wait(self, task: Task) -> bool:
        """Whether a READY task may wait beside a free worker for a reason of its own (none here)."""
        return False

    def priority(self, task_id: int, pool: str) -> int | None:
        task = self.engine.get(task_id)
        assert task is not None
        return task.spec.priority if task.spec.pool == pool else None


EngineMachine.TestCase.settings = settings(
    max_examples=150, stateful_step_count=60, deadline=None, suppress_health_check=[HealthCheck.too_slow]
)
TestEngineMachine = EngineMachine.TestCase
