"""Status events and the streams that deliver them.

A stream never slows the scheduler down: each one buffers up to ``event_capacity`` events, and when its
consumer falls behind the oldest are dropped and counted (``lagged``) instead of the scheduler waiting.
With ``on_lag="raise"`` the consumer is told, once per gap, by an :class:`EventsLagged`.
"""

from __future__ import annotations

import asyncio
from collections import deque
from dataclasses import dataclass
from types import TracebackType
from typing import TYPE_CHECKING

from .errors import EventsLagged

if TYPE_CHECKING:
    from .scheduler import Scheduler


@dataclass(slots=True, repr=False)  # not frozen: built on the hot path; treat it as read-only
class StatusEvent:
    """A task changed status: ``status`` is the lower-case name, ``attempt`` 0 before the first
    dispatch, ``at`` Unix seconds, ``message`` why it failed, was cancelled or was skipped."""

    id: int
    pool: str
    key: str | None
    status: str
    attempt: int
    at: float
    message: str

    def __repr__(self) -> str:
        return (
            f'StatusEvent(id={self.id}, pool="{self.pool}", key={self.key!r}, status="{self.status}", '
            f"attempt={self.attempt})"
        )


class EventStream:
    """An async iterator of :class:`StatusEvent` (terminal ones only, unless the scheduler was built
    with ``emit_transitions=True``). It ends when closed or when the scheduler shuts down (after the
    events already buffered)."""

    __slots__ = (
        "_buffer",
        "_capacity",
        "_closed",
        "_ended",
        "_raise_on_lag",
        "_scheduler",
        "_unreported",
        "_waiter",
        "lagged",
    )

    def __init__(self, scheduler: Scheduler, capacity: int, raise_on_lag: bool) -> None:
        self._scheduler = scheduler
        self._capacity = capacity
        self._raise_on_lag = raise_on_lag
        self._buffer: deque[StatusEvent] = deque()
        self._closed = False  # by the consumer: nothing more is delivered
        self._ended = False  # by the scheduler: what is buffered is still delivered
        self._unreported = 0  # dropped since the last EventsLagged
        self._waiter: asyncio.Future[None] | None = None
        self.lagged = 0

    @property
    def closed(self) -> bool:
        return self._closed or self._ended

    def push(self, event: StatusEvent) -> None:
        buffer = self._buffer
        if len(buffer) >= self._capacity:
            buffer.popleft()
            self.lagged += 1
            self._unreported += 1
        buffer.append(event)
        self._wake()

    def end(self) -> None:
        """The scheduler stopped: finish after the buffered events."""
        self._ended = True
        self._wake()

    def close(self) -> None:
        """Stop receiving events; iteration ends at once."""
        if not self._closed:
            self._closed = True
            self._buffer.clear()
            self._scheduler._unsubscribe(self)
            self._wake()

    async def aclose(self) -> None:
        self.close()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> StatusEvent:
        while True:
            if self._unreported and self._raise_on_lag and not self._closed:
                skipped, self._unreported = self._unreported, 0
                raise EventsLagged(skipped)
            if self._buffer:
                return self._buffer.popleft()
            if self._closed or self._ended:
                raise StopAsyncIteration
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            try:
                await waiter
            finally:
                self._waiter = None

    async def __aenter__(self) -> EventStream:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"EventStream(buffered={len(self._buffer)}, lagged={self.lagged}, closed={self.closed})"
