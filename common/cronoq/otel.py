"""A tracing server's spans, with OpenTelemetry (the ``otel`` extra; imported only by :mod:`cronoq.telemetry`).

A task's trace, as docs/operations.md (Tracing) draws it::

    producer's span                              (the SDK's caller; traceparent in the Submit's metadata)
    └─ cronoq.v1.Tasks/Submit      SERVER        one per Submit or SubmitBatch; stored as the task's context
       ├─ cronoq.attempt           PRODUCER      one per lease, from dispatch to the attempt's outcome;
       │  │                                      its context is the lease's traceparent
       │  └─ the worker's handler  CONSUMER      (the worker SDK)
       └─ cronoq.outcome           INTERNAL      the task's final status, when it gets one

A retry is an event (``cronoq.retry``) of the attempt that failed. Spans carry ``cronoq.task.id``,
``cronoq.pool`` and, per attempt, ``cronoq.attempt``. Only the text of a context crosses processes
(:mod:`cronoq.tracecontext`): the stored task, the lease and the metadata carry ``traceparent`` and
``tracestate``, which this module turns into OpenTelemetry contexts and back with the W3C propagator.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager

from opentelemetry.context import Context
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor
from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
from opentelemetry.trace import Span, SpanKind, Status, StatusCode, set_span_in_context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

from cronoq.config.model import TelemetrySection
from cronoq.engine.model import Dispatch, StatusChange
from cronoq.engine.model import Status as TaskStatus
from cronoq.errors import ApiError
from cronoq.tracecontext import TraceContext, trace_context

TASK_ID = "cronoq.task.id"
POOL = "cronoq.pool"
ATTEMPT = "cronoq.attempt"
STATUS = "cronoq.status"
_W3C = TraceContextTextMapPropagator()
_FAILED = frozenset({TaskStatus.FAILED, TaskStatus.DEAD_LETTERED, TaskStatus.RETRYING})


def parent(context: TraceContext | Mapping[str, str]) -> Context:
    """The OpenTelemetry context of a carried trace context (an empty one when it has none)."""
    return _W3C.extract(dict(context))


def carried(span: Span) -> TraceContext:
    """A span's context as text to carry (``()`` for a span that is not sampled in a way that
    propagates: an invalid context)."""
    carrier: dict[str, str] = {}
    _W3C.inject(carrier, set_span_in_context(span))
    return trace_context(carrier.get("traceparent"), carrier.get("tracestate"))


class ServerTracing:
    """The spans of a server (or router): one tracer, and the attempt spans open now."""

    def __init__(self, provider: TracerProvider) -> None:
        self.provider = provider
        self.tracer = provider.get_tracer("cronoq")
        self._attempts: dict[int, Span] = {}  # task id -> its attempt's span, from dispatch to outcome

    @classmethod
    def start(cls, section: TelemetrySection, program: str, environ: Mapping[str, str]) -> ServerTracing:
        """Export over OTLP/gRPC in a background thread (batched); what the section leaves out is the
        SDK's to read from ``OTEL_*`` variables."""
        service = section.service_name or environ.get("OTEL_SERVICE_NAME") or program
        sampler = (
            None if section.sample_ratio is None else ParentBased(TraceIdRatioBased(section.sample_ratio))
        )
        provider = TracerProvider(sampler=sampler, resource=Resource.create({SERVICE_NAME: service}))
        provider.add_span_processor(BatchSpanProcessor(OTLPSpanExporter(endpoint=section.endpoint)))
        return cls(provider)

    def shutdown(self) -> None:
        """End the open attempt spans and export what is left (blocks up to the exporter's timeout)."""
        self.abandon("the server stopped")
        self.provider.shutdown()

    @contextmanager
    def submit(self, method: str, context: TraceContext, pool: str) -> Iterator[tuple[Span, TraceContext]]:
        """The span of a Submit (``method``) while it is served, child of the caller's context, and its
        own context, which the tasks it submits carry. An error the call answers marks it failed."""
        with self.tracer.start_as_current_span(
            f"cronoq.v1.Tasks/{method}",
            context=parent(context),
            kind=SpanKind.SERVER,
            attributes={
                POOL: pool,
                "rpc.system": "grpc",
                "rpc.service": "cronoq.v1.Tasks",
                "rpc.method": method,
            },
            record_exception=False,
            set_status_on_exception=False,
        ) as span:
            try:
                yield span, carried(span) or context
            except ApiError as err:
                span.set_status(Status(StatusCode.ERROR, f"{err.code}: {err.message}"))
                raise

    @staticmethod
    def submitted(span: Span, ids: Sequence[int]) -> None:
        """Name the tasks a Submit (``cronoq.task.id``) or SubmitBatch (``cronoq.task.ids``) made."""
        if len(ids) == 1:
            span.set_attribute(TASK_ID, ids[0])
        else:
            span.set_attribute("cronoq.task.ids", list(ids))

    def attempt(self, action: Dispatch) -> dict[str, str]:
        """Open the span of an attempt as its lease goes out; the lease's tags, with its context."""
        task = action.task
        spec = task.spec
        span = self.tracer.start_span(
            "cronoq.attempt",
            context=parent(spec.tags),
            kind=SpanKind.PRODUCER,
            attributes={
                TASK_ID: task.id,
                POOL: spec.pool,
                ATTEMPT: action.attempt,
                "cronoq.kind": spec.kind,
                "cronoq.lease": action.lease,
                "cronoq.worker.id": action.worker_id,
            },
        )
        previous = self._attempts.pop(task.id, None)
        if previous is not None:  # its outcome never came through (not expected)
            previous.end()
        self._attempts[task.id] = span
        own = carried(span)
        return {**spec.tags, **dict(own)} if own else spec.tags

    def changed(self, event: StatusChange) -> None:
        """A task's status changed: end its attempt's span (a retry is an event of it), and record a
        final status as the task's outcome."""
        status, attempt, _, message, task = event
        if status is TaskStatus.RUNNING:
            return
        span = self._attempts.pop(task.id, None)
        if span is not None:
            span.set_attribute(STATUS, status.label)
            if status is TaskStatus.RETRYING:
                span.add_event("cronoq.retry", {ATTEMPT: attempt, "cronoq.message": message})
            if status in _FAILED:
                span.set_status(Status(StatusCode.ERROR, message or status.label))
            span.end()
        if status.terminal:
            outcome = self.tracer.start_span(
                "cronoq.outcome",
                context=parent(task.spec.tags),
                attributes={TASK_ID: task.id, POOL: task.spec.pool, ATTEMPT: attempt, STATUS: status.label},
            )
            if status in _FAILED:
                outcome.set_status(Status(StatusCode.ERROR, message or status.label))
            outcome.end()

    def abandon(self, reason: str) -> None:
        """End every open attempt span: this server no longer leads (their outcomes are the next
        leader's to record)."""
        attempts, self._attempts = self._attempts, {}
        for span in attempts.values():
            span.add_event("cronoq.abandoned", {"cronoq.message": reason})
            span.end()


__all__ = ["ServerTracing", "carried", "parent"]
