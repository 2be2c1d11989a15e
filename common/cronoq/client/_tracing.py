"""OpenTelemetry in the SDK, when the application has it.

The SDK uses the OpenTelemetry *API* only (``opentelemetry-api``, which the ``otel`` extra brings), with
whatever tracer provider and propagators the application configured (``opentelemetry-instrument``,
or its own ``TracerProvider``; the standard ``OTEL_*`` variables apply there). Without the API installed
nothing is imported but once, on the first call that could carry a context, and nothing is done after.

- A producer's Submit and SubmitBatch carry the current context as ``traceparent``/``tracestate`` metadata
  (:func:`outgoing`); the server keeps it with the task.
- A worker runs each handler in a ``cronoq.handle`` span (kind CONSUMER), child of the context the lease's
  tags carry (:func:`handling`), so that the handler's own spans join the producer's trace.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from functools import cache
from time import monotonic
from types import ModuleType
from typing import TYPE_CHECKING

from cronoq.tracecontext import TRACEPARENT, TRACESTATE, TraceContext, trace_context

if TYPE_CHECKING:
    from cronoq.client._worker import Lease


@cache
def _api() -> tuple[ModuleType, ModuleType] | None:
    """The OpenTelemetry API's ``propagate`` and ``trace`` modules; None when not installed."""
    try:
        from opentelemetry import propagate, trace
    except ImportError:
        return None
    return propagate, trace


def outgoing() -> TraceContext:
    """The current context, as a Submit's metadata carries it (``()`` without one)."""
    api = _api()
    if api is None:
        return ()
    carrier: dict[str, str] = {}
    api[0].inject(carrier)
    return trace_context(carrier.get(TRACEPARENT), carrier.get(TRACESTATE))


class _ProviderCheck:
    """Whether the application has set a tracer provider, asked of the API at most once a second: the
    question itself (``get_tracer_provider`` looks at the environment each time) cost a no-op task's
    worker about 3 us, most of what tracing adds when it is off. A provider set while the worker
    runs is used from the next lease a second later; the API lets it be set only once."""

    __slots__ = ("asked_at", "set")

    def __init__(self) -> None:
        self.asked_at = -math.inf
        self.set = False

    def __call__(self, trace: ModuleType) -> bool:
        if self.set:
            return True
        now = monotonic()
        if now - self.asked_at >= 1.0:
            self.asked_at = now
            self.set = not isinstance(trace.get_tracer_provider(), trace.ProxyTracerProvider)
        return self.set


_provider_set = _ProviderCheck()


def handling(lease: Lease) -> AbstractContextManager[object]:
    """The span a handler runs in (current while it runs); nothing without the API, or while the
    application has set no tracer provider (the API's placeholder would make a span that records
    nothing, at a cost per lease: a fifth of a no-op task's worker CPU)."""
    api = _api()
    if api is None or not _provider_set(api[1]):
        return _NO_SPAN
    return _span(api, lease)


_NO_SPAN = nullcontext()  # reusable: it holds nothing


@contextmanager
def _span(api: tuple[ModuleType, ModuleType], lease: Lease) -> Iterator[object]:
    propagate, trace = api
    tracer = trace.get_tracer("cronoq")
    with tracer.start_as_current_span(
        "cronoq.handle",
        # Only the context's own tags: a producer's tag that another propagator reads (``baggage``) is not one.
        context=propagate.extract({k: v for k, v in lease.tags.items() if k in (TRACEPARENT, TRACESTATE)}),
        kind=trace.SpanKind.CONSUMER,
        attributes={
            "cronoq.task.id": lease.task_id,
            "cronoq.pool": lease.pool,
            "cronoq.attempt": lease.attempt,
            "cronoq.kind": lease.kind,
            "cronoq.lease": lease.id,
        },
    ) as span:
        yield span


__all__ = ["handling", "outgoing"]
