"""Fixed starts: the reservations a pool promises them, the worker slots held for them, and their start.

A fixed-start task reserves [start - tolerance, start + duration estimate + tolerance]. A pool accepts
at most ``limit`` = max(1, floor(max x reservable_fraction)) reservations overlapping at any instant, so
capacity promised to fixed starts never exceeds what the pool can hold aside for them; one more is a
``reservation_conflict`` at submission. A reservation lasts until its task ends or its window closes.
Fixed starts are rare next to ordinary tasks, so a plain scan is the right structure.

Once its dependencies are met a fixed start is SCHEDULED until its start; from start - max(tolerance,
1 s) a compatible worker slot is held for it, so that it can run on time even when the pool is busy.
At its start it runs on that slot (or queues READY if there was none); by start + tolerance it must
have run, or ``on_miss`` decides (MISSED, FAILED, or run late as a non-hit).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING, Final

from .model import WAITING, AdmissionError, MissPolicy, PoolConfig, Status, Task, TaskSpec
from .pool import PoolState
from .table import TaskTable
from .timers import TimerKind
from .workers import Group, Worker, label_set

if TYPE_CHECKING:
    from .core import EngineCore

Window = tuple[float, float]  # (from, to), Unix seconds

_SCHEDULED: Final = Status.SCHEDULED
_READY: Final = Status.READY
FIXED_MISSED: Final = "fixed start missed"
MIN_HOLD_AHEAD: Final = 1.0  # a worker is held from start - max(tolerance, this) for a fixed start


def reservation_limit(max_workers: int, reservable_fraction: float) -> int:
    """How many reservations of a pool may overlap."""
    return max(1, math.floor(max_workers * reservable_fraction))


def peak_overlap(windows: list[Window], lo: float, hi: float) -> int:
    """The most of ``windows`` that overlap at one instant within [lo, hi] (touching ends do not)."""
    points: list[tuple[float, int]] = []
    for start, end in windows:
        if start < hi and lo < end:
            points.append((max(start, lo), 1))
            points.append((min(end, hi), -1))
    points.sort()  # at equal times an end (-1) sorts before a start (+1): touching windows do not overlap
    depth = peak = 0
    for _, step in points:
        depth += step
        peak = max(peak, depth)
    return peak


class Reservations:
    """The reservations of one pool, by task id."""

    __slots__ = ("limit", "windows")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.windows: dict[int, Window] = {}

    def fits(self, window: Window, planned: list[Window]) -> bool:
        """Whether ``window`` can be reserved next to the current reservations and ``planned`` ones (the
        earlier fixed starts of the same batch)."""
        lo, hi = window
        return peak_overlap([*self.windows.values(), *planned], lo, hi) < self.limit

    def add(self, task_id: int, window: Window) -> None:
        self.windows[task_id] = window

    def remove(self, task_id: int) -> None:
        self.windows.pop(task_id, None)

    def active(self, now: float) -> int:
        """Reservations whose window has not closed (the snapshot's ``reservations``); closed ones are
        dropped on the way."""
        closed = [task_id for task_id, (_, end) in self.windows.items() if end < now]
        for task_id in closed:
            del self.windows[task_id]
        return len(self.windows)

    def peak_ahead(self, now: float, horizon: float, waiting: set[int]) -> int:
        """The peak overlap within [now, now + horizon] of the reservations of ``waiting`` tasks (fixed
        starts not started yet): capacity the autoscaler must provide on top of the backlog."""
        windows = [window for task_id, window in self.windows.items() if task_id in waiting]
        return peak_overlap(windows, now, now + horizon)


class FixedStarts:
    """The fixed-start feature of one engine: each pool's reservations, the slots held for starts, and
    the rules from admission to the start (or the miss).

    The engine asks it to check and reserve a batch's fixed starts, hands it a task whose dependencies
    are met (``schedule``), its timers (FIXED_HOLD, FIXED_START, FIXED_MISS), the end of a fixed-start
    task (``ended``) and workers that leave or shrink (``move_holds``), and serves waiting holds first
    when it dispatches (``serve_holds``). It calls back into the engine for what every status change
    goes through (``_finish``, ``_eligible``, ``_start_held``), and into ``RecurringSchedules`` for the
    ``overlap = skip`` check of an occurrence whose start came. The holds still waiting for a slot are
    ``PoolState.hold_wanted``, on the pool, because every dispatch looks at them.
    """

    __slots__ = ("_engine", "_holds", "_reservations", "_table")

    def __init__(self, engine: EngineCore, table: TaskTable, pools: Sequence[PoolConfig]) -> None:
        self._engine = engine
        self._table = table
        self._reservations = {
            c.name: Reservations(reservation_limit(c.max, c.reservable_fraction)) for c in pools
        }
        self._holds: dict[int, Worker] = {}  # task id -> worker with a slot held for its fixed start

    # ------------------------------------------------------------------------------- admission

    def check(self, pool: PoolState, spec: TaskSpec, index: int, planned: dict[str, list[Window]]) -> None:
        """Raise AdmissionError (with ``index``) if the fixed start of ``spec`` would overlap more
        reservations of its pool than the pool allows, counting the earlier fixed starts of the same
        batch (``planned``, per pool, which this extends)."""
        window = self._window(pool, spec)
        mine = planned.setdefault(pool.name, [])
        if not self._reservations[pool.name].fits(window, mine):
            raise AdmissionError("reservation_conflict", "fixed-start reservation conflict", index)
        mine.append(window)

    def reserve(self, pool: PoolState, task: Task) -> None:
        """Reserve the window of a fixed-start task admitted (or restored) in ``pool``."""
        self._reservations[pool.name].add(task.id, self._window(pool, task.spec))

    def schedule(self, pool: PoolState, task: Task, now: float) -> None:
        """A fixed-start task whose dependencies are met (BLOCKED until now, or SCHEDULED as restored):
        SCHEDULED until its start (a worker is held from start - max(tolerance, 1 s)); or, its start
        passed, judged as ``_start`` would have judged it on time (an overlapped occurrence is skipped),
        then READY within its tolerance or missed already.

        The task comes counted in the engine's ``_waiting`` and stays so only while SCHEDULED: a task
        that ends here leaves the count in ``_finish``, which goes by its status, so counting it out
        beforehand would count it out twice."""
        spec = task.spec
        start = spec.start
        assert start is not None
        engine = self._engine
        late = start + spec.tolerance
        if now < start:
            task.status = _SCHEDULED
            engine._actions.append((_SCHEDULED, 0, now, "", task))
            engine._arm(start, TimerKind.FIXED_START, task.id)
            engine._arm(late, TimerKind.FIXED_MISS, task.id)
            hold_at = start - max(spec.tolerance, MIN_HOLD_AHEAD)
            if hold_at <= now:
                self._hold(pool, task)
            else:
                engine._arm(hold_at, TimerKind.FIXED_HOLD, task.id)
            return
        if engine._recurring.skip_overlap(pool, task, now):
            return
        if now > late and spec.on_miss is not MissPolicy.RUN_LATE:
            self._miss(pool, task, now)
            return
        if now <= late:
            engine._arm(late, TimerKind.FIXED_MISS, task.id)
        engine._eligible(pool, task, start, now)  # dispatched past its tolerance, it counts as a non-hit

    def restored_ready(self, task: Task) -> None:
        """A fixed-start task restored READY before its first attempt: its miss is still to be judged
        (unless it runs late anyway)."""
        spec = task.spec
        assert spec.start is not None
        if not task.attempt and spec.on_miss is not MissPolicy.RUN_LATE:
            self._engine._arm(spec.start + spec.tolerance, TimerKind.FIXED_MISS, task.id)

    # ---------------------------------------------------------------------------------- timers

    def due(self, due: float, kind: TimerKind, task: Task) -> float | None:
        """When a FIXED_START, FIXED_HOLD or FIXED_MISS timer of ``task`` fires: None once it no longer
        applies (the task started, ended, or runs late anyway)."""
        status = task.status
        if kind is TimerKind.FIXED_MISS:
            waiting = status is _SCHEDULED or status is _READY
            return (
                due if waiting and not task.attempt and task.spec.on_miss is not MissPolicy.RUN_LATE else None
            )
        return due if status is _SCHEDULED else None

    def fire(self, kind: TimerKind, pool: PoolState, task: Task, now: float) -> None:
        """Run a FIXED_START, FIXED_HOLD or FIXED_MISS timer that still applies."""
        if kind is TimerKind.FIXED_START:
            self._start(pool, task, now)
        elif kind is TimerKind.FIXED_MISS:
            self._miss(pool, task, now)
        else:
            self._hold(pool, task)

    # ------------------------------------------------------------------------- slots and ends

    def serve_holds(self, pool: PoolState) -> None:
        """Give slots that came free to fixed starts waiting for a hold, oldest first."""
        wanted = pool.hold_wanted
        for task in list(wanted.values()):
            worker = pool.workers.take(label_set(task.spec.labels))
            if worker is not None:
                del wanted[task.id]
                self._holds[task.id] = worker

    def move_holds(self, pool: PoolState, worker: Worker) -> None:
        """Fixed starts holding a slot on ``worker`` (leaving, or drained) need a slot elsewhere."""
        if not self._holds:
            return
        for task_id, held in list(self._holds.items()):
            if held is worker:
                del self._holds[task_id]
                pool.workers.release(worker)
                pool.hold_wanted[task_id] = self._table.by_id[task_id]

    def ended(self, pool: PoolState, task: Task) -> None:
        """A fixed-start task ended: its reservation goes, and so does the slot held for it, if any."""
        self._reservations[pool.name].remove(task.id)
        worker = self._holds.pop(task.id, None)
        if worker is None:
            pool.hold_wanted.pop(task.id, None)
        else:
            pool.workers.release(worker)

    # ----------------------------------------------------------------------------------- views

    def held(self, pool: str) -> list[Group]:
        """The group of each slot of ``pool`` held for a fixed start (a slot held is not busy)."""
        return [worker.group for worker in self._holds.values() if worker.pool == pool]

    def reservations(self, pool: str, now: float) -> int:
        """Reservations of ``pool`` whose window has not closed."""
        return self._reservations[pool].active(now)

    def reserved_ahead(self, pool: str, now: float, horizon: float) -> int:
        """The peak overlap within [now, now + horizon] of the reservations of fixed starts of ``pool``
        not started yet: capacity the autoscaler must provide on top of the backlog."""
        reservations = self._reservations[pool]
        by_id = self._table.by_id
        not_started = {
            task_id
            for task_id in reservations.windows
            if (task := by_id.get(task_id)) is not None and task.status in WAITING
        }
        return reservations.peak_ahead(now, horizon, not_started)

    # ------------------------------------------------------------------------------- internals

    def _window(self, pool: PoolState, spec: TaskSpec) -> Window:
        """The reservation of a fixed start: [start - tolerance, start + estimate + tolerance]."""
        assert spec.start is not None
        hint = spec.duration_hint
        estimate = pool.queue.durations.of(spec.kind) if hint is None else hint
        return (spec.start - spec.tolerance, spec.start + estimate + spec.tolerance)

    def _hold(self, pool: PoolState, task: Task) -> None:
        """Set a compatible worker slot aside for a fixed start; if none is free, the next dispatch of
        the pool serves the hold before any queued task."""
        if task.id in self._holds:
            return
        worker = pool.workers.take(label_set(task.spec.labels))
        if worker is None:
            pool.hold_wanted[task.id] = task
        else:
            self._holds[task.id] = worker

    def _start(self, pool: PoolState, task: Task, now: float) -> None:
        """The start time of a SCHEDULED task arrived: run it on its held slot, or queue it."""
        spec = task.spec
        start = spec.start
        assert start is not None
        engine = self._engine
        if engine._recurring.skip_overlap(pool, task, now):
            return
        pool.hold_wanted.pop(task.id, None)
        worker = self._holds.pop(task.id, None)
        if worker is not None and (not spec.resources or engine._resources.take(spec.resources, now) is None):
            engine._start_held(pool, task, worker, start, now)
            return
        if worker is not None:
            pool.workers.release(worker)
        engine._eligible(pool, task, start, now)

    def _miss(self, pool: PoolState, task: Task, now: float) -> None:
        """Start + tolerance passed before the task ran: MISSED or FAILED as ``on_miss`` says (run_late
        tasks just stay READY and count as a non-hit when they run)."""
        pool.stats.bucket(now).fixed_start(False)
        status = Status.MISSED if task.spec.on_miss is MissPolicy.SKIP else Status.FAILED
        self._engine._finish(pool, task, status, FIXED_MISSED, now)
        self._engine._mark_dirty(pool)
