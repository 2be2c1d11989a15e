"""Admission of a submitted batch: key dedup, pool bounds and overflow, decided before anything changes.

A batch is atomic, so every spec is decided first and the engine applies the decisions only when all of
them are admitted. The decisions follow what submitting the specs one by one would do: a later spec in
the batch can shed an earlier one (under shed_lowest an earlier Low task is the newest pending Low).
Victims taken from a pool's shed index are put back if the batch is refused.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping, Sequence

from .model import AdmissionError, Overflow, Priority, Task, TaskSpec
from .overflow import ShedEntry, ShedIndex
from .pool import PoolState
from .table import TaskTable


class Shed:
    """Admit a spec into ``pool`` after shedding ``victim``: a pending task, or the batch index of an
    earlier spec of the same batch."""

    __slots__ = ("pool", "victim")

    def __init__(self, pool: PoolState, victim: Task | int) -> None:
        self.pool = pool
        self.victim = victim


# Per spec: the existing task its key names (a duplicate), the pool to insert it into, or a Shed.
Decision = Task | PoolState | Shed


class _Batch:
    """What the specs decided so far add to each pool, as one-by-one submission would see it."""

    __slots__ = ("added", "by_class", "taken")

    def __init__(self) -> None:
        self.added: dict[str, int] = {}  # net pending change per bounded pool
        self.by_class: dict[tuple[str, int], deque[int]] = {}  # admitted, not shed: batch indexes
        self.taken: list[tuple[ShedIndex, ShedEntry]] = []

    def victim(self, pool: PoolState, index: ShedIndex, incoming: Priority) -> Task | int | None:
        """Choose the task a full pool sheds for an ``incoming`` task, taking it out of the running."""
        for cls in index.victim_classes(incoming):
            own = self.by_class.get((pool.name, cls))
            if index.newest and own:  # the batch's own tasks are newer than any pending one
                return own.pop()
            entry = index.take(cls)
            if entry is not None:
                self.taken.append((index, entry))
                return entry[2]
            if own:
                return own.popleft()
        return None


def plan(
    specs: Sequence[TaskSpec],
    pools: Mapping[str, PoolState],
    table: TaskTable,
    pending_total: int,
    max_total: int,
) -> list[Decision]:
    """Decide every spec of a batch, or raise AdmissionError (with the spec's index) changing nothing."""
    batch = _Batch()
    try:
        return _decide(specs, pools, table, pending_total, max_total, batch)
    except AdmissionError:
        for index, entry in batch.taken:
            index.restore(entry)
        raise


def _decide(
    specs: Sequence[TaskSpec],
    pools: Mapping[str, PoolState],
    table: TaskTable,
    pending_total: int,
    max_total: int,
    batch: _Batch,
) -> list[Decision]:
    decisions: list[Decision] = []
    keys: set[str] = set()
    for i, spec in enumerate(specs):
        pool = pools.get(spec.pool)
        if pool is None:
            raise AdmissionError("unknown_pool", f"unknown pool '{spec.pool}'", i)
        key = spec.key
        if key:
            if key in keys:
                raise AdmissionError("duplicate_key_in_batch", f"key '{key}' appears twice in the batch", i)
            keys.add(key)
            existing = table.by_key.get(key)
            if existing is not None:
                decisions.append(existing)
                continue
        decision: Decision = pool
        limit = pool.config.max_pending
        added = 0
        if limit is not None:
            added = batch.added.get(pool.name, 0)
            if sum(pool.pending) + added >= limit:
                decision = Shed(pool, _make_room(pool, limit, spec.priority, batch, i))
        if decision is pool:
            if pending_total >= max_total:
                raise AdmissionError(
                    "overloaded",
                    f"overloaded: {max_total} tasks pending (limits.max_pending_total)",
                    i,
                    limit="max_pending_total",
                )
            pending_total += 1
            if limit is not None:
                batch.added[pool.name] = added + 1
        if pool.shed is not None:
            batch.by_class.setdefault((pool.name, spec.priority), deque()).append(i)
        decisions.append(decision)
    return decisions


def _make_room(pool: PoolState, limit: int, incoming: Priority, batch: _Batch, i: int) -> Task | int:
    """The victim that makes room in a full pool, or AdmissionError as its overflow policy says."""
    overflow = pool.config.overflow
    if overflow is Overflow.WAIT:
        raise AdmissionError(
            "full", f"pool '{pool.name}' is full: {limit} tasks pending (max_pending)", i, limit="max_pending"
        )
    victim = None if pool.shed is None else batch.victim(pool, pool.shed, incoming)
    if victim is None:
        why = "" if overflow is Overflow.REJECT else " and no task it may shed"
        raise AdmissionError(
            "overloaded",
            f"pool '{pool.name}' is overloaded: {limit} tasks pending (max_pending){why}",
            i,
            limit="max_pending",
        )
    return victim
