"""The engine: tasks in, leases out, driven entirely by its callers' inputs and their clock.

Every input method takes ``now`` (Unix seconds) and, where capacity and READY tasks meet, dispatches at
once; what the caller must do (send a lease, abort a lease, publish a status change) accumulates in
``take_actions()``. Time-driven work (attempt timeouts, lease expiry, the end of a retry backoff,
forgetting old finished tasks) happens in ``tick(now)``, which the caller schedules at
``next_wakeup()``. One engine is single-threaded: the server calls it from one event loop.

Worker reports name a lease; a report for a lease the worker does not hold (already expired, aborted,
completed, or never issued) changes nothing and is counted in ``totals.stale_completions``, so lease ids
fence late reports from workers that lost their lease.

This module is the engine's public face: each input, its contract, and the views. The state and the
transitions the inputs share live in ``EngineCore`` (core.py), which also says where each optional
feature lives.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Iterable, Mapping, Sequence
from typing import Final

from .core import BLOCKED, CANCELLED, FAILED, READY, RUNNING, SCHEDULED, SUCCEEDED, EngineCore
from .model import (
    Abort,
    Action,
    PoolConfig,
    Recurring,
    RecurringSpec,
    Status,
    Submitted,
    Task,
    TaskSpec,
)
from .snapshot import EngineSnapshot, GroupStats, PoolStats, Totals, WorkerView
from .stats import WaitTotals
from .timers import TimerKind
from .workers import label_set

DISCONNECTED: Final = "worker disconnected"
LOST_IN_FAILOVER: Final = "attempt lost in failover"
LOST_EXHAUSTED: Final = "attempt lost in failover; retries exhausted"
# The totals that count tasks ending in a status (kept in EngineCore._ended, by status).
ENDED_TOTALS: Final = (
    ("succeeded", SUCCEEDED),
    ("failed", FAILED),
    ("dead_lettered", Status.DEAD_LETTERED),
    ("cancelled", CANCELLED),
    ("skipped", Status.SKIPPED),
    ("missed", Status.MISSED),
    ("shed", Status.SHED),
)


class Engine(EngineCore):
    """The scheduling state machine for a set of pools (see the module docstring for the contract)."""

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
        task (``duplicate=True``) and is otherwise ignored. Raises AdmissionError changing nothing.

        Specs of one batch may depend on each other's keys, in any order: every task of the batch exists
        before any edge is resolved."""
        submitted, touched = self._insert(specs, now)
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
            self._release(pool, task, now, CANCELLED)
        self._finish(pool, task, CANCELLED, "cancelled", now)
        self._dispatch(pool, now)
        return True

    def restore(
        self,
        tasks: Iterable[Task],
        now: float,
        schedules: Iterable[Recurring] = (),
        totals: Totals | None = None,
    ) -> None:
        """Take over the tasks, recurring schedules and ``totals`` a previous leader left in the store
        (tasks in ascending ids, all below this engine's ``first_id``), before any other input. The
        totals count on from the previous leader's, so that they never go back across a failover; what
        restoring itself counts (lost attempts) comes on top.

        Pending tasks queue again (READY ones keep their place in time, so their wait keeps counting);
        BLOCKED ones judge their edges again and SCHEDULED ones wait for their start again; an attempt
        that was RUNNING is lost with its worker's stream and counts as a retryable failure; finished
        tasks are retained, from when they finished, for key dedup, lookups and the edges of live
        dependents. A task of a pool that is no longer configured, or needing a resource that is no
        longer configured (or no longer that big), cannot run here, so it fails saying so rather than
        staying pending for ever. A schedule whose cron no longer parses is dropped and counted in
        ``totals.recurring_invalid``; a schedule's pending occurrence keeps its ``overlap`` check.
        """
        if totals is not None:
            self._count_on(totals)
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
        self._recurring.restore(schedules, live)
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
                self._fixed.reserve(pool, task)
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
                    self._fixed.schedule(pool, task, now)
            elif status is READY:
                ready_at = task.ready_at if task.ready_at is not None else task.created
                pool.queue.push(task, ready_at)
                if spec.start is not None:
                    self._fixed.restored_ready(task)
            elif task.ready_at is not None and task.ready_at > now:  # RETRYING: its backoff goes on
                self._arm(task.ready_at, TimerKind.RETRY_READY, task.id, task.attempt)
            else:  # RETRYING, and its backoff is over (or from before backoff ends were stored)
                self._make_ready(pool, task, now, now)
        for task in blocked:
            if task.status is BLOCKED:
                self._deps.resolve(task, now)
        for pool in self._pools.values():
            self._dispatch(pool, now)

    def _fail_restored(self, task: Task, message: str, now: float) -> None:
        """A recovered live task that cannot run here ends FAILED with ``message``. It is not counted as
        pending yet, so there is nothing to take out of its pool's counts; an occurrence is unlinked."""
        self._recurring.unlink(task.id)
        self._end(task, FAILED, message, now)

    # -------------------------------------------------------------------------------- recurring

    def add_recurring(self, spec: RecurringSpec, now: float) -> Recurring:
        """Add a cron schedule, or replace the one of that name, and create its first occurrence.

        Raises RecurringError naming the field (``cron: ...``, ``tz: ...``, ``template.deps: ...``) for a
        schedule that cannot run; the engine is then unchanged. The occurrence a replaced schedule
        created ahead stays; if the new schedule's first start is that occurrence's, it is adopted as
        the new schedule's own instead of a second one being made for the same start (re-adding a
        schedule unchanged, as a service does each time it starts, changes nothing).
        """
        recurring = self._recurring.add(spec, now)
        self._dispatch_dirty(None, now)
        return recurring

    def remove_recurring(self, name: str, now: float) -> bool:
        """Remove a schedule, cancelling the occurrence it created ahead while that one's start is still
        to come (see ``RecurringSchedules.remove``). False if there was none."""
        removed = self._recurring.remove(name, now)
        self._dispatch_dirty(None, now)
        return removed

    def list_recurring(self) -> list[Recurring]:
        """The schedules, in the order they were first added."""
        return self._recurring.schedules()

    # -------------------------------------------------------------------------------- lookups

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
        if worker.busy > granted:  # a drained worker must not run a fixed start
            self._fixed.move_holds(pool, worker)
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
        self._fixed.move_holds(pool, worker)
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
        if self._autoscaling.scalers:
            self._actions.extend(self._autoscaling.evaluate(now))
        for pool in self._pools.values():
            self._dispatch(pool, now)
        self._parking.rearm_refills(now)

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
        due = self._autoscaling.next_due()
        if due is not None and (wake is None or due < wake):
            wake = due
        return wake

    def take_actions(self) -> list[Action]:
        """Everything to do since the last call, in the order it arose."""
        actions = self._actions
        self._actions = []
        return actions

    # ------------------------------------------------------------------------------------ views

    def dispatch_waits(self) -> dict[str, WaitTotals]:
        """Each pool's dispatch waits since the engine started, by priority class (the histogram of
        ``/metrics``; live objects, to be read before the engine runs again)."""
        return {name: pool.stats.settled_waits() for name, pool in self._pools.items()}

    def snapshot(self, now: float) -> EngineSnapshot:
        """Pools, counts and totals as of ``now``."""
        pools: list[PoolStats] = []
        # READY tasks waiting for a resource are out of their pool's queue (and its count) until woken.
        parked_in = self._parking.per_pool()
        running: dict[str, list[float]] = {}
        for task in self._leases.values():
            assert task.started is not None  # set at dispatch
            running.setdefault(task.spec.pool, []).append(task.started)
        for pool in self._pools.values():
            w = pool.workers
            window = pool.stats.view(now, running.get(pool.name, ()))  # integrates worker-seconds up to now
            holds = self._fixed.held(pool.name)
            held = len(holds)
            pools.append(
                PoolStats(
                    name=pool.name,
                    capacity=w.capacity,
                    busy=w.busy - held,
                    held=held,
                    desired=self._autoscaling.desired(pool.name, w.capacity),
                    pending_by_class=list(pool.pending),
                    reservations=self._fixed.reservations(pool.name, now),
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
        return EngineSnapshot(
            pools=pools,
            live_tasks=self._table.live,
            running=len(self._leases),
            pending=self._pending_total,
            totals=self.totals(),
            workers_connected=len(self._workers),
            resources=self._resources.stats(now, self._parking.waiting()),
        )

    def totals(self) -> Totals:
        """The counters as of now (a copy): a store keeps them with each commit, for the next leader."""
        ended = self._ended
        totals = dataclasses.replace(self._totals)
        for name, status in ENDED_TOTALS:
            setattr(totals, name, ended[status])
        return totals

    def _count_on(self, totals: Totals) -> None:
        """Start the counters at ``totals`` (in place: the features count into the same object)."""
        for field in dataclasses.fields(Totals):
            setattr(self._totals, field.name, getattr(totals, field.name))
        for name, status in ENDED_TOTALS:
            self._ended[status] = getattr(totals, name)
            setattr(self._totals, name, 0)  # these live in _ended

    def workers(self) -> list[WorkerView]:
        """Connected workers in the order they connected."""
        # busy counts leases only: a slot held for a fixed start is not running anything yet.
        return [
            WorkerView(w.id, w.pool, dict(w.labels), w.slots, len(w.leases)) for w in self._workers.values()
        ]


def _grant(config: PoolConfig, requested: int) -> int:
    """Slots granted to a worker asking for ``requested``: at most the pool's ``max`` and
    ``max_slots_per_worker``, never negative."""
    cap = config.max
    if config.max_slots_per_worker is not None:
        cap = min(cap, config.max_slots_per_worker)
    return max(0, min(requested, cap))
