"""Logging set-up shared by every cronoq process.

structlog renders JSON lines when stdout is not a terminal (what log collectors want) and a readable
console format on a terminal. The level comes from ``CRONOQ_LOG`` (falling back to ``RUST_LOG``, which
the reference server's deployments already set), default ``info``.

Libraries that log through the standard library (grpc's Python layer, psycopg's connection pool, asyncio,
aiohttp) are handed to structlog too, at warning and above, so that their records are lines of the same
stream in the same format (with the library's logger name as ``logger``), not plain ``WARNING:name:...``
lines of another format on stderr that a collector parsing JSON would choke on. grpc's core writes to
stderr itself; :mod:`cronoq.grpc_settings` keeps all but its errors out of a server's stream.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping

import structlog

_LEVELS = {
    "trace": logging.DEBUG,
    "debug": logging.DEBUG,
    "info": logging.INFO,
    "warn": logging.WARNING,
    "warning": logging.WARNING,
    "error": logging.ERROR,
    "off": logging.CRITICAL + 10,
}


def level_from_env(env: Mapping[str, str]) -> int:
    """The level named by CRONOQ_LOG / RUST_LOG; an EnvFilter-style value (``cronoq=debug,info``) uses
    its last bare level, and anything unrecognised means info."""
    raw = env.get("CRONOQ_LOG") or env.get("RUST_LOG") or "info"
    level = logging.INFO
    for part in raw.split(","):
        name = part.rsplit("=", 1)[-1].strip().lower()
        if name in _LEVELS:
            level = _LEVELS[name]
    return level


def configure(env: Mapping[str, str] | None = None, *, stream: object = None) -> None:
    """Configure structlog (and the stdlib root logger grpc/aiohttp log through) for this process."""
    env = os.environ if env is None else env
    out = sys.stdout if stream is None else stream
    level = level_from_env(env)
    json_output = not (hasattr(out, "isatty") and out.isatty())
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if json_output else structlog.dev.ConsoleRenderer()
    )
    structlog.configure(
        processors=[
            structlog.contextvars.merge_contextvars,
            structlog.processors.add_log_level,
            structlog.processors.TimeStamper(fmt="iso", utc=True),
            structlog.processors.format_exc_info,
            renderer,
        ],
        wrapper_class=structlog.make_filtering_bound_logger(level),
        logger_factory=structlog.PrintLoggerFactory(file=out),  # type: ignore[arg-type]
        cache_logger_on_first_use=True,
    )
    root = logging.getLogger()
    root.setLevel(max(level, logging.WARNING))
    if not any(isinstance(h, StructlogHandler) for h in root.handlers):
        root.addHandler(StructlogHandler())
    server_log = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, MalformedHttpFilter) for f in server_log.filters):
        server_log.addFilter(MalformedHttpFilter())


class StructlogHandler(logging.Handler):
    """Hands each standard-library record to structlog: the message as ``event``, the level, the
    logger's name as ``logger`` and a traceback as ``exception``. Written by structlog's own logger, the
    line also shares its lock, so it never interleaves with one of ours from another thread (grpc logs
    from its own threads)."""

    def emit(self, record: logging.LogRecord) -> None:
        try:
            get_logger(record.name).log(
                record.levelno, record.getMessage(), logger=record.name, exc_info=record.exc_info or False
            )
        except Exception:  # as logging's own handlers do: a failing log line must not raise
            self.handleError(record)


class MalformedHttpFilter(logging.Filter):
    """aiohttp logs a request it cannot parse (a control character in a header, a bad request line) with
    a traceback whose message quotes the offending raw line, so a client that sent its token followed by
    a stray byte would put the token into the log, as an error, in a format that is not ours. Such a
    request is the client's fault and was answered 400: log one debug line naming only the kind of
    error, never the bytes."""

    def filter(self, record: logging.LogRecord) -> bool:
        from aiohttp.http_exceptions import HttpProcessingError

        exc = record.exc_info[1] if record.exc_info else None
        if not isinstance(exc, HttpProcessingError):
            return True
        get_logger("cronoq.http").debug("http_request_malformed", error=type(exc).__name__)
        return False


def get_logger(name: str) -> structlog.typing.FilteringBoundLogger:
    return structlog.get_logger(name)  # type: ignore[no-any-return]
