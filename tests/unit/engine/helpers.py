"""Small builders and action filters shared by the engine tests."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import NamedTuple

from cronoq.engine import (
    Abort,
    Action,
    Dispatch,
    Engine,
    EngineLimits,
    Overflow,
    PoolConfig,
    Priority,
    RetryRule,
    Status,
    StatusChange,
    Task,
    TaskSpec,
    UnknownDependency,
)

# Two pools between them using every pool option that changes scheduling: the feature property tests
# and the compiled-against-interpreted trace (trace.py) run on them.
FEATURE_POOLS = [
    PoolConfig(
        "a",
        max=4,
        lease_ttl=3.0,
        max_pending=8,
        overflow=Overflow.SHED_LOWEST,
        retry=RetryRule(max_attempts=3, initial_backoff=0.5, max_backoff=2.0),
        unknown_dependency=UnknownDependency.AWAIT,
        await_timeout=6.0,
        fair_share=True,
        tenant_weights={"t1": 2.0},
    ),
    PoolConfig(
        "b",
        max=3,
        max_pending=6,
        overflow=Overflow.REJECT,
        retry=RetryRule(max_attempts=2, initial_backoff=0.0, jitter=False),
    ),
]

NO_RETRY = RetryRule(max_attempts=1)
FIXED = RetryRule(max_attempts=3, initial_backoff=1.0, multiplier=2.0, max_backoff=60.0, jitter=False)


def make_engine(*pools: PoolConfig, limits: EngineLimits | None = None, seed: int = 0) -> Engine:
    """An engine with the given pools (default: one pool "p" without jitter) and a seeded rng."""
    configs = list(pools) or [PoolConfig("p", retry=FIXED)]
    return Engine(configs, limits=limits, rng=random.Random(seed))


def spec(
    pool: str = "p",
    *,
    priority: Priority = Priority.NORMAL,
    key: str = "",
    deadline: float | None = None,
    labels: dict[str, str] | None = None,
    timeout: float | None = None,
    retry: RetryRule | None = None,
    payload: object = b"x",
) -> TaskSpec:
    return TaskSpec(
        pool,
        payload=payload,
        priority=priority,
        key=key,
        deadline=deadline,
        labels=labels or {},
        timeout=timeout,
        retry=retry,
    )


class Event(NamedTuple):
    """A status event with its fields named; the engine emits plain ``StatusChange`` tuples."""

    id: int
    pool: str
    key: str
    status: Status
    attempt: int
    at: float
    message: str
    task: Task


def named(event: StatusChange) -> Event:
    status, attempt, at, message, task = event
    return Event(task.id, task.spec.pool, task.spec.key, status, attempt, at, message, task)


@dataclass
class Drained:
    """The actions taken from an engine, split by kind."""

    actions: list[Action] = field(default_factory=list)

    @property
    def dispatches(self) -> list[Dispatch]:
        return [a for a in self.actions if isinstance(a, Dispatch)]

    @property
    def aborts(self) -> list[Abort]:
        return [a for a in self.actions if isinstance(a, Abort)]

    @property
    def events(self) -> list[Event]:
        return [named(a) for a in self.actions if type(a) is tuple]

    def statuses(self, task_id: int) -> list[Status]:
        return [e.status for e in self.events if e.id == task_id]

    def dispatched_ids(self) -> list[int]:
        return [d.task.id for d in self.dispatches]


def drain(engine: Engine) -> Drained:
    return Drained(engine.take_actions())


def task_of(engine: Engine, ref: int | str) -> Task:
    """The task ``ref`` names (fails if the engine does not know it)."""
    task = engine.get(ref)
    assert task is not None, ref
    return task


def only_dispatch(engine: Engine) -> Dispatch:
    """The single Dispatch among the pending actions (fails otherwise)."""
    dispatches = drain(engine).dispatches
    assert len(dispatches) == 1, dispatches
    return dispatches[0]


def run_one_at_a_time(engine: Engine, worker_id: int, now: float) -> list[int]:
    """Complete leases one by one on a 1-slot worker and return the task ids in dispatch order."""
    order: list[int] = []
    pending = drain(engine).dispatches
    while pending:
        lease = pending[0]
        order.append(lease.task.id)
        assert engine.complete(worker_id, lease.lease, now)
        pending = drain(engine).dispatches
    return order
