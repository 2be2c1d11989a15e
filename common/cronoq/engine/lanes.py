"""A pool's ready queue: lanes per class and label set, and the score that picks between lane heads.

Each lane holds its READY tasks in FIFO order by sequence number (a retried task goes back at its
original sequence, ahead of later arrivals) and, for tasks with a deadline, in an EDF heap keyed by latest
start time (deadline - duration estimate: deadline order when the estimates are equal, and the most
urgent first when they are not). Picking the next task compares only the heads of the lanes that have a
free compatible worker, so a dispatch costs O(lanes + log n) however long the queue is.

Cancelled and shed tasks are not searched for: their entries stay in the heap and are dropped when they
surface (an entry is live exactly while its task is READY, because a READY task has one entry and leaves
the queue when dispatched).
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from heapq import heapify, heappop, heappush
from typing import Protocol

from .model import Priority, Status, Task
from .workers import NO_LABELS, LabelSet, label_set

# Score = BASE[class] + min(AGING_RATE * wait, AGING_CAP) + urgency. The bases are far enough apart
# that aging lets a Low pass a fresh Normal (after 45 s) but never a fresh High, and nothing reaches
# Critical: the most a non-Critical task can score is 1000 + 800 + 8000 = 9800.
BASE = (10_000.0, 1_000.0, 100.0, 10.0)
AGING_RATE = 2.0  # points per second waiting
AGING_CAP = 800.0
URGENCY_MAX = 5_000.0  # at the latest start time
URGENCY_MIN_WINDOW = 5.0  # urgency ramps up over max(this, duration estimate) before the latest start
OVERDUE_RATE = 100.0  # points per second past the latest start
OVERDUE_CAP = 3_000.0
# The most a task of each class can score without a deadline, and with one.
_CEILING = tuple(base + AGING_CAP for base in BASE)
_CEILING_EDF = tuple(ceiling + URGENCY_MAX + OVERDUE_CAP for ceiling in _CEILING)

_READY = Status.READY
_COMPACT_SLACK = 64  # stale entries a lane may hold before it is worth compacting
_CLASSES = range(len(Priority))

FifoEntry = tuple[int, float, Task]  # (seq, ready_at, task): for retried tasks
EdfEntry = tuple[float, int, float, float, Task]  # (latest_start, seq, ready_at, window, task)


def urgency(slack: float, window: float) -> float:
    """Points for a deadline: 0 while the latest start is at least ``window`` away, then rising
    linearly to URGENCY_MAX at the latest start, then OVERDUE_RATE more per second late (capped)."""
    if slack >= window:
        return 0.0
    if slack >= 0.0:
        return URGENCY_MAX * (1.0 - slack / window)
    return URGENCY_MAX + min(-slack * OVERDUE_RATE, OVERDUE_CAP)


class HasFree(Protocol):
    """Whether some worker with all of these labels has a free slot (``PoolWorkers.has_free``)."""

    def __call__(self, required: LabelSet, /) -> bool: ...


class Lane:
    """The READY tasks of one class that require one label set.

    FIFO order is kept by two structures: ``fresh``, a deque of first arrivals (their sequence numbers
    only grow, so appending keeps it sorted and taking the head is O(1); it holds the tasks themselves,
    which saves a tuple per task), and ``requeued``, a heap by sequence number for tasks coming back from
    a retry at their original place. The head of the lane's FIFO order is the smaller of the two heads.
    """

    __slots__ = ("active", "edf", "fresh", "priority", "requeued", "required", "stale")

    def __init__(self, priority: int, required: LabelSet) -> None:
        self.priority = priority
        self.required = required
        self.active = False  # in PoolQueue.active
        self.stale = 0  # entries of tasks that left without being dispatched
        self.fresh: deque[Task] = deque()
        self.requeued: list[FifoEntry] = []
        self.edf: list[EdfEntry] = []


class PoolQueue:
    """The lanes of one pool. ``active`` lists the lanes that may hold READY tasks, Critical first, so
    a dispatch looks only at lanes with something in them; ``ready`` counts the READY tasks."""

    __slots__ = ("_edf_entries", "_labelled", "_plain", "active", "default_duration", "ready")

    def __init__(self, default_duration: float) -> None:
        self.default_duration = default_duration
        self._plain = [Lane(c, NO_LABELS) for c in _CLASSES]
        self._labelled: dict[tuple[int, LabelSet], Lane] = {}
        self.active: list[Lane] = []
        # EDF entries per class, stale ones included: an upper bound on whether a class can have urgency.
        self._edf_entries = [0 for _ in _CLASSES]
        self.ready = 0

    def push(self, task: Task, ready_at: float) -> None:
        """Queue a task that became READY at ``ready_at``: at the back of its lane when it is new, at its
        original place when it comes back from a retry, or by latest start time when it has a deadline."""
        spec = task.spec
        priority = spec.priority
        lane = self._labelled_lane(priority, spec.labels) if spec.labels else self._plain[priority]
        deadline = spec.deadline
        if deadline is not None:
            hint = spec.duration_hint
            estimate = self.default_duration if hint is None else hint
            window = max(URGENCY_MIN_WINDOW, estimate)
            heappush(lane.edf, (deadline - estimate, task.seq, ready_at, window, task))
            self._edf_entries[priority] += 1
        elif task.attempt:
            heappush(lane.requeued, (task.seq, ready_at, task))
        else:
            lane.fresh.append(task)  # its ready_at is ``ready_at``
        self.ready += 1
        if not lane.active:
            lane.active = True
            active = self.active
            at = len(active)
            while at and active[at - 1].priority > priority:
                at -= 1
            active.insert(at, lane)

    def forget(self, task: Task) -> None:
        """A READY task left the queue without being dispatched (cancelled, shed). Its entry is dropped
        when it surfaces, or when such entries make up half of its lane: a lane nobody can serve (no
        worker has its labels) never surfaces anything, and must not keep finished tasks alive."""
        self.ready -= 1
        spec = task.spec
        lane = self._labelled_lane(spec.priority, spec.labels) if spec.labels else self._plain[spec.priority]
        lane.stale += 1
        if lane.stale > _COMPACT_SLACK and 2 * lane.stale > len(lane.fresh) + len(lane.requeued) + len(
            lane.edf
        ):
            self._compact(lane)

    def _labelled_lane(self, priority: int, labels: Mapping[str, str]) -> Lane:
        key = (priority, label_set(labels))
        lane = self._labelled.get(key)
        if lane is None:
            lane = self._labelled[key] = Lane(*key)
        return lane

    def _compact(self, lane: Lane) -> None:
        """Drop the entries of tasks that are no longer READY from every structure of ``lane``."""
        lane.fresh = deque(task for task in lane.fresh if task.status is _READY)
        requeued = [entry for entry in lane.requeued if entry[2].status is _READY]
        heapify(requeued)
        lane.requeued = requeued
        edf = [entry for entry in lane.edf if entry[4].status is _READY]
        heapify(edf)
        self._edf_entries[lane.priority] -= len(lane.edf) - len(edf)
        lane.edf = edf
        lane.stale = 0

    def pop_best(self, now: float, has_free: HasFree) -> tuple[Task, LabelSet, bool, float] | None:
        """Remove and return the best lane head among lanes with a free compatible worker, with the
        lane's label set, whether it passed over an eligible head of a higher class (an inversion), and
        when the task became READY.

        Lanes are scanned Critical first and the scan stops once no task of the remaining lanes can beat
        the best score found, so a busy Critical lane costs one score per dispatch.
        """
        best_score = -math.inf
        best_seq = 0
        best_lane: Lane | None = None
        best_from = 0  # 1 fresh, 2 requeued, 3 edf
        top_class = -1
        edf_entries = self._edf_entries
        drained: list[Lane] | None = None  # lanes found holding only stale entries
        for lane in self.active:
            cls = lane.priority
            if best_lane is not None and best_score > (_CEILING_EDF if edf_entries[cls] else _CEILING)[cls]:
                break
            required = lane.required
            if required and not has_free(required):
                continue
            fresh = lane.fresh
            while fresh and fresh[0].status is not _READY:
                fresh.popleft()
                lane.stale -= 1
            requeued = lane.requeued
            while requeued and requeued[0][2].status is not _READY:
                heappop(requeued)
                lane.stale -= 1
            if fresh or requeued:
                if fresh and (not requeued or fresh[0].seq < requeued[0][0]):
                    head = fresh[0]
                    seq = head.seq
                    ready_at = head.ready_at
                    assert ready_at is not None  # set with READY
                    source = 1
                else:
                    seq, ready_at, _ = requeued[0]
                    source = 2
                aging = AGING_RATE * (now - ready_at)
                s = BASE[cls] + (aging if aging < AGING_CAP else AGING_CAP)
                if s > best_score or (s == best_score and seq < best_seq):
                    best_score, best_seq, best_lane, best_from = s, seq, lane, source
                if top_class < 0:
                    top_class = cls
            edf = lane.edf
            while edf and edf[0][4].status is not _READY:
                heappop(edf)
                edf_entries[cls] -= 1
                lane.stale -= 1
            if edf:
                latest, seq, ready_at, window, _ = edf[0]
                aging = AGING_RATE * (now - ready_at)
                s = BASE[cls] + (aging if aging < AGING_CAP else AGING_CAP) + urgency(latest - now, window)
                if s > best_score or (s == best_score and seq < best_seq):
                    best_score, best_seq, best_lane, best_from = s, seq, lane, 3
                if top_class < 0:
                    top_class = cls
            elif not (fresh or requeued):
                drained = [lane] if drained is None else [*drained, lane]
        if drained is not None:
            self._deactivate(drained)
        if best_lane is None:
            return None
        self.ready -= 1
        if best_from == 1:
            task = best_lane.fresh.popleft()
            ready_at = task.ready_at
            assert ready_at is not None
        elif best_from == 2:
            _, ready_at, task = heappop(best_lane.requeued)
        else:
            edf_entries[best_lane.priority] -= 1
            _, _, ready_at, _, task = heappop(best_lane.edf)
        return task, best_lane.required, best_lane.priority > top_class, ready_at

    def _deactivate(self, lanes: list[Lane]) -> None:
        """Take empty lanes out of the scan; labelled ones are forgotten, so label sets that stopped
        arriving cost nothing."""
        for lane in lanes:
            lane.active = False
            self.active.remove(lane)
            if lane.required:
                del self._labelled[(lane.priority, lane.required)]
