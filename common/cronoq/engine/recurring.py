"""Recurring schedules: a cron that creates one fixed-start task (an occurrence) per start.

Each schedule keeps exactly one occurrence ahead: when the occurrence of a start is created, a RECURRING
timer at that start creates the next. An occurrence is an ordinary fixed-start task made from the
schedule's template (key ``{key}@{start}``, ``start``, a deadline ``deadline_in`` after it); what makes
it recurring is its link to the occurrence before it, which ``overlap`` judges: ``queue`` and
``queue_on_success`` turn it into a dependency edge, ``skip`` skips the occurrence when its start comes
while the previous one is still live, and ``allow`` ignores it. A timer that fires late (a takeover, a
stalled loop) catches up with one occurrence, not one per passed start.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Final

from .cron import CronSchedule, occurrence_key
from .model import (
    WAITING,
    AdmissionError,
    DepEdge,
    DepOn,
    Overlap,
    Recurring,
    RecurringError,
    RecurringSpec,
    ScheduleChanged,
    Status,
    Task,
    TaskSpec,
)
from .pool import PoolState
from .readonly import NO_RESOURCES
from .resources import Resources
from .snapshot import Totals
from .table import TaskTable
from .timers import TimerKind

if TYPE_CHECKING:
    from .core import EngineCore

OVERLAPPED: Final = "previous occurrence still running"
REMOVED: Final = "cancelled: its recurring schedule was removed"


class RecurringSchedules:
    """The recurring feature of one engine: its schedules, the link of each pending occurrence to the
    one before it, and the rules that plan, create and judge occurrences.

    The engine forwards ``add_recurring``, ``remove_recurring``, ``list_recurring`` and the schedules of
    a takeover here, and RECURRING timers; ``FixedStarts`` asks ``skip_overlap`` when an occurrence's
    start comes, and the engine calls ``unlink`` when a fixed-start task ends. Occurrences enter through
    the engine's own admission (``EngineCore._insert``), so they are checked, counted and evented as any
    submission; a conflict or an invalid template counts in ``totals`` instead of raising, since no
    caller is there to tell.
    """

    __slots__ = (
        "_engine",
        "_next_number",
        "_numbered",
        "_occurrences",
        "_overlapped",
        "_pools",
        "_resources",
        "_schedules",
        "_table",
        "_totals",
    )

    def __init__(
        self,
        engine: EngineCore,
        table: TaskTable,
        pools: Mapping[str, PoolState],
        resources: Resources,
        totals: Totals,
    ) -> None:
        self._engine = engine
        self._table = table
        self._pools = pools
        self._resources = resources
        self._totals = totals
        self._schedules: dict[str, _Schedule] = {}
        self._numbered: dict[int, _Schedule] = {}  # the same schedules by number, for their timers
        self._next_number = 0
        self._occurrences: dict[int, tuple[_Schedule, int]] = {}  # occurrence id -> schedule, previous id
        # An occurrence skipped for overlap -> the live one it was skipped for, which the next occurrence
        # must then not overlap either (the entry goes when that next one is judged).
        self._overlapped: dict[int, int] = {}

    # ---------------------------------------------------------------------------------- inputs

    def add(self, spec: RecurringSpec, now: float) -> Recurring:
        """``Engine.add_recurring`` without the dispatch (see there)."""
        try:
            cron = CronSchedule.parse(spec.cron, spec.tz)
        except ValueError as err:
            raise RecurringError("invalid", str(err)) from None
        template = spec.template
        if template.pool not in self._pools:
            raise RecurringError("unknown_pool", f"template.pool: unknown pool '{template.pool}'")
        if template.deps:
            raise RecurringError(
                "invalid",
                "template.deps: a recurring template cannot have dependencies "
                "(use overlap = queue to chain occurrences)",
            )
        if template.start is not None:
            raise RecurringError(
                "invalid", "template.start: a recurring template cannot have a fixed start (the cron sets it)"
            )
        if template.deadline is not None:
            raise RecurringError(
                "invalid",
                "template.deadline: a recurring template cannot have an absolute deadline; use deadline_in",
            )
        if template.resources:
            problem = self._resources.check(template.resources)
            if problem is not None:
                raise RecurringError(problem[0], f"template.resources: {problem[1]}")
        start = cron.next_after(now)
        if start is None:
            raise RecurringError(
                "invalid", f"cron: {spec.cron!r} has no start after now (its years have passed)"
            )
        old = self._schedules.get(spec.name)
        recurring = Recurring(spec, None, old.recurring.last_task_id if old is not None else 0)
        schedule = self._new_schedule(recurring, cron)
        self._plan_occurrence(schedule, start, now)
        return recurring

    def remove(self, name: str, now: float) -> bool:
        """Remove a schedule; False if there was none.

        The occurrence it created ahead is cancelled with it while that occurrence's start is still to
        come (``scheduled``, or ``blocked`` waiting for the previous one to finish): left there, a
        removed schedule would run once more. Occurrences whose start has come (ready, running,
        retrying, or queued behind the previous one) were due before the removal and run to their end.
        """
        schedule = self._schedules.pop(name, None)
        if schedule is None:
            return False
        del self._numbered[schedule.number]
        self._engine._actions.append(ScheduleChanged(name, None))
        ahead = self._table.by_id.get(schedule.recurring.last_task_id)
        if ahead is not None and ahead.status in WAITING and (ahead.spec.start or 0.0) > now:
            pool = self._pools[ahead.spec.pool]
            self._engine._finish(pool, ahead, Status.CANCELLED, REMOVED, now)
            self._engine._mark_dirty(pool)  # its reservation's held slot, if any, is free again
        return True

    def schedules(self) -> list[Recurring]:
        """The schedules, in the order they were first added."""
        return [schedule.recurring for schedule in self._schedules.values()]

    def restore(self, schedules: Iterable[Recurring], live: Sequence[Task]) -> None:
        """Take over the schedules a previous leader stored, with their timers, and link each pending
        occurrence among the ``live`` restored tasks to the one before it. A schedule whose cron no
        longer parses is dropped and counted in ``totals.recurring_invalid``."""
        for recurring in schedules:
            try:
                cron = CronSchedule.parse(recurring.spec.cron, recurring.spec.tz)
            except ValueError:
                self._totals.recurring_invalid += 1
                continue
            schedule = self._new_schedule(recurring, cron)
            if recurring.next_start is not None:
                self._engine._arm(
                    recurring.next_start, TimerKind.RECURRING, schedule.number, schedule.generation
                )
        if self._schedules:
            self._relink_occurrences(live)

    # ---------------------------------------------------------------------------------- timers

    def due(self, due: float, number: int, generation: int) -> float | None:
        """When a RECURRING timer fires: None if its schedule was removed or replaced since."""
        schedule = self._numbered.get(number)
        return due if schedule is not None and schedule.generation == generation else None

    def fire(self, due: float, number: int, now: float) -> None:
        """The start ``due`` of a schedule came (``due`` checked it is current): plan the next one."""
        schedule = self._numbered[number]
        self._plan_occurrence(schedule, self._next_start(schedule, due, now), now)

    # ----------------------------------------------------------------------------- occurrences

    def skip_overlap(self, pool: PoolState, task: Task, now: float) -> bool:
        """The start of a fixed-start task came (on time, or passed before it was scheduled): if it is
        an occurrence of an ``overlap = skip`` schedule whose previous occurrence is still live, it ends
        SKIPPED and this returns True. Either way its link to the previous occurrence is done with.

        A previous occurrence that was itself skipped never ran: what counts is the one it was skipped
        for, else a minutely schedule whose run takes three minutes would skip one start and then run
        two occurrences at once."""
        occurrence = self._occurrences.pop(task.id, None)
        if occurrence is None or occurrence[0].recurring.spec.overlap is not Overlap.SKIP:
            return False
        previous_id = occurrence[1]
        overlapped = self._overlapped
        while previous_id in overlapped:
            previous_id = overlapped.pop(previous_id)
        previous = self._table.by_id.get(previous_id)
        if previous is None or previous.status.terminal:
            return False
        overlapped[task.id] = previous_id
        self._engine._finish(pool, task, Status.SKIPPED, OVERLAPPED, now)
        self._engine._mark_dirty(pool)
        return True

    def unlink(self, task_id: int) -> None:
        """A task ended: if it was a pending occurrence, it ends unjudged (cancelled, or failed at a
        takeover), so nothing follows its link to the previous one."""
        if self._occurrences and (link := self._occurrences.pop(task_id, None)) is not None:
            self._overlapped.pop(link[1], None)

    # ------------------------------------------------------------------------------- internals

    def _new_schedule(self, recurring: Recurring, cron: CronSchedule) -> _Schedule:
        """Register a schedule (replacing one of the same name: the old one's timers go stale)."""
        name = recurring.spec.name
        old = self._schedules.get(name)
        if old is not None:
            number = old.number
        else:
            number = self._next_number
            self._next_number += 1
        generation = old.generation + 1 if old is not None else 0
        schedule = _Schedule(number, generation, recurring, cron)
        self._schedules[name] = self._numbered[number] = schedule
        return schedule

    def _plan_occurrence(self, schedule: _Schedule, start: float | None, now: float) -> None:
        """Create the occurrence starting at ``start`` (one ahead) and the timer that creates the next
        one when it fires."""
        recurring = schedule.recurring
        recurring.next_start = start
        if start is not None:
            if not self._adopt(schedule, start):
                self._create_occurrence(schedule, start, now)
            self._engine._arm(start, TimerKind.RECURRING, schedule.number, schedule.generation)
        self._engine._actions.append(ScheduleChanged(recurring.spec.name, recurring))

    def _adopt(self, schedule: _Schedule, start: float) -> bool:
        """Whether the schedule ``schedule`` replaced already made the occurrence of ``start`` (one not
        started yet: its link to the previous occurrence is still kept), which is then this one's."""
        last = schedule.recurring.last_task_id
        link = self._occurrences.get(last)
        if link is None or link[0] is schedule or self._table.by_id[last].spec.start != start:
            return False
        self._occurrences[last] = (schedule, link[1])
        return True

    def _relink_occurrences(self, restored: Sequence[Task]) -> None:
        """After a takeover, tell each schedule's pending occurrence which one came before it, as
        ``_create_occurrence`` did, so that ``overlap = skip`` still judges it when its start comes.

        The store keeps no such link. Only a previous occurrence still live can make the pending one
        skip, so it is looked for among the ``restored`` tasks still live with a fixed start (few): the
        newest older one that the schedule's template makes."""
        fixed = [task for task in restored if task.spec.start is not None and not task.status.terminal]
        for schedule in self._schedules.values():
            pending = self._table.by_id.get(schedule.recurring.last_task_id)
            if pending is None or pending.status.terminal:
                continue
            spec = schedule.recurring.spec
            previous = 0
            for task in fixed:
                if task.id >= pending.id:
                    break
                if _occurrence_of(spec, task.spec):
                    previous = task.id
            self._occurrences[pending.id] = (schedule, previous)

    def _next_start(self, schedule: _Schedule, due: float, now: float) -> float | None:
        """The start of the occurrence to plan when the timer of the one starting at ``due`` fires.

        That is the cron's next start, unless the timer fired late (the engine was down before a
        takeover, or library mode's loop stalled) and starts passed meanwhile. Replaying them would
        create an occurrence per passed start in one tick (1,440 for a minutely schedule a day late),
        all running late at once. The occurrence of ``due``, created one ahead and judged by its own
        ``on_miss``, already stands for the gap; of the passed starts, only the latest gets an
        occurrence, and only if it is still within the template's tolerance (so on time). A schedule
        that skips starts this way counts once in ``totals.recurring_skipped`` and goes on with the first
        start after ``now``. The latest passed start is found by bisection (``CronSchedule.last_until``),
        so a catch-up costs a few dozen cron searches however long the engine was away. None: the
        schedule's year field has run out.
        """
        cron = schedule.cron
        start = cron.next_after(due)
        if start is None or start > now:
            return start
        following = cron.next_after(start)
        latest = start
        if following is not None and following <= now:
            latest = cron.last_until(now, start)
            following = cron.next_after(latest)
        if now <= latest + schedule.recurring.spec.template.tolerance:
            self._create_occurrence(schedule, latest, now)
            if latest == start:  # only a little late: nothing was skipped
                return following
        self._totals.recurring_skipped += 1
        return following

    def _create_occurrence(self, schedule: _Schedule, start: float, now: float) -> None:
        """Submit the occurrence of ``start`` through the engine's admission, and link it to the one
        before it before its edges are judged (a start already passed is judged at once, its overlap
        too)."""
        engine = self._engine
        spec = schedule.recurring.spec
        template = spec.template
        previous = schedule.recurring.last_task_id
        deps: tuple[DepEdge, ...] = ()
        if spec.overlap in (Overlap.QUEUE, Overlap.QUEUE_ON_SUCCESS) and previous in self._table.by_id:
            on = DepOn.COMPLETE if spec.overlap is Overlap.QUEUE else DepOn.SUCCESS
            deps = (DepEdge(previous, on),)
        occurrence = dataclasses.replace(
            template,
            key=occurrence_key(template.key, start),
            start=start,
            deadline=None if spec.deadline_in is None else start + spec.deadline_in,
            deps=deps,
            tags=dict(template.tags),
            labels=dict(template.labels),
            resources=dict(template.resources) if template.resources else NO_RESOURCES,
        )
        try:
            (submitted,), touched = engine._insert([occurrence], now, link=False)
        except AdmissionError as err:
            if err.code == "reservation_conflict":
                self._totals.recurring_conflicts += 1
            else:
                self._totals.recurring_invalid += 1
            return
        for pool in touched.values():
            engine._mark_dirty(pool)
        if submitted.duplicate:
            return
        schedule.recurring.last_task_id = submitted.id
        self._occurrences[submitted.id] = (schedule, previous)
        task = self._table.by_id[submitted.id]
        engine._deps.link((task,), [task], now)


class _Schedule:
    """A recurring schedule with its parsed cron; ``number`` names it in timers and ``generation``
    tells the timers of a replaced schedule from the current ones."""

    __slots__ = ("cron", "generation", "number", "recurring")

    def __init__(self, number: int, generation: int, recurring: Recurring, cron: CronSchedule) -> None:
        self.number = number
        self.generation = generation
        self.recurring = recurring
        self.cron = cron


def _occurrence_of(recurring: RecurringSpec, spec: TaskSpec) -> bool:
    """Whether ``spec`` is an occurrence of ``recurring``: its template with what ``_create_occurrence``
    sets per start (key, start, deadline, the edge to the previous occurrence)."""
    template = recurring.template
    start = spec.start
    return (
        start is not None
        and spec.key == occurrence_key(template.key, start)
        and dataclasses.replace(spec, key=template.key, start=None, deadline=None, deps=()) == template
    )
