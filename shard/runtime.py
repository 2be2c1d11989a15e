"""The engine's driver on the event loop.

The engine is sans-IO: it returns actions and a next wake-up time. This module is the one place that
turns those into I/O: leases and aborts go to worker sessions, status events wake waiters and Watch
streams, and a single loop timer calls ``tick``. Everything runs on one asyncio loop, so the engine
needs no locks.

With a durable store nothing leaves the process before it is committed (DESIGN principle 4): the tasks
that changed and the actions that followed are held, one committer task writes everything held in one
transaction (group commit: whatever piles up while a commit is in flight goes into the next one), and
only then are leases sent, events published and callers of :meth:`Runtime.sync` answered. Recurring
schedules the engine added, advanced or removed (``ScheduleChanged``) ride in the same batch as the
tasks, so a schedule's advance and the occurrence it created are durable together, and so do the
engine's totals, so that the next leader counts on from exactly what it recovers. The memory store
skips all of that and delivers at once. Autoscaler targets (``Scale``) are not state: they go to
``on_scale`` (the webhook scalers) as soon as the engine emits them.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import Callable, Collection, Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

from cronoq.engine import Engine
from cronoq.engine.model import (
    Abort,
    Action,
    Dispatch,
    Recurring,
    Scale,
    ScheduleChanged,
    Status,
    StatusChange,
    Task,
)
from cronoq.errors import DataLoss, Unavailable
from cronoq.histogram import Histogram
from cronoq.logs import get_logger
from cronoq.timers import call_no_earlier

from .outputs import OutputCache
from .store import Batch, Store, StoreError, StoreUnavailable

if TYPE_CHECKING:
    from cronoq.otel import ServerTracing

log = get_logger("cronoq.runtime")
RETRY_COMMIT_S = (0.05, 0.1, 0.2, 0.5, 1.0)  # backoff between attempts at a batch the store refused


class WorkerSink(Protocol):
    """Where the runtime sends a connected worker's leases and aborts (a Work stream)."""

    def send_lease(self, action: Dispatch) -> None: ...

    def send_abort(self, action: Abort) -> None: ...


@dataclass(slots=True)
class Watcher:
    """One Watch subscription: a filter and a bounded buffer; overflow ends it with DATA_LOSS."""

    pools: frozenset[str] | None  # None: every pool; empty: none (a credential scoped to no pools)
    ids: frozenset[int]
    keys: frozenset[str]
    all_transitions: bool
    capacity: int
    buffer: deque[StatusChange] = field(default_factory=deque)
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    error: Exception | None = None

    def wants(self, event: StatusChange) -> bool:
        status, _, _, _, task = event
        if not self.all_transitions and not status.terminal:
            return False
        if self.pools is not None and task.spec.pool not in self.pools:
            return False
        if self.ids or self.keys:
            key = task.spec.key
            return task.id in self.ids or (bool(key) and key in self.keys)
        return True

    def push(self, event: StatusChange) -> None:
        if self.error is not None:
            return
        if len(self.buffer) >= self.capacity:
            self.fail(DataLoss(f"watch consumer fell behind by more than {self.capacity} events"))
            return
        self.buffer.append(event)
        self.wakeup.set()

    def fail(self, error: Exception) -> None:
        self.error = error
        self.buffer.clear()
        self.wakeup.set()


@dataclass(slots=True)
class CommitStats:
    """Group-commit figures for ``/metrics`` and the benchmark: totals, and the most recent commits'
    latencies and sizes (bounded)."""

    commits: int = 0
    tasks: int = 0
    recent_seconds: deque[float] = field(default_factory=lambda: deque(maxlen=4096))
    recent_sizes: deque[int] = field(default_factory=lambda: deque(maxlen=4096))
    latency: Histogram = field(default_factory=Histogram)  # every commit's, since this term began

    def add(self, seconds: float, size: int) -> None:
        self.commits += 1
        self.tasks += size
        self.recent_seconds.append(seconds)
        self.recent_sizes.append(size)
        self.latency.observe(seconds)


