"""The transport's latency floor: raw grpc.aio submit→start with the shapes of cronoq's own path.

A producer process makes a unary Submit call to a server process, which writes the task's payload as a
Lease on the Work stream of a worker process, all at a steady rate and with no scheduler, store or
checks anywhere. The worker records the time from just before the Submit to the Lease's arrival, as the
end-to-end latency benchmark does, so ``make bench`` can print what grpc.aio alone costs next to it.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import grpc

from cronoq.v1 import cronoq_pb2 as pb
from cronoq.v1 import cronoq_pb2_grpc as pbg

from . import on_loop
from .rawgrpc import free_port, serve, spawn


class _Relay(pbg.TasksServicer, pbg.WorkersServicer):
    """Every submitted payload goes out at once on the (one) Work stream."""

    def __init__(self) -> None:
        self.payloads: asyncio.Queue[bytes] = asyncio.Queue()

    async def Submit(self, request: pb.SubmitRequest, context: grpc.aio.ServicerContext) -> pb.SubmitResponse:
        self.payloads.put_nowait(request.task.payload)
        return pb.SubmitResponse(id=1)

    # grpc.aio serves a coroutine that writes through the context; the generated stub knows only iterators.
    async def Work(  # type: ignore[override]
        self, request_iterator: object, context: grpc.aio.ServicerContext
    ) -> None:
        while True:
            payload = await self.payloads.get()
            lease = pb.Lease(lease=1, task_id=1, attempt=1, pool="default", payload=payload)
            await context.write(pb.ServerMessage(lease=lease))


async def _serve(port: int) -> None:
    # The generated base class answers the methods not written here UNIMPLEMENTED; its stub calls them abstract.
    relay = _Relay()  # type: ignore[abstract]

    def register(server: grpc.aio.Server) -> None:
        pbg.add_TasksServicer_to_server(relay, server)
        pbg.add_WorkersServicer_to_server(relay, server)

    await serve(port, register)


async def _work(port: int, n: int) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = pbg.WorkersStub(channel).Work()
        await channel.channel_ready()
        print("ready", flush=True)
        latencies = []
        for _ in range(n):
            message = await call.read()
            latencies.append((time.time_ns() - int(message.lease.payload)) / 1e9)
        print(json.dumps(latencies), flush=True)


async def _produce(port: int, n: int, rate: float) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pbg.TasksStub(channel)
        start = time.perf_counter()
        for i in range(n):
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            await stub.Submit(pb.SubmitRequest(task=pb.TaskSpec(payload=str(time.time_ns()).encode())))


def run(rate: float = 200.0, seconds: float = 10.0) -> list[float]:
    """Submit→start latencies in seconds, one per task, at ``rate`` tasks/s for ``seconds``."""
    n = int(rate * seconds)
    port = free_port()
    server = spawn("bench.latency_floor", "--serve", str(port))
    try:
        worker = spawn("bench.latency_floor", "--work", str(port), "--n", str(n))
        try:
            on_loop(_produce(port, n, rate))
            out, _ = worker.communicate(timeout=60)
        finally:
            worker.kill()
        latencies: list[float] = json.loads(out.strip().splitlines()[-1])
        return latencies
    finally:
        server.kill()
        server.wait()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--serve", type=int)
    p.add_argument("--work", type=int)
    p.add_argument("--n", type=int, default=2000)
    p.add_argument("--rate", type=float, default=200.0)
    args = p.parse_args()
    if args.serve:
        on_loop(_serve(args.serve))
    elif args.work:
        on_loop(_work(args.work, args.n))
    else:
        ordered = sorted(run(args.rate, args.n / args.rate))
        p50, p99 = ordered[len(ordered) // 2], ordered[int(0.99 * len(ordered))]
        print(f"raw grpc.aio submit->start: p50 {p50 * 1e3:.2f} ms, p99 {p99 * 1e3:.2f} ms")
