"""The engine's driver on the event loop.

The engine is sans-IO: it returns actions and a next wake-up time. This module is the one place that
turns those into I/O: leases and aborts go to worker sessions, status events wake waiters and Watch
streams, and a single loop timer calls ``tick``. Everything runs on one asyncio loop, so the engine
needs no locks.
"""

from __future__ import annotations

import asyncio
import time
from collections import deque
from collections.abc import Callable, Collection
from dataclasses import dataclass, field
from typing import Protocol

from cronoq.engine import Engine
from cronoq.engine.model import Abort, Dispatch, Status, StatusEvent, Task
from cronoq.errors import DataLoss, Unavailable

from .outputs import OutputCache


class WorkerSink(Protocol):
    """Where the runtime sends a connected worker's leases and aborts (a Work stream)."""

    def send_lease(self, action: Dispatch) -> None: ...

    def send_abort(self, action: Abort) -> None: ...


@dataclass(slots=True)
class Watcher:
    """One Watch subscription: a filter and a bounded buffer; overflow ends it with DATA_LOSS."""

    pools: frozenset[str]
    ids: frozenset[int]
    keys: frozenset[str]
    all_transitions: bool
    capacity: int
    buffer: deque[StatusEvent] = field(default_factory=deque)
    wakeup: asyncio.Event = field(default_factory=asyncio.Event)
    error: Exception | None = None

    def wants(self, event: StatusEvent) -> bool:
        if not self.all_transitions and not event.status.terminal:
            return False
        if self.pools and event.pool not in self.pools:
            return False
        if self.ids or self.keys:
            return event.id in self.ids or (bool(event.key) and event.key in self.keys)
        return True

    def push(self, event: StatusEvent) -> None:
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


class Runtime:
    """Owns the engine of one serving leader and everything that reacts to its actions."""

    def __init__(
        self,
        engine: Engine,
        outputs: OutputCache,
        *,
        clock: Callable[[], float] = time.time,
        watch_buffer: int = 10_000,
    ) -> None:
        self.engine = engine
        self.outputs = outputs
        self.clock = clock
        self.watch_buffer = watch_buffer
        self.sessions: dict[int, WorkerSink] = {}
        self.accepting = True
        self._next_worker_id = 1
        self._waiters: dict[int, list[asyncio.Future[None]]] = {}
        self._watchers: list[Watcher] = []
        self._space: dict[str, asyncio.Event] = {}
        self._timer: asyncio.TimerHandle | None = None
        self._timer_at: float | None = None
        self._idle: asyncio.Event | None = None
        self.outcomes: dict[tuple[str, Status], int] = {}  # (pool, terminal status) -> count, for /metrics

    # ----------------------------------------------------------------------------- action fan-out

    def flush(self) -> None:
        """Deliver every pending engine action and re-arm the timer. Call after each engine input."""
        engine = self.engine
        actions = engine.take_actions()
        while actions:
            for action in actions:
                if isinstance(action, StatusEvent):
                    self._on_event(action)
                elif isinstance(action, Dispatch):
                    self.sessions[action.worker_id].send_lease(action)
                else:
                    sink = self.sessions.get(action.worker_id)
                    if sink is not None:
                        sink.send_abort(action)
            actions = engine.take_actions()
        self._arm_timer()
        if self._idle is not None and self.busy() == 0:
            self._idle.set()

    def _on_event(self, event: StatusEvent) -> None:
        status = event.status
        if status.terminal:
            key = (event.pool, status)
            self.outcomes[key] = self.outcomes.get(key, 0) + 1
            waiters = self._waiters.pop(event.id, None)
            if waiters:
                for fut in waiters:
                    if not fut.done():
                        fut.set_result(None)
        if status is Status.RUNNING or status.terminal:
            space = self._space.get(event.pool)
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
        loop = asyncio.get_running_loop()
        self._timer_at = wake
        self._timer = loop.call_later(max(0.0, wake - self.clock()), self._on_timer)

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

    async def wait_for_space(self, pool: str, timeout: float) -> None:
        """Park a submission to a full ``overflow = wait`` pool until some pending task leaves."""
        event = self._space.setdefault(pool, asyncio.Event())
        event.clear()
        await asyncio.wait_for(event.wait(), timeout)

    def wake_waiters_unavailable(self) -> None:
        for waiters in self._waiters.values():
            for fut in waiters:
                if not fut.done():
                    fut.set_exception(Unavailable("server is shutting down"))
        self._waiters.clear()

    # ---------------------------------------------------------------------------------- watch

    def subscribe(
        self, pools: Collection[str], ids: Collection[int], keys: Collection[str], all_transitions: bool
    ) -> Watcher:
        watcher = Watcher(
            frozenset(pools), frozenset(ids), frozenset(keys), all_transitions, self.watch_buffer
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
        return task.status is Status.SUCCEEDED and task.id in self.outputs

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
