"""The engine's timers: one heap of (due time, kind, target) entries, cancelled lazily.

Cancelling a timer would mean finding it in the heap; instead an entry names its target by id plus a
token, and the engine decides when the entry comes due whether it still applies (the lease is still
held, the task is still RETRYING after the same attempt). When dead entries outnumber the live ones the
heap is compacted, which keeps its size proportional to the live leases and retries. A heartbeat does not touch the heap at all: it
moves the lease's expiry, and the old entry re-arms itself when it comes due.
"""

from __future__ import annotations

import enum
import heapq
from collections.abc import Callable


class TimerKind(enum.IntEnum):
    """What an entry does when it comes due. ``target`` is a lease id or a task id accordingly."""

    ATTEMPT_TIMEOUT = 1  # target: lease id
    LEASE_EXPIRY = 2  # target: lease id
    RETRY_READY = 3  # target: task id; token: the attempt that failed
    FIXED_HOLD = 4  # target: task id; hold a worker for its fixed start
    FIXED_START = 5  # target: task id; its fixed start arrived
    FIXED_MISS = 6  # target: task id; start + tolerance passed
    AWAIT_TIMEOUT = 7  # target: task id; stop awaiting unknown dependencies
    RESOURCE_WAKE = 8  # target: 0; token buckets may have refilled enough for parked tasks
    RECURRING = 9  # target: schedule number; token: its generation


# (due, tie-breaker, kind, target, token): the tie-breaker keeps entries due at the same time in the
# order they were armed and stops the comparison before the ints that follow.
TimerEntry = tuple[float, int, TimerKind, int, int]


class TimerHeap:
    """A min-heap of timer entries by due time."""

    __slots__ = ("_heap", "_n")

    def __init__(self) -> None:
        self._heap: list[TimerEntry] = []
        self._n = 0

    def __len__(self) -> int:
        return len(self._heap)

    def compact(self, live: Callable[[TimerEntry], bool]) -> None:
        """Drop every entry for which ``live`` is false (a timer of a lease that already ended, say),
        so a long timeout on many short attempts does not fill the heap with dead entries."""
        kept = [entry for entry in self._heap if live(entry)]
        heapq.heapify(kept)
        self._heap = kept

    def push(self, due: float, kind: TimerKind, target: int, token: int = 0) -> None:
        self._n += 1
        heapq.heappush(self._heap, (due, self._n, kind, target, token))

    def peek(self) -> TimerEntry | None:
        return self._heap[0] if self._heap else None

    def pop(self) -> TimerEntry:
        return heapq.heappop(self._heap)
