"""Two shards behind a router on this machine: aggregate end-to-end throughput against one shard, and
what the router adds to a Submit. Memory stores, so that the numbers are about routing, not disks.

Issue #4's targets: aggregate throughput ≥ 1.6 times one shard's; router overhead per forwarded Submit
≤ 1 ms p50. Next to the overhead it prints what one raw grpc.aio forwarding hop adds (``proxy_floor``),
which no router on grpc.aio can go below. Beside each drain it prints the CPU its processes spent per
task and the rate the machine's cores allow at those costs: where one shard already keeps every core
busy, two shards on the same cores cannot go faster than that bound, whatever the router does.
"""

from __future__ import annotations

import asyncio
import json
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from cronoq.client import Client, task
from tests.integration.shardproc import ShardSpec, cluster_tables, new_cluster, router_process

from . import on_loop, proxy_floor
from .cpu import machine_busy_s, process_cpu_s, self_cpu_s
from .worker import start_worker

POOLS = {"a": "a1", "b": "b1"}
LIMITS = "[limits]\nmax_tasks_per_batch = 1000\nmax_pending_per_pool = 1000000\n"


def specs(pools: dict[str, str]) -> list[ShardSpec]:
    """One shard per entry of ``pools`` (shard name: its one pool), numbered from 1."""
    return [
        ShardSpec(name, number, (pool,), pool_options="max = 1024\nlease_ttl_s = 30")
        for number, (name, pool) in enumerate(pools.items(), start=1)
    ]


class Cluster:
    """Shard servers (a and b unless ``shards`` says otherwise) and a router, as processes in
    ``directory``."""

    def __init__(self, directory: Path, shards: list[ShardSpec] | None = None) -> None:
        shards = specs(POOLS) if shards is None else shards
        self.shards = new_cluster(directory, shards, extra={spec.name: LIMITS for spec in shards})
        endpoints = {name: f"http://127.0.0.1:{proc.grpc_port}" for name, proc in self.shards.items()}
        self.router = router_process(directory / "router", LIMITS + cluster_tables(shards, endpoints))

    def __enter__(self) -> Cluster:
        try:
            for proc in (*self.shards.values(), self.router):
                proc.start()
        except BaseException:  # stop those that started: no __exit__ follows a failed __enter__
            self.__exit__()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        for proc in (self.router, *self.shards.values()):
            proc.stop()


async def submit_latency(target: str, n: int) -> float:
    """Median seconds of a sequential Submit to pool a1 through ``target``."""
    async with Client(target) as client:
        for _ in range(50):  # warm the channel and the code paths
            await client.submit(None, pool="a1")
        samples = []
        for _ in range(n):
            began = time.perf_counter()
            await client.submit(None, pool="a1")
            samples.append(time.perf_counter() - began)
    return statistics.median(samples)


@dataclass(frozen=True, slots=True)
class Drain:
    """A drain's tasks, its wall time and the CPU seconds its processes spent meanwhile."""

    tasks: int
    elapsed_s: float
    shards_cpu_s: tuple[float, ...]  # each shard server's, in the cluster's order
    router_cpu_s: float
    workers_cpu_s: float
    producer_cpu_s: float
    machine_cpu_s: float  # every core's busy time, anyone's work on the machine included

    @property
    def tasks_per_s(self) -> float:
        return self.tasks / self.elapsed_s

    @property
    def servers_us(self) -> float:
        """CPU per task of the shard servers and the router, in microseconds."""
        return (sum(self.shards_cpu_s) + self.router_cpu_s) * 1e6 / self.tasks

    @property
    def workers_us(self) -> float:
        return self.workers_cpu_s * 1e6 / self.tasks

    @property
    def producer_us(self) -> float:
        return self.producer_cpu_s * 1e6 / self.tasks

    @property
    def cpu_bound(self) -> float:
        """The most tasks/s this machine's cores allow at these costs, however the work is spread."""
        return (os.cpu_count() or 1) * 1e6 / (self.servers_us + self.workers_us + self.producer_us)


