"""Traces across real processes: a producer here, a ``cronoq-router`` in front of two shard servers, and a
worker process, every one exporting its spans over OTLP/gRPC to a receiver running in this test. The
producer's trace must run unbroken through the router's and the shard's Submit spans, each attempt, and
the worker's handler span, with the right parents (docs/operations.md, Tracing)."""

from __future__ import annotations

import asyncio
import contextlib
import subprocess
import sys
from collections.abc import AsyncIterator, Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import grpc
import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.trace.v1 import trace_pb2
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import BatchSpanProcessor

from cronoq.client import Client

from .shardproc import ShardSpec, routed_cluster

pytestmark = pytest.mark.asyncio

SPECS = [
    ShardSpec("a", 1, ("a1",)),
    # Retries at once, so that the retried task's second attempt comes without a backoff to wait out.
    ShardSpec("b", 2, ("b1",), pool_options="retry = { initial_backoff_s = 0.0, jitter = false }"),
]
WAIT_S = 20.0


@dataclass(frozen=True, slots=True)
class Received:
    """One exported span, with the service that sent it."""

    service: str
    span: trace_pb2.Span

    @property
    def attributes(self) -> dict[str, object]:
        out: dict[str, object] = {}
        for kv in self.span.attributes:
            value = kv.value
            out[kv.key] = getattr(value, value.WhichOneof("value") or "string_value")
        return out


class Receiver(trace_service_pb2_grpc.TraceServiceServicer):
    """An OTLP/gRPC trace receiver (the collector's TraceService.Export), keeping what it is sent."""

    def __init__(self) -> None:
        self.spans: list[Received] = []
        self.arrived = asyncio.Event()

    async def Export(
        self, request: trace_service_pb2.ExportTraceServiceRequest, context: object
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        for resource_spans in request.resource_spans:
            service = next(
                (a.value.string_value for a in resource_spans.resource.attributes if a.key == SERVICE_NAME),
                "",
            )
            for scope in resource_spans.scope_spans:
                self.spans.extend(Received(service, span) for span in scope.spans)
        self.arrived.set()
        return trace_service_pb2.ExportTraceServiceResponse()

    async def until(
        self, found: Sequence[tuple[str, str]], trace_id: bytes
    ) -> dict[tuple[str, str], list[Received]]:
        """Wait (bounded) until spans of every (service, name) of ``found`` arrived in ``trace_id``, as
        many of each as ``found`` names it."""

        def missing() -> list[tuple[str, str]]:
            got = self.by_name(trace_id)
            return [key for key in set(found) if len(got.get(key, ())) < found.count(key)]

        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(WAIT_S):
                while missing():
                    self.arrived.clear()
                    await self.arrived.wait()
        got = self.by_name(trace_id)
        everything = sorted((r.service, r.span.name, r.span.trace_id.hex()) for r in self.spans)
        assert not missing(), f"not received in {WAIT_S} s: {missing}; received: {everything}"
        return got

    def by_name(self, trace_id: bytes) -> dict[tuple[str, str], list[Received]]:
        out: dict[tuple[str, str], list[Received]] = {}
        for r in self.spans:
            if r.span.trace_id == trace_id:
                out.setdefault((r.service, r.span.name), []).append(r)
        return out


@contextlib.asynccontextmanager
async def receiver() -> AsyncIterator[tuple[Receiver, str]]:
    server = grpc.aio.server()
    found = Receiver()
    trace_service_pb2_grpc.add_TraceServiceServicer_to_server(found, server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield found, f"http://127.0.0.1:{port}"
    finally:
        await server.stop(None)


@contextlib.contextmanager
def traced_worker(target: str, pool: str, endpoint: str, log: Path) -> Iterator[None]:
    """tests/integration/traced_worker.py in its own process, registered."""
    with log.open("wb") as errors:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tests.integration.traced_worker", "--target", target, "--pool", pool],
            stdout=subprocess.PIPE,
            stderr=errors,
            env={"OTEL_EXPORTER_OTLP_ENDPOINT": endpoint, "PATH": "/usr/bin:/bin"},
        )
    try:
        assert proc.stdout is not None
        line = proc.stdout.readline()  # bounded by the worker's own 30 s registration timeout
        assert line == b"registered\n", log.read_text()
        yield
    finally:
        proc.terminate()
        proc.wait(10)


def producer(endpoint: str) -> TracerProvider:
    """The test's own tracing, exporting from a thread of its own (the receiver runs on this loop, which
    an export made on it would block)."""
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: "test-producer"}))
    exporter = OTLPSpanExporter(endpoint=endpoint, insecure=True)
    provider.add_span_processor(BatchSpanProcessor(exporter, schedule_delay_millis=50))
    return provider


