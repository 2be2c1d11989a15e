"""Errors shared by the SDK, the engine and the servers.

Every error that crosses the wire is an :class:`ApiError` subclass named for its gRPC status, the way
psycopg maps SQLSTATE codes to classes: a server raises ``InvalidArgument("task.pool: ...")`` once, each
transport renders it (gRPC status, HTTP code + JSON body), and the SDK turns the received status back into
the same class. The class carries the retry decision (``retryable``) so callers need no table of their own.

``Retryable`` and ``Permanent`` are what a handler raises to say how its attempt failed; the worker SDK
turns them into the ``fail`` message of the worker protocol.
"""

from __future__ import annotations

import math
import numbers
from datetime import timedelta
from typing import ClassVar

# An error's message travels as the ``grpc-message`` trailer, percent-encoded (up to 3 bytes per byte);
# grpc clients refuse trailers over 16 KiB outright and, above 8 KiB, at random, reporting
# RESOURCE_EXHAUSTED "Stream removed" instead of the error. Messages are cut to this many UTF-8 bytes.
MAX_MESSAGE_BYTES = 1024
SHOWN_CHARS = 64  # of a caller's value quoted in a message (see ``shown``)
# Characters of a worker's report text (a failure's message, a nack's reason) that a server keeps. The
# worker SDK cuts its reports to it: a handler's exception text can be any length, and a report over
# the server's message limit would end the stream, retrying every lease on it.
MAX_REPORT_CHARS = 8192


def bounded(message: str) -> str:
    """``message`` cut to :data:`MAX_MESSAGE_BYTES` UTF-8 bytes (saying how long it was), so that it
    reaches the caller whatever it quotes."""
    if len(message) <= MAX_MESSAGE_BYTES // 4:  # no character takes more than 4 bytes
        return message
    data = message.encode(errors="replace")  # (text from JSON may hold lone surrogates)
    if len(data) <= MAX_MESSAGE_BYTES:
        return message
    kept = data[: MAX_MESSAGE_BYTES - 48].decode(errors="ignore")
    return f"{kept}... (message cut: {len(message):,} characters)"


def shown(value: str) -> str:
    """A caller's value quoted for an error message: a value the server does not know (a pool, a key)
    has not been length-checked, and a message quoting all of it would be as long as the request."""
    if len(value) <= SHOWN_CHARS:
        return f"'{value}'"
    return f"'{value[:SHOWN_CHARS]}...' ({len(value):,} characters)"


class CronoqError(Exception):
    """Base of every error cronoq raises."""


class ApiError(CronoqError):
    """An error with a gRPC status code (lower-case name in ``code``)."""

    code: ClassVar[str] = "unknown"
    http_status: ClassVar[int] = 500
    retryable: ClassVar[bool] = False
    # Sent with the status (gRPC trailing metadata, HTTP headers): e.g. where a shard's pool is served.
    metadata: tuple[tuple[str, str], ...] = ()
    # The ``[limits]`` key that refused the request, if one did (see cronoq.limit_hits); never sent.
    limit: str | None = None

    def __init__(self, message: str = "", code: str | None = None) -> None:
        message = bounded(message)
        super().__init__(message)
        self.message = message
        if code is not None and code != type(self).code:
            # Only for codes with no class of their own (kept so nothing is lost in translation).
            self.code = code  # type: ignore[misc]

    def __str__(self) -> str:
        return f"{self.code}: {self.message}" if self.message else self.code

    def __reduce__(self) -> tuple[object, ...]:
        return (type(self), (self.message, self.code))


class InvalidArgument(ApiError):
    code = "invalid_argument"
    http_status = 400


class Unauthenticated(ApiError):
    code = "unauthenticated"
    http_status = 401


class PermissionDenied(ApiError):
    code = "permission_denied"
    http_status = 403


class NotFound(ApiError):
    code = "not_found"
    http_status = 404


class FailedPrecondition(ApiError):
    code = "failed_precondition"
    http_status = 409


class AlreadyExists(ApiError):
    code = "already_exists"
    http_status = 409


class ResourceExhausted(ApiError):
    code = "resource_exhausted"
    http_status = 429
    retryable = True


class MessageTooLarge(ResourceExhausted):
    """RESOURCE_EXHAUSTED because a message is over a size limit (this channel's or the server's).

    Still a :class:`ResourceExhausted`, but not retryable: the same message is just as
    large the next time.
    """

    retryable = False


class Unavailable(ApiError):
    code = "unavailable"
    http_status = 503
    retryable = True


class DeadlineExceeded(ApiError):
    code = "deadline_exceeded"
    http_status = 504


class DataLoss(ApiError):
    code = "data_loss"
    http_status = 500


class Cancelled(ApiError):
    code = "cancelled"
    http_status = 499


class Unimplemented(ApiError):
    code = "unimplemented"
    http_status = 501


class Internal(ApiError):
    code = "internal"
    http_status = 500


class Aborted(ApiError):
    code = "aborted"
    http_status = 409


class OutOfRange(ApiError):
    code = "out_of_range"
    http_status = 400


class Unknown(ApiError):
    code = "unknown"
    http_status = 500


_BY_CODE: dict[str, type[ApiError]] = {
    cls.code: cls
    for cls in (
        InvalidArgument,
        Unauthenticated,
        PermissionDenied,
        NotFound,
        FailedPrecondition,
        AlreadyExists,
        ResourceExhausted,
        Unavailable,
        DeadlineExceeded,
        DataLoss,
        Cancelled,
        Unimplemented,
        Internal,
        Aborted,
        OutOfRange,
        Unknown,
    )
}


def error_for(code: str, message: str) -> ApiError:
    """The error instance for a lower-case gRPC status name (``unknown`` keeps an unfamiliar code)."""
    cls = _BY_CODE.get(code)
    if cls is None:
        return Unknown(message, code=code)
    return cls(message)


class Retryable(CronoqError):
    """Raised by a handler: the attempt failed but a retry may succeed.

    ``message`` goes through ``str()``, so ``raise Retryable(err) from err`` reports the error's text.
    ``retry_after`` (seconds, or a ``timedelta``) is the earliest the next attempt should start; the server
    waits the larger of it and the backoff of the task's retry policy. It is checked here, where the
    mistake is made, because a server refuses a negative, NaN or infinite value by ending the worker's
    stream: anything but a finite number >= 0 raises ``ValueError``.
    """

    def __init__(self, message: object = "", retry_after: float | timedelta | None = None) -> None:
        super().__init__(message)
        self.message = str(message)
        self.retry_after = self.retry_after_seconds(retry_after)

    @staticmethod
    def retry_after_seconds(value: object) -> float | None:
        """``value`` as seconds the wire accepts, ``None`` for ``None``; ``ValueError`` otherwise. The
        worker checks again before sending, since the attribute can be replaced after construction."""
        if value is None:
            return None
        seconds = math.nan
        if isinstance(value, timedelta):
            seconds = value.total_seconds()
        elif isinstance(value, numbers.Real) and not isinstance(value, bool):
            try:
                seconds = float(value)
            except OverflowError:  # an int beyond float's range
                seconds = math.inf
        if not math.isfinite(seconds) or seconds < 0:
            raise ValueError(
                f"retry_after must be a finite number of seconds >= 0 or a timedelta (got {value!r})"
            )
        return seconds


class Permanent(CronoqError):
    """Raised by a handler: retrying cannot help (bad input, a 4xx). The task ends FAILED.

    ``message`` goes through ``str()``, so ``raise Permanent(err) from err`` reports the error's text.
    """

    def __init__(self, message: object = "") -> None:
        super().__init__(message)
        self.message = str(message)
