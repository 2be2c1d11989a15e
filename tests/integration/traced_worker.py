"""A worker in its own process that traces as an application would: its own ``TracerProvider``, set as
the global one, exporting every span at once over OTLP/gRPC to ``OTEL_EXPORTER_OTLP_ENDPOINT``. The
handler starts a span of its own (``work``), fails the first attempt of a task whose payload is
``retry`` (retryable, at once) and succeeds otherwise. Prints ``registered`` once serving."""

from __future__ import annotations

import argparse
import asyncio

from opentelemetry import trace
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.sdk.resources import SERVICE_NAME, Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor

from cronoq.client import Lease, Worker
from cronoq.errors import Retryable


async def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--target", required=True)
    p.add_argument("--pool", required=True)
    args = p.parse_args()
    provider = TracerProvider(resource=Resource.create({SERVICE_NAME: "test-worker"}))
    provider.add_span_processor(SimpleSpanProcessor(OTLPSpanExporter()))
    trace.set_tracer_provider(provider)
    tracer = trace.get_tracer("test-worker")

    async def handler(lease: Lease) -> str:
        with tracer.start_as_current_span("work"):
            if lease.text() == "retry" and lease.attempt == 1:
                raise Retryable("first attempt fails", retry_after=0)
            return f"done {lease.attempt}"

    worker = Worker(args.target, args.pool, handler, name="traced-worker")
    task = asyncio.create_task(worker.run())
    await worker.wait_registered(30)
    print("registered", flush=True)
    try:
        await task
    finally:
        provider.shutdown()


if __name__ == "__main__":
    asyncio.run(main())
