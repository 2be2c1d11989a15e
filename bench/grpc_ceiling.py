"""The transport ceiling: raw grpc.aio bidi round trips/s with the Work stream's message shapes.

A server process writes Lease messages (at most ``window`` unanswered) and a client process answers each
with a Complete, with no scheduler on either side. cronoq's end-to-end drain cannot beat this number, so
``make bench`` prints it next to the drain to show how much of the gap is ours and how much is grpc.aio.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import grpc

from cronoq.v1 import cronoq_pb2 as pb
from cronoq.v1 import cronoq_pb2_grpc as pbg

from . import on_loop
from .cpu import process_cpu_s
from .rawgrpc import free_port, serve, spawn


class _Echo(pbg.WorkersServicer):
    def __init__(self, n: int, window: int) -> None:
        self.n = n
        self.window = window

    # grpc.aio serves a coroutine that writes through the context; the generated stub knows only iterators.
    async def Work(  # type: ignore[override]
        self, request_iterator: object, context: grpc.aio.ServicerContext
    ) -> None:
        credit = asyncio.Semaphore(self.window)

        async def read_all() -> None:
            for _ in range(self.n):
                await context.read()
                credit.release()

        reader = asyncio.create_task(read_all())
        lease = pb.ServerMessage(lease=pb.Lease(lease=1, task_id=1, attempt=1, pool="default"))
        for _ in range(self.n):
            await credit.acquire()
            await context.write(lease)
        await reader


async def _serve(port: int, n: int, window: int) -> None:
    await serve(port, lambda server: pbg.add_WorkersServicer_to_server(_Echo(n, window), server))


async def _client(port: int, n: int) -> float:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        call = pbg.WorkersStub(channel).Work()
        answers: asyncio.Queue[None] = asyncio.Queue()
        complete = pb.WorkerMessage(complete=pb.Complete(lease=1))

        async def write_all() -> None:
            for _ in range(n):
                await answers.get()
                await call.write(complete)

        writer = asyncio.create_task(write_all())
        start = time.perf_counter()
        for _ in range(n):
            await call.read()
            answers.put_nowait(None)
        await writer
        return n / (time.perf_counter() - start)


def run(n: int = 20_000, window: int = 64) -> tuple[float, float, float]:
    """Round trips per second between two processes on this machine, and the CPU microseconds the
    serving process and the client (this process) each spent per round trip: the price of the transport
    alone on each side, the floor under the server's and a worker's CPU per task."""
    port = free_port()
    server = spawn("bench.grpc_ceiling", "--serve", str(port), "--n", str(n), "--window", str(window))
    try:
        before, own_before = process_cpu_s(server.pid), time.process_time()
        rate = on_loop(_client(port, n))
        own = time.process_time() - own_before
        return rate, (process_cpu_s(server.pid) - before) / n * 1e6, own / n * 1e6
    finally:
        server.kill()
        server.wait()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--serve", type=int)
    p.add_argument("--n", type=int, default=20_000)
    p.add_argument("--window", type=int, default=64)
    args = p.parse_args()
    if args.serve:
        on_loop(_serve(args.serve, args.n, args.window))
    else:
        rate, server_us, client_us = run(args.n, args.window)
        print(
            f"{rate:,.0f} round trips/s, CPU per round trip: server {server_us:.0f} us, client {client_us:.0f} us"
        )
