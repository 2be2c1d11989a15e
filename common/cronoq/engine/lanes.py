"""A pool's ready queue: lanes per class and label set, and the score that picks between lane heads.

Each lane holds its READY tasks in FIFO order by sequence number (a retried task goes back at its
original sequence, ahead of later arrivals) and, for tasks with a deadline, in an EDF heap keyed by latest
start time (deadline - duration estimate: deadline order when the estimates are equal, and the most
urgent first when they are not). Picking the next task compares only the heads of the lanes that have a
free compatible worker, so a dispatch costs O(lanes + log n) however long the queue is.

Cancelled and shed tasks are not searched for: their entries stay in the heap and are dropped when they
surface (an entry is live exactly while its task is READY, because a READY task has one entry and leaves
the queue when dispatched).

In a fair-share pool the FIFO part of each lane is shared between tenants by weighted fair queueing (see
``FairLane``); the score between lanes and the EDF heaps are the same as in any pool.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping
from heapq import heapify, heappop, heappush, heapreplace
from typing import Final, Protocol

from .model import Priority, Status, Task, TaskSpec
from .workers import NO_LABELS, LabelSet, label_set

# Score = BASE[class] + min(AGING_RATE * wait, AGING_CAP) + urgency. The bases are far enough apart
# that aging lets a Low pass a fresh Normal (after 45 s) but never a fresh High, and nothing reaches
# Critical: the most a non-Critical task can score is 1000 + 800 + 8000 = 9800.
# Annotated in full: mypyc 2.4 loses a Final tuple whose type it infers from a literal (NameError).
BASE: Final[tuple[float, ...]] = (10_000.0, 1_000.0, 100.0, 10.0)
AGING_RATE: Final = 2.0  # points per second waiting
AGING_CAP: Final = 800.0
URGENCY_MAX: Final = 5_000.0  # at the latest start time
URGENCY_MIN_WINDOW: Final = 5.0  # urgency ramps up over max(this, duration estimate) before the latest start
OVERDUE_RATE: Final = 100.0  # points per second past the latest start
OVERDUE_CAP: Final = 3_000.0
# The most a task of each class can score without a deadline, and with one.
_CEILING: Final = tuple(base + AGING_CAP for base in BASE)
_CEILING_EDF: Final = tuple(ceiling + URGENCY_MAX + OVERDUE_CAP for ceiling in _CEILING)

_READY: Final = Status.READY
_COMPACT_SLACK: Final = 64  # stale entries a lane may hold before it is worth compacting
_SWEEP_MIN: Final = 64  # tenants a fair lane may remember before it looks for idle ones to forget
_CLASSES: Final = range(len(Priority))

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


class Durations:
    """How long a pool's attempts of each kind take, learned from successful attempts: the duration
    estimate of tasks without a ``duration_hint`` (their urgency and their fixed-start reservation),
    the pool's ``default_duration`` until a kind has succeeded once.

    An exponentially weighted mean, so the estimate follows a kind whose run time drifts; kinds are
    free-form, so at most ``MAX_KINDS`` are learned per pool and the rest use the default.
    """

    __slots__ = ("default", "mean")

    MAX_KINDS = 1024
    WEIGHT = 0.2  # of the newest run time

    def __init__(self, default: float) -> None:
        self.default = default
        self.mean: dict[str, float] = {}

    def of(self, kind: str) -> float:
        return self.mean.get(kind, self.default)

    def learn(self, kind: str, seconds: float) -> None:
        mean = self.mean
        old = mean.get(kind)
        if old is not None:
            mean[kind] = old + (seconds - old) * self.WEIGHT
        elif len(mean) < self.MAX_KINDS:
            mean[kind] = seconds


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

    def entries(self) -> int:
        """The entries the lane holds, those of tasks that left included."""
        return len(self.fresh) + len(self.requeued) + len(self.edf)


class Tenant:
    """One tenant's FIFO tasks in a fair lane (``fresh`` and ``requeued`` as in ``Lane``) and its virtual
    clock there.

    The clock is kept as ``base + served / weight`` rather than summed 1/weight at a time, so shares that
    are equal in exact arithmetic give equal floats (three dispatches at weight 3 weigh exactly one at
    weight 1) and such ties go to the earlier submission, as the rule says, instead of to rounding.
    """

    __slots__ = ("base", "clock", "entry", "fresh", "requeued", "served", "weight")

    def __init__(self, weight: float) -> None:
        self.weight = weight
        self.base = 0.0  # the clock when the tenant last became active
        self.served = 0  # dispatches since then
        self.clock = 0.0
        self.fresh: deque[Task] = deque()
        self.requeued: list[FifoEntry] = []
        self.entry: TenantEntry | None = None  # its live entry in FairLane.order; None while it is idle

    def head_seq(self) -> int:
        """The sequence number of its first queued task (which may have left: a lower bound)."""
        fresh = self.fresh
        requeued = self.requeued
        if fresh and (not requeued or fresh[0].seq < requeued[0][0]):
            return fresh[0].seq
        return requeued[0][0]


# (clock, seq of the tenant's head, entry number, tenant): the lowest clock first, then the earlier
# submission; the entry number is unique, so tuples never go on to compare tenants.
TenantEntry = tuple[float, int, int, Tenant]


class FairLane(Lane):
    """A lane of a fair-share pool. Its FIFO tasks are kept per tenant (the inherited ``fresh`` and
    ``requeued`` stay empty); deadline tasks use the inherited EDF heap as in any lane and are neither
    held back by nor charged to a tenant's clock: fairness orders the FIFO part, urgency the rest.

    Weighted fair queueing: a tenant's clock advances by 1/weight per dispatch of one of its tasks
    (weights from the pool's ``tenant_weights``, 1 for any other tenant; untenanted tasks are the tenant
    ""), and the next FIFO task is the head of the tenant with the lowest clock, the earlier submission on
    a tie. ``order`` is a heap of the tenants with queued tasks by (clock, head seq), so a dispatch costs
    O(log tenants). An entry is live while it is its tenant's ``entry``; a tenant whose key changes gets a
    new entry and the old one is dropped when it surfaces.

    Idle tenants: ``vtime`` is the clock at which the last FIFO task was served, i.e. the lowest clock
    among the tenants waiting at that moment; it never decreases. A tenant that becomes active again (or
    for the first time) starts from max(its clock, vtime). It cannot bank the turns it did not use while
    away and then monopolise the lane: it rejoins level with the least-served tenant still waiting. A
    tenant that has had its turn keeps its higher clock; that is how the reference's untenanted group
    could stand at 1 while new tenants started at 0. No clock is ever more than one turn (1/weight) ahead
    of vtime (a tenant is served only at the lowest clock), so that is all an idle tenant's record holds
    over a tenant never seen, which starts from vtime; ``_sweep`` forgets idle records so that tenants
    seen once cost no memory for ever.

    A task taken and then parked because a resource it needs is taken was not dispatched, so its tenant
    gets the turn back (``refund``): otherwise a tenant whose tasks wait for a resource would lose its
    share to the others, each parked task costing it a turn. A labelled lane is dropped when it empties,
    as in any pool, and its clocks with it.
    """

    __slots__ = ("order", "queued", "serial", "sweep_at", "tenants", "vtime", "weights")

    def __init__(self, priority: int, required: LabelSet, weights: Mapping[str, float]) -> None:
        super().__init__(priority, required)
        self.weights = weights
        self.tenants: dict[str, Tenant] = {}
        self.order: list[TenantEntry] = []
        self.vtime = 0.0
        self.queued = 0  # tasks the tenants hold, stale ones included
        self.serial = 0  # the number of the last entry made
        self.sweep_at = _SWEEP_MIN

    def entries(self) -> int:
        return super().entries() + self.queued

    def add(self, task: Task, ready_at: float, requeue: bool) -> None:
        """Queue a FIFO task with its tenant, (re)activating the tenant if it had nothing queued; a
        retried or ``requeue``d task goes back at its original place (see ``PoolQueue.push``)."""
        name = task.spec.tenant
        tenant = self.tenants.get(name)
        if tenant is None:
            if len(self.tenants) >= self.sweep_at:
                self._sweep()
            tenant = self.tenants[name] = Tenant(self.weights.get(name, 1.0))
        seq = task.seq
        if task.attempt or requeue:
            heappush(tenant.requeued, (seq, ready_at, task))
        else:
            tenant.fresh.append(task)  # its ready_at is ``ready_at``
        self.queued += 1
        entry = tenant.entry
        if entry is None:
            tenant.base = tenant.clock = max(tenant.clock, self.vtime)
            tenant.served = 0
            self._enter(tenant, seq)
        elif seq < entry[1]:  # a retried task went back ahead of the tenant's head
            self._enter(tenant, seq)

    def head(self) -> tuple[int, float] | None:
        """The sequence number and ready time of the next FIFO task, leaving its tenant's entry on top of
        ``order`` for ``take``; None if no tenant has a READY task. Tasks that left are dropped here."""
        order = self.order
        while order:
            entry = order[0]
            tenant = entry[3]
            live = tenant.entry
            # Compared by entry number, not identity: compiled code may box the same tuple anew.
            if live is None or live[2] != entry[2]:
                heappop(order)
                continue
            fresh = tenant.fresh
            requeued = tenant.requeued
            dropped = 0
            while fresh and fresh[0].status is not _READY:
                fresh.popleft()
                dropped += 1
            while requeued and requeued[0][2].status is not _READY:
                heappop(requeued)
                dropped += 1
            if dropped:
                self.stale -= dropped
                self.queued -= dropped
            if not (fresh or requeued):
                tenant.entry = None
                heappop(order)
                continue
            seq = tenant.head_seq()
            if seq != entry[1]:  # its head left: re-key the tenant and look again
                self._enter(tenant, seq, replace=True)
                continue
            if fresh and fresh[0].seq == seq:
                ready_at = fresh[0].ready_at
                assert ready_at is not None  # set with READY
                return seq, ready_at
            return seq, requeued[0][1]
        return None

    def take(self) -> tuple[Task, float]:
        """Remove the task ``head`` found, charge it to its tenant and move ``vtime`` to the clock it was
        served at."""
        tenant = self.order[0][3]
        fresh = tenant.fresh
        requeued = tenant.requeued
        if fresh and (not requeued or fresh[0].seq < requeued[0][0]):
            task = fresh.popleft()
            ready_at = task.ready_at
            assert ready_at is not None
        else:
            _, ready_at, task = heappop(requeued)
        self.queued -= 1
        self.vtime = tenant.clock
        tenant.served += 1
        tenant.clock = tenant.base + tenant.served / tenant.weight
        if fresh or requeued:
            self._enter(tenant, tenant.head_seq(), replace=True)
        else:
            tenant.entry = None
            heappop(self.order)
        return task, ready_at

    def refund(self, name: str) -> None:
        """Undo the charge ``take`` made to tenant ``name`` for a task that was then not dispatched. A
        tenant that was forgotten, or re-based when it became active again, holds no charge to undo."""
        tenant = self.tenants.get(name)
        if tenant is None or not tenant.served:
            return
        tenant.served -= 1
        tenant.clock = tenant.base + tenant.served / tenant.weight
        if tenant.entry is not None:  # re-keyed by its lower clock; the old entry goes stale
            self._enter(tenant, tenant.head_seq())

    def compact(self) -> None:
        """Drop the tenants' tasks that are no longer READY and rebuild ``order`` from the live keys."""
        order: list[TenantEntry] = []
        queued = 0
        for tenant in self.tenants.values():
            if tenant.entry is None:
                continue
            tenant.fresh = deque(task for task in tenant.fresh if task.status is _READY)
            requeued = [entry for entry in tenant.requeued if entry[2].status is _READY]
            heapify(requeued)
            tenant.requeued = requeued
            held = len(tenant.fresh) + len(requeued)
            if held:
                queued += held
                self.serial += 1
                entry = tenant.entry = (tenant.clock, tenant.head_seq(), self.serial, tenant)
                order.append(entry)
            else:
                tenant.entry = None
        heapify(order)
        self.order = order
        self.queued = queued

    def _enter(self, tenant: Tenant, seq: int, *, replace: bool = False) -> None:
        """Give ``tenant`` a new live entry keyed by its clock and ``seq``; with ``replace`` it takes the
        place of the top entry (the tenant's own, just served or re-keyed)."""
        self.serial += 1
        entry = tenant.entry = (tenant.clock, seq, self.serial, tenant)
        if replace:
            heapreplace(self.order, entry)
        else:
            heappush(self.order, entry)

    def _sweep(self) -> None:
        """Forget the idle tenants. One that comes back starts from vtime, at most the one turn its record
        was ahead earlier (not at all once vtime has caught up with it). This runs when a new tenant
        arrives and the table holds max(_SWEEP_MIN, twice what the last sweep kept): memory follows the
        tenants recently active, a lane that sees fewer than _SWEEP_MIN tenants forgets nothing, and the
        cost is O(1) per tenant added."""
        self.tenants = {name: tenant for name, tenant in self.tenants.items() if tenant.entry is not None}
        self.sweep_at = max(_SWEEP_MIN, 2 * len(self.tenants))


