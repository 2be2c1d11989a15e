"""``TaskContext``: what an executor learns about the attempt it runs, and how it heartbeats and notices
that the attempt was cancelled.

One context is built per attempt on the hot path, so it holds only references (the engine's task, the
capacity it runs on) and reads everything else from them on demand.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import TYPE_CHECKING, Any

from cronoq.engine import Task

if TYPE_CHECKING:
    from .scheduler import Scheduler


# Guards every context's list of cancelled() waiters: they may be added from any thread (an executor's
# own loop) while the scheduler's loop ends the attempt. Taken only for attempts where cancelled() was
# called, so the hot path never does.
_WAITERS = threading.Lock()


class Capacity:
    """In-process capacity of one pool with one label set: an engine worker whose slots are the
    capacity, the executor its attempts run, and for a plain-function executor the pool's threads."""

    __slots__ = ("executor", "labels", "pool", "threads", "worker_id")

    def __init__(
        self,
        worker_id: int,
        pool: str,
        labels: dict[str, str],
        executor: Callable[..., Any],
        threads: ThreadPoolExecutor | None,
    ) -> None:
        self.worker_id = worker_id
        self.pool = pool
        self.labels = labels
        self.executor = executor
        self.threads = threads  # None: a coroutine executor, run on the loop


class TaskContext:
    """The executor's first argument.

    Attributes: ``id``, ``attempt`` (1-based), ``lease``, ``pool``, ``kind``, ``key`` (None without
    one), ``tags``, ``group`` (the labels of the capacity running it, ``{}`` when unlabelled),
    ``deadline`` (Unix seconds or None) and ``timeout`` (seconds or None).

    An attempt is cancelled when its task is cancelled, times out, misses its lease TTL or the scheduler
    shuts down: a coroutine executor's task is cancelled (``asyncio.CancelledError`` at its next await),
    ``is_cancelled()`` becomes true and ``cancelled()`` returns True. A plain-function executor cannot be
    interrupted; it should poll ``is_cancelled()``.
    """

    __slots__ = (
        "_aborted",
        "_capacity",
        "_ended",
        "_job",
        "_scheduler",
        "_task",
        "_waiters",
        "attempt",
        "id",
        "lease",
    )

    def __init__(
        self, scheduler: Scheduler, task: Task, lease: int, attempt: int, capacity: Capacity
    ) -> None:
        self._scheduler = scheduler
        self._task = task
        self._capacity = capacity
        self._aborted = False  # cronoq cancelled the attempt
        self._ended = False  # the attempt is over, cancelled or not; set after _aborted
        self._job: asyncio.Task[None] | None = None  # the asyncio task running the attempt
        # What cancelled() callers await, each on its own loop; made by the first call, taken by _end.
        self._waiters: list[asyncio.Future[bool]] | None = None
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
        only in pools with a ``lease_ttl``; safe to call from an executor's thread. Once the attempt is
        over it does nothing: there is no lease left to extend."""
        if not self._ended:
            self._scheduler._heartbeat(self)

    async def cancelled(self) -> bool:
        """Wait until the attempt is over: True once cronoq cancels it, False if it ends otherwise (the
        executor returned or raised), at once if it already has. So a helper task awaiting it always
        ends with the attempt. It may be awaited on any loop, e.g. ``asyncio.run`` in an executor's
        thread."""
        if self._ended:
            return self._aborted
        waiter: asyncio.Future[bool] = asyncio.get_running_loop().create_future()
        with _WAITERS:
            if self._waiters is None:
                self._waiters = []
            self._waiters.append(waiter)
        try:
            # The attempt may have ended between the check above and the append, after _end took the
            # list: then nobody resolves this waiter, but _ended is already set.
            if self._ended:
                return self._aborted
            return await waiter
        finally:
            with _WAITERS:  # a caller that gives up (a timeout) must not leave its future behind
                if self._waiters is not None and waiter in self._waiters:
                    self._waiters.remove(waiter)

    def _abort(self) -> None:
        """The engine ended this attempt (its slot is already free): stop the executor."""
        self._aborted = True
        if self._job is not None:
            self._job.cancel()
        self._end()

    def _end(self) -> None:
        """The attempt is over (aborted, or its executor returned or raised): resolve the cancelled()
        waiters, each on its own loop (thread-safely: it may belong to an executor's thread), with
        whether it was aborted. The list is taken, so a second call (the end of an aborted attempt's
        asyncio task) resolves nothing twice."""
        self._ended = True
        if self._waiters is None:
            return
        with _WAITERS:
            waiters, self._waiters = self._waiters, None
        for waiter in waiters or ():
            with contextlib.suppress(RuntimeError):  # its loop is closed: nobody is waiting any more
                waiter.get_loop().call_soon_threadsafe(_settle, waiter, self._aborted)

    def __repr__(self) -> str:
        return f"TaskContext(id={self.id}, attempt={self.attempt}, pool={self.pool!r}, key={self.key!r})"


def _settle(waiter: asyncio.Future[bool], cancelled: bool) -> None:
    """Resolve a cancelled() waiter, on its own loop's thread."""
    if not waiter.done():  # its caller may have given up
        waiter.set_result(cancelled)