@dataclass(slots=True)
class CommitFailures:
    """Commits that failed, for ``cronoq_store_commit_failures_total``: ``retried`` after a passing
    failure, ``fatal`` when the store failed and the leader stepped down. The server keeps one for the
    process and hands it to each term's runtime, so a failure that ended a term still shows on the
    standby's page that follows it, and the counter never goes back while the process runs."""

    retried: int = 0
    fatal: int = 0


class Runtime:
    """Owns the engine of one serving leader and everything that reacts to its actions."""

    def __init__(
        self,
        engine: Engine,
        outputs: OutputCache,
        *,
        clock: Callable[[], float] = time.time,
        watch_buffer: int = 10_000,
        store: Store | None = None,
        on_store_failure: Callable[[str], None] | None = None,
        on_scale: Callable[[str, int], None] | None = None,
        first_worker_id: int = 1,
        commit_failures: CommitFailures | None = None,
        tracing: ServerTracing | None = None,
    ) -> None:
        self.engine = engine
        # The server's spans (None: it does not trace): attempts open with their leases, end with the
        # status change that ends them, as those are delivered (after their commit).
        self.tracing = tracing
        self.outputs = outputs
        self.clock = clock
        self.watch_buffer = watch_buffer
        self.store = store if store is not None and store.durable else None
        self._on_store_failure = on_store_failure
        self._on_scale = on_scale
        # Held for the next commit (durable store only): tasks by id, outputs, schedule changes and
        # actions in order, and the callers of sync() to answer once it is done.
        self._changed: dict[int, Task] = {}
        self._writing: dict[int, Task] = {}  # the tasks of the commit in flight
        self._schedules: list[tuple[str, Recurring | None]] = []
        self._new_outputs: list[tuple[int, bytes, str]] = []
        self._held: list[Action] = []
        self._synced: list[asyncio.Future[None]] = []
        self._inflight: list[asyncio.Future[None]] = []  # callers answered by the commit in flight
        self._failed: str | None = None  # set when the committer gave up: the store failed
        self._kick = asyncio.Event()
        self._committing = False
        self._committer: asyncio.Task[None] | None = None
        self.max_id = 0  # highest task id issued, for the store's high-water mark
        self.commit_stats = CommitStats()
        self.commit_failures = commit_failures if commit_failures is not None else CommitFailures()
        self.sessions: dict[int, WorkerSink] = {}
        # Leases or aborts went to worker streams since the last sync() (read with the memory store only).
        self._handed = False
        self.accepting = True
        self._next_worker_id = first_worker_id  # ShardMap.first_worker_id: the shard's range
        self._waiters: dict[int, list[asyncio.Future[None]]] = {}
        self._watchers: list[Watcher] = []
        self._space: dict[str, asyncio.Event] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._idle: asyncio.Event | None = None
        self.outcomes: dict[tuple[str, Status], int] = {}  # (pool, terminal status) -> count, for /metrics

    # ----------------------------------------------------------------------------- action fan-out

    def flush(self) -> None:
        """Deliver (or, with a durable store, hold for the next commit) every pending engine action and
        re-arm the timer. Call after each engine input."""
        engine = self.engine
        actions = engine.take_actions()
        if self.store is None:
            while actions:
                self._deliver(actions)
                actions = engine.take_actions()
        elif actions:
            changed = self._changed
            held = self._held
            for action in actions:
                if type(action) is tuple:  # a StatusChange
                    task = action[-1]  # (status, attempt, at, message, task)
                    changed[task.id] = task
                    held.append(action)
                elif isinstance(action, ScheduleChanged):
                    self._schedules.append((action.name, _copy(action.recurring)))
                elif isinstance(action, Scale):
                    self._scale(action)
                else:
                    held.append(action)
            self._kick.set()
        self._arm_timer()
        if self._idle is not None and self.busy() == 0:
            self._idle.set()

    def _deliver(self, actions: list[Action]) -> None:
        sessions = self.sessions
        tracing = self.tracing
        for action in actions:
            if type(action) is tuple:  # a StatusChange
                self._on_event(action)
                if tracing is not None:
                    tracing.changed(action)
            elif isinstance(action, Dispatch):
                sink = sessions.get(action.worker_id)
                if sink is not None:  # (a held lease whose worker left meanwhile was retried by then)
                    sink.send_lease(action)
                    self._handed = True
            elif isinstance(action, Abort):
                sink = sessions.get(action.worker_id)
                if sink is not None:
                    sink.send_abort(action)
                    self._handed = True
            elif isinstance(action, Scale):
                self._scale(action)
            # ScheduleChanged: nothing to deliver (the memory store keeps nothing)

    def _scale(self, action: Scale) -> None:
        if self._on_scale is not None:
            self._on_scale(action.pool, action.desired)

    def record_output(self, task_id: int, output: bytes, content_type: str) -> None:
        """Keep a succeeded task's output: in the cache, and in the store with the task's next commit."""
        self.outputs.put(task_id, output, content_type)
        if self.store is not None:
            self._new_outputs.append((task_id, output, content_type))

    async def sync(self) -> None:
        """Return once everything flushed so far is committed. Raises Unavailable when the store failed
        and this server stepped down.

        With the memory store there is nothing to commit, but when leases (or aborts) went to worker
        streams since the last call this returns after one pass of the event loop: each stream's writer
        starts its write before the caller builds and writes its answer, rather than after (a Submit
        whose task goes straight to a worker: submit->start p50 0.89 -> 0.81 ms, p99 1.24 -> 1.10 ms at
        200 tasks/s, three pairs of runs of ``make bench``'s latency part). A durable store's committer
        delivers before it answers, so its callers resume after the writers anyway."""
        if self.store is None:
            if self._handed:
                self._handed = False
                await asyncio.sleep(0)
            return
        if self._failed is not None:
            raise Unavailable(f"{self._failed}; this server stepped down")
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        if self._held or self._changed or self._schedules:
            self._synced.append(fut)
            self._kick.set()
        elif self._committing:  # everything of ours is in the batch being written
            self._inflight.append(fut)
        else:
            return
        await fut

    async def settle(self, task_ids: Iterable[int]) -> None:
        """Return once the state of these tasks, as the engine has it now, is committed: an answer built
        from that state (Get, List, Wait) may then be sent. Without it a client could be told a task
        succeeded, the leader crash before the commit, and the next leader run the task again."""
        if self.store is None:
            return
        if self._failed is not None:  # the failed batch left _writing: what the engine says is unwritten
            raise Unavailable(f"{self._failed}; this server stepped down")
        changed, writing = self._changed, self._writing
        if any(i in changed or i in writing for i in task_ids):
            await self.sync()

    def start_committer(self) -> None:
        if self.store is not None and self._committer is None:
            self._committer = asyncio.get_running_loop().create_task(self._commit_loop())

    async def stop_committer(self) -> None:
        """Commit what is held (shutdown), then stop the committer."""
        task = self._committer
        if task is None:
            return
        if not task.done():
            with contextlib.suppress(Unavailable):
                await self.sync()
            task.cancel()
        await asyncio.gather(task, return_exceptions=True)
        self._committer = None

    async def abandon(self) -> None:
        """Leadership is gone: stop committing at once; nothing held is delivered or acknowledged."""
        task = self._committer
        self._committer = None
        if task is not None:
            task.cancel()
            await asyncio.gather(task, return_exceptions=True)
        self._failed = self._failed or "leadership lost"
        for fut in self._inflight + self._synced:
            if not fut.done():
                fut.set_exception(
                    Unavailable("this server is no longer the leader; retry against the new leader")
                )
        self._held.clear()
        self._changed.clear()
        self._schedules.clear()

    async def _commit_loop(self) -> None:
        store = self.store
        assert store is not None
        while True:
            await self._kick.wait()
            self._kick.clear()
            if not (self._held or self._changed or self._schedules or self._synced):
                continue
            changed, self._changed = self._changed, {}
            self._writing = changed
            outputs, self._new_outputs = self._new_outputs, []
            schedules, self._schedules = self._schedules, []
            held, self._held = self._held, []
            synced, self._synced = self._synced, []
            self._inflight = synced
            self.max_id = max(self.max_id, self.engine.last_id)
            batch = Batch(list(changed.values()), outputs, self.max_id, schedules, self.engine.totals())
            self._committing = True
            began = time.perf_counter()
            try:
                await self._commit(store, batch)
            except Exception as err:
                # A StoreError; anything else is a bug in the store, and as fatal: a committer that
                # stopped without saying would leave every caller waiting and the server looking ready.
                if not isinstance(err, StoreError):
                    log.exception("commit_failed_unexpectedly")
                    err = StoreError(f"{type(err).__name__}: {err}")
                self._failed = reason = f"store failure: {err}"
                self.commit_failures.fatal += 1
                for fut in synced + self._synced:
                    if not fut.done():
                        fut.set_exception(Unavailable(f"{reason}; this server stepped down"))
                if self._on_store_failure is not None:
                    self._on_store_failure(reason)
                return
            finally:
                self._committing = False
                self._writing = {}
            self.commit_stats.add(time.perf_counter() - began, len(batch.tasks))
            self._deliver(held)
            for fut in synced:
                if not fut.done():
                    fut.set_result(None)

    async def _commit(self, store: Store, batch: Batch) -> None:
        """Commit ``batch``, retrying transient failures with backoff; Fenced and fatal errors raise."""
        attempt = 0
        while True:
            try:
                await store.commit(batch)
                return
            except StoreUnavailable as err:
                delay = RETRY_COMMIT_S[min(attempt, len(RETRY_COMMIT_S) - 1)]
                attempt += 1
                self.commit_failures.retried += 1
                log.warning("commit_retry", error=str(err), attempt=attempt, retry_in_s=delay)
                await asyncio.sleep(delay)

    def _on_event(self, event: StatusChange) -> None:
        status, _, _, _, task = event
        pool = task.spec.pool
        if status.terminal:
            key = (pool, status)
            self.outcomes[key] = self.outcomes.get(key, 0) + 1
            waiters = self._waiters.pop(task.id, None)
            if waiters:
                for fut in waiters:
                    if not fut.done():
                        fut.set_result(None)
        if status is Status.RUNNING or status.terminal:
            space = self._space.get(pool)
            if space is not None:
                space.set()
        for watcher in self._watchers:
            if watcher.wants(event):
                watcher.push(event)

    def _arm_timer(self) -> None:
        wake = self.engine.next_wakeup()
        if wake is None or (self._timer_at is not None and self._timer_at <= wake):
            return
        if self._timer is not None:
            self._timer.cancel()
        self._timer_at = wake
        self._timer = call_no_earlier(asyncio.get_running_loop(), wake - self.clock(), self._on_timer)

    def _on_timer(self) -> None:
        self._timer = None
        self._timer_at = None
        self.engine.tick(self.clock())
        self.flush()

    # --------------------------------------------------------------------------------- workers

    def new_worker_id(self) -> int:
        wid = self._next_worker_id
        self._next_worker_id += 1
        return wid

    def attach(self, worker_id: int, sink: WorkerSink, pool: str, slots: int, labels: dict[str, str]) -> int:
        """Register a connected worker with the engine; leases may flow to ``sink`` from here on."""
        self.sessions[worker_id] = sink
        granted = self.engine.add_worker(worker_id, pool, slots, labels, self.clock())
        self.flush()
        return granted

    def detach(self, worker_id: int) -> None:
        """The worker's stream ended: its in-flight leases are retried elsewhere."""
        if self.sessions.pop(worker_id, None) is None:
            return
        self.engine.remove_worker(worker_id, self.clock())
        self.flush()

    # --------------------------------------------------------------------------------- waiting

    async def wait_terminal(self, task_id: int, timeout: float) -> bool:
        """Wait until the task is terminal; False when ``timeout`` elapsed first."""
        task = self.engine.get(task_id)
        if task is None or task.status.terminal:
            return True
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._waiters.setdefault(task_id, []).append(fut)
        try:
            await asyncio.wait_for(asyncio.shield(fut), timeout)
            return True
        except TimeoutError:
            return False
        finally:
            waiters = self._waiters.get(task_id)
            if waiters is not None and fut in waiters:
                waiters.remove(fut)
                if not waiters:
                    del self._waiters[task_id]

    def stop_accepting(self) -> None:
        """Admit nothing more (shutdown, step-down). Submissions parked for room in a full pool are woken
        to see it and refuse (UNAVAILABLE, never admitted, so safe to send elsewhere); left parked, they
        would be cut when the listener's drain ends, with an UNAVAILABLE that does not say they never
        ran, which no client can safely send again without a key."""
        self.accepting = False
        for space in self._space.values():
            space.set()

    def stop_dispatching(self) -> None:
        """Shutdown: start no new attempt (every worker drained to 0 slots). Running attempts go on
        and their outcomes are taken during the grace; a slot they free must not start another attempt
        that the end of the grace would then cut off (losing one of the task's attempts)."""
        now = self.clock()
        for worker_id in list(self.sessions):
            self.engine.set_worker_slots(worker_id, 0, now)
        self.flush()

    async def wait_for_space(self, pool: str, timeout: float) -> None:
        """Park a submission to a full ``overflow = wait`` pool until some pending task leaves."""
        event = self._space.setdefault(pool, asyncio.Event())
        event.clear()
        await asyncio.wait_for(event.wait(), timeout)

    def wake_waiters_unavailable(self, message: str = "server is shutting down") -> None:
        """Fail every pending wait and commit (shutdown, step-down). Those calls were admitted, so the
        error is never marked as a refusal before admission (``cronoq.transport.unadmitted``): a
        forwarder must not send them to the new leader, where a keyless Submit would run twice."""
        for waiters in self._waiters.values():
            for fut in waiters:
                if not fut.done():
                    fut.set_exception(Unavailable(message))
        self._waiters.clear()
        for fut in self._synced:
            if not fut.done():
                fut.set_exception(Unavailable(message))
        self._synced.clear()

    # ---------------------------------------------------------------------------------- watch

    def subscribe(
        self,
        pools: Collection[str] | None,
        ids: Collection[int],
        keys: Collection[str],
        all_transitions: bool,
    ) -> Watcher:
        """A subscription to the status events of ``pools`` (None: every pool) and, if given, only of
        these ``ids`` or ``keys``."""
        watcher = Watcher(
            None if pools is None else frozenset(pools),
            frozenset(ids),
            frozenset(keys),
            all_transitions,
            self.watch_buffer,
        )
        self._watchers.append(watcher)
        return watcher

    @property
    def watch_count(self) -> int:
        return len(self._watchers)

    def unsubscribe(self, watcher: Watcher) -> None:
        if watcher in self._watchers:
            self._watchers.remove(watcher)

    def close_watchers(self, error: Exception) -> None:
        for watcher in self._watchers:
            watcher.fail(error)
        self._watchers.clear()

    # -------------------------------------------------------------------------------- helpers

    def output_available(self, task: Task) -> bool:
        """Whether Get/Wait can return the output: cached, or kept by a durable store with the task."""
        return task.status is Status.SUCCEEDED and (self.store is not None or task.id in self.outputs)

    async def wait_idle(self, timeout: float) -> bool:
        """Wait until no attempt is running (shutdown grace); False when ``timeout`` elapsed first."""
        self._idle = asyncio.Event()
        if self.busy() == 0:
            return True
        try:
            await asyncio.wait_for(self._idle.wait(), timeout)
            return True
        except TimeoutError:
            return False
        finally:
            self._idle = None

    def busy(self) -> int:
        return sum(view.busy for view in self.engine.workers())

    def cancel_timer(self) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
            self._timer_at = None


def _copy(recurring: Recurring | None) -> Recurring | None:
    """The schedule as it is now: the engine keeps advancing its own object (next start, last task)
    while this change waits for the commit."""
    if recurring is None:
        return None
    return Recurring(recurring.spec, recurring.next_start, recurring.last_task_id)
