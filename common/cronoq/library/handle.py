"""``TaskHandle``: a submitted task's id and a way to wait for its result.

Every handle for the same task shares one future, resolved by the scheduler when the task ends (or the
scheduler shuts down) with an :data:`Outcome`; awaiting a handle never cancels that future, so any
number of callers may await it, time out, and await it again.
"""

from __future__ import annotations

import asyncio
from collections.abc import Generator
from typing import TYPE_CHECKING, Any

from .errors import TaskFailed

if TYPE_CHECKING:
    from .scheduler import Scheduler

Outcome = tuple[bool, str, str, Any]
"""(succeeded, status, message, result): what awaiting a handle returns (result) or raises (TaskFailed
with status and message)."""


class TaskHandle:
    """A submitted task: ``id``, ``duplicate`` (the key named an existing task, whose outcome this is),
    ``done()``, ``cancel()`` and ``result()``. Awaiting the handle is ``await handle.result()``: it
    returns what the executor returned, or raises :class:`TaskFailed` saying how the task ended."""

    __slots__ = ("_future", "_outcome", "_scheduler", "duplicate", "id")

    def __init__(
        self,
        scheduler: Scheduler,
        task_id: int,
        duplicate: bool,
        future: asyncio.Future[Outcome] | None = None,
        outcome: Outcome | None = None,
    ) -> None:
        self._scheduler = scheduler
        self._future = future
        self._outcome = outcome
        self.id = task_id
        self.duplicate = duplicate

    def done(self) -> bool:
        """Whether the task has ended (awaiting the handle would not wait)."""
        return self._outcome is not None or (self._future is not None and self._future.done())

    def cancel(self) -> None:
        """Cancel the task without waiting for the answer (``Scheduler.cancel`` says whether it was
        still live); the handle then raises TaskFailed with status cancelled."""
        self._scheduler._cancel_soon(self.id)

    async def result(self) -> Any:
        """The executor's return value once the task succeeds; TaskFailed if it ends otherwise."""
        outcome = self._outcome
        if outcome is None:
            assert self._future is not None  # a handle has an outcome or a future
            outcome = self._outcome = await asyncio.shield(self._future)
        succeeded, status, message, value = outcome
        if succeeded:
            return value
        raise TaskFailed(status, message, self.id)

    def __await__(self) -> Generator[Any, None, Any]:
        return self.result().__await__()

    def __repr__(self) -> str:
        return f"TaskHandle(id={self.id}, duplicate={self.duplicate}, done={self.done()})"
