"""The engine: tasks in, leases out, driven entirely by its callers' inputs and their clock.

Every input method takes ``now`` (Unix seconds) and, where capacity and READY tasks meet, dispatches at
once; what the caller must do (send a lease, abort a lease, publish a status change) accumulates in
``take_actions()``. Time-driven work (attempt timeouts, lease expiry, the end of a retry backoff,
forgetting old finished tasks) happens in ``tick(now)``, which the caller schedules at
``next_wakeup()``. One engine is single-threaded: the server calls it from one event loop.

Worker reports name a lease; a report for a lease the worker does not hold (already expired, aborted,
completed, or never issued) changes nothing and is counted in ``totals.stale_completions``, so lease ids
fence late reports from workers that lost their lease.
"""

from __future__ import annotations

import dataclasses
import random
from collections import Counter
from collections.abc import Collection, Iterable, Mapping, Sequence
from heapq import heapify, heappop, heappush
from typing import Final

from .admission import Shed, plan
from .autoscale import Autoscaler
from .cron import CronSchedule, occurrence_key
from .deps import Dependencies, edge_met
from .fixed import Reservations, Window, reservation_limit
from .model import (
    Abort,
    Action,
    Dep,
    DepOn,
    Dispatch,
    EngineLimits,
    MissPolicy,
    Overlap,
    PoolConfig,
    Priority,
    Recurring,
    RecurringError,
    RecurringSpec,
    ResourceConfig,
    Scale,
    ScheduleChanged,
    Status,
    SubmitError,
    Submitted,
    Task,
    TaskSpec,
    UnknownDependency,
)
from .pool import PoolState
from .readonly import NO_RESOURCES
from .resources import Resources
from .retry import backoff_delay
from .snapshot import GroupStats, PoolStats, Snapshot, Totals, WorkerView
from .stats import Bucket
from .table import TaskTable
from .timers import TimerEntry, TimerHeap, TimerKind
from .workers import Worker, label_set

# Module constants for the statuses of the hot path: a global load costs a seventh of an enum class
# attribute lookup (``Status.SUCCEEDED``) in CPython 3.11.
BLOCKED: Final = Status.BLOCKED
SCHEDULED: Final = Status.SCHEDULED
READY: Final = Status.READY
RUNNING: Final = Status.RUNNING
RETRYING: Final = Status.RETRYING
SUCCEEDED: Final = Status.SUCCEEDED
FAILED: Final = Status.FAILED
CANCELLED: Final = Status.CANCELLED

TIMED_OUT: Final = "attempt timed out"
LEASE_EXPIRED: Final = "lease expired"
DISCONNECTED: Final = "worker disconnected"
LOST_IN_FAILOVER: Final = "attempt lost in failover"
LOST_EXHAUSTED: Final = "attempt lost in failover; retries exhausted"
FIXED_MISSED: Final = "fixed start missed"
OVERLAPPED: Final = "previous occurrence still running"
AWAIT_TIMED_OUT: Final = "timed out awaiting unknown dependency"
MIN_HOLD_AHEAD: Final = 1.0  # a worker is held from start - max(tolerance, this) for a fixed start
_WAITING: Final = frozenset({BLOCKED, SCHEDULED})  # pending but not yet eligible: not backlog

_TIMER_SLACK: Final = 1024  # dead timer entries tolerated before the heap is worth compacting
# Entries of a resource's parked heap tolerated before dead ones are worth dropping.
_PARKED_SLACK: Final = 256


