"""Overflow: which pending task a full pool sheds to make room.

``shed_lowest`` evicts the newest pending task of the lowest class strictly below the incoming one;
``shed_oldest`` evicts the oldest pending Low task. Pending tasks sit in lanes and in retry timers, so
neither can be found there cheaply; a pool with a shed policy therefore also keeps one heap per class
ordered the way its policy searches (newest or oldest first). Pools with another policy keep nothing.

Entries are dropped lazily: an entry carries the task's attempt number from when it became pending, and
it is live while the task is still pending with that attempt number (a task is pending once at submit
and once after each failed attempt, so the pair is unique). Stale entries are compacted away when they
outnumber the live ones, which bounds the heaps by twice the pending count.
"""

from __future__ import annotations

from collections.abc import Sequence
from heapq import heapify, heappop, heappush

from .model import PENDING, Overflow, Priority, Task

ShedEntry = tuple[int, int, Task]  # (seq, or -seq for newest first; attempt when it became pending; task)

_COMPACT_SLACK = 64  # stale entries tolerated before a heap is worth compacting


def _live(entry: ShedEntry) -> bool:
    """Whether the task is still pending since the moment the entry was made."""
    task = entry[2]
    return task.status in PENDING and task.attempt == entry[1]


class ShedIndex:
    """The pending tasks of one pool that its shed policy may evict, per class."""

    __slots__ = ("_heaps", "newest")

    def __init__(self, policy: Overflow) -> None:
        self.newest = policy is Overflow.SHED_LOWEST  # else shed_oldest
        self._heaps: list[list[ShedEntry]] = [[] for _ in Priority]

    def victim_classes(self, incoming: Priority) -> Sequence[int]:
        """The classes to search, in order, for a victim to make room for a task of class ``incoming``."""
        if self.newest:
            return range(Priority.LOW, incoming, -1)
        return (Priority.LOW,)

    def track(self, task: Task, pending_in_class: int) -> None:
        """``task`` just became pending; ``pending_in_class`` counts its pool's pending tasks of its class."""
        cls = task.spec.priority
        if cls == Priority.CRITICAL or (not self.newest and cls != Priority.LOW):
            return  # never a victim under this policy
        heap = self._heaps[cls]
        heappush(heap, (-task.seq if self.newest else task.seq, task.attempt, task))
        if len(heap) > 2 * pending_in_class + _COMPACT_SLACK:
            live = [entry for entry in heap if _live(entry)]
            heapify(live)
            self._heaps[cls] = live

    def take(self, cls: int) -> ShedEntry | None:
        """Remove and return the first live entry of class ``cls`` in policy order, if any."""
        heap = self._heaps[cls]
        while heap:
            entry = heappop(heap)
            if _live(entry):
                return entry
        return None

    def restore(self, entry: ShedEntry) -> None:
        """Put back an entry taken for a batch that was then refused."""
        heappush(self._heaps[entry[2].spec.priority], entry)