async def drain(cluster: Cluster, target: str, pools: list[str], n: int, slots: int) -> Drain:
    """``n`` no-op tasks split over ``pools``, one worker per pool, all through ``target``."""
    per_pool = n // len(pools)
    servers = [proc.proc.pid for proc in (*cluster.shards.values(), cluster.router) if proc.proc is not None]
    workers = [start_worker(target, per_pool, slots, pool) for pool in pools]
    async with Client(target) as client:
        before = [process_cpu_s(pid) for pid in servers]
        producer_before, machine_before = self_cpu_s(), machine_busy_s()
        began = time.perf_counter()

        async def submit(pool: str) -> None:
            for i in range(0, per_pool, 1000):
                await client.submit_batch([task(None, pool=pool) for _ in range(min(1000, per_pool - i))])

        await asyncio.gather(*(submit(pool) for pool in pools))
        outs = await asyncio.gather(*(asyncio.to_thread(w.communicate) for w in workers))
        elapsed = time.perf_counter() - began
        producer_s, machine_s = self_cpu_s() - producer_before, machine_busy_s() - machine_before
        used = [process_cpu_s(pid) - began_s for pid, began_s in zip(servers, before, strict=True)]
    summaries = [json.loads(out.strip().splitlines()[-1]) for out, _ in outs]
    return Drain(
        tasks=sum(summary["handled"] for summary in summaries),
        elapsed_s=elapsed,
        shards_cpu_s=tuple(used[:-1]),
        router_cpu_s=used[-1],
        workers_cpu_s=sum(summary["cpu_s"] for summary in summaries),
        producer_cpu_s=producer_s,
        machine_cpu_s=machine_s,
    )


def run(tasks: int, slots: int) -> None:
    with tempfile.TemporaryDirectory() as tmp, Cluster(Path(tmp)) as cluster:
        direct = on_loop(submit_latency(cluster.shards["a"].target, 1000))
        routed = on_loop(submit_latency(cluster.router.target, 1000))
        print(
            f"router overhead per Submit: p50 {direct * 1e3:.2f} ms direct to the shard, "
            f"{routed * 1e3:.2f} ms through the router: +{(routed - direct) * 1e3:.2f} ms   target <= 1 ms",
            flush=True,
        )
        raw, proxied = proxy_floor.run()
        print(
            f"  transport floor of that overhead: a raw grpc.aio proxy hop adds +{(proxied - raw) * 1e3:.2f} ms "
            f"to a Submit ({raw * 1e3:.2f} ms direct, {proxied * 1e3:.2f} ms proxied; no routing or checks)",
            flush=True,
        )
        one = on_loop(drain(cluster, cluster.shards["a"].target, ["a1"], tasks // 2, slots))
        two = on_loop(drain(cluster, cluster.router.target, ["a1", "b1"], tasks, slots))
        print(
            f"sharded drain: one shard {one.tasks_per_s:,.0f} tasks/s ({tasks // 2:,} tasks, direct); two shards "
            f"through the router (workers redirected) {two.tasks_per_s:,.0f} tasks/s ({tasks:,} tasks): "
            f"{two.tasks_per_s / one.tasks_per_s:.2f}x   target >= 1.6x\n"
            f"{_cpu_figures('one shard', one)}\n{_cpu_figures('two shards', two)}: "
            f"{two.cpu_bound / one.tasks_per_s:.2f}x one shard's rate is the most these {os.cpu_count()} cores allow",
            flush=True,
        )


def _cpu_figures(name: str, d: Drain) -> str:
    return (
        f"  CPU per task, {name}: servers and router {d.servers_us:.0f} us, workers {d.workers_us:.0f} us, "
        f"producer {d.producer_us:.0f} us; {os.cpu_count()} cores allow at most {d.cpu_bound:,.0f} tasks/s"
    )
