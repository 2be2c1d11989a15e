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
from collections.abc import Collection, Iterable, Mapping, Sequence

from .admission import Shed, plan
from .model import (
    Abort,
    Action,
    Dispatch,
    EngineLimits,
    PoolConfig,
    Status,
    StatusEvent,
    Submitted,
    Task,
    TaskSpec,
)
from .pool import PoolState
from .retry import backoff_delay
from .snapshot import GroupStats, PoolStats, Snapshot, Totals, WorkerView
from .table import TaskTable
from .timers import TimerEntry, TimerHeap, TimerKind
from .workers import Worker, label_set

READY = Status.READY
RUNNING = Status.RUNNING
RETRYING = Status.RETRYING

TIMED_OUT = "attempt timed out"
LEASE_EXPIRED = "lease expired"
DISCONNECTED = "worker disconnected"
LOST_IN_FAILOVER = "attempt lost in failover"
LOST_EXHAUSTED = "attempt lost in failover; retries exhausted"

_TIMER_SLACK = 1024  # dead timer entries tolerated before the heap is worth compacting


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
        self._table = TaskTable(first_id, limits.key_retention, limits.key_retention_max)
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
        task (``duplicate=True``) and is otherwise ignored. Raises SubmitError changing nothing."""
        decisions = plan(specs, self._pools, self._table, self._pending_total, self._limits.max_pending_total)
        table = self._table
        append = self._actions.append
        submitted: list[Submitted] = []
        created: dict[int, Task] = {}
        touched: dict[str, PoolState] = {}
        seq = self._seq
        for i, spec in enumerate(specs):
            decision = decisions[i]
            if isinstance(decision, Task):
                submitted.append(Submitted(decision.id, True))
                continue
            if isinstance(decision, Shed):
                pool = decision.pool
                victim = decision.victim
                victim = victim if isinstance(victim, Task) else created[victim]
                self._finish(pool, victim, Status.SHED, "shed under overload", now)
            else:
                pool = decision
            retry = spec.retry if spec.retry is not None else pool.config.retry
            seq += 1
            task_id = table.next_id
            # BLOCKED until its dependencies are met; without any (all tasks, for now) it is READY at
            # once, so it is built READY and the BLOCKED step shows only in the events.
            task = Task(task_id, spec, seq, READY, now, 0, retry.max_attempts, now)
            table.add(task)
            created[i] = task
            pool.pending[spec.priority] += 1
            if pool.shed is not None:
                pool.shed.track(task, pool.pending[spec.priority])
            pool.queue.push(task, now)
            append(StatusEvent(task_id, spec.pool, spec.key, Status.BLOCKED, 0, now, "", task))
            append(StatusEvent(task_id, spec.pool, spec.key, READY, 0, now, "", task))
            submitted.append(Submitted(task_id, False))
            touched[pool.name] = pool
        self._seq = seq
        self._pending_total += len(created)
        self._totals.submitted += len(created)
        for pool in touched.values():
            self._dispatch(pool, now)
        return submitted

    def cancel(self, ref: int | str, now: float) -> bool:
        """Cancel a live task by id or key (a running one is aborted); False if finished or unknown."""
        task = self._table.get(ref)
        if task is None or task.status.terminal:
            return False
        pool = self._pools[task.spec.pool]
        if task.status is RUNNING:
            self._actions.append(Abort(task.worker, task.lease, "cancelled"))
            self._release(pool, task, now, Status.CANCELLED)
        self._finish(pool, task, Status.CANCELLED, "cancelled", now)
        self._dispatch(pool, now)
        return True

    def restore(self, tasks: Iterable[Task], now: float) -> None:
        """Take over the tasks a previous leader left in the store (ascending ids, all below this
        engine's ``first_id``), before any other input.

        Pending tasks queue again (READY ones keep their place in time, so their wait keeps counting);
        an attempt that was RUNNING is lost with its worker's stream and counts as a retryable failure;
        finished tasks are retained for key dedup and lookups. A task of a pool that is no longer
        configured cannot run here, so it fails saying so rather than staying pending for ever.
        """
        table = self._table
        for task in tasks:
            table.restore(task, now)
            self._seq = max(self._seq, task.seq)
            status = task.status
            if status.terminal:
                continue
            pool = self._pools.get(task.spec.pool)
            if pool is None:
                task.status = Status.FAILED  # not pending: nothing to take out of the pool's counts
                task.message = f"pool '{task.spec.pool}' is no longer configured"
                task.finished = now
                self._ended[Status.FAILED] += 1
                table.retire(task, now)
                self._actions.append(
                    StatusEvent(
                        task.id,
                        task.spec.pool,
                        task.spec.key,
                        Status.FAILED,
                        task.attempt,
                        now,
                        task.message,
                        task,
                    )
                )
                continue
            if status is RUNNING:  # _retry and _finish treat it as an attempt that just ended
                task.lease = task.worker = 0
                if task.attempt >= task.max_attempts:
                    self._finish(pool, task, Status.DEAD_LETTERED, LOST_EXHAUSTED, now)
                else:
                    self._retry(pool, task, LOST_IN_FAILOVER, None, now)
                continue
            priority = task.spec.priority
            pool.pending[priority] += 1
            self._pending_total += 1
            if pool.shed is not None:
                pool.shed.track(task, pool.pending[priority])
            if status is READY:
                ready_at = task.ready_at if task.ready_at is not None else task.created
                pool.queue.push(task, ready_at)
            else:  # RETRYING (its backoff timer died with the old leader) or not yet ready
                self._make_ready(pool, task, now, now)
        for pool in self._pools.values():
            self._dispatch(pool, now)

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
            self._release(pool, task, now, Status.FAILED)
            self._retry(pool, task, DISCONNECTED, None, now)
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
        task = self._held(worker_id, lease)
        if task is None:
            return False
        pool = self._pools[task.spec.pool]
        self._release(pool, task, now, Status.SUCCEEDED)
        self._finish(pool, task, Status.SUCCEEDED, "", now)
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
        self._release(pool, task, now, Status.FAILED)
        if permanent:
            self._finish(pool, task, Status.FAILED, message, now)
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
        self._release(pool, task, now, Status.FAILED if other is None else None)
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
        self._release(pool, task, now, Status.CANCELLED)
        self._finish(pool, task, Status.CANCELLED, "cancelled by the worker", now)
        self._dispatch(pool, now)
        return True

    # ------------------------------------------------------------------------------------- time

    def tick(self, now: float) -> None:
        """Run every timer due by ``now``, forget finished tasks past retention, and dispatch."""
        timers = self._timers
        while (entry := timers.peek()) is not None and entry[0] <= now:
            timers.pop()
            due = self._due(entry)
            if due is None:
                continue
            if due > now:  # a heartbeat moved the lease's expiry
                timers.push(due, entry[2], entry[3], entry[4])
            else:
                self._fire(entry, now)
        self._table.prune(now)
        for pool in self._pools.values():
            self._dispatch(pool, now)

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
        prune = self._table.next_prune()
        if entry is None:
            return prune
        return entry[0] if prune is None else min(entry[0], prune)

    def take_actions(self) -> list[Action]:
        """Everything to do since the last call, in the order it arose."""
        actions = self._actions
        self._actions = []
        return actions

    # ------------------------------------------------------------------------------------ views

    def snapshot(self, now: float) -> Snapshot:
        """Pools, counts and totals as of ``now``."""
        pools: list[PoolStats] = []
        for pool in self._pools.values():
            w = pool.workers
            window = pool.stats.view(now)
            pools.append(
                PoolStats(
                    name=pool.name,
                    capacity=w.capacity,
                    busy=w.busy,
                    held=0,
                    desired=w.capacity,
                    pending_by_class=list(pool.pending),
                    reservations=0,
                    dispatched=window.dispatched,
                    succeeded=window.succeeded,
                    failed=window.failed,
                    priority_adherence=window.priority_adherence,
                    fixed_start_hit_rate=1.0,
                    utilization=window.utilization,
                    schedule_efficiency=window.schedule_efficiency,
                    wait_p50=window.wait_p50,
                    wait_p90=window.wait_p90,
                    wait_p99=window.wait_p99,
                    cost=pool.stats.worker_seconds * pool.config.cost_per_worker_second,
                    workers_connected=w.workers,
                    groups=[GroupStats(dict(g.labels), g.capacity, g.busy) for g in w.groups.values()],
                )
            )
        ended = self._ended
        totals = dataclasses.replace(
            self._totals,
            succeeded=ended[Status.SUCCEEDED],
            failed=ended[Status.FAILED],
            dead_lettered=ended[Status.DEAD_LETTERED],
            cancelled=ended[Status.CANCELLED],
            skipped=ended[Status.SKIPPED],
            missed=ended[Status.MISSED],
            shed=ended[Status.SHED],
        )
        return Snapshot(
            pools=pools,
            live_tasks=self._table.live,
            running=len(self._leases),
            pending=self._pending_total,
            totals=totals,
            workers_connected=len(self._workers),
        )

    def workers(self) -> list[WorkerView]:
        """Connected workers in the order they connected."""
        return [WorkerView(w.id, w.pool, dict(w.labels), w.slots, w.busy) for w in self._workers.values()]

    # --------------------------------------------------------------------------------- internals

    def _dispatch(self, pool: PoolState, now: float) -> None:
        """Lease READY tasks to free compatible workers, best score first, until one side runs out."""
        queue = pool.queue
        workers = pool.workers
        if not (workers.free and queue.ready):
            return
        bucket = pool.stats.bucket(now)
        pending = pool.pending
        started = 0
        while workers.free and queue.ready:  # usually one task: an outcome freed one slot
            best = queue.pop_best(now, workers.has_free)
            if best is None:
                break
            task, required, inverted, ready_at = best
            worker = workers.take(required)
            assert worker is not None, "pop_best offers only lanes with a free compatible worker"
            spec = task.spec
            pending[spec.priority] -= 1
            bucket.dispatch(now - ready_at, inverted)
            task.attempt = attempt = task.attempt + 1
            task.status = RUNNING
            task.started = now
            self._lease(pool, task, worker, now)
            self._actions.append(StatusEvent(task.id, spec.pool, spec.key, RUNNING, attempt, now, "", task))
            started += 1
        self._pending_total -= started
        self._totals.dispatched += started

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
            pool.stats.bucket(now).attempt(now - started, outcome)

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
        self._actions.append(
            StatusEvent(task.id, spec.pool, spec.key, RETRYING, task.attempt, now, message, task)
        )
        if delay > 0.0:
            self._arm(now + delay, TimerKind.RETRY_READY, task.id, task.attempt)
        else:
            self._make_ready(pool, task, now, now)

    def _make_ready(self, pool: PoolState, task: Task, ready_at: float, now: float) -> None:
        """A pending task becomes READY (as of ``ready_at``, from which its wait counts) and is queued."""
        task.status = READY
        task.ready_at = ready_at
        pool.queue.push(task, ready_at)
        spec = task.spec
        self._actions.append(StatusEvent(task.id, spec.pool, spec.key, READY, task.attempt, now, "", task))

    def _finish(self, pool: PoolState, task: Task, status: Status, message: str, now: float) -> None:
        """End a task in terminal ``status``. A RUNNING task's lease must already be released."""
        spec = task.spec
        was = task.status
        if was is not RUNNING:
            pool.pending[spec.priority] -= 1
            self._pending_total -= 1
            if was is READY:
                pool.queue.forget(task)
        task.status = status
        task.message = message
        task.finished = now
        self._ended[status] += 1
        self._table.retire(task, now)
        self._actions.append(
            StatusEvent(task.id, spec.pool, spec.key, status, task.attempt, now, message, task)
        )

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
        return due if target in self._leases else None

    def _fire(self, entry: TimerEntry, now: float) -> None:
        """Run a due timer that still applies."""
        due, _, kind, target, _ = entry
        if kind is TimerKind.RETRY_READY:
            task = self._table.by_id[target]
            self._make_ready(self._pools[task.spec.pool], task, due, now)
            return
        task = self._leases[target]
        pool = self._pools[task.spec.pool]
        if kind is TimerKind.ATTEMPT_TIMEOUT:
            message = TIMED_OUT
            self._totals.timeouts += 1
        else:
            message = LEASE_EXPIRED
            self._totals.lease_expiries += 1
        self._actions.append(Abort(task.worker, target, message))
        self._release(pool, task, now, Status.FAILED)
        self._retry(pool, task, message, None, now)


def _grant(config: PoolConfig, requested: int) -> int:
    """Slots granted to a worker asking for ``requested``: at most the pool's ``max`` and
    ``max_slots_per_worker``, never negative."""
    cap = config.max
    if config.max_slots_per_worker is not None:
        cap = min(cap, config.max_slots_per_worker)
    return max(0, min(requested, cap))
