"""What a ``/metrics`` scrape costs a loaded server: ``python -m bench.scrape [--tasks N] [--workers W]``.

A memory-store server gets ``N`` queued tasks over ``--pools`` pools and ``W`` connected worker streams
(one slot each, every one holding a lease it never finishes), then is scraped ``--scrapes`` times in a
row. Printed: the median and the worst scrape and the page's size; and how long ``/healthz`` takes to
answer, asked again and again, on its own and while the scrapes run: the families are collected on the
server's event loop (they read the engine), so what a scrape takes from the loop shows there as the
probe's worst time. Nothing here asserts: the numbers are for people.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
import urllib.request
from pathlib import Path
from typing import Any

import aiohttp
import grpc

from cronoq.client import Client, task
from cronoq.engine import compiled
from cronoq.v1 import cronoq_pb2 as pb
from cronoq.v1 import cronoq_pb2_grpc as pbg
from tests.integration.serverproc import ServerProcess, running_server

from . import on_loop

BATCH = 1000


def config(pools: int) -> str:
    tables = "".join(f'[[pools]]\nname = "p{i}"\nmax = 100000\nlease_ttl_s = 3600\n\n' for i in range(pools))
    return (
        "[limits]\nmax_tasks_per_batch = 1000\nmax_pending_per_pool = 10000000\n"
        f"max_pending_total = 10000000\nmax_concurrent_streams = 100000\n\n{tables}"
    )


def scrapes(server: ServerProcess, n: int) -> tuple[list[float], int]:
    """Seconds of ``n`` ``/metrics`` pages asked one after the other, and the last page's size."""
    times, size = [], 0
    for _ in range(n):
        seconds, size = scrape(server)
        times.append(seconds)
    return times, size


async def probe(server: ServerProcess, done: asyncio.Future[Any]) -> list[float]:
    """Seconds of each ``/healthz`` answer, asked one after the other until ``done``."""
    times = []
    async with aiohttp.ClientSession() as http:
        while not done.done():
            t0 = time.perf_counter()
            async with http.get(f"{server.http}/healthz") as response:
                await response.read()
            times.append(time.perf_counter() - t0)
    return times


def ms(times: list[float]) -> str:
    return f"median {statistics.median(times) * 1e3:.2f} ms, worst {max(times) * 1e3:.2f} ms"


def scrape(server: ServerProcess) -> tuple[float, int]:
    """Seconds and bytes of one ``/metrics`` page."""
    t0 = time.perf_counter()
    with urllib.request.urlopen(f"{server.http}/metrics", timeout=60) as response:
        size = len(response.read())
    return time.perf_counter() - t0, size


async def load(
    server: ServerProcess, tasks: int, workers: int, pools: int
) -> list[grpc.aio.StreamStreamCall]:
    """Queue ``tasks`` and connect ``workers`` one-slot streams, spread over the pools; the streams are
    returned open (each got a lease it keeps)."""
    async with Client(server.target) as client:
        for start in range(0, tasks, BATCH):
            count = min(BATCH, tasks - start)
            await client.submit_batch([task(b"", pool=f"p{(start + i) % pools}") for i in range(count)])
    channel = grpc.aio.insecure_channel(server.target)
    stub = pbg.WorkersStub(channel)
    streams = []
    for i in range(workers):
        call = stub.Work()
        await call.write(pb.WorkerMessage(register=pb.Register(pool=f"p{i % pools}", slots=1)))
        streams.append(call)
    for call in streams:  # its first message from the server: registered (and then given a lease)
        await call.read()
    return streams


async def measure(tasks: int, workers: int, pools: int, n: int) -> None:
    with tempfile.TemporaryDirectory() as directory, running_server(Path(directory), config(pools)) as server:
        t0 = time.perf_counter()
        streams = await load(server, tasks, workers, pools)
        print(
            f"loaded {tasks:,} tasks and {workers} busy workers over {pools} pools in {time.perf_counter() - t0:.1f} s"
        )
        alone = asyncio.get_running_loop().create_future()
        asyncio.get_running_loop().call_later(2.0, alone.set_result, None)
        quiet = await probe(server, alone)
        scraping = asyncio.ensure_future(asyncio.to_thread(scrapes, server, n))
        busy = await probe(server, scraping)
        times, size = await scraping
        print(f"/metrics: {ms(times)} over {n} scrapes; {size:,} bytes (engine compiled: {compiled()})")
        print(f"/healthz alone: {ms(quiet)}; while scraping: {ms(busy)}")
        for call in streams:
            call.cancel()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=100_000)
    parser.add_argument("--workers", type=int, default=500)
    parser.add_argument("--pools", type=int, default=10)
    parser.add_argument("--scrapes", type=int, default=50)
    args = parser.parse_args()
    on_loop(measure(args.tasks, args.workers, args.pools, args.scrapes))


if __name__ == "__main__":
    main()
