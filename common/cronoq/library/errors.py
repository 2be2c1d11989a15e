"""The errors library mode raises, on top of :class:`cronoq.errors.CronoqError`.

Each one keeps its constructor arguments as attributes and pickles through them (``__reduce__``), so an
error raised in one process can be sent to another (a multiprocessing pool, a test runner) and still
carry its code or status.
"""

from __future__ import annotations

from cronoq.errors import CronoqError


class SubmitError(CronoqError):
    """The scheduler refused a submission; nothing of it was inserted.

    ``code`` is one of unknown_pool, unknown_resource, resource_exceeds_capacity, reservation_conflict,
    cycle, unknown_dependency, full, overloaded, duplicate_key_in_batch, invalid. ``index`` is the
    position of the refused task in a batch, when known.
    """

    def __init__(self, code: str, message: str, index: int | None = None) -> None:
        super().__init__(message)
        self.code = code
        self.message = message
        self.index = index

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.code, self.message, self.index))


class SchedulerError(CronoqError):
    """The scheduler cannot do what was asked: it is misconfigured, or its event loop is gone."""

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.message,))


class TaskFailed(CronoqError):
    """Awaiting a task that did not succeed: ``status`` is how it ended (a terminal status, or
    ``"shutdown"`` when the scheduler stopped first) and ``message`` why."""

    def __init__(self, status: str, message: str, task_id: int | None = None) -> None:
        super().__init__(f"task {task_id} ended as {status}: {message}")
        self.status = status
        self.message = message
        self.task_id = task_id

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.status, self.message, self.task_id))


class EventsLagged(CronoqError):
    """An event stream opened with ``on_lag="raise"`` dropped ``skipped`` events because its consumer
    fell behind; iterating again continues with the events still buffered."""

    def __init__(self, skipped: int) -> None:
        super().__init__(f"the event stream fell behind: {skipped} events were dropped")
        self.skipped = skipped

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.skipped,))
