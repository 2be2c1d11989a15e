"""``Scheduler``: library mode, the engine driven on the caller's event loop with in-process executors.

The engine is the same sans-IO state machine the server runs. Each pool's capacity is an engine worker
whose slots are the capacity (one per label group); a ``Dispatch`` runs the pool's executor as an
asyncio task, its outcome goes back as ``complete``/``fail``, and an ``Abort`` cancels that task (the
engine has already freed the slot). The scheduler reads the clock and calls ``tick`` from one loop timer
armed at the engine's ``next_wakeup()``.

Throughput comes from doing as little per task as possible: ``enqueue`` builds no handle or future,
skips option parsing when there are no options, and hands such tasks to the engine in batches (one
engine call per loop iteration instead of one per task); engine actions are applied in one deferred
pass per loop iteration (``_flush``), so a burst of completions costs one pass, one ``next_wakeup`` and
one timer check; and an attempt is a single coroutine that calls the executor and reports to the engine
itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import functools
import inspect
import math
import random
import sys
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future as ThreadFuture
from concurrent.futures import ThreadPoolExecutor
from typing import Any, NoReturn, Unpack

from cronoq.engine import (
    Abort,
    Action,
    AdmissionError,
    Dispatch,
    Engine,
    EngineLimits,
    Overlap,
    RecurringSpec,
    Scale,
    Status,
    StatusChange,
    Submitted,
    TaskSpec,
)
from cronoq.errors import Permanent, Retryable
from cronoq.timers import call_no_earlier

from . import validate
from .context import Capacity, TaskContext
from .errors import SchedulerError, SubmitError
from .events import EventStream, StatusEvent
from .handle import Outcome, TaskHandle
from .options import Resource, task_ref
from .pool import Pool
from .snapshot import Snapshot, from_engine
from .task import RECURRING_OPTIONS, RecurringOptions, Task, TaskOptions, parse

NOT_STARTED = "scheduler not started; call `await scheduler.start()` first"
CANCELLED_BY_EXECUTOR = "CancelledError: raised by the executor, not by cronoq"
SHUTDOWN: Outcome = (False, "shutdown", "scheduler shut down", None)
ALREADY_FINISHED = "task already finished"
# After the grace period, aborted attempts get this long to unwind (finally blocks) before shutdown()
# returns; an executor that swallows CancelledError must not hold shutdown up for ever.
ABORT_WAIT_S = 1.0
# Results of keyed tasks are kept while the engine retains the task (a duplicate submission resolves to
# the original result); the engine forgets tasks on its own schedule, so stale results are swept
# whenever the table has doubled since the last sweep.
RESULTS_SWEEP_MIN = 1024
BATCH_MAX = 1024  # enqueued tasks handed to the engine in one call, at most

_NEW, _RUNNING, _STOPPING, _STOPPED = range(4)
_SUCCEEDED = Status.SUCCEEDED
_RUNNING_STATUS = Status.RUNNING
_LABELS = {status: status.label for status in Status}
_time = time.time
LabelSet = frozenset[tuple[str, str]]


def _grace(field: str, value: object) -> float:
    """Seconds to wait for running attempts: >= 0, and ``inf`` waits as long as they take."""
    if isinstance(value, bool) or not isinstance(value, int | float) or math.isnan(value) or value < 0:
        raise ValueError(f"{field} must be a non-negative number of seconds or inf (got {value!r})")
    return float(value)


def _retry_after(value: object) -> float | None:
    """A ``Retryable.retry_after`` usable as a backoff floor (seconds or a timedelta, as the worker SDK
    takes it); anything else is ignored rather than letting a malformed exception break the attempt's
    report (it can be replaced after the exception was built)."""
    try:
        return Retryable.retry_after_seconds(value)
    except ValueError:
        return None


def _submit_error(err: AdmissionError) -> SubmitError:
    return SubmitError(err.code, err.message, err.index)


def _describe(exc: BaseException, *, named: bool = True) -> str:
    """How a failed attempt is reported: ``"ValueError: boom"`` (just ``str(exc)`` if not ``named``).
    An exception whose ``__str__`` raises is reported by its type's name alone, since the attempt must
    be reported whatever the executor raised."""
    try:
        text = str(exc)
    except Exception:
        return type(exc).__name__
    return f"{type(exc).__name__}: {text}" if named else text


def _call_sync(executor: Callable[..., Any], ctx: TaskContext, payload: Any) -> Any:
    """Call a plain-function executor in a thread. A StopIteration it raises could not cross into the
    asyncio future awaiting the call (asyncio refuses it and the attempt would never be reported), so it
    comes back as the retryable failure any other exception is."""
    try:
        return executor(ctx, payload)
    except StopIteration as exc:
        raise Retryable(_describe(exc)) from exc


class Scheduler:
    """Runs tasks in this process on the event loop that calls :meth:`start`.

    ``pools`` are the queues with their executors; the first pool named "default", else the first pool,
    takes tasks that name none. ``resources`` are limits shared by all pools. Event streams carry
    terminal events only, or every transition with ``emit_transitions=True``; each buffers up to
    ``event_capacity`` events. Leaving ``async with`` shuts down with ``shutdown_grace``.

    Every method is a coroutine except :meth:`events`; all of them must run on the scheduler's loop.
    """

    def __init__(
        self,
        pools: Sequence[Pool],
        resources: Sequence[Resource] | None = None,
        emit_transitions: bool = False,
        *,
        shutdown_grace: float = 5.0,
        event_capacity: int = 1024,
    ) -> None:
        self._pools: dict[str, Pool] = {}
        for pool in pools:
            if not isinstance(pool, Pool):
                raise TypeError(f"pools must hold Pool objects (got {type(pool).__name__})")
            if pool.name in self._pools:
                raise ValueError(f"duplicate pool name '{pool.name}'")
            self._pools[pool.name] = pool
        if not self._pools:
            raise ValueError("at least one pool is required")
        limits: dict[str, Resource] = {}
        for resource in resources or ():
            if not isinstance(resource, Resource):
                raise TypeError(f"resources must hold Resource objects (got {type(resource).__name__})")
            if resource.name in limits:
                raise ValueError(f"duplicate resource name '{resource.name}'")
            limits[resource.name] = resource
        if not isinstance(emit_transitions, bool):
            raise TypeError(f"emit_transitions must be a bool (got {type(emit_transitions).__name__})")
        self._emit_transitions = emit_transitions
        self._shutdown_grace = _grace("shutdown_grace", shutdown_grace)
        self._event_capacity = validate.count("event_capacity", event_capacity, 1)
        self._default_pool = "default" if "default" in self._pools else next(iter(self._pools))
        self._limits = EngineLimits()
        self._engine = Engine(
            [dataclasses.replace(pool.config) for pool in self._pools.values()],
            limits=self._limits,
            rng=random.Random(),
            resources=[resource.config for resource in limits.values()],
        )
        self._state = _NEW
        self._loop: asyncio.AbstractEventLoop  # set by start(); only read once started
        self._thread = 0  # the loop's thread, for calls that may come from an executor's thread
        self._capacity: dict[int, Capacity] = {}  # engine worker id -> capacity
        self._groups: dict[tuple[str, LabelSet], Capacity] = {}  # (pool, label set) -> its capacity
        self._running: dict[int, TaskContext] = {}  # lease -> the attempt running under it
        self._waiters: dict[int, asyncio.Future[Outcome]] = {}  # task id -> what its handles await
        self._results: dict[int, Any] = {}  # task id -> result not yet handed to a waiter (see above)
        self._results_sweep = RESULTS_SWEEP_MIN
        self._streams: list[EventStream] = []
        self._space: dict[str, asyncio.Future[None]] = {}  # pool -> what full-pool submitters await
        self._flush_pending = False
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._idle: asyncio.Future[None] | None = None  # shutdown waits on it for running attempts
        self._stopped: asyncio.Future[None] | None = None
        self._threads: dict[str, ThreadPoolExecutor] = {}  # pool -> its threads, for plain functions
        # Enqueued specs not yet handed to the engine, the id the first one will get, and when it came.
        self._batchable = self._pools[self._default_pool].config.max_pending is None
        self._batch: list[TaskSpec] = []
        self._batch_first = 0
        self._batch_at = 0.0
        self._batch_room = 0

    # --------------------------------------------------------------------------------- lifecycle

    @property
    def started(self) -> bool:
        """True from a successful start until shutdown completes."""
        return self._state in (_RUNNING, _STOPPING)

    @property
    def pools(self) -> list[str]:
        return list(self._pools)

    @property
    def default_pool(self) -> str:
        return self._default_pool

    async def start(self) -> None:
        """Bind to the running loop and give every pool its initial capacity."""
        if self._state == _STOPPED:
            raise RuntimeError("scheduler was shut down; build a new one")
        if self._state != _NEW:
            raise RuntimeError("scheduler already started")
        self._loop = asyncio.get_running_loop()
        self._thread = threading.get_ident()
        # A plain-function executor gets threads of its pool's own, started whenever all are busy: the
        # engine counts an attempt as running (its timeout and lease TTL too) from dispatch, so the call
        # must start then, never queue behind other pools' calls or a shared pool's size. There is no
        # cap: each label group may run up to ``max`` attempts, and an aborted call keeps its thread
        # until it returns while the engine already runs the retry.
        self._threads = {
            pool.name: ThreadPoolExecutor(sys.maxsize, thread_name_prefix=f"cronoq-{pool.name}")
            for pool in self._pools.values()
            if not pool.is_async
        }
        now = _time()
        for pool in self._pools.values():
            self._add_capacity(pool, {}, pool.initial, now)
        self._engine.tick(now)  # the autoscaler's first evaluation: capacity is at least min from here
        self._state = _RUNNING
        self._flush()

    async def shutdown(self, grace: float = 5.0) -> None:
        """Stop accepting work, let running attempts finish for up to ``grace`` seconds (``inf``: as
        long as they take), then cancel the rest. Handles of tasks that did not finish raise TaskFailed
        with status "shutdown"; event streams end after the events they buffered.

        Cancelling the call (an outer timeout, a failing TaskGroup sibling, a second Ctrl-C) cuts the
        grace period short: the scheduler still stops completely, at once, before the CancelledError
        propagates, so nothing is left waiting on a scheduler that is half stopped."""
        grace = _grace("grace", grace)
        if self._state == _NEW:
            self._state = _STOPPED
            return
        if self._state == _STOPPED:
            return
        if self._stopped is not None:  # another caller is shutting down
            await asyncio.shield(self._stopped)
            return
        loop = self._loop
        stopped = self._stopped = loop.create_future()
        self._state = _STOPPING
        try:
            try:
                now = _time()
                for capacity in self._capacity.values():  # no new attempts; running ones go on
                    self._sync().set_worker_slots(capacity.worker_id, 0, now)
                for space in self._space.values():  # parked submitters wake up to a refusal
                    if not space.done():
                        space.set_result(None)
                self._space.clear()
                self._flush()
                if self._running:
                    idle = self._idle = loop.create_future()
                    await asyncio.wait([idle], timeout=None if math.isinf(grace) else grace)
            finally:
                jobs = self._stop()
            if jobs:
                await asyncio.wait(jobs, timeout=ABORT_WAIT_S)
        finally:
            stopped.set_result(None)

    def _stop(self) -> list[asyncio.Task[None]]:
        """The end of shutdown: abort what still runs and settle everything that waits on the scheduler
        (handles, streams, threads). Synchronous, so it completes even when shutdown() is cancelled.
        Returns the aborted attempts' asyncio tasks, which shutdown gives a moment to unwind."""
        self._idle = None
        self._flush()  # outcomes reported during the grace period
        aborted = list(self._running.values())
        self._running.clear()
        for ctx in aborted:
            ctx._abort()
        self._state = _STOPPED
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        for waiter in self._waiters.values():
            if not waiter.done():
                waiter.set_result(SHUTDOWN)
        self._waiters.clear()
        self._results.clear()
        for stream in self._streams:
            stream.end()
        self._streams.clear()
        for threads in self._threads.values():  # a call still running keeps its thread until it returns
            threads.shutdown(wait=False, cancel_futures=True)
        return [ctx._job for ctx in aborted if ctx._job is not None]

    async def __aenter__(self) -> Scheduler:
        await self.start()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.shutdown(self._shutdown_grace)

    # -------------------------------------------------------------------------------- submitting

    async def enqueue(self, payload: Any = None, **options: Unpack[TaskOptions]) -> int:
        """Submit a task and return its id: the cheapest way in (no handle, nothing to await later).
        Options are those of :meth:`submit`.

        Without options, into a default pool with no ``max_pending``, the task cannot be refused, so it
        joins a batch that is handed to the engine in one call before anything else touches the engine
        (at the latest in the next loop iteration); its id is the one the engine will give it.
        """
        if self._state != _RUNNING or asyncio.get_running_loop() is not self._loop:
            self._refuse()
        if options or not self._batchable:
            return (await self._submit_one(payload, options)).id
        batch = self._batch
        if not batch:
            engine = self._engine
            room = self._limits.max_pending_total - sum(engine.pending_count(name) for name in self._pools)
            if room <= 0:  # let the engine refuse it
                return (await self._submit_one(payload, options)).id
            self._batch_room = min(BATCH_MAX, room)
            self._batch_first = engine.last_id + 1
            self._batch_at = _time()
            if not self._flush_pending:
                self._flush_pending = True
                self._loop.call_soon(self._flush)
        batch.append(TaskSpec(self._default_pool, payload))
        task_id = self._batch_first + len(batch) - 1
        if len(batch) >= self._batch_room:
            self._submit_enqueued()
        return task_id

    def _sync(self) -> Engine:
        """The engine, once the enqueued batch is in it: every engine call but enqueue's goes through
        here, so nothing observes or changes the engine while a batch is outstanding."""
        if self._batch:
            self._submit_enqueued()
        return self._engine

    def _submit_enqueued(self) -> None:
        batch = self._batch
        self._batch = []
        submitted = self._engine.submit(batch, self._batch_at)
        first = self._batch_first
        if submitted[0].id != first or submitted[-1].id != first + len(batch) - 1:
            raise SchedulerError(
                f"the engine numbered {len(batch)} enqueued tasks {submitted[0].id}.. instead of {first}.."
            )

    async def _submit_one(self, payload: Any, options: TaskOptions) -> Submitted:
        now = _time()
        spec = (
            parse(options).spec(payload, self._default_pool, now)
            if options
            else TaskSpec(self._default_pool, payload)
        )
        return (await self._submit([spec], now))[0]

    async def submit(self, payload: Any = None, **options: Unpack[TaskOptions]) -> TaskHandle:
        """Submit a task; the handle resolves to the executor's result.

        Options: ``priority`` (Priority, 0..3 or a name), ``pool``, ``kind``, ``key`` (a second
        submission with a live or retained key returns that task, ``duplicate=True``),
        ``deadline_in``/``deadline_at`` (soft: raises urgency), ``start_in``/``start_at`` (a fixed
        start) with ``tolerance`` and ``on_miss``, ``duration_hint``, ``timeout`` (per attempt),
        ``retry``, ``after``/``deps``, ``resources``, ``tags``, ``labels`` and ``tenant``. Raises
        SubmitError when the scheduler refuses the task, ValueError/TypeError for bad options.
        """
        self._check()
        return self._handle(await self._submit_one(payload, options))

    async def submit_batch(self, tasks: Sequence[Task]) -> list[TaskHandle]:
        """Submit tasks atomically (all or none), in order; they may depend on each other's keys."""
        self._check()
        now = _time()
        specs: list[TaskSpec] = []
        for task in tasks:
            if not isinstance(task, Task):
                raise TypeError(f"submit_batch takes Task objects (got {type(task).__name__})")
            specs.append(task.template.spec(task.payload, self._default_pool, now))
        if not specs:
            return []
        return [self._handle(submitted) for submitted in await self._submit(specs, now)]

    async def _submit(self, specs: list[TaskSpec], now: float) -> list[Submitted]:
        try:
            submitted = self._sync().submit(specs, now)
        except AdmissionError as err:
            submitted = await self._submit_when_room(specs, err)
        self._schedule_flush()
        return submitted

    async def _submit_when_room(self, specs: list[TaskSpec], err: AdmissionError) -> list[Submitted]:
        """Overflow "wait": a full pool parks the submission until one of its tasks starts or ends,
        then tries again; any other refusal is raised."""
        while err.code == "full":
            pool = specs[err.index or 0].pool
            space = self._space.get(pool)
            if space is None:
                space = self._space[pool] = self._loop.create_future()
            await asyncio.shield(space)  # a caller giving up must not wake the others
            if self._state != _RUNNING:
                raise RuntimeError(NOT_STARTED)
            try:
                return self._sync().submit(specs, _time())
            except AdmissionError as again:
                err = again
        raise _submit_error(err) from None

    def _handle(self, submitted: Submitted) -> TaskHandle:
        """The handle for a submission; a duplicate of a finished task resolves to its outcome."""
        task_id = submitted.id
        if submitted.duplicate:
            task = self._sync().get(task_id)
            if task is not None and task.status.terminal:
                succeeded = task.status is _SUCCEEDED
                value = self._results.get(task_id) if succeeded else None
                outcome = (succeeded, _LABELS[task.status], task.message, value)
                return TaskHandle(self, task_id, True, outcome=outcome)
        return TaskHandle(self, task_id, submitted.duplicate, future=self._waiter(task_id))

    def _waiter(self, task_id: int) -> asyncio.Future[Outcome]:
        waiter = self._waiters.get(task_id)
        if waiter is None:
            waiter = self._waiters[task_id] = self._loop.create_future()
        return waiter

    # ----------------------------------------------------------------------------------- queries

    async def cancel(self, target: int | str) -> bool:
        """Cancel a live task by id or key (a running attempt is cancelled): True if it was live."""
        self._check(stopping=True)
        cancelled = self._sync().cancel(task_ref("target", target), _time())
        self._schedule_flush()
        return cancelled

    def _cancel_soon(self, task_id: int) -> None:
        """``TaskHandle.cancel()``: fire and forget, from the loop's thread or any other."""
        if self._state not in (_RUNNING, _STOPPING):
            return
        if threading.get_ident() != self._thread:
            self._loop.call_soon_threadsafe(self._cancel_soon, task_id)
            return
        self._sync().cancel(task_id, _time())
        self._schedule_flush()

    async def status(self, target: int | str) -> str | None:
        """The task's status name, or None if the scheduler does not know (or no longer retains) it."""
        self._check(stopping=True)
        task = self._sync().get(task_ref("target", target))
        return None if task is None else _LABELS[task.status]

    async def handle(self, target: int | str) -> TaskHandle | None:
        """A handle for a known task, None for an unknown one. A task that has already finished gets a
        handle that raises TaskFailed("task already finished"): only handles that exist when a task
        ends receive its result."""
        self._check(stopping=True)
        task = self._sync().get(task_ref("target", target))
        if task is None:
            return None
        if task.status.terminal:
            outcome = (False, _LABELS[task.status], ALREADY_FINISHED, None)
            return TaskHandle(self, task.id, False, outcome=outcome)
        return TaskHandle(self, task.id, False, future=self._waiter(task.id))

    async def snapshot(self) -> Snapshot:
        """Pools, counts and totals as of now."""
        self._check(stopping=True)
        return from_engine(self._sync().snapshot(_time()), self._limits.metrics_window)

    def events(self, on_lag: str = "skip") -> EventStream:
        """A new stream of status events. When its consumer falls behind by ``event_capacity`` events,
        the oldest are dropped: silently (``on_lag="skip"``, counted in ``lagged``) or reported by an
        EventsLagged from the next read (``"raise"``)."""
        if on_lag not in ("skip", "raise"):
            raise ValueError("on_lag must be 'skip' or 'raise'")
        self._check()
        stream = EventStream(self, self._event_capacity, on_lag == "raise")
        self._streams.append(stream)
        return stream

    def _unsubscribe(self, stream: EventStream) -> None:
        if stream in self._streams:
            self._streams.remove(stream)

    # ---------------------------------------------------------------------------------- capacity

    async def set_capacity(self, pool: str, capacity: int) -> None:
        """Set the unlabelled capacity of ``pool`` (at most its ``max``); with autoscaling on, the
        autoscaler's next change of target overrides it."""
        self._check()
        self._set_capacity(self._pool(pool), {}, validate.count("capacity", capacity, 0))

    async def set_group_capacity(self, pool: str, labels: dict[str, str], capacity: int) -> None:
        """Set the capacity of ``pool`` that carries exactly ``labels``: tasks run there only if all
        their labels are among these (unlabelled tasks run anywhere)."""
        self._check()
        self._set_capacity(
            self._pool(pool), validate.strings("labels", labels), validate.count("capacity", capacity, 0)
        )

    def _pool(self, name: str) -> Pool:
        pool = self._pools.get(validate.text("pool", name))
        if pool is None:
            raise ValueError(f"unknown pool '{name}'")
        return pool

    def _set_capacity(self, pool: Pool, labels: dict[str, str], slots: int) -> None:
        now = _time()
        capacity = self._groups.get((pool.name, frozenset(labels.items())))
        if capacity is None:
            self._add_capacity(pool, labels, slots, now)
        else:
            self._sync().set_worker_slots(capacity.worker_id, slots, now)
        self._schedule_flush()

    def _add_capacity(self, pool: Pool, labels: dict[str, str], slots: int, now: float) -> None:
        worker_id = len(self._capacity) + 1
        capacity = Capacity(worker_id, pool.name, labels, pool.executor, self._threads.get(pool.name))
        self._capacity[worker_id] = capacity
        self._groups[(pool.name, frozenset(labels.items()))] = capacity
        self._sync().add_worker(worker_id, pool.name, slots, labels, now)

    # --------------------------------------------------------------------------------- recurring

    async def add_recurring(
        self,
        name: str,
        cron: str,
        payload: Any = None,
        *,
        tz: str | None = None,
        overlap: str = "skip",
        **options: Unpack[RecurringOptions],
    ) -> None:
        """Run ``payload`` on a cron schedule (5 fields, or 6 with leading seconds) in time zone ``tz``
        (IANA name, default UTC). Each occurrence is a fixed-start task; ``overlap`` (skip, allow,
        queue, queue_on_success) says what happens when one starts while the previous still runs.
        Re-adding a name replaces the schedule. A bad cron or zone raises SchedulerError."""
        self._check()
        template = parse(options, RECURRING_OPTIONS)
        spec = RecurringSpec(
            name=validate.name("name", name),
            cron=validate.name("cron", cron),
            template=template.base(payload, self._default_pool),
            tz="UTC" if tz is None else validate.name("tz", tz),
            overlap=validate.choice("overlap", overlap, Overlap),
            deadline_in=template.deadline_in,
        )
        pool = spec.template.pool
        if pool not in self._pools:
            raise SubmitError("unknown_pool", f"unknown pool '{pool}'")
        try:
            self._sync().add_recurring(spec, _time())
        except ValueError as err:
            raise SchedulerError(f"configuration error: {err}") from None
        self._schedule_flush()

    async def remove_recurring(self, name: str) -> bool:
        """Stop a schedule (an occurrence already created stays); False if there was none."""
        self._check()
        removed = self._sync().remove_recurring(validate.text("name", name), _time())
        self._schedule_flush()
        return removed

    # ----------------------------------------------------------------------------------- driving

    def _check(self, *, stopping: bool = False) -> None:
        """Refuse calls before start, after shutdown (during it too, unless ``stopping`` is allowed),
        and from another loop."""
        state = self._state
        if not (state == _RUNNING or (stopping and state == _STOPPING)):
            raise RuntimeError(NOT_STARTED)
        if asyncio.get_running_loop() is not self._loop:
            self._refuse()

    def _refuse(self) -> NoReturn:
        if self._state != _RUNNING:
            raise RuntimeError(NOT_STARTED)
        if self._loop.is_closed():
            raise SchedulerError("the event loop this scheduler was started on is closed")
        raise SchedulerError("this scheduler runs on another event loop")

    def _schedule_flush(self) -> None:
        if not self._flush_pending:
            self._flush_pending = True
            self._loop.call_soon(self._flush)

    def _flush(self) -> None:
        """Apply every pending engine action, then re-arm the timer."""
        self._flush_pending = False
        if self._state == _STOPPED:
            return
        engine = self._sync()
        actions = engine.take_actions()
        while actions:
            self._apply(actions)
            actions = engine.take_actions()  # a Scale changes capacity, which may dispatch
        self._arm_timer()
        idle = self._idle
        if idle is not None and not self._running and not idle.done():
            idle.set_result(None)

    def _apply(self, actions: list[Action]) -> None:
        waiters = self._waiters
        streams = self._streams
        space = self._space
        running = self._running
        transitions = self._emit_transitions
        create_task = self._loop.create_task
        for action in actions:
            # Exact types: cheaper than isinstance, and actions are never subclassed. A status event is
            # a plain tuple (see cronoq.engine.StatusEvent).
            if type(action) is tuple:
                event: StatusChange = action
                status, _, _, _, task = event
                if status >= _SUCCEEDED:
                    if waiters:
                        waiter = waiters.pop(task.id, None)
                        if waiter is not None:
                            self._resolve(waiter, event)
                    if space:
                        self._room(task.spec.pool)
                    if streams:
                        self._publish(event)
                else:
                    if space and status is _RUNNING_STATUS:
                        self._room(task.spec.pool)
                    if transitions and streams:
                        self._publish(event)
            elif type(action) is Dispatch:
                task = action.task
                capacity = self._capacity[action.worker_id]
                ctx = TaskContext(self, task, action.lease, action.attempt, capacity)
                running[action.lease] = ctx
                ctx._job = create_task(self._run(ctx, capacity.executor, task.spec.payload, capacity.threads))
            elif type(action) is Abort:
                aborted = running.pop(action.lease, None)
                if aborted is not None:
                    aborted._abort()
            elif type(action) is Scale and self._state == _RUNNING:  # stopping keeps capacity at 0
                worker_id = self._groups[(action.pool, frozenset())].worker_id
                self._sync().set_worker_slots(worker_id, action.desired, _time())
            # ScheduleChanged tells a durable runtime what to write; library mode keeps no store.

    def _resolve(self, waiter: asyncio.Future[Outcome], event: StatusChange) -> None:
        status, _, _, message, task = event
        value = None
        succeeded = status is _SUCCEEDED
        if succeeded:
            task_id = task.id
            value = self._results.get(task_id) if task.spec.key else self._results.pop(task_id, None)
        if not waiter.done():
            waiter.set_result((succeeded, _LABELS[status], message, value))

    def _room(self, pool: str) -> None:
        space = self._space.pop(pool, None)
        if space is not None and not space.done():
            space.set_result(None)

    def _publish(self, event: StatusChange) -> None:
        status, attempt, at, message, task = event
        spec = task.spec
        published = StatusEvent(task.id, spec.pool, spec.key or None, _LABELS[status], attempt, at, message)
        for stream in self._streams:
            stream.push(published)

    def _arm_timer(self) -> None:
        wake = self._sync().next_wakeup()
        if wake is None or (self._timer_at is not None and self._timer_at <= wake):
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = wake
        self._timer = call_no_earlier(self._loop, wake - _time(), self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = None
        if self._state == _STOPPED:
            return
        self._sync().tick(_time())
        self._flush()

    # ---------------------------------------------------------------------------------- attempts

    async def _run(
        self,
        ctx: TaskContext,
        executor: Callable[..., Any],
        payload: Any,
        threads: ThreadPoolExecutor | None,
    ) -> None:
        """Run one attempt (a coroutine executor on the loop, a plain function in one of ``threads``)
        and report how it ended. Nothing an executor does escapes into the loop: every exception
        becomes a failed attempt."""
        try:
            if threads is None:
                value = await executor(ctx, payload)
            else:
                value = await self._in_thread(ctx, executor, payload, threads)
        except asyncio.CancelledError:
            job = asyncio.current_task()
            if ctx._aborted or (job is not None and job.cancelling()):
                raise  # cronoq's cancellation (or the loop's): the engine expects no report
            self._failed(ctx, CANCELLED_BY_EXECUTOR, False, None)
            return
        except Permanent as exc:
            self._failed(ctx, _describe(exc, named=False), True, None)
            return
        except Retryable as exc:
            self._failed(ctx, _describe(exc, named=False), False, _retry_after(exc.retry_after))
            return
        except Exception as exc:
            self._failed(ctx, _describe(exc), False, None)
            return
        except BaseException as exc:  # SystemExit, KeyboardInterrupt: report, then let them stop the loop
            self._failed(ctx, _describe(exc), False, None)
            raise
        finally:
            ctx._end()
        if self._state == _STOPPED:
            return
        lease = ctx.lease
        self._running.pop(lease, None)
        # An aborted attempt's report is stale: the engine counts it and changes nothing.
        if self._sync().complete(ctx._capacity.worker_id, lease, _time()) and value is not None:
            if ctx._task.spec.key:
                self._keep_result(ctx.id, value)
            elif ctx.id in self._waiters:
                self._results[ctx.id] = value
        if not self._flush_pending:
            self._flush_pending = True
            self._loop.call_soon(self._flush)

    async def _in_thread(
        self, ctx: TaskContext, executor: Callable[..., Any], payload: Any, threads: ThreadPoolExecutor
    ) -> Any:
        """Call a plain-function executor in one of its pool's threads (awaiting what it returns, if
        awaitable). When the attempt is aborted the call goes on in its thread; what it returns then
        is still reported, as a late report from a remote worker reaches the server, so the engine
        fences it by its lease and counts it in ``totals.stale_completions``."""
        call = threads.submit(_call_sync, executor, ctx, payload)
        try:
            value = await asyncio.wrap_future(call, loop=self._loop)
        except asyncio.CancelledError:
            if ctx._aborted:
                call.add_done_callback(functools.partial(self._late, ctx))
            raise
        if inspect.isawaitable(value):
            value = await value
        return value

    def _late(self, ctx: TaskContext, call: ThreadFuture[Any]) -> None:
        """An aborted attempt's thread returned (this runs in that thread): report it on the loop."""
        if not call.cancelled() and self._state != _STOPPED:  # cancelled: it never ran
            with contextlib.suppress(RuntimeError):  # the loop closed: no scheduler is left to count it
                self._loop.call_soon_threadsafe(self._report_late, ctx)

    def _report_late(self, ctx: TaskContext) -> None:
        if self._state != _STOPPED:
            self._sync().complete(ctx._capacity.worker_id, ctx.lease, _time())  # stale: counted

    def _failed(self, ctx: TaskContext, message: str, permanent: bool, retry_after: float | None) -> None:
        if self._state == _STOPPED:
            return
        self._running.pop(ctx.lease, None)
        self._sync().fail(ctx._capacity.worker_id, ctx.lease, message, permanent, retry_after, _time())
        self._schedule_flush()

    def _keep_result(self, task_id: int, value: Any) -> None:
        results = self._results
        results[task_id] = value
        if len(results) > self._results_sweep:
            known = self._sync().get
            for stale in [tid for tid in results if known(tid) is None]:
                del results[stale]
            self._results_sweep = max(RESULTS_SWEEP_MIN, 2 * len(results))

    def _heartbeat(self, ctx: TaskContext) -> None:
        """``TaskContext.heartbeat()``: the engine is touched only from the loop's thread."""
        if threading.get_ident() == self._thread:
            self._beat(ctx)
        else:
            self._loop.call_soon_threadsafe(self._beat, ctx)

    def _beat(self, ctx: TaskContext) -> None:
        if self._state in (_RUNNING, _STOPPING) and not ctx._ended:  # a lease the attempt still holds
            self._sync().heartbeat(ctx._capacity.worker_id, ctx.lease, _time())

    def __repr__(self) -> str:
        state = ("new", "running", "stopping", "stopped")[self._state]
        return f"Scheduler(pools={self.pools}, {state})"
