"""Whether a server or router traces, and starting it: ``[telemetry]`` and the standard ``OTEL_*`` variables.

Tracing needs the ``otel`` extra (``pip install 'cronoq[otel]'``), which a plain install does not
have, so nothing here imports OpenTelemetry: :func:`start` imports :mod:`cronoq.otel` only when tracing
is wanted, and a process that does not trace never loads it (nor pays for it per call: the request
paths test for ``None``). A process told to trace without the extra refuses to start
(:func:`problems`), naming what told it and the command that installs the extra.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Awaitable, Callable, Mapping
from typing import TYPE_CHECKING, TypeVar

from cronoq.config.model import TelemetrySection
from cronoq.tracecontext import TraceContext, incoming, incoming_trace

if TYPE_CHECKING:
    from cronoq.otel import ServerTracing

INSTALL = "pip install 'cronoq[otel]'"
# Setting where spans go turns tracing on, as the OpenTelemetry SDKs' auto-configuration does.
Answer = TypeVar("Answer")
ENDPOINT_VARIABLES = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
# The modules the extra brings that a traced process imports (the API comes with the SDK).
_EXTRA_MODULES = ("opentelemetry.sdk.trace", "opentelemetry.exporter.otlp.proto.grpc.trace_exporter")


def wanted(section: TelemetrySection, environ: Mapping[str, str] = os.environ) -> str | None:
    """What asks for tracing (``telemetry.enabled``, or the endpoint variable that is set); None when
    nothing does or ``OTEL_SDK_DISABLED=true`` (the SDK's own switch) turns it off."""
    if environ.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return None
    if section.enabled:
        return "telemetry.enabled"
    return next((name for name in ENDPOINT_VARIABLES if environ.get(name)), None)


def installed() -> bool:
    """Whether the ``otel`` extra is installed (found, not imported)."""
    try:
        return all(importlib.util.find_spec(name) is not None for name in _EXTRA_MODULES)
    except ModuleNotFoundError:  # a parent package is missing
        return False


def problems(section: TelemetrySection, environ: Mapping[str, str] = os.environ) -> list[str]:
    """Why a process asked to trace cannot: the extra is not installed."""
    why = wanted(section, environ)
    if why is None or installed():
        return []
    return [
        f"{why}: tracing needs the OpenTelemetry SDK and OTLP exporter, which are not installed: "
        f"{INSTALL} (or turn tracing off)"
    ]


def start(
    section: TelemetrySection, program: str, environ: Mapping[str, str] = os.environ
) -> ServerTracing | None:
    """The process's tracing, exporting from now on; None when not wanted (nothing is imported)."""
    if wanted(section, environ) is None:
        return None
    from cronoq.otel import ServerTracing

    return ServerTracing.start(section, program, environ)


async def traced(
    tracing: ServerTracing | None,
    call: tuple[str, str],
    serve: Callable[[TraceContext], Awaitable[Answer]],
    ids: Callable[[Answer], list[int]],
) -> Answer:
    """``serve`` a Submit or SubmitBatch (``call``: the method and its pool) with the caller's trace
    context. When the process traces, inside the call's span, whose context the tasks then carry, and a
    forwarded call passes on; ``ids`` names the tasks of the answer, for the span."""
    if tracing is None:
        return await serve(incoming.get())
    method, pool = call
    with tracing.submit(method, incoming.get(), pool) as (span, trace), incoming_trace(trace):
        answer = await serve(trace)
        tracing.submitted(span, ids(answer))
        return answer


__all__ = ["ENDPOINT_VARIABLES", "INSTALL", "installed", "problems", "start", "traced", "wanted"]
