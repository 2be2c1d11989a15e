"""Worker capacity of a pool: workers, their label groups, free slots and the leases they hold.

Workers with exactly the same label set form a group (the snapshot reports groups). Each group keeps a
ring of its workers that have a free slot, so finding a worker is O(groups) and taking the ring's first
worker and putting it back at the end spreads leases round-robin. The invariant that makes this cheap:
a worker is in its group's ring exactly when ``busy < slots``.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from typing import Final

from .model import Task

LabelSet = frozenset[tuple[str, str]]
NO_LABELS: Final[LabelSet] = frozenset()
_COMPATIBLE_CACHE: Final = 1024  # label sets whose compatible groups are remembered


def label_set(labels: Mapping[str, str]) -> LabelSet:
    """The hashable form of a label mapping: the key of groups and of labelled lanes."""
    return frozenset(labels.items()) if labels else NO_LABELS


class Worker:
    """A connected worker (or a library-mode capacity source) serving one pool."""

    __slots__ = ("busy", "group", "id", "in_ring", "labels", "leases", "pool", "slots")

    def __init__(self, worker_id: int, pool: str, labels: Mapping[str, str], group: Group) -> None:
        self.id = worker_id
        self.pool = pool
        self.labels = dict(labels)
        self.group = group
        self.slots = 0
        self.busy = 0  # leases held: len(leases), kept as a count by PoolWorkers
        self.in_ring = False
        self.leases: dict[int, Task] = {}  # lease id -> the task it runs


class Group:
    """The workers of a pool that share one exact label set."""

    __slots__ = ("busy", "capacity", "key", "labels", "ring", "workers")

    def __init__(self, key: LabelSet) -> None:
        self.key = key
        self.labels = dict(key)
        self.capacity = 0
        self.busy = 0
        self.workers = 0
        self.ring: deque[Worker] = deque()


class PoolWorkers:
    """All workers of one pool, with capacity, busy and free-slot totals kept current."""

    __slots__ = ("_compatible", "_rr", "busy", "capacity", "free", "groups", "workers")

    def __init__(self) -> None:
        self.groups: dict[LabelSet, Group] = {}
        self.workers = 0
        self.capacity = 0  # sum of granted slots
        self.busy = 0  # leases held
        self.free = 0  # sum over workers of max(0, slots - busy)
        self._compatible: dict[LabelSet, list[Group]] = {}
        self._rr = 0

    # ------------------------------------------------------------------------------ membership

    def add(self, worker_id: int, pool: str, labels: Mapping[str, str], slots: int) -> Worker:
        """Connect a worker with ``slots`` granted, in the group of its exact label set."""
        key = label_set(labels)
        group = self.groups.get(key)
        if group is None:
            group = self.groups[key] = Group(key)
            self._compatible.clear()
        group.workers += 1
        self.workers += 1
        worker = Worker(worker_id, pool, labels, group)
        self.set_slots(worker, slots)
        return worker

    def remove(self, worker: Worker) -> None:
        """Forget an idle worker (the engine ends its leases first)."""
        self.set_slots(worker, 0)
        group = worker.group
        group.workers -= 1
        self.workers -= 1
        if not group.workers:
            del self.groups[group.key]
            self._compatible.clear()

    def set_slots(self, worker: Worker, slots: int) -> None:
        """Grant ``worker`` ``slots`` (possibly fewer than it has leases: those run on, it gets no more)."""
        group = worker.group
        old_free = max(0, worker.slots - worker.busy)
        new_free = max(0, slots - worker.busy)
        group.capacity += slots - worker.slots
        self.capacity += slots - worker.slots
        self.free += new_free - old_free
        worker.slots = slots
        if new_free and not worker.in_ring:
            worker.in_ring = True
            group.ring.append(worker)
        elif not new_free and worker.in_ring:
            worker.in_ring = False
            group.ring.remove(worker)

    # --------------------------------------------------------------------------------- matching

    def compatible(self, required: LabelSet) -> list[Group]:
        """Groups whose labels include all of ``required`` (cached until the set of groups changes)."""
        groups = self._compatible.get(required)
        if groups is None:
            if len(self._compatible) >= _COMPATIBLE_CACHE:
                self._compatible.clear()
            groups = [g for key, g in self.groups.items() if required <= key]
            self._compatible[required] = groups
        return groups

    def has_free(self, required: LabelSet) -> bool:
        """Whether a worker whose labels include ``required`` has a free slot."""
        return any(g.ring for g in self.compatible(required))

    def take(self, required: LabelSet) -> Worker | None:
        """Take a slot on a worker whose labels include ``required``, round-robin across groups and
        across the workers of a group; None if every such worker is full."""
        groups = self._compatible.get(required) or self.compatible(required)  # a cache hit without a call
        count = len(groups)
        start = self._rr
        self._rr = start + 1
        for i in range(count):
            group = groups[(start + i) % count]
            if group.ring:
                return self._occupy(group, group.ring.popleft())
        return None

    def take_other(self, required: LabelSet, excluded: set[int]) -> Worker | None:
        """Like ``take`` but skipping the workers in ``excluded`` (those that nacked the attempt)."""
        for group in self.compatible(required):
            for worker in group.ring:
                if worker.id not in excluded:
                    group.ring.remove(worker)
                    return self._occupy(group, worker)
        return None

    def _occupy(self, group: Group, worker: Worker) -> Worker:
        """Occupy one slot of ``worker``, just taken out of ``group``'s ring; it goes back at the end of
        the ring if it still has a free slot."""
        worker.busy += 1
        group.busy += 1
        self.busy += 1
        self.free -= 1
        if worker.busy < worker.slots:
            group.ring.append(worker)
        else:
            worker.in_ring = False
        return worker

    def release(self, worker: Worker) -> None:
        """A lease on ``worker`` ended: its slot is free again (unless its slots were lowered meanwhile)."""
        worker.busy -= 1
        worker.group.busy -= 1
        self.busy -= 1
        if worker.busy < worker.slots:
            self.free += 1
            if not worker.in_ring:
                worker.in_ring = True
                worker.group.ring.append(worker)
