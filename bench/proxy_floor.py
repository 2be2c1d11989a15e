"""The router's floor: what one raw grpc.aio forwarding hop adds to a unary Submit.

An echo server process answers Submit at once; a proxy process answers Submit by making the same call
to the echo server over one kept channel, as the router forwards to a shard, with no routing, checks or
engine anywhere. A client times sequential Submits straight to the echo server and through the proxy.
The difference is what grpc.aio alone costs per forwarded call, which ``make bench`` prints next to the
router's own overhead (issue #4 asks for at most 1 ms).
"""

from __future__ import annotations

import argparse
import statistics
import time

import grpc

from cronoq.v1 import cronoq_pb2 as pb
from cronoq.v1 import cronoq_pb2_grpc as pbg

from . import on_loop
from .rawgrpc import free_port, serve, spawn


class _Echo(pbg.TasksServicer):
    async def Submit(self, request: pb.SubmitRequest, context: grpc.aio.ServicerContext) -> pb.SubmitResponse:
        return pb.SubmitResponse(id=1)


class _Proxy(pbg.TasksServicer):
    """Forwards every Submit to the echo server on ``port`` (its channel opened on first use, in the
    serving loop)."""

    def __init__(self, port: int) -> None:
        self.port = port
        self.stub: pbg.TasksStub | None = None

    async def Submit(self, request: pb.SubmitRequest, context: grpc.aio.ServicerContext) -> pb.SubmitResponse:
        if self.stub is None:
            self.stub = pbg.TasksStub(grpc.aio.insecure_channel(f"127.0.0.1:{self.port}"))
        answer: pb.SubmitResponse = await self.stub.Submit(request, timeout=10.0)
        return answer


async def _median_submit_s(port: int, n: int) -> float:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
        stub = pbg.TasksStub(channel)
        request = pb.SubmitRequest(task=pb.TaskSpec(pool="a1"))
        for _ in range(50):  # warm the channels and the code paths
            await stub.Submit(request)
        samples = []
        for _ in range(n):
            began = time.perf_counter()
            await stub.Submit(request)
            samples.append(time.perf_counter() - began)
    return statistics.median(samples)


def run(n: int = 1000) -> tuple[float, float]:
    """Median seconds of a Submit straight to the echo server, and through the proxy."""
    echo_port, proxy_port = free_port(), free_port()
    procs = [spawn("bench.proxy_floor", "--echo", str(echo_port))]
    try:
        procs.append(spawn("bench.proxy_floor", "--proxy", str(proxy_port), str(echo_port)))
        return on_loop(_median_submit_s(echo_port, n)), on_loop(_median_submit_s(proxy_port, n))
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


if __name__ == "__main__":
    p = argparse.ArgumentParser()
    p.add_argument("--echo", type=int)
    p.add_argument("--proxy", type=int, nargs=2, metavar=("PORT", "ECHO_PORT"))
    args = p.parse_args()
    # The generated base class answers the methods not written here UNIMPLEMENTED; its stub calls them abstract.
    if args.echo:
        echo = _Echo()  # type: ignore[abstract]
        on_loop(serve(args.echo, lambda server: pbg.add_TasksServicer_to_server(echo, server)))
    elif args.proxy:
        port, echo_port = args.proxy
        proxy = _Proxy(echo_port)  # type: ignore[abstract]
        on_loop(serve(port, lambda server: pbg.add_TasksServicer_to_server(proxy, server)))
    else:
        direct, proxied = run()
        print(f"raw grpc.aio Submit: {direct * 1e3:.2f} ms direct, {proxied * 1e3:.2f} ms through a proxy")