class PoolQueue:
    """The lanes of one pool. ``active`` lists the lanes that may hold READY tasks, Critical first, so
    a dispatch looks only at lanes with something in them; ``ready`` counts the READY tasks."""

    __slots__ = ("_edf_entries", "_labelled", "_plain", "active", "durations", "ready")

    def __init__(self, default_duration: float) -> None:
        self.durations = Durations(default_duration)
        self._plain = [self._new_lane(c, NO_LABELS) for c in _CLASSES]
        self._labelled: dict[tuple[int, LabelSet], Lane] = {}
        self.active: list[Lane] = []
        # EDF entries per class, stale ones included: an upper bound on whether a class can have urgency.
        self._edf_entries = [0 for _ in _CLASSES]
        self.ready = 0

    def push(self, task: Task, ready_at: float, *, requeue: bool = False) -> None:
        """Queue a task that became READY at ``ready_at``: at the back of its lane when it is new, at its
        original place when it comes back from a retry or, with ``requeue``, after it was taken without
        running (it waited for a resource), or by latest start time when it has a deadline."""
        spec = task.spec
        priority = spec.priority
        lane = self._labelled_lane(priority, spec.labels) if spec.labels else self._plain[priority]
        deadline = spec.deadline
        if deadline is not None:
            hint = spec.duration_hint
            estimate = self.durations.of(spec.kind) if hint is None else hint
            window = max(URGENCY_MIN_WINDOW, estimate)
            heappush(lane.edf, (deadline - estimate, task.seq, ready_at, window, task))
            self._edf_entries[priority] += 1
        elif task.attempt or requeue:
            heappush(lane.requeued, (task.seq, ready_at, task))
        else:
            lane.fresh.append(task)  # its ready_at is ``ready_at``
        self.ready += 1
        if not lane.active:
            self._activate(lane)

    def forget(self, task: Task) -> None:
        """A READY task left the queue without being dispatched (cancelled, shed). Its entry is dropped
        when it surfaces, or when such entries make up half of its lane: a lane nobody can serve (no
        worker has its labels) never surfaces anything, and must not keep finished tasks alive."""
        self.ready -= 1
        lane = self._lane_of(task.spec)
        lane.stale += 1
        if lane.stale > _COMPACT_SLACK and 2 * lane.stale > lane.entries():
            self._compact(lane)

    def _lane_of(self, spec: TaskSpec) -> Lane:
        return self._labelled_lane(spec.priority, spec.labels) if spec.labels else self._plain[spec.priority]

    def _activate(self, lane: Lane) -> None:
        """Put a lane that was out of the scan back in ``active``, after the lanes of its own and higher
        classes."""
        lane.active = True
        active = self.active
        priority = lane.priority
        at = len(active)
        while at and active[at - 1].priority > priority:
            at -= 1
        active.insert(at, lane)

    def _labelled_lane(self, priority: int, labels: Mapping[str, str]) -> Lane:
        key = (priority, label_set(labels))
        lane = self._labelled.get(key)
        if lane is None:
            lane = self._labelled[key] = self._new_lane(*key)
        return lane

    def _new_lane(self, priority: int, required: LabelSet) -> Lane:
        return Lane(priority, required)

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
        best_from = 0  # 1 fresh, 2 requeued, 3 edf, 4 a fair lane's tenants
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
            if fresh and (not requeued or fresh[0].seq < requeued[0][0]):
                head = fresh[0]
                seq = head.seq
                ready_at = head.ready_at
                source = 1
            elif requeued:
                seq, ready_at, _ = requeued[0]
                source = 2
            elif type(lane) is FairLane and (fair_head := lane.head()) is not None:
                seq, ready_at = fair_head
                source = 4
            else:
                source = 0
            if source:
                assert ready_at is not None  # set with READY
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
            elif not source:
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
        elif best_from == 4:
            assert type(best_lane) is FairLane
            task, ready_at = best_lane.take()
        else:
            edf_entries[best_lane.priority] -= 1
            _, _, ready_at, _, task = heappop(best_lane.edf)
        return task, best_lane.required, best_lane.priority > top_class, ready_at

    def refund(self, task: Task) -> None:
        """``task``, just returned by ``pop_best``, is not dispatched after all (a resource it needs is
        taken): nothing to undo outside fair-share pools."""

    def _deactivate(self, lanes: list[Lane]) -> None:
        """Take empty lanes out of the scan; labelled ones are forgotten, so label sets that stopped
        arriving cost nothing."""
        for lane in lanes:
            lane.active = False
            self.active.remove(lane)
            if lane.required:
                del self._labelled[(lane.priority, lane.required)]