def child_of(span: Received, parent: Received) -> bool:
    return span.span.parent_span_id == parent.span.span_id and span.span.trace_id == parent.span.trace_id


async def test_one_trace_from_producer_through_router_and_shard_to_worker(tmp_path: Path) -> None:
    async with receiver() as (spans, endpoint):
        shared = f'[telemetry]\nenabled = true\nendpoint = "{endpoint}"\n'
        env = {"OTEL_BSP_SCHEDULE_DELAY": "50"}  # the servers export every 50 ms
        provider = producer(endpoint)
        tracer = provider.get_tracer("test")
        with (
            routed_cluster(tmp_path, SPECS, shared, env) as (router, _),
            traced_worker(router.target, "b1", endpoint, tmp_path / "worker.log"),
        ):
            async with Client(router.target) as client:
                with tracer.start_as_current_span("produce") as produce:
                    done = await client.submit(b"retry", pool="b1", wait=True, wait_timeout=WAIT_S)
            assert done.result is not None and done.result.text() == "done 2"
            trace_id = produce.get_span_context().trace_id.to_bytes(16, "big")
            got = await spans.until(
                [
                    ("test-producer", "produce"),
                    ("cronoq-router", "cronoq.v1.Tasks/Submit"),
                    ("cronoq-server", "cronoq.v1.Tasks/Submit"),
                    ("cronoq-server", "cronoq.outcome"),
                    *[("cronoq-server", "cronoq.attempt")] * 2,
                    *[("test-worker", "cronoq.handle")] * 2,
                    *[("test-worker", "work")] * 2,
                ],
                trace_id,
            )
            [produced] = got[("test-producer", "produce")]
            [routed] = got[("cronoq-router", "cronoq.v1.Tasks/Submit")]
            [submitted] = got[("cronoq-server", "cronoq.v1.Tasks/Submit")]
            assert child_of(routed, produced) and routed.span.kind == trace_pb2.Span.SPAN_KIND_SERVER
            assert child_of(submitted, routed) and submitted.span.kind == trace_pb2.Span.SPAN_KIND_SERVER
            assert submitted.attributes["cronoq.task.id"] == done.id
            assert submitted.attributes["cronoq.pool"] == "b1"

            attempts = sorted(
                got[("cronoq-server", "cronoq.attempt")], key=lambda r: str(r.attributes["cronoq.attempt"])
            )
            assert [a.attributes["cronoq.attempt"] for a in attempts] == [1, 2]
            for attempt in attempts:
                assert child_of(attempt, submitted)
                assert attempt.span.kind == trace_pb2.Span.SPAN_KIND_PRODUCER
                assert attempt.attributes["cronoq.task.id"] == done.id
                assert attempt.attributes["cronoq.pool"] == "b1"
            first, second = attempts
            assert [e.name for e in first.span.events] == ["cronoq.retry"]
            assert first.span.status.code == trace_pb2.Status.STATUS_CODE_ERROR
            assert first.attributes["cronoq.status"] == "retrying"
            assert second.attributes["cronoq.status"] == "succeeded"

            handled = got[("test-worker", "cronoq.handle")]
            assert len(handled) == 2
            for handle in handled:
                [attempt] = [a for a in attempts if child_of(handle, a)]
                assert handle.span.kind == trace_pb2.Span.SPAN_KIND_CONSUMER
                assert handle.attributes["cronoq.attempt"] == attempt.attributes["cronoq.attempt"]
                assert handle.attributes["cronoq.task.id"] == done.id
            assert all(any(child_of(w, h) for h in handled) for w in got[("test-worker", "work")])

            [outcome] = got[("cronoq-server", "cronoq.outcome")]
            assert child_of(outcome, submitted) and outcome.attributes["cronoq.status"] == "succeeded"

            # Over HTTP: the traceparent header is the Submit's parent, at the router and on to the shard.
            header = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
            async with (
                aiohttp.ClientSession() as http,
                http.post(
                    f"{router.http}/v1/tasks", json={"pool": "a1"}, headers={"traceparent": header}
                ) as r,
            ):
                assert r.status == 200, await r.text()
            http_trace = bytes.fromhex("0af7651916cd43dd8448eb211c80319c")
            got = await spans.until(
                [("cronoq-router", "cronoq.v1.Tasks/Submit"), ("cronoq-server", "cronoq.v1.Tasks/Submit")],
                http_trace,
            )
            [routed] = got[("cronoq-router", "cronoq.v1.Tasks/Submit")]
            [submitted] = got[("cronoq-server", "cronoq.v1.Tasks/Submit")]
            assert routed.span.parent_span_id == bytes.fromhex("b7ad6b7169203331")
            assert child_of(submitted, routed)
        provider.shutdown()
