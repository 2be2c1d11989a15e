"""The engine's state and the transitions every input goes through: ``EngineCore``, which ``Engine``
(engine.py) extends with the inputs and views its callers use.

The core keeps admission (``_insert``), dispatch (``_dispatch``), the lease life cycle (``_lease``,
``_release``, ``_retry``, ``_finish``) and the timers (``_arm``, ``_due``, ``_fire``). Each optional
feature is a collaborator that owns its state and its rules, created here and skipped on the hot path
until a task or a pool uses it:

- ``Dependencies`` (deps.py): the edges of BLOCKED tasks; checks, cycles, the skip cascade.
- ``FixedStarts`` (fixed.py): reservations, slots held for a start, the start and the miss.
- ``RecurringSchedules`` (recurring.py): cron schedules, their occurrences and ``overlap``.
- ``ResourceParking`` (resources.py): READY tasks waiting for a semaphore or a token bucket.
- ``Autoscaling`` (autoscale.py): each autoscaled pool's ``Autoscaler`` and what feeds it.

A collaborator holds the core and calls back into its underscore methods (``_finish``, ``_eligible``,
``_arm``, ``_insert``, ...): they are the package's internal interface, so that every status change,
count, event and dispatch still goes through the one place that keeps them consistent, and the compiled
build calls them natively. ``Engine``'s public methods are the only way in from outside the package.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Final

from .admission import Shed, plan
from .autoscale import Autoscaling
from .deps import Dependencies
from .fixed import FixedStarts, Window
from .model import (
    Abort,
    Action,
    AdmissionError,
    Dispatch,
    EngineLimits,
    PoolConfig,
    Priority,
    ResourceConfig,
    Status,
    Submitted,
    Task,
    TaskSpec,
)
from .pool import PoolState
from .recurring import RecurringSchedules
from .resources import ResourceParking, Resources
from .retry import backoff_delay
from .snapshot import Totals
from .stats import Bucket
from .table import TaskTable
from .timers import TimerEntry, TimerHeap, TimerKind
from .workers import Worker

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

_TIMER_SLACK: Final = 1024  # dead timer entries tolerated before the heap is worth compacting


class EngineCore:
    """The engine's state, admission, dispatch, lease life cycle and timers (see the module docstring);
    constructed as ``Engine``, never alone."""

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
        # Pools that may have work to dispatch, found in the middle of an input (a task made READY by a
        # cascade, a fixed start, a wake-up): every input dispatches them once it is whole, never before.
        self._dirty: dict[str, PoolState] = {}
        self._waiting = {c.name: [0 for _ in Priority] for c in pools}  # BLOCKED + SCHEDULED per class
        self._resources = Resources(resources)  # the units; ResourceParking keeps the tasks waiting
        # The features (module docstring): all empty, and all skipped on the hot path, until a task or a
        # pool uses them.
        self._deps = Dependencies(self, self._table, self._pools)
        self._fixed = FixedStarts(self, self._table, pools)
        self._recurring = RecurringSchedules(self, self._table, self._pools, self._resources, self._totals)
        self._parking = ResourceParking(self, self._pools, self._resources)
        self._autoscaling = Autoscaling(self._pools, self._waiting, self._fixed, pools)

    # -------------------------------------------------------------------------------- admission

    def _insert(
        self, specs: Sequence[TaskSpec], now: float, link: bool = True
    ) -> tuple[list[Submitted], dict[str, PoolState]]:
        """``submit`` without the dispatch: the answers, and the pools that got tasks (for the caller
        to dispatch once its input is whole). With ``link`` False the new tasks' edges are left to the
        caller, which must ``Dependencies.link`` them: ``RecurringSchedules`` first links an occurrence
        to the one before it, which judging it may need at once."""
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
        arrivals = self._autoscaling.arrivals if self._autoscaling.scalers else None
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
                    self._fixed.reserve(pool, task)
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
            self._deps.link(created.values(), blocked, now)
        return submitted, touched

    def _check_batch(self, specs: Sequence[TaskSpec], now: float) -> None:
        """The checks only dependencies, fixed starts and resources need (plan() does the rest): raise
        AdmissionError with the spec's index, changing nothing. Each spec is checked whole, in order, so
        the first bad spec is the one named, with its first problem."""
        by_key = self._table.by_key
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
                    raise AdmissionError(problem[0], problem[1], i, ".resources")
            if spec.start is not None:
                self._fixed.check(pool, spec, i, planned)
            if spec.deps:
                has_deps = True
                self._deps.check(pool, spec, i, batch_keys)
        if has_deps:
            self._deps.check_cycles(specs, batch_keys)

    # --------------------------------------------------------------------------------- dispatch

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
            self._fixed.serve_holds(pool)
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
                    self._parking.park(task, short, ready_at, now)
                    continue
                worker = workers.take(required)
                assert worker is not None, "pop_best offers only lanes with a free compatible worker"
                self._run(pool, task, worker, ready_at, inverted, now, bucket)
                started += 1
            self._pending_total -= started
            self._totals.dispatched += started
        if self._parking.rewoken and not nested:
            self._parking.settle(now)

    def _dispatch_dirty(self, current: PoolState | None, now: float) -> None:
        """Dispatch the pools marked dirty during the input that just ended, except ``current``, which
        the caller dispatches next. (Dispatching never marks a pool, so one pass empties the set.)"""
        dirty = self._dirty
        self._dirty = {}
        for pool in dirty.values():
            if pool is not current:
                self._dispatch(pool, now, nested=True)

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
        bucket.dispatch(now - ready_at, inverted, spec.priority)
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

    def _start_held(self, pool: PoolState, task: Task, worker: Worker, start: float, now: float) -> None:
        """The start of a SCHEDULED task came and a slot was held for it on ``worker``: it runs there at
        once (READY for the instant before), one dispatch with its wait counted from ``start``."""
        self._waiting[pool.name][task.spec.priority] -= 1
        task.status = READY
        self._actions.append((READY, 0, now, "", task))
        self._run(pool, task, worker, start, False, now, pool.stats.bucket(now))
        self._pending_total -= 1
        self._totals.dispatched += 1

    # ------------------------------------------------------------------------- lease life cycle

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
                self._autoscaling.ran(pool.name, now - started)
            if task.spec.resources:
                self._resources.release(task.spec.resources)
                if self._parking.parked:
                    self._parking.released(task.spec.resources, now)

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

    def _eligible(self, pool: PoolState, task: Task, ready_at: float, now: float) -> None:
        """A waiting task (BLOCKED, or SCHEDULED: counted in ``_waiting``) may run: its edges are met,
        or its fixed start came. It becomes READY as of ``ready_at``, counts as an arrival for the
        autoscaler, and its pool is dispatched once the input is whole."""
        self._waiting[pool.name][task.spec.priority] -= 1
        self._make_ready(pool, task, ready_at, now)
        if self._autoscaling.scalers:
            self._autoscaling.arrivals[pool.name] += 1
        self._dirty[pool.name] = pool

    def _mark_dirty(self, pool: PoolState) -> None:
        """Dispatch ``pool`` once the input under way is whole (its state changed in the middle of it)."""
        self._dirty[pool.name] = pool

    def _finish(
        self, pool: PoolState, task: Task, status: Status, message: str, now: float, cascade: bool = True
    ) -> None:
        """End a task in terminal ``status`` (a RUNNING task's lease must already be released) and, unless
        ``Dependencies.cascade`` itself is the caller, judge the dependency edges waiting for it."""
        spec = task.spec
        was = task.status
        if was is not RUNNING:
            pool.pending[spec.priority] -= 1
            self._pending_total -= 1
            if was is READY:
                if not self._parking.unpark(task):  # parked tasks are out of the queue already
                    pool.queue.forget(task)
            elif was is BLOCKED or was is SCHEDULED:
                self._waiting[pool.name][spec.priority] -= 1
                if was is BLOCKED:
                    self._deps.forget(task)
        if spec.start is not None:
            self._fixed.ended(pool, task)
            self._recurring.unlink(task.id)
        self._end(task, status, message, now)
        if cascade and self._deps.waiting and task.id in self._deps.waiting:
            self._deps.cascade(task, now)

    def _end(self, task: Task, status: Status, message: str, now: float) -> None:
        """Record that ``task`` ended in ``status``: on the task, in the counts, in the table (which
        retains it from now on) and as an event. The caller has taken it out of everything else."""
        task.status = status
        task.message = message
        task.finished = now
        self._ended[status] += 1
        self._table.retire(task, now)
        self._actions.append((status, task.attempt, now, message, task))

    # ----------------------------------------------------------------------------------- timers

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
            return self._parking.due(due)
        if kind is TimerKind.RECURRING:
            return self._recurring.due(due, target, token)
        task = self._table.by_id.get(target)
        if task is None:
            return None
        if kind is TimerKind.AWAIT_TIMEOUT:
            return due if self._deps.awaits_key(task) else None
        return self._fixed.due(due, kind, task)

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
        if kind is TimerKind.RESOURCE_WAKE:
            self._parking.refilled(now)
            return
        if kind is TimerKind.RECURRING:
            self._recurring.fire(due, target, now)
            return
        task = self._table.by_id[target]
        pool = self._pools[task.spec.pool]
        if kind is TimerKind.AWAIT_TIMEOUT:
            self._deps.timed_out(pool, task, now)
        else:
            self._fixed.fire(kind, pool, task, now)