class FairPoolQueue(PoolQueue):
    """The queue of a fair-share pool: its lanes are ``FairLane``s, whose FIFO tasks wait per tenant.

    ``push`` is overridden rather than branched on, so that a plain pool's push pays nothing for
    fairness. ``pop_best`` is shared: it asks a lane's tenants only when the lane has no task in its
    plain FIFO structures, which in a plain pool happens only for lanes holding nothing but deadline
    tasks or nothing at all.
    """

    __slots__ = ("_weights",)

    def __init__(self, default_duration: float, tenant_weights: Mapping[str, float]) -> None:
        self._weights = tenant_weights  # before the base class makes the lanes
        super().__init__(default_duration)

    def push(self, task: Task, ready_at: float, *, requeue: bool = False) -> None:
        """As in any pool, except that a FIFO task waits with its tenant (``FairLane.add``)."""
        spec = task.spec
        if spec.deadline is not None:
            super().push(task, ready_at, requeue=requeue)
            return
        lane = self._lane_of(spec)
        assert type(lane) is FairLane
        lane.add(task, ready_at, requeue)
        self.ready += 1
        if not lane.active:
            self._activate(lane)

    def refund(self, task: Task) -> None:
        """Give the turn ``pop_best`` charged for ``task`` back to its tenant (deadline tasks are never
        charged). Its lane is still there: the task is in flight, not finished."""
        spec = task.spec
        if spec.deadline is None:
            lane = self._lane_of(spec)
            assert type(lane) is FairLane
            lane.refund(spec.tenant)

    def _new_lane(self, priority: int, required: LabelSet) -> FairLane:
        return FairLane(priority, required, self._weights)

    def _compact(self, lane: Lane) -> None:
        super()._compact(lane)
        assert type(lane) is FairLane
        lane.compact()
