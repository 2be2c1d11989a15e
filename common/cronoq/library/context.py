"""``TaskContext``: what an executor learns about the attempt it runs, and how it heartbeats and notices
that the attempt was cancelled.

One context is built per attempt on the hot path, so it holds only references (the engine's task, the
capacity it runs on) and reads everything else from them on demand.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from cronoq.engine import Task

if TYPE_CHECKING:
    from .scheduler import Scheduler


class Capacity:
    """In-process capacity of one pool with one label set: an engine worker whose slots are the
    capacity, and the executor its attempts run."""

    __slots__ = ("executor", "is_async", "labels", "pool", "worker_id")

    def __init__(
        self,
        worker_id: int,
        pool: str,
        labels: dict[str, str],
        executor: Callable[..., Any],
        is_async: bool,
    ) -> None:
        self.worker_id = worker_id
        self.pool = pool
        self.labels = labels
        self.executor = executor
        self.is_async = is_async


class TaskContext:
    """The executor's first argument.

    Attributes: ``id``, ``attempt`` (1-based), ``lease``, ``pool``, ``kind``, ``key`` (None without
    one), ``tags``, ``group`` (the labels of the capacity running it, ``{}`` when unlabelled),
    ``deadline`` (Unix seconds or None) and ``timeout`` (seconds or None).

    An attempt is cancelled when its task is cancelled, times out, misses its lease TTL or the scheduler
    shuts down: a coroutine executor's task is cancelled (``asyncio.CancelledError`` at its next await),
    ``is_cancelled()`` becomes true and ``cancelled()`` returns. A plain-function executor cannot be
    interrupted; it should poll ``is_cancelled()``.
    """

    __slots__ = ("_aborted", "_capacity", "_job", "_scheduler", "_task", "_waiter", "attempt", "id", "lease")

    def __init__(
        self, scheduler: Scheduler, task: Task, lease: int, attempt: int, capacity: Capacity
    ) -> None:
        self._scheduler = scheduler
        self._task = task
        self._capacity = capacity
        self._aborted = False
        self._job: asyncio.Task[None] | None = None  # the asyncio task running the attempt
        self._waiter: asyncio.Future[None] | None = None  # made by the first cancelled() call
        self.id = task.id
        self.lease = lease
        self.attempt = attempt

    @property
    def pool(self) -> str:
        return self._task.spec.pool

    @property
    def kind(self) -> str:
        return self._task.spec.kind

    @property
    def key(self) -> str | None:
        return self._task.spec.key or None

    @property
    def tags(self) -> dict[str, str]:
        return dict(self._task.spec.tags)  # a copy: the engine's spec must not change under it

    @property
    def group(self) -> dict[str, str]:
        return dict(self._capacity.labels)

    @property
    def deadline(self) -> float | None:
        return self._task.spec.deadline

    @property
    def timeout(self) -> float | None:
        return self._task.spec.timeout

    def tag(self, name: str) -> str | None:
        return self._task.spec.tags.get(name)

    def traceparent(self) -> str | None:
        """The W3C trace context the producer attached as the ``traceparent`` tag, to continue its trace
        in the executor; None when there is none."""
        return self._task.spec.tags.get("traceparent")

    def is_cancelled(self) -> bool:
        """Whether cronoq abandoned this attempt (safe to call from an executor's thread)."""
        return self._aborted

    def heartbeat(self) -> None:
        """Tell the scheduler this attempt is alive, pushing its lease expiry ``lease_ttl`` ahead. Needed
        only in pools with a ``lease_ttl``; safe to call from an executor's thread."""
        if not self._aborted:
            self._scheduler._heartbeat(self)

    async def cancelled(self) -> None:
        """Return once the attempt is cancelled (at once if it already is), e.g. to stop helper tasks."""
        if self._aborted:
            return
        waiter = self._waiter
        if waiter is None:
            waiter = self._waiter = asyncio.get_running_loop().create_future()
        await asyncio.shield(waiter)  # one caller giving up must not cancel the others' wait

    def _abort(self) -> None:
        """The engine ended this attempt (its slot is already free): stop the executor."""
        self._aborted = True
        if self._job is not None:
            self._job.cancel()
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def __repr__(self) -> str:
        return f"TaskContext(id={self.id}, attempt={self.attempt}, pool={self.pool!r}, key={self.key!r})"
