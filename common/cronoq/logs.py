"""Logging set-up shared by every cronoq process.

structlog renders JSON lines when stdout is not a terminal (what log collectors want) and a readable
console format on a terminal. The level comes from ``CRONOQ_LOG`` (falling back to ``RUST_LOG``, which
the reference server's deployments already set), default ``info``.

Libraries that log through the standard library (grpc's Python layer, psycopg's connection pool, asyncio,
aiohttp) are handed to structlog too, so that their records are lines of the same stream in the same
format (with the library's logger name as ``logger``), not plain ``WARNING:name:...`` lines of another
format on stderr that a collector parsing JSON would choke on. They write at warning and above unless
``CRONOQ_LOG`` names them, EnvFilter-style (``info,grpc=debug,psycopg.pool=info``): their info and
debug are noise until one is being looked into, and then one library can be opened up alone.
grpc's core writes to stderr itself; :mod:`cronoq.grpc_settings` keeps all but its errors out of a
server's stream.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

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


OWN = "cronoq"  # the target that names cronoq's own loggers (as the reference's crate name does)


@dataclass(frozen=True, slots=True)
class LogLevels:
    """What ``CRONOQ_LOG`` asks for: cronoq's own level and the levels of named standard-library
    loggers (the libraries not named write at warning and above, or at ``own`` when that is higher)."""

    own: int = logging.INFO
    targets: Mapping[str, int] = field(default_factory=dict)

    @property
    def libraries(self) -> int:
        return max(self.own, logging.WARNING)


def levels_from_env(env: Mapping[str, str]) -> LogLevels:
    """``CRONOQ_LOG`` (else ``RUST_LOG``), EnvFilter-style: a bare level is cronoq's own (the last one
    wins), ``target=level`` sets a library logger's (``grpc=debug``, ``psycopg.pool=info``), and
    ``cronoq=level`` cronoq's own ahead of any bare level. A part whose level is unrecognised is
    ignored, so a typo leaves the default (info) rather than stopping the process."""
    raw = env.get("CRONOQ_LOG") or env.get("RUST_LOG") or "info"
    bare, own, targets = logging.INFO, None, {}
    for part in raw.split(","):
        target, _, name = part.strip().rpartition("=")
        level = _LEVELS.get(name.strip().lower())
        target = target.strip()
        if level is None:
            continue
        if not target:
            bare = level
        elif target == OWN:
            own = level
        else:
            targets[target] = level
    return LogLevels(bare if own is None else own, targets)


def configure(env: Mapping[str, str] | None = None, *, stream: object = None) -> None:
    """Configure structlog (and the stdlib root logger grpc/aiohttp log through) for this process."""
    env = os.environ if env is None else env
    out = sys.stdout if stream is None else stream
    levels = levels_from_env(env)
    json_output = not (hasattr(out, "isatty") and out.isatty())
    renderer: structlog.typing.Processor = (
        structlog.processors.JSONRenderer() if json_output else structlog.dev.ConsoleRenderer()
    )
    processors: list[structlog.typing.Processor] = [
        structlog.contextvars.merge_contextvars,
        structlog.processors.add_log_level,
        structlog.processors.TimeStamper(fmt="iso", utc=True),
        structlog.processors.format_exc_info,
        renderer,
    ]
    structlog.configure(
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(levels.own),
        logger_factory=structlog.PrintLoggerFactory(file=out),  # type: ignore[arg-type]
        cache_logger_on_first_use=True,
    )
    root = logging.getLogger()
    root.setLevel(levels.libraries)
    for target, level in levels.targets.items():
        logging.getLogger(target).setLevel(level)
    handler = next((h for h in root.handlers if isinstance(h, StructlogHandler)), None)
    if handler is None:
        handler = StructlogHandler()
        root.addHandler(handler)
    # The standard library has filtered a record by its logger's level already: written unfiltered
    # (a grpc=debug record passes when cronoq's own level is info), to the same stream.
    handler.write_to = structlog.wrap_logger(
        structlog.PrintLogger(out),  # type: ignore[arg-type]
        processors=processors,
        wrapper_class=structlog.make_filtering_bound_logger(logging.DEBUG),
    )
    server_log = logging.getLogger("aiohttp.server")
    if not any(isinstance(f, MalformedHttpFilter) for f in server_log.filters):
        server_log.addFilter(MalformedHttpFilter())


class StructlogHandler(logging.Handler):
    """Hands each standard-library record to structlog: the message as ``event``, the level, the
    logger's name as ``logger`` and a traceback as ``exception``. Written by structlog's own logger, the
    line also shares its lock, so it never interleaves with one of ours from another thread (grpc logs
    from its own threads)."""

    write_to: Any = None  # set by configure()

    def emit(self, record: logging.LogRecord) -> None:
        try:
            self.write_to.log(
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