class Engine:
    """The scheduling state machine for a set of pools (see the module docstring for the contract)."""

    def __init__(
        self,
        pools: Sequence[PoolConfig],
        *,
        limits: EngineLimits | None = None,
        rng: random.Random | None = None,
        first_id: int = 1,
        first_lease: int = 1,
        resources: Sequence[ResourceConfig] = (),
    ) -> None:
        if not pools:
            raise ValueError("at least one pool is required")
        self._limits = limits = limits if limits is not None else EngineLimits()
        self._rng = rng if rng is not None else random.Random()
        self._pools: dict[str, PoolState] = {}
        for config in pools:
            if config.name in self._pools:
                raise ValueError(f"pool '{config.name}' is configured twice")
            self._pools[config.name] = PoolState(config, limits.metrics_window)
        self._table = TaskTable(
            first_id,
            limits.key_retention,
            limits.key_retention_max,
            limits.record_retention,
            limits.record_max,
        )
        self._seq = 0
        self._pending_total = 0
        self._next_lease = first_lease
        # A task holds at most one lease, so a lease is its id plus the RUNNING task's ``lease`` and
        # ``worker`` fields; only what few leases need lives beside it.
        self._leases: dict[int, Task] = {}  # lease id -> the task running under it
        self._expiry: dict[int, float] = {}  # lease id -> expiry without a heartbeat (pools with a TTL)
        self._refused: dict[int, set[int]] = {}  # lease id -> workers that nacked this attempt
        self._workers: dict[int, Worker] = {}
        self._timers = TimerHeap()
        self._actions: list[Action] = []
        self._totals = Totals()  # the terminal-status counters live in _ended
        self._ended = [0] * (max(Status) + 1)
        # Dependencies, fixed starts, resources, schedules and autoscaling: all empty (and all skipped on
        # the hot path) until a task or a pool uses them.
        self._deps = Dependencies()
        self._reservations = {
            c.name: Reservations(reservation_limit(c.max, c.reservable_fraction)) for c in pools
        }
        self._holds: dict[int, Worker] = {}  # task id -> worker with a slot held for its fixed start
        self._resources = Resources(resources)
        self._parked: dict[int, tuple[Task, float]] = {}  # READY tasks waiting for resources, ready_at
        # Per resource and amount, the parked tasks waiting for it as (priority, seq, id), best first;
        # entries of tasks no longer parked are dropped when they surface.
        # (A heap per amount asked, so a wake never walks past requests bigger than the room left.)
        self._parked_on: dict[str, dict[int, list[tuple[int, int, int]]]] = {}
        # The one RESOURCE_WAKE timer that counts: the earliest refill a task parked on a bucket waits
        # for (None: none armed). One timer serves every waiter of every bucket; a backlog behind a rate
        # limit would otherwise hold a timer per task and wake them all at each refill.
        self._refill_wake: float | None = None
        # Resources whose last wake-up woke someone: a woken task that finds no worker takes nothing, so
        # the room it was woken for goes to the next waiters (maybe of another pool) once the input's
        # dispatch is done.
        self._rewoken: set[str] = set()
        # Pools that may have work to dispatch, found in the middle of an input (a task made READY by a
        # cascade, a fixed start, a wake-up): every input dispatches them once it is whole, never before.
        self._dirty: dict[str, PoolState] = {}
        self._waiting = {c.name: [0 for _ in Priority] for c in pools}  # BLOCKED + SCHEDULED per class
        self._arrivals = {c.name: 0 for c in pools}  # tasks that became eligible since the last evaluation
        self._runs = {c.name: [0.0, 0] for c in pools}  # attempt run seconds and count, for service time
        self._autoscalers = {
            c.name: Autoscaler(c.autoscale, c.min, c.max, c.default_duration, c.initial)
            for c in pools
            if c.autoscale is not None
        }
        self._schedules: dict[str, _Schedule] = {}
        self._numbered: dict[int, _Schedule] = {}  # the same schedules by number, for their timers
        self._next_number = 0
        self._occurrences: dict[int, tuple[_Schedule, int]] = {}  # occurrence id -> schedule, previous id
        # An occurrence skipped for overlap -> the live one it was skipped for, which the next occurrence
        # must then not overlap either (the entry goes when that next one is judged).
        self._overlapped: dict[int, int] = {}

    # ------------------------------------------------------------------------------------ pools

    @property
    def pool_names(self) -> list[str]:
        """Pool names in configuration order."""
        return list(self._pools)

    def has_pool(self, name: str) -> bool:
        return name in self._pools

    @property
    def last_id(self) -> int:
        """The highest task id issued so far (``first_id - 1`` before the first submission)."""
        return self._table.next_id - 1

    def pool_config(self, name: str) -> PoolConfig:
        """The configuration of pool ``name`` (KeyError if there is none)."""
        return self._pools[name].config

    # -------------------------------------------------------------------------------- producers

    def submit(self, specs: Sequence[TaskSpec], now: float) -> list[Submitted]:
        """Insert a batch atomically, in order; a spec whose key names a live or retained task gets that
        task (``duplicate=True``) and is otherwise ignored. Raises SubmitError changing nothing.

        Specs of one batch may depend on each other's keys, in any order: every task of the batch exists
        before any edge is resolved."""
        submitted, touched = self._insert(specs, now)
        for pool in touched.values():
            self._dispatch(pool, now)
        return submitted

    def _insert(
        self, specs: Sequence[TaskSpec], now: float, link: bool = True
    ) -> tuple[list[Submitted], dict[str, PoolState]]:
        """``submit`` without the dispatch: the answers, and the pools that got tasks (for the caller
        to dispatch once its input is whole). With ``link`` False the new tasks' edges are left to the
        caller, which must ``_link`` them: ``_create_occurrence`` first links an occurrence to the one
        before it, which judging it may need at once."""
        special = False
        for spec in specs:
            if spec.deps or spec.start is not None or spec.resources:
                special = True
                self._check_batch(specs, now)
                break
        decisions = plan(specs, self._pools, self._table, self._pending_total, self._limits.max_pending_total)
        table = self._table
        append = self._actions.append
        submitted: list[Submitted] = []
        created: dict[int, Task] = {}
        touched: dict[str, PoolState] = {}
        blocked: list[Task] = []
        arrivals = self._arrivals if self._autoscalers else None
        seq = self._seq
        for i, spec in enumerate(specs):
            decision = decisions[i]
            if type(decision) is PoolState:  # the usual decision, tested first: exact types are cheapest
                pool = decision
            elif isinstance(decision, Task):
                submitted.append(Submitted(decision.id, True))
                continue
            else:
                assert isinstance(decision, Shed)
                pool = decision.pool
                victim = decision.victim
                victim = victim if isinstance(victim, Task) else created[victim]
                if not victim.status.terminal:  # an earlier shed may have skipped it (a dependent)
                    self._finish(pool, victim, Status.SHED, "shed under overload", now)
            retry = spec.retry if spec.retry is not None else pool.config.retry
            seq += 1
            task_id = table.next_id
            pool.pending[spec.priority] += 1
            if spec.deps or spec.start is not None:
                # BLOCKED until every task of the batch exists and its edges are resolved.
                task = Task(task_id, spec, seq, BLOCKED, now, 0, retry.max_attempts, None)
                table.add(task)
                self._waiting[pool.name][spec.priority] += 1
                if spec.start is not None:
                    self._reservations[pool.name].add(task_id, self._window(pool, spec))
                blocked.append(task)
                append((BLOCKED, 0, now, "", task))
            else:
                # Without dependencies or a fixed start a task is READY at once, so it is built READY and
                # the BLOCKED step shows only in the events.
                task = Task(task_id, spec, seq, READY, now, 0, retry.max_attempts, now)
                table.add(task)
                pool.queue.push(task, now)
                append((BLOCKED, 0, now, "", task))
                append((READY, 0, now, "", task))
                if arrivals is not None:
                    arrivals[pool.name] += 1
            created[i] = task
            if pool.shed is not None:
                pool.shed.track(task, pool.pending[spec.priority])
            submitted.append(Submitted(task_id, False))
            touched[pool.name] = pool
        self._seq = seq
        self._pending_total += len(created)
        self._totals.submitted += len(created)
        if link and (special or self._deps.awaiting):
            self._link(created.values(), blocked, now)
        return submitted, touched

    def cancel(self, ref: int | str, now: float) -> bool:
        """Cancel a live task by id or key (a running one is aborted); False if finished or unknown."""
        task = self._table.get(ref)
        if task is None or task.status.terminal:
            return False
        pool = self._pools[task.spec.pool]
        if task.status is RUNNING:
            self._actions.append(Abort(task.worker, task.lease, "cancelled"))
            self._release(pool, task, now, CANCELLED)
        self._finish(pool, task, CANCELLED, "cancelled", now)
        self._dispatch(pool, now)
        return True

    def restore(self, tasks: Iterable[Task], now: float, schedules: Iterable[Recurring] = ()) -> None:
        """Take over the tasks and recurring schedules a previous leader left in the store (tasks in
        ascending ids, all below this engine's ``first_id``), before any other input.

        Pending tasks queue again (READY ones keep their place in time, so their wait keeps counting);
        BLOCKED ones judge their edges again and SCHEDULED ones wait for their start again; an attempt
        that was RUNNING is lost with its worker's stream and counts as a retryable failure; finished
        tasks are retained, from when they finished, for key dedup, lookups and the edges of live
        dependents. A task of a pool that is no longer configured, or needing a resource that is no
        longer configured (or no longer that big), cannot run here, so it fails saying so rather than
        staying pending for ever. A schedule whose cron no longer parses is dropped and counted in
        ``totals.recurring_invalid``; a schedule's pending occurrence keeps its ``overlap`` check.
        """
        table = self._table
        live: list[Task] = []
        finished: list[Task] = []
        for task in tasks:
            table.restore(task)
            self._seq = max(self._seq, task.seq)
            (finished if task.status.terminal else live).append(task)
        table.retain_restored(finished, now)
        # Schedules first: a pending occurrence whose start passed during the takeover is judged (its
        # overlap too) as soon as it is restored, so it must be linked to the one before it by then.
        for recurring in schedules:
            try:
                cron = CronSchedule.parse(recurring.spec.cron, recurring.spec.tz)
            except ValueError:
                self._totals.recurring_invalid += 1
                continue
            schedule = self._new_schedule(recurring, cron)
            if recurring.next_start is not None:
                self._arm(recurring.next_start, TimerKind.RECURRING, schedule.number, schedule.generation)
        if self._schedules:
            self._relink_occurrences(live)
        blocked: list[Task] = []
        for task in live:
            status = task.status
            spec = task.spec
            pool = self._pools.get(spec.pool)
            if pool is None:
                self._fail_restored(task, f"pool '{spec.pool}' is no longer configured", now)
                continue
            if spec.resources and (problem := self._resources.unavailable(spec.resources)) is not None:
                self._fail_restored(task, problem, now)
                continue
            if spec.start is not None:
                self._reservations[pool.name].add(task.id, self._window(pool, spec))
            if status is RUNNING:  # _retry and _finish treat it as an attempt that just ended
                task.lease = task.worker = 0
                if task.attempt >= task.max_attempts:
                    self._finish(pool, task, Status.DEAD_LETTERED, LOST_EXHAUSTED, now)
                else:
                    self._retry(pool, task, LOST_IN_FAILOVER, None, now)
                continue
            priority = spec.priority
            pool.pending[priority] += 1
            self._pending_total += 1
            if pool.shed is not None:
                pool.shed.track(task, pool.pending[priority])
            if status is BLOCKED or status is SCHEDULED:
                self._waiting[pool.name][priority] += 1
                if status is BLOCKED:
                    blocked.append(task)
                else:
                    self._schedule(pool, task, now)
            elif status is READY:
                ready_at = task.ready_at if task.ready_at is not None else task.created
                pool.queue.push(task, ready_at)
                if spec.start is not None and not task.attempt and spec.on_miss is not MissPolicy.RUN_LATE:
                    self._arm(spec.start + spec.tolerance, TimerKind.FIXED_MISS, task.id)
            elif task.ready_at is not None and task.ready_at > now:  # RETRYING: its backoff goes on
                self._arm(task.ready_at, TimerKind.RETRY_READY, task.id, task.attempt)
            else:  # RETRYING, and its backoff is over (or from before backoff ends were stored)
                self._make_ready(pool, task, now, now)
        for task in blocked:
            if task.status is BLOCKED:
                self._resolve(task, now)
        for pool in self._pools.values():
            self._dispatch(pool, now)

    def _fail_restored(self, task: Task, message: str, now: float) -> None:
        """A recovered live task that cannot run here ends FAILED with ``message``. It is not counted as
        pending yet, so there is nothing to take out of its pool's counts; an occurrence is unlinked."""
        if self._occurrences:
            self._occurrences.pop(task.id, None)
        task.status = FAILED
        task.message = message
        task.finished = now
        self._ended[FAILED] += 1
        self._table.retire(task, now)
        self._actions.append((FAILED, task.attempt, now, message, task))

    # -------------------------------------------------------------------------------- recurring

    def add_recurring(self, spec: RecurringSpec, now: float) -> Recurring:
        """Add a cron schedule, or replace the one of that name, and create its first occurrence.

        Raises RecurringError naming the field (``cron: ...``, ``tz: ...``, ``template.deps: ...``) for a
        schedule that cannot run; the engine is then unchanged. The occurrence a replaced schedule
        created ahead stays; if the new schedule's first start is that occurrence's, it is adopted as
        the new schedule's own instead of a second one being made for the same start (re-adding a
        schedule unchanged, as a service does each time it starts, changes nothing).
        """
        try:
            cron = CronSchedule.parse(spec.cron, spec.tz)
        except ValueError as err:
            raise RecurringError("invalid", str(err)) from None
        template = spec.template
        pool = self._pools.get(template.pool)
        if pool is None:
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
        self._dispatch_dirty(None, now)
        return recurring

    def remove_recurring(self, name: str, now: float) -> bool:
        """Remove a schedule; an occurrence it already created stays. False if there was none."""
        schedule = self._schedules.pop(name, None)
        if schedule is None:
            return False
        del self._numbered[schedule.number]
        self._actions.append(ScheduleChanged(name, None))
        return True

    def list_recurring(self) -> list[Recurring]:
        """The schedules, in the order they were first added."""
        return [schedule.recurring for schedule in self._schedules.values()]

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

    def get(self, ref: int | str) -> Task | None:
        """A live or retained finished task by id, or by key (the task currently holding that key)."""
        return self._table.get(ref)

    def list_tasks(
        self,
        *,
        pools: Collection[str] | None,
        statuses: Collection[Status] | None,
        after: int,
        limit: int,
    ) -> tuple[list[Task], int]:
        """Up to ``limit`` (>= 1) known tasks with id > ``after`` in id order, filtered by pool and status
        (None: any), and the ``after`` for the next page (0 when this is the last page)."""
        if limit < 1:
            raise ValueError(f"limit must be at least 1 (got {limit})")
        return self._table.page(pools, statuses, after, limit)

    def pending_count(self, pool: str) -> int:
        """Tasks of ``pool`` not yet running (blocked, scheduled, ready, retrying)."""
        return sum(self._pools[pool].pending)

    # ---------------------------------------------------------------------------------- workers

    def add_worker(self, worker_id: int, pool: str, slots: int, labels: Mapping[str, str], now: float) -> int:
        """Connect a worker; returns the slots granted: ``slots`` capped by the pool's ``max`` and
        ``max_slots_per_worker``."""
        if worker_id in self._workers:
            raise ValueError(f"worker {worker_id} is already connected")
        state = self._pools.get(pool)
        if state is None:
            raise ValueError(f"unknown pool '{pool}'")
        granted = _grant(state.config, slots)
        self._workers[worker_id] = state.workers.add(worker_id, pool, labels, granted)
        state.stats.advance(now, state.workers.capacity)
        self._dispatch(state, now)
        return granted

    def grant(self, pool: str, requested: int) -> int:
        """The slots a worker asking ``requested`` of ``pool`` would get (what ``add_worker`` grants), for
        a server that must tell the worker before the first lease can flow."""
        return _grant(self._pools[pool].config, requested)

    def set_worker_slots(self, worker_id: int, slots: int, now: float) -> int:
        """Change a worker's slots (capped as in ``add_worker``); 0 drains it: no new leases, running
        ones continue. Returns the slots granted."""
        worker = self._workers[worker_id]
        pool = self._pools[worker.pool]
        granted = _grant(pool.config, slots)
        pool.workers.set_slots(worker, granted)
        if self._holds and worker.busy > granted:  # a drained worker must not run a fixed start
            self._move_holds(pool, worker)
        pool.stats.advance(now, pool.workers.capacity)
        self._dispatch(pool, now)
        return granted

    def remove_worker(self, worker_id: int, now: float) -> None:
        """Disconnect a worker: each lease it held fails as retryable ("worker disconnected").
        Unknown ids are ignored, so a stream may be closed twice."""
        worker = self._workers.get(worker_id)
        if worker is None:
            return
        pool = self._pools[worker.pool]
        for task in list(worker.leases.values()):
            self._release(pool, task, now, FAILED)
            self._retry(pool, task, DISCONNECTED, None, now)
        if self._holds:
            self._move_holds(pool, worker)
        del self._workers[worker_id]
        pool.workers.remove(worker)
        pool.stats.advance(now, pool.workers.capacity)
        self._dispatch(pool, now)

    def heartbeat(self, worker_id: int, lease: int, now: float) -> bool:
        """The worker still runs ``lease``: its expiry moves to ``now + lease_ttl``."""
        task = self._held(worker_id, lease)
        if task is None:
            return False
        ttl = self._pools[task.spec.pool].config.lease_ttl
        if ttl is not None:
            self._expiry[lease] = now + ttl
        return True

    def complete(self, worker_id: int, lease: int, now: float) -> bool:
        """The attempt succeeded."""
        task = self._leases.get(lease)  # _held, inlined on the hottest path
        if task is None or task.worker != worker_id:
            self._totals.stale_completions += 1
            return False
        pool = self._pools[task.spec.pool]
        self._release(pool, task, now, SUCCEEDED)
        self._finish(pool, task, SUCCEEDED, "", now)
        self._dispatch(pool, now)
        return True

    def fail(
        self, worker_id: int, lease: int, message: str, permanent: bool, retry_after: float | None, now: float
    ) -> bool:
        """The attempt failed: permanently (FAILED), or retryably (RETRYING, or DEAD_LETTERED when it was
        the last attempt). ``retry_after`` is a floor for the backoff."""
        task = self._held(worker_id, lease)
        if task is None:
            return False
        pool = self._pools[task.spec.pool]
        self._release(pool, task, now, FAILED)
        if permanent:
            self._finish(pool, task, FAILED, message, now)
        else:
            self._retry(pool, task, message, retry_after, now)
        self._dispatch(pool, now)
        return True

    def nack(self, worker_id: int, lease: int, reason: str, now: float) -> bool:
        """The worker hands the lease back unrun: the same attempt goes, under a new lease (with its own
        timeout and TTL), to another worker that can take it and has not refused it; if there is none,
        the attempt fails retryably with ``reason``."""
        task = self._held(worker_id, lease)
        if task is None:
            return False
        pool = self._pools[task.spec.pool]
        refused = self._refused.get(lease, set())
        refused.add(worker_id)
        other = pool.workers.take_other(label_set(task.spec.labels), refused)
        self._release(pool, task, now, FAILED if other is None else None)
        if other is None:
            self._retry(pool, task, reason, None, now)
        else:
            self._refused[self._lease(pool, task, other, now)] = refused
        self._dispatch(pool, now)
        return True

    def cancelled(self, worker_id: int, lease: int, now: float) -> bool:
        """The worker ended the task as cancelled (CancelTask): CANCELLED, no retry."""
        task = self._held(worker_id, lease)
        if task is None:
            return False
        pool = self._pools[task.spec.pool]
        self._release(pool, task, now, CANCELLED)
        self._finish(pool, task, CANCELLED, "cancelled by the worker", now)
        self._dispatch(pool, now)
        return True

    # ------------------------------------------------------------------------------------- time

    def tick(self, now: float) -> None:
        """Run every timer due by ``now``, forget finished tasks past retention, and dispatch."""
        timers = self._timers
        while (entry := timers.peek()) is not None and entry[0] <= now:
            timers.pop()
            if self._dirty and entry[2] is TimerKind.FIXED_MISS:
                # A start due in this same tick may have found its slot freed earlier in it: run it
                # before the miss is judged.
                self._dispatch_dirty(None, now)
            due = self._due(entry)
            if due is None:
                continue
            if due > now:  # a heartbeat moved the lease's expiry
                timers.push(due, entry[2], entry[3], entry[4])
            else:
                self._fire(entry, now)
        self._table.prune(now)
        if self._autoscalers:
            self._autoscale(now)
        for pool in self._pools.values():
            self._dispatch(pool, now)
        if self._parked_on:
            self._rearm_refills(now)

    def next_wakeup(self) -> float | None:
        """The earliest time at which ``tick`` has something to do; None if nothing is scheduled."""
        timers = self._timers
        while (entry := timers.peek()) is not None:
            due = self._due(entry)
            if due == entry[0]:
                break
            timers.pop()  # stale, or moved later by a heartbeat
            if due is not None:
                timers.push(due, entry[2], entry[3], entry[4])
        wake = entry[0] if entry is not None else None
        prune = self._table.next_prune()
        if prune is not None and (wake is None or prune < wake):
            wake = prune
        for scaler in self._autoscalers.values():
            # Before its first evaluation an autoscaler is due at once (-inf); 0.0 says so to any caller.
            due = max(scaler.due_at, 0.0)
            if wake is None or due < wake:
                wake = due
        return wake

    def take_actions(self) -> list[Action]:
        """Everything to do since the last call, in the order it arose."""
        actions = self._actions
        self._actions = []
        return actions

    # ------------------------------------------------------------------------------------ views

    def snapshot(self, now: float) -> Snapshot:
        """Pools, counts and totals as of ``now``."""
        pools: list[PoolStats] = []
        # READY tasks waiting for a resource are out of their pool's queue (and its count) until woken.
        parked_in = Counter(task.spec.pool for task, _ in self._parked.values())
        running: dict[str, list[float]] = {}
        for task in self._leases.values():
            assert task.started is not None  # set at dispatch
            running.setdefault(task.spec.pool, []).append(task.started)
        for pool in self._pools.values():
            w = pool.workers
            window = pool.stats.view(now, running.get(pool.name, ()))  # integrates worker-seconds up to now
            holds = [worker.group for worker in self._holds.values() if worker.pool == pool.name]
            held = len(holds)
            scaler = self._autoscalers.get(pool.name)
            pools.append(
                PoolStats(
                    name=pool.name,
                    capacity=w.capacity,
                    busy=w.busy - held,
                    held=held,
                    desired=w.capacity if scaler is None else scaler.desired,
                    pending_by_class=list(pool.pending),
                    reservations=self._reservations[pool.name].active(now),
                    dispatched=window.dispatched,
                    succeeded=window.succeeded,
                    failed=window.failed,
                    priority_adherence=window.priority_adherence,
                    fixed_start_hit_rate=window.fixed_start_hit_rate,
                    utilization=window.utilization,
                    schedule_efficiency=window.schedule_efficiency,
                    wait_p50=window.wait_p50,
                    wait_p90=window.wait_p90,
                    wait_p99=window.wait_p99,
                    cost=pool.stats.worker_seconds * pool.config.cost_per_worker_second,
                    workers_connected=w.workers,
                    groups=[
                        GroupStats(dict(g.labels), g.capacity, g.busy - holds.count(g))
                        for g in w.groups.values()
                    ],
                    ready=pool.queue.ready + parked_in[pool.name],
                    retried=window.retried,
                    worker_seconds=pool.stats.worker_seconds,
                    wait_mean=window.wait_mean,
                    run_p50=window.run_p50,
                    run_p99=window.run_p99,
                )
            )
        ended = self._ended
        totals = dataclasses.replace(
            self._totals,
            succeeded=ended[SUCCEEDED],
            failed=ended[FAILED],
            dead_lettered=ended[Status.DEAD_LETTERED],
            cancelled=ended[CANCELLED],
            skipped=ended[Status.SKIPPED],
            missed=ended[Status.MISSED],
            shed=ended[Status.SHED],
        )
        parked = self._parked
        waiting = {
            name: sum(1 for heap in by_amount.values() for entry in heap if entry[2] in parked)
            for name, by_amount in self._parked_on.items()
        }
        return Snapshot(
            pools=pools,
            live_tasks=self._table.live,
            running=len(self._leases),
            pending=self._pending_total,
            totals=totals,
            workers_connected=len(self._workers),
            resources=self._resources.stats(now, waiting),
        )

    def workers(self) -> list[WorkerView]:
        """Connected workers in the order they connected."""
        # busy counts leases only: a slot held for a fixed start is not running anything yet.
        return [
            WorkerView(w.id, w.pool, dict(w.labels), w.slots, len(w.leases)) for w in self._workers.values()
        ]

    # --------------------------------------------------------------------------------- internals

    def _dispatch(self, pool: PoolState, now: float, nested: bool = False) -> None:
        """Lease READY tasks to free compatible workers, best score first, until one side runs out.
        Fixed starts waiting for a held slot are served first; a task whose resources are taken is
        parked and the next best goes instead. At the end of an input (not ``nested``) the pools it
        marked dirty are dispatched first, and resources its woken tasks left unused are settled."""
        if self._dirty:
            self._dispatch_dirty(pool, now)
        queue = pool.queue
        workers = pool.workers
        if workers.free and pool.hold_wanted:
            self._serve_holds(pool)
        if workers.free and queue.ready:
            started = 0
            bucket = pool.stats.bucket(now)
            while workers.free and queue.ready:  # usually one task: an outcome freed one slot
                best = queue.pop_best(now, workers.has_free)
                if best is None:
                    break
                task, required, inverted, ready_at = best
                if (
                    task.spec.resources
                    and (short := self._resources.take(task.spec.resources, now)) is not None
                ):
                    queue.refund(task)
                    self._park(task, short, ready_at, now)
                    continue
                worker = workers.take(required)
                assert worker is not None, "pop_best offers only lanes with a free compatible worker"
                self._run(pool, task, worker, ready_at, inverted, now, bucket)
                started += 1
            self._pending_total -= started
            self._totals.dispatched += started
        if self._rewoken and not nested:
            self._settle(now)

    def _dispatch_dirty(self, current: PoolState | None, now: float) -> None:
        """Dispatch the pools marked dirty during the input that just ended, except ``current``, which
        the caller dispatches next. (Dispatching never marks a pool, so one pass empties the set.)"""
        dirty = self._dirty
        self._dirty = {}
        for pool in dirty.values():
            if pool is not current:
                self._dispatch(pool, now, nested=True)

    def _settle(self, now: float) -> None:
        """After an input's dispatch: units that woken tasks left unused (they found no free worker,
        or another resource short) go to the next waiters, until a wake-up wakes nobody. Each round
        takes at least one task out of the waiting heaps, so this ends."""
        while self._rewoken:
            names, self._rewoken = self._rewoken, set()
            for name in names:
                self._wake(name, now)
            self._dispatch_dirty(None, now)

    def _run(
        self,
        pool: PoolState,
        task: Task,
        worker: Worker,
        ready_at: float,
        inverted: bool,
        now: float,
        bucket: Bucket,
    ) -> None:
        """Start the next attempt of a READY task on ``worker`` (whose slot is taken). The caller
        counts it in ``_pending_total`` and ``totals.dispatched``, and passes the stats bucket of ``now``."""
        spec = task.spec
        pool.pending[spec.priority] -= 1
        bucket.dispatch(now - ready_at, inverted)
        if spec.start is not None and not task.attempt:
            bucket.fixed_start(now <= spec.start + spec.tolerance)
        task.attempt = attempt = task.attempt + 1
        task.status = RUNNING
        task.started = now
        self._lease(pool, task, worker, now)
        self._actions.append((RUNNING, attempt, now, "", task))

    def _lease(self, pool: PoolState, task: Task, worker: Worker, now: float) -> int:
        """Issue a new lease for the task's current attempt on ``worker`` (whose slot is taken)."""
        lease = self._next_lease
        self._next_lease = lease + 1
        task.lease = lease
        task.worker = worker.id
        self._leases[lease] = worker.leases[lease] = task
        timeout = task.spec.timeout
        if timeout is not None:
            self._arm(now + timeout, TimerKind.ATTEMPT_TIMEOUT, lease)
        ttl = pool.config.lease_ttl
        if ttl is not None:
            self._expiry[lease] = now + ttl
            self._arm(now + ttl, TimerKind.LEASE_EXPIRY, lease)
        self._actions.append(Dispatch(worker.id, lease, task, task.attempt, ttl))
        return lease

    def _held(self, worker_id: int, lease: int) -> Task | None:
        """The task running under ``lease`` if ``worker_id`` holds it; otherwise count a stale report."""
        task = self._leases.get(lease)
        if task is None or task.worker != worker_id:
            self._totals.stale_completions += 1
            return None
        return task

    def _release(self, pool: PoolState, task: Task, now: float, outcome: Status | None) -> None:
        """End the task's lease, free its worker's slot and record how the attempt ended: SUCCEEDED,
        FAILED or CANCELLED, or None when the attempt goes on under another lease (a nack)."""
        lease = task.lease
        del self._leases[lease]
        worker = self._workers[task.worker]
        del worker.leases[lease]
        pool.workers.release(worker)
        if pool.config.lease_ttl is not None:
            del self._expiry[lease]
        if self._refused:
            self._refused.pop(lease, None)
        task.lease = task.worker = 0
        if outcome is not None:
            started = task.started
            assert started is not None  # set at dispatch
            pool.stats.attempt(started, now, outcome)
            if outcome is SUCCEEDED:
                pool.queue.durations.learn(task.spec.kind, now - started)
            if pool.config.autoscale is not None:
                runs = self._runs[pool.name]
                runs[0] += now - started
                runs[1] += 1
            if task.spec.resources:
                resources = self._resources
                resources.release(task.spec.resources)
                if self._parked:
                    for name in task.spec.resources:
                        if name in self._parked_on and not resources.refills(name):  # tokens stay spent
                            self._wake(name, now)

    def _retry(
        self, pool: PoolState, task: Task, message: str, retry_after: float | None, now: float
    ) -> None:
        """After a retryable failure: RETRYING until the backoff ends, or DEAD_LETTERED if it was the
        last attempt."""
        if task.attempt >= task.max_attempts:
            self._finish(pool, task, Status.DEAD_LETTERED, message, now)
            return
        spec = task.spec
        policy = spec.retry if spec.retry is not None else pool.config.retry
        delay = backoff_delay(policy, task.attempt, retry_after, self._rng)
        task.status = RETRYING
        task.message = message
        pool.pending[spec.priority] += 1
        self._pending_total += 1
        if pool.shed is not None:
            pool.shed.track(task, pool.pending[spec.priority])
        self._totals.retries += 1
        pool.stats.bucket(now).retry()
        self._actions.append((RETRYING, task.attempt, now, message, task))
        if delay > 0.0:
            # Kept on the task (and so in the store): a new leader resumes the backoff (a worker's
            # retry_after too) rather than retry at once.
            task.ready_at = now + delay
            self._arm(task.ready_at, TimerKind.RETRY_READY, task.id, task.attempt)
        else:
            self._make_ready(pool, task, now, now)

    def _make_ready(self, pool: PoolState, task: Task, ready_at: float, now: float) -> None:
        """A pending task becomes READY (as of ``ready_at``, from which its wait counts) and is queued."""
        task.status = READY
        task.ready_at = ready_at
        pool.queue.push(task, ready_at)
        self._actions.append((READY, task.attempt, now, "", task))

    def _finish(
        self, pool: PoolState, task: Task, status: Status, message: str, now: float, cascade: bool = True
    ) -> None:
        """End a task in terminal ``status`` (a RUNNING task's lease must already be released) and, unless
        ``_cascade`` itself is the caller, judge the dependency edges waiting for it."""
        spec = task.spec
        was = task.status
        if was is not RUNNING:
            pool.pending[spec.priority] -= 1
            self._pending_total -= 1
            if was is READY:
                if self._parked.pop(task.id, None) is None:  # parked tasks are out of the queue already
                    pool.queue.forget(task)
            elif was is BLOCKED or was is SCHEDULED:
                self._waiting[pool.name][spec.priority] -= 1
                if was is BLOCKED:
                    self._deps.forget(task)
        if spec.start is not None:
            self._reservations[pool.name].remove(task.id)
            self._drop_hold(pool, task)
            if self._occurrences and (link := self._occurrences.pop(task.id, None)) is not None:
                self._overlapped.pop(link[1], None)  # ends unjudged (cancelled): nothing follows the link
        task.status = status
        task.message = message
        task.finished = now
        self._ended[status] += 1
        self._table.retire(task, now)
        self._actions.append((status, task.attempt, now, message, task))
        if cascade and self._deps.waiting and task.id in self._deps.waiting:
            self._cascade(task, now)

    def _arm(self, due: float, kind: TimerKind, target: int, token: int = 0) -> None:
        """Add a timer; compact the heap first when it holds far more entries than can be live (each
        lease has at most two, each pending task at most one)."""
        timers = self._timers
        if len(timers) > _TIMER_SLACK + 4 * (len(self._leases) + self._pending_total):
            timers.compact(lambda entry: self._due(entry) is not None)
        timers.push(due, kind, target, token)

    def _due(self, entry: TimerEntry) -> float | None:
        """When ``entry`` should fire: None if it no longer applies, later than its time if a heartbeat
        moved the lease's expiry."""
        due, _, kind, target, token = entry
        if kind is TimerKind.RETRY_READY:
            task = self._table.by_id.get(target)
            return due if task is not None and task.status is RETRYING and task.attempt == token else None
        if kind is TimerKind.LEASE_EXPIRY:
            return self._expiry.get(target)
        if kind is TimerKind.ATTEMPT_TIMEOUT:
            return due if target in self._leases else None
        if kind is TimerKind.RESOURCE_WAKE:
            return due if due == self._refill_wake else None
        if kind is TimerKind.RECURRING:
            schedule = self._numbered.get(target)
            return due if schedule is not None and schedule.generation == token else None
        task = self._table.by_id.get(target)
        if task is None:
            return None
        status = task.status
        if kind is TimerKind.FIXED_START:
            return due if status is SCHEDULED else None
        if kind is TimerKind.FIXED_MISS:
            waiting = status is SCHEDULED or status is READY
            return (
                due if waiting and not task.attempt and task.spec.on_miss is not MissPolicy.RUN_LATE else None
            )
        if kind is TimerKind.FIXED_HOLD:
            return due if status is SCHEDULED else None
        # AWAIT_TIMEOUT: still BLOCKED on a key nobody holds
        refs = self._deps.blocked_on(target) if status is BLOCKED else ()
        return due if any(isinstance(ref, str) for ref in refs) else None

    def _fire(self, entry: TimerEntry, now: float) -> None:
        """Run a due timer that still applies."""
        due, _, kind, target, _ = entry
        if kind is TimerKind.RETRY_READY:
            task = self._table.by_id[target]
            self._make_ready(self._pools[task.spec.pool], task, due, now)
            return
        if kind is TimerKind.ATTEMPT_TIMEOUT or kind is TimerKind.LEASE_EXPIRY:
            task = self._leases[target]
            pool = self._pools[task.spec.pool]
            if kind is TimerKind.ATTEMPT_TIMEOUT:
                message = TIMED_OUT
                self._totals.timeouts += 1
            else:
                message = LEASE_EXPIRED
                self._totals.lease_expiries += 1
            self._actions.append(Abort(task.worker, target, message))
            self._release(pool, task, now, FAILED)
            self._retry(pool, task, message, None, now)
            return
        if kind is TimerKind.RESOURCE_WAKE:  # buckets refilled: tick dispatches, then arms the next one
            self._refill_wake = None
            for name in list(self._parked_on):
                if self._resources.refills(name):
                    self._wake(name, now)
            return
        if kind is TimerKind.RECURRING:
            schedule = self._numbered[target]  # _due checked it
            self._plan_occurrence(schedule, self._next_start(schedule, due, now), now)
            return
        task = self._table.by_id[target]
        pool = self._pools[task.spec.pool]
        if kind is TimerKind.FIXED_START:
            self._start_fixed(pool, task, now)
        elif kind is TimerKind.FIXED_MISS:
            self._miss(pool, task, now)
        elif kind is TimerKind.FIXED_HOLD:
            self._hold(pool, task)
        else:  # AWAIT_TIMEOUT
            self._finish(pool, task, Status.SKIPPED, AWAIT_TIMED_OUT, now)
            self._dirty[pool.name] = pool

    # ------------------------------------------------------------------- dependencies (internals)

    def _check_batch(self, specs: Sequence[TaskSpec], now: float) -> None:
        """The checks only dependencies, fixed starts and resources need (plan() does the rest): raise
        SubmitError with the spec's index, changing nothing."""
        table = self._table
        by_key = table.by_key
        batch_keys = {spec.key: i for i, spec in enumerate(specs) if spec.key and spec.key not in by_key}
        planned: dict[str, list[Window]] = {}
        has_deps = False
        for i, spec in enumerate(specs):
            pool = self._pools.get(spec.pool)
            if pool is None or (spec.key and spec.key in by_key):
                continue  # plan() reports the unknown pool; a duplicate's options are ignored
            if spec.resources:
                problem = self._resources.check(spec.resources)
                if problem is not None:
                    raise SubmitError(problem[0], problem[1], i, ".resources")
            if spec.start is not None:
                window = self._window(pool, spec)
                mine = planned.setdefault(pool.name, [])
                if not self._reservations[pool.name].fits(window, mine):
                    raise SubmitError("reservation_conflict", "fixed-start reservation conflict", i)
                mine.append(window)
            for j, dep in enumerate(spec.deps):
                has_deps = True
                target = dep.target
                if isinstance(target, str):
                    if target in batch_keys or target in by_key:
                        continue
                    if pool.config.unknown_dependency is UnknownDependency.AWAIT:
                        continue
                    raise SubmitError(
                        "unknown_dependency", f"unknown dependency '{target}'", i, f".deps[{j}].key"
                    )
                if target not in table.by_id:
                    raise SubmitError(
                        "unknown_dependency", f"unknown dependency {target}", i, f".deps[{j}].id"
                    )
        if has_deps:
            self._check_cycles(specs, batch_keys)

    def _check_cycles(self, specs: Sequence[TaskSpec], batch_keys: Mapping[str, int]) -> None:
        """Refuse a batch whose edges close a cycle. Tasks already admitted form no cycle among
        themselves (edges only point at older tasks, or at keys not yet held), so a cycle must pass
        through the batch: a depth-first search from each spec, over batch edges, edges of live tasks,
        and awaited keys the batch provides, looks for a path back to a spec on the current path."""
        table = self._table
        deps = self._deps

        def successors(node: int | str) -> list[int | str]:
            # Batch specs are nodes "#<index>" (str), live tasks are their ids (int).
            if isinstance(node, str):
                out: list[int | str] = []
                for dep in specs[int(node[1:])].deps:
                    target = dep.target
                    if isinstance(target, str) and target in batch_keys:
                        out.append(f"#{batch_keys[target]}")
                    else:
                        task = table.get(target)
                        if task is not None and task.status is BLOCKED:
                            out.append(task.id)
                return out
            found: list[int | str] = []
            for ref in deps.blocked_on(node):
                if isinstance(ref, str):
                    if ref in batch_keys:
                        found.append(f"#{batch_keys[ref]}")
                else:
                    task = table.by_id.get(ref)
                    if task is not None and task.status is BLOCKED:
                        found.append(ref)
            return found

        done: set[int | str] = set()
        for i, spec in enumerate(specs):
            start: int | str = f"#{i}"
            if not spec.deps or start in done:
                continue
            path = {start}
            stack = [(start, iter(successors(start)))]
            while stack:
                node, todo = stack[-1]
                nxt = next(todo, None)
                if nxt is None:
                    stack.pop()
                    path.discard(node)
                    done.add(node)
                elif nxt in path:
                    raise SubmitError("cycle", "dependency cycle", i, ".deps")
                elif nxt not in done:
                    path.add(nxt)
                    stack.append((nxt, iter(successors(nxt))))

    def _link(self, created: Iterable[Task], blocked: list[Task], now: float) -> None:
        """After a batch was inserted: edges awaiting the keys of new tasks now wait for them, and each
        new BLOCKED task resolves its own edges."""
        deps = self._deps
        if deps.awaiting:
            for task in created:
                if task.spec.key in deps.awaiting:
                    deps.arrived(task)
                    if task.status.terminal:  # shed by a later spec of the batch: judge the edges now
                        self._cascade(task, now)
        for task in blocked:
            if task.status is BLOCKED:  # not shed by a later spec of the batch
                self._resolve(task, now)

    def _resolve(self, task: Task, now: float) -> None:
        """Register the edges of a new BLOCKED task; targets already ended are judged at once."""
        spec = task.spec
        pool = self._pools[spec.pool]
        deps = self._deps
        awaited = False
        awaits = pool.config.unknown_dependency is UnknownDependency.AWAIT
        for dep in spec.deps:
            target = self._table.get(dep.target)
            if target is None:
                if isinstance(dep.target, str) and awaits:  # a key no task holds yet
                    deps.wait(task, dep.target, dep.on)
                    awaited = True
                # Otherwise only a restored task gets here: its target is gone from the store, so it
                # ended long ago, and met this edge (had it not, the task would have been skipped then).
            elif not target.status.terminal:
                deps.wait(task, target, dep.on)
            elif not edge_met(dep.on, target.status):
                self._finish(pool, task, Status.SKIPPED, f"dependency ended as {target.status.label}", now)
                return
        if task.id not in deps.unmet:
            self._unblock(pool, task, now)
        elif awaited and pool.config.await_timeout is not None:
            self._arm(now + pool.config.await_timeout, TimerKind.AWAIT_TIMEOUT, task.id)

    def _unblock(self, pool: PoolState, task: Task, now: float) -> None:
        """Every edge of a BLOCKED task is met: READY, or on to ``_schedule`` for its fixed start (still
        counted as waiting: ``_schedule`` knows whether it stays so)."""
        if task.spec.start is not None:
            self._schedule(pool, task, now)
            return
        self._waiting[pool.name][task.spec.priority] -= 1
        self._make_ready(pool, task, now, now)
        if self._autoscalers:
            self._arrivals[pool.name] += 1
        self._dirty[pool.name] = pool

    def _cascade(self, ended: Task, now: float) -> None:
        """``ended`` reached a terminal status: judge the edges waiting for it. A dependent whose edge
        can no longer be met is skipped, which its own dependents judge in turn (iteratively: chains
        may be long)."""
        deps = self._deps
        stack = [ended]
        while stack:
            target = stack.pop()
            for dependent, on in deps.waiting.pop(target.id, ()):
                if dependent.status is not BLOCKED or dependent.id not in deps.unmet:
                    continue  # cancelled or skipped meanwhile
                if edge_met(on, target.status):
                    if deps.met(dependent):
                        self._unblock(self._pools[dependent.spec.pool], dependent, now)
                    continue
                message = f"dependency {target.id} ended as {target.status.label}"
                pool = self._pools[dependent.spec.pool]
                self._finish(pool, dependent, Status.SKIPPED, message, now, cascade=False)
                if dependent.id in deps.waiting:
                    stack.append(dependent)

    # ------------------------------------------------------------------- fixed starts (internals)

    def _window(self, pool: PoolState, spec: TaskSpec) -> Window:
        """The reservation of a fixed start: [start - tolerance, start + estimate + tolerance]."""
        assert spec.start is not None
        hint = spec.duration_hint
        estimate = pool.queue.durations.of(spec.kind) if hint is None else hint
        return (spec.start - spec.tolerance, spec.start + estimate + spec.tolerance)

    def _schedule(self, pool: PoolState, task: Task, now: float) -> None:
        """A fixed-start task whose dependencies are met (BLOCKED until now, or SCHEDULED as restored):
        SCHEDULED until its start (a worker is held from start - max(tolerance, 1 s)); or, its start
        passed, judged as ``_start_fixed`` would have judged it on time (an overlapped occurrence is
        skipped), then READY within its tolerance or missed already.

        The task comes counted in ``_waiting`` and stays so only while SCHEDULED: a task that ends here
        leaves the count in ``_finish``, which goes by its status, so counting it out beforehand would
        count it out twice."""
        spec = task.spec
        start = spec.start
        assert start is not None
        late = start + spec.tolerance
        if now < start:
            task.status = SCHEDULED
            self._actions.append((SCHEDULED, 0, now, "", task))
            self._arm(start, TimerKind.FIXED_START, task.id)
            self._arm(late, TimerKind.FIXED_MISS, task.id)
            hold_at = start - max(spec.tolerance, MIN_HOLD_AHEAD)
            if hold_at <= now:
                self._hold(pool, task)
            else:
                self._arm(hold_at, TimerKind.FIXED_HOLD, task.id)
            return
        if self._skip_overlap(pool, task, now):
            return
        if now > late and spec.on_miss is not MissPolicy.RUN_LATE:
            self._miss(pool, task, now)
            return
        self._waiting[pool.name][spec.priority] -= 1
        if now <= late:
            self._arm(late, TimerKind.FIXED_MISS, task.id)
        self._make_ready(pool, task, start, now)  # dispatched past its tolerance, it counts as a non-hit
        if self._autoscalers:
            self._arrivals[pool.name] += 1
        self._dirty[pool.name] = pool

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

    def _drop_hold(self, pool: PoolState, task: Task) -> bool:
        """Give back the slot held for ``task``, if any; True when a slot came free."""
        worker = self._holds.pop(task.id, None)
        if worker is None:
            pool.hold_wanted.pop(task.id, None)
            return False
        pool.workers.release(worker)
        return True

    def _move_holds(self, pool: PoolState, worker: Worker) -> None:
        """Fixed starts holding a slot on ``worker`` (leaving, or drained) need a slot elsewhere."""
        for task_id, held in list(self._holds.items()):
            if held is worker:
                del self._holds[task_id]
                pool.workers.release(worker)
                pool.hold_wanted[task_id] = self._table.by_id[task_id]

    def _serve_holds(self, pool: PoolState) -> None:
        """Give slots that came free to fixed starts waiting for a hold, oldest first."""
        wanted = pool.hold_wanted
        for task in list(wanted.values()):
            worker = pool.workers.take(label_set(task.spec.labels))
            if worker is not None:
                del wanted[task.id]
                self._holds[task.id] = worker

    def _start_fixed(self, pool: PoolState, task: Task, now: float) -> None:
        """The start time of a SCHEDULED task arrived: run it on its held slot, or queue it."""
        spec = task.spec
        start = spec.start
        assert start is not None
        if self._skip_overlap(pool, task, now):
            return
        self._waiting[pool.name][spec.priority] -= 1
        pool.hold_wanted.pop(task.id, None)
        worker = self._holds.pop(task.id, None)
        if worker is not None and (not spec.resources or self._resources.take(spec.resources, now) is None):
            task.status = READY  # for the instant before it runs
            self._actions.append((READY, 0, now, "", task))
            self._run(pool, task, worker, start, False, now, pool.stats.bucket(now))
            self._pending_total -= 1
            self._totals.dispatched += 1
            return
        if worker is not None:
            pool.workers.release(worker)
        self._make_ready(pool, task, start, now)
        if self._autoscalers:
            self._arrivals[pool.name] += 1
        self._dirty[pool.name] = pool

    def _skip_overlap(self, pool: PoolState, task: Task, now: float) -> bool:
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
        self._finish(pool, task, Status.SKIPPED, OVERLAPPED, now)
        self._dirty[pool.name] = pool
        return True

    def _miss(self, pool: PoolState, task: Task, now: float) -> None:
        """Start + tolerance passed before the task ran: MISSED or FAILED as ``on_miss`` says (run_late
        tasks just stay READY and count as a non-hit when they run)."""
        pool.stats.bucket(now).fixed_start(False)
        status = Status.MISSED if task.spec.on_miss is MissPolicy.SKIP else FAILED
        self._finish(pool, task, status, FIXED_MISSED, now)
        self._dirty[pool.name] = pool

    # ----------------------------------------------------------------------- resources (internals)

    def _park(self, task: Task, short: str, ready_at: float, now: float) -> None:
        """A READY task whose resources are taken leaves the queue (so it blocks nobody) until a release
        or a token refill of ``short``, the resource it waits for, may let it go; it keeps its sequence
        number for when it comes back."""
        amounts = task.spec.resources
        self._parked[task.id] = (task, ready_at)
        by_amount = self._parked_on.setdefault(short, {})
        waiting = by_amount.get(amounts[short])
        if waiting is None:
            waiting = by_amount[amounts[short]] = []
        elif len(waiting) > _PARKED_SLACK and len(waiting) > 2 * len(self._parked):
            # Mostly entries of tasks that finished while parked (cancelled, shed): drop them.
            waiting[:] = [entry for entry in waiting if entry[2] in self._parked]
            heapify(waiting)
        heappush(waiting, (task.spec.priority, task.seq, task.id))
        if self._resources.refills(short):
            self._arm_refill(self._resources.refill_at(short, amounts[short], now))

    def _arm_refill(self, due: float) -> None:
        """Make sure a RESOURCE_WAKE fires by ``due`` (an earlier one serves: it arms the next)."""
        if self._refill_wake is None or due < self._refill_wake:
            self._refill_wake = due
            self._arm(due, TimerKind.RESOURCE_WAKE, 0)

    def _rearm_refills(self, now: float) -> None:
        """At the end of a tick (after a refill wake-up, its dispatch and settling): arm the wake-up for
        the next refill any parked task waits for. Settling has woken every waiter the tokens there
        could serve, so that refill is in the future: a timer armed in the past would spin."""
        resources = self._resources
        due: float | None = None
        for name, by_amount in self._parked_on.items():
            if resources.refills(name):
                at = resources.refill_at(name, min(by_amount), now)
                if due is None or at < due:
                    due = at
        if due is not None and due > now:
            self._arm_refill(due)

    def _wake(self, name: str, now: float) -> None:
        """Put the parked tasks waiting for resource ``name`` back in their queues at their original
        places, best first among those asking no more than the free units left, until none fits (a big
        request lets smaller ones behind it go). Each step looks at one head per distinct amount, so a
        release costs O(woken · amounts · log n), never a pass over the backlog: one behind a one-permit
        semaphore would otherwise be re-queued and parked again, whole, at every release. A woken task
        that still cannot run parks again. Their pools are marked dirty, dispatched once the input is
        whole: this runs while an attempt is being released, between two consistent states."""
        by_amount = self._parked_on.get(name)
        if not by_amount:
            return
        room = self._resources.room(name, now)
        parked = self._parked
        while room > 0:
            best: list[tuple[int, int, int]] | None = None
            best_amount = 0
            for amount, waiting in by_amount.items():
                while waiting and waiting[0][2] not in parked:
                    heappop(waiting)  # finished while parked
                if waiting and amount <= room and (best is None or waiting[0] < best[0]):
                    best, best_amount = waiting, amount
            if best is None:
                break
            room -= best_amount
            task, ready_at = parked.pop(heappop(best)[2])
            pool = self._pools[task.spec.pool]
            pool.queue.push(task, ready_at, requeue=True)
            self._dirty[pool.name] = pool
            self._rewoken.add(name)
        for amount in [a for a, waiting in by_amount.items() if not waiting]:
            del by_amount[amount]
        if not by_amount:
            del self._parked_on[name]

    # ------------------------------------------------------------------- recurring (internals)

    def _plan_occurrence(self, schedule: _Schedule, start: float | None, now: float) -> None:
        """Create the occurrence starting at ``start`` (one ahead) and the timer that creates the next
        one when it fires."""
        recurring = schedule.recurring
        recurring.next_start = start
        if start is not None:
            if not self._adopt(schedule, start):
                self._create_occurrence(schedule, start, now)
            self._arm(start, TimerKind.RECURRING, schedule.number, schedule.generation)
        self._actions.append(ScheduleChanged(recurring.spec.name, recurring))

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
        spec = schedule.recurring.spec
        template = spec.template
        previous = schedule.recurring.last_task_id
        deps: tuple[Dep, ...] = ()
        if spec.overlap in (Overlap.QUEUE, Overlap.QUEUE_ON_SUCCESS) and previous in self._table.by_id:
            on = DepOn.COMPLETE if spec.overlap is Overlap.QUEUE else DepOn.SUCCESS
            deps = (Dep(previous, on),)
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
            (submitted,), touched = self._insert([occurrence], now, link=False)
        except SubmitError as err:
            if err.code == "reservation_conflict":
                self._totals.recurring_conflicts += 1
            else:
                self._totals.recurring_invalid += 1
            return
        self._dirty.update(touched)
        if submitted.duplicate:
            return
        schedule.recurring.last_task_id = submitted.id
        # Linked before its edges are judged: a start already passed is judged right away, overlap too.
        self._occurrences[submitted.id] = (schedule, previous)
        task = self._table.by_id[submitted.id]
        self._link((task,), [task], now)

    # ----------------------------------------------------------------------- autoscaling (internals)

    def _autoscale(self, now: float) -> None:
        """Evaluate every autoscaled pool whose interval is up; report targets that changed."""
        for name, scaler in self._autoscalers.items():
            if now < scaler.due_at:
                continue
            pool = self._pools[name]
            run_total, runs = self._runs[name]
            waiting = self._waiting[name]
            backlog = [pending - waiting[c] for c, pending in enumerate(pool.pending)]
            not_started = {
                task_id
                for task_id in self._reservations[name].windows
                if (task := self._table.by_id.get(task_id)) is not None and task.status in _WAITING
            }
            reserved = self._reservations[name].peak_ahead(
                now, scaler.config.reservation_horizon, not_started
            )
            target = scaler.evaluate(
                now,
                arrivals=self._arrivals[name],
                service_time=run_total / runs if runs else None,
                backlog=backlog,
                capacity=pool.workers.capacity,
                reserved=reserved,
            )
            self._arrivals[name] = 0
            if target is not None:
                self._actions.append(Scale(name, target))


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


def _grant(config: PoolConfig, requested: int) -> int:
    """Slots granted to a worker asking for ``requested``: at most the pool's ``max`` and
    ``max_slots_per_worker``, never negative."""
    cap = config.max
    if config.max_slots_per_worker is not None:
        cap = min(cap, config.max_slots_per_worker)
    return max(0, min(requested, cap))
