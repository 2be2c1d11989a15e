"""The W3C trace context a task carries, without OpenTelemetry: read, checked and passed on as text.

A producer's ``traceparent`` (and ``tracestate``) arrive as gRPC metadata or HTTP headers of a Submit;
the server keeps them as the task's tags of the same names, which every store already keeps with the
task, and every lease hands them to the worker (docs/operations.md, Tracing). None of that needs the
``otel`` extra: a server that does not trace still passes its producers' context on to their workers.

:data:`incoming` holds the context of the call being served (set by the gRPC and HTTP Submit handlers),
so that the request logic and the forwarding of a call to another shard find it without every handler
signature carrying it. Each call is served in its own asyncio task, so one call never sees another's.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from typing import TypeAlias

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
# W3C Trace Context has a receiver pass on at least 512 characters of tracestate and lets it drop the
# rest; a longer one is dropped whole here, so that what a task adds to its lease stays small and bounded.
MAX_TRACESTATE = 512
# version-trace_id-parent_id-flags, lower-case hex; version ff is invalid, and a future version may add
# fields after the flags (which are kept as sent: the receiver reads what it knows).
_TRACEPARENT = re.compile(r"(?!ff)[0-9a-f]{2}-(?!0{32})[0-9a-f]{32}-(?!0{16})[0-9a-f]{16}-[0-9a-f]{2}(-.*)?")

TraceContext: TypeAlias = tuple[tuple[str, str], ...]
"""``((traceparent, value),)`` or that and ``(tracestate, value)``: metadata pairs and tags alike."""

incoming: ContextVar[TraceContext] = ContextVar("cronoq_incoming_trace", default=())


def trace_context(traceparent: str | None, tracestate: str | None) -> TraceContext:
    """The context to carry, or none (``()``) when ``traceparent`` is missing or malformed: W3C has a
    receiver ignore a bad header, not refuse the request. A version-00 value must be exactly 55
    characters. The tracestate goes only with a valid traceparent, and only up to MAX_TRACESTATE."""
    if not traceparent or not _TRACEPARENT.fullmatch(traceparent):
        return ()
    if traceparent.startswith("00") and len(traceparent) != 55:
        return ()
    if tracestate and len(tracestate) <= MAX_TRACESTATE and "\x00" not in tracestate:
        return ((TRACEPARENT, traceparent), (TRACESTATE, tracestate))
    return ((TRACEPARENT, traceparent),)


def from_metadata(metadata: Iterable[tuple[str, str | bytes]] | None) -> TraceContext:
    """The trace context of gRPC invocation metadata (its keys are lower-case)."""
    traceparent = tracestate = None
    for key, value in metadata or ():
        if key == TRACEPARENT and isinstance(value, str):
            traceparent = value
        elif key == TRACESTATE and isinstance(value, str):
            tracestate = value
    return trace_context(traceparent, tracestate) if traceparent is not None else ()


def from_headers(headers: Mapping[str, str]) -> TraceContext:
    """The trace context of HTTP headers (a case-insensitive mapping, as aiohttp's)."""
    traceparent = headers.get(TRACEPARENT)
    return trace_context(traceparent, headers.get(TRACESTATE)) if traceparent is not None else ()


def with_context(tags: dict[str, str], context: TraceContext) -> dict[str, str]:
    """A task's tags with the caller's trace context added, unless the producer set a ``traceparent``
    tag itself (an SDK that sends no metadata may carry it so), which is then the task's context."""
    if not context or TRACEPARENT in tags:
        return tags
    return {**tags, **dict(context)}


@contextmanager
def incoming_trace(context: TraceContext) -> Iterator[None]:
    """Make ``context`` the :data:`incoming` one while a call is served."""
    token = incoming.set(context)
    try:
        yield
    finally:
        incoming.reset(token)


__all__ = [
    "TRACEPARENT",
    "TRACESTATE",
    "TraceContext",
    "from_headers",
    "from_metadata",
    "incoming",
    "incoming_trace",
    "trace_context",
    "with_context",
]
