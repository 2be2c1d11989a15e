"""``make bench``: end-to-end drain, submit→start latency and engine decisions/s, numbers printed.

Targets on the 2-core reference machine: ≥ 5,000 tasks/s end to end, p99 ≤ 2 ms at a steady 200 tasks/s,
library mode (in-process ``cronoq.Scheduler``) ≥ 12,600 tasks/s,
engine ≥ 250,000 decisions/s on the core run (issue #2, memory store; the same run with every feature on is
printed beside it); the same drain with durable stores (fsync on):
≥ 4,000 tasks/s with SQLite and ≥ 6,500 with Postgres (issue #3), with group-commit batch sizes and
commit latency percentiles read from the server's ``/metrics``. A lone Submit's acknowledgement, on
the memory store and on Postgres (issue #25: p50 <= 1.5 ms on Postgres, ``bench.lone_submit``). Simulated
scale-out (issue #25): 1, 2 and 3 shards, each server under the same CPU quota, ≥ 1.8 and ≥ 2.6 times one shard's drain
(``bench.scaleout``). pgqueuer, the plain Postgres job queue, drained and timed on the same Postgres in the same
run (``bench.pgqueuer_drain``, part ``pgqueuer``), and cronoq's drains over its rate against issue #25's
targets: the memory store ≥ twice its rate, Postgres ≥ its rate (aiming for 1.5 times). Nothing here
asserts: the numbers are for people.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import json
import os
import re
import subprocess
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

from cronoq.client import Client, task
from cronoq.engine import compiled
from tests.integration.serverproc import ServerProcess, running_server

from . import (
    LOOP,
    engine_bench,
    failover,
    grpc_ceiling,
    latency_floor,
    library,
    local_port,
    lone_submit,
    on_loop,
    percentile,
    pgqueuer_drain,
    postgres_or_skip,
    scaleout,
    sdk_workers,
    sharding,
)
from .cpu import cost_line, postgres_cpu_s, process_cpu_s, self_cpu_s
from .worker import start_worker

if TYPE_CHECKING:
    from tests.postgres import PostgresServer

POOL_CONFIG = """
[limits]
max_tasks_per_batch = 1000
max_pending_per_pool = 1000000
max_pending_total = 1000000

[[pools]]
name = "default"
max = 1024
lease_ttl_s = 30
"""


PARTS = ("library", "memory", "sdks", "shards", "scaleout", "sqlite", "postgres", "pgqueuer")


async def drain(
    server: ServerProcess,
    n: int,
    slots: int,
    *,
    database_port: int | None = None,
    launch: Callable[[str, int, int], subprocess.Popen[str]] = start_worker,
) -> dict[str, float]:
    """Tasks/s end to end, and the CPU each process spent per task: on a machine whose cores are all
    busy, cores / (CPU per task) bounds the rate whatever the scheduling does. ``database_port``: the
    local Postgres server the store uses, whose CPU is counted too. ``launch`` starts the worker process
    (target, tasks, slots), registered, printing the summary bench/worker.py prints: by default the
    Python SDK's on BatchedWorkers.Work (``bench.sdk_workers`` passes the other SDKs' and streams)."""
    assert server.proc is not None

    def database_s() -> float:
        return 0.0 if database_port is None else postgres_cpu_s(database_port)

    cpu = (process_cpu_s(server.proc.pid), self_cpu_s(), database_s())
    worker = launch(server.target, n, slots)
    async with Client(server.target) as client:
        start = time.perf_counter()
        batch = 1000
        for i in range(0, n, batch):
            await client.submit_batch([task(None) for _ in range(min(batch, n - i))])
        submitted = time.perf_counter()
        out, _ = await asyncio.to_thread(worker.communicate)
        end = time.perf_counter()
    summary = json.loads(out.strip().splitlines()[-1])
    handled = summary["handled"]
    server_s = process_cpu_s(server.proc.pid) - cpu[0]
    worker_s = summary["cpu_s"]  # from registering to the last task: its start-up is not the drain's
    producer_s = self_cpu_s() - cpu[1]
    database = database_s() - cpu[2]
    return {
        "tasks": handled,
        "submit_s": submitted - start,
        "total_s": end - start,
        "tasks_per_s": handled / (end - start),
        "server_us": server_s / handled * 1e6,
        "worker_us": worker_s / handled * 1e6,
        "producer_us": producer_s / handled * 1e6,
        "database_us": database / handled * 1e6,
    }


def cpu_figures(d: dict[str, float]) -> str:
    names = {
        "server_us": "server",
        "worker_us": "worker",
        "producer_us": "producer",
        "database_us": "Postgres",
    }
    return cost_line("task", {name: d[key] for key, name in names.items()})


async def latency(target: str, rate: float, seconds: float) -> dict[str, float]:
    n = int(rate * seconds)
    worker = start_worker(target, n, 64)
    async with Client(target) as client:
        interval = 1.0 / rate
        t0 = time.perf_counter()
        for i in range(n):
            delay = t0 + i * interval - time.perf_counter()
            if delay > 0:
                await asyncio.sleep(delay)
            await client.submit(str(time.time_ns()).encode())
        out, _ = await asyncio.to_thread(worker.communicate)
    lat = json.loads(out.strip().splitlines()[-1])["latencies"]
    return {
        "tasks": len(lat),
        "p50_ms": percentile(lat, 0.50) * 1e3,
        "p99_ms": percentile(lat, 0.99) * 1e3,
        "max_ms": max(lat) * 1e3,
    }


def commit_figures(server: ServerProcess) -> str:
    """Group-commit figures from the server's /metrics: commits, mean batch, latency quantiles."""
    with urllib.request.urlopen(f"{server.http}/metrics", timeout=5) as response:
        text = response.read().decode()

    def value(pattern: str) -> float:
        match = re.search(pattern + r" ([0-9.e+-]+|NaN)", text)
        return float(match.group(1)) if match else float("nan")

    commits = value("cronoq_store_commits_total")
    rows = value("cronoq_store_committed_tasks_total")
    quantiles = [
        value(f'cronoq_store_commit_seconds{{quantile="{q}"}}') * 1e3 for q in ("0.5", "0.9", "0.99")
    ]
    return (
        f"{commits:,.0f} commits, {rows / commits if commits else 0:,.0f} task rows per commit on average; "
        f"commit latency p50 {quantiles[0]:.2f} ms, p90 {quantiles[1]:.2f} ms, p99 {quantiles[2]:.2f} ms "
        "(last 4096 commits)"
    )


def durable_drain(
    name: str,
    store: str,
    tasks: int,
    slots: int,
    target_rate: int,
    env: dict[str, str],
    database_port: int | None = None,
) -> float:
    """Print the drain through a server on ``store``; its tasks/s."""
    with tempfile.TemporaryDirectory() as tmp:
        body = POOL_CONFIG + store.replace("{tmp}", tmp)
        with running_server(Path(tmp), body, env=env) as server:
            d = on_loop(drain(server, tasks, slots, database_port=database_port))
            print(
                f"end-to-end drain, {name} store (fsync on): {d['tasks']:,.0f} tasks: {d['tasks_per_s']:,.0f} tasks/s "
                f"(submit {d['submit_s']:.2f} s, total {d['total_s']:.2f} s)   target >= {target_rate:,}\n"
                f"{cpu_figures(d)}\n"
                f"  group commit: {commit_figures(server)}",
                flush=True,
            )
            return d["tasks_per_s"]


def main() -> None:
    p = argparse.ArgumentParser(
        prog="python -m bench", description="What `make bench` runs (with every part, and these defaults)."
    )
    p.add_argument(
        "--tasks", type=int, default=20_000, help="tasks in each drain, pgqueuer's too (default: %(default)s)"
    )
    p.add_argument("--slots", type=int, default=64, help="the drain worker's slots (default: %(default)s)")
    p.add_argument(
        "--rate",
        type=float,
        default=200.0,
        help="tasks/s of the latency runs, pgqueuer's too (default: %(default)s)",
    )
    p.add_argument(
        "--seconds", type=float, default=10.0, help="length of the latency runs (default: %(default)s)"
    )
    p.add_argument(
        "--engine-tasks", type=int, default=100_000, help="tasks of the engine run (default: %(default)s)"
    )
    p.add_argument(
        "--library-tasks",
        type=int,
        default=50_000,
        help="tasks of the library-mode run (default: %(default)s)",
    )
    p.add_argument(
        "--failovers", type=int, default=5, help="failover rounds on Postgres (default: %(default)s)"
    )
    p.add_argument(
        "--stores",
        default=",".join(PARTS),
        help="comma-separated parts: library (in-process mode), memory (engine, transport, drain, latency), "
        "sdks (the drain served by each SDK's worker: Python, TypeScript, Go), "
        "shards (two shards and a router), scaleout (1, 2 and 3 shards, each under the same CPU quota), "
        "sqlite and postgres (durable drains; postgres also failover), pgqueuer (the plain Postgres job "
        "queue on the same Postgres, for the comparison issue #25 asks for) (default: all)",
    )
    args = p.parse_args()
    stores = set(args.stores.split(","))
    if stores - set(PARTS):
        p.error(
            f"--stores: unknown part(s) {', '.join(sorted(stores - set(PARTS)))}; choose from {', '.join(PARTS)}"
        )
    print(
        f"event loop: {LOOP.name} (CRONOQ_EVENT_LOOP={os.environ.get('CRONOQ_EVENT_LOOP') or 'auto'}); "
        f"engine: {'compiled with mypyc' if compiled() else 'interpreted (built with CRONOQ_COMPILE=0 or no C compiler)'}",
        flush=True,
    )
    rates: dict[str, float] = {}  # drains' tasks/s: cronoq's "memory" and "Postgres", and "pgqueuer"
    if "library" in stores:
        library.report(args.library_tasks)
    if "memory" in stores:
        rates["memory"] = memory_figures(args)
    if "sdks" in stores:
        sdk_workers.run(args.tasks, args.slots)
    if "shards" in stores:
        sharding.run(args.tasks, args.slots)
    if "scaleout" in stores:
        scaleout.run(scaleout.QUOTA, [1, 2, 3], args.tasks // 2, args.slots, scaleout.ROUNDS)
    if "sqlite" in stores:
        durable_drain(
            "SQLite", '[store]\nkind = "sqlite"\npath = "{tmp}/cronoq.db"\n', args.tasks, args.slots, 4000, {}
        )
    if stores & {"postgres", "pgqueuer"}:
        with postgres_or_skip() as pg:
            if pg is not None:
                postgres_figures(args, stores, pg, rates)
    comparison(rates)


def postgres_figures(
    args: argparse.Namespace, stores: set[str], pg: PostgresServer, rates: dict[str, float]
) -> None:
    """cronoq on Postgres and pgqueuer, one after the other on the same server, then failover."""
    if "postgres" in stores:
        lone_submit.report_postgres(pg.url)
        rates["Postgres"] = durable_drain(
            "Postgres",
            '[store]\nkind = "postgres"\nschema = "cronoq_bench"\n',
            args.tasks,
            args.slots,
            6500,
            {**os.environ, "DATABASE_URL": pg.url},
            local_port(pg),
        )
    if "pgqueuer" in stores:
        plan = pgqueuer_drain.Plan(args.tasks, args.rate, args.seconds)
        rates["pgqueuer"] = pgqueuer_drain.report(pg.url, plan, database_port=local_port(pg))
    if "postgres" in stores:
        failover.report(pg.url, args.failovers)


def comparison(rates: dict[str, float]) -> None:
    """cronoq's drains over pgqueuer's measured in this run, against issue #25's targets: the memory
    store at least twice pgqueuer's rate, Postgres at least pgqueuer's, aiming for 1.5 times."""
    if "pgqueuer" not in rates:
        return
    targets = {"memory": "target >= 2x", "Postgres": "target >= 1x, aim 1.5x"}
    ratios = [
        f"{name} {rates[name] / rates['pgqueuer']:.1f}x ({target})"
        for name, target in targets.items()
        if name in rates
    ]
    if ratios:
        print(f"cronoq vs pgqueuer in this run: {', '.join(ratios)}", flush=True)


def memory_figures(args: argparse.Namespace) -> float:
    """Print the memory store's figures; the tasks/s of its drain (over the batched worker stream)."""
    eng = engine_bench.run(args.engine_tasks)
    print(
        f"engine: {eng['decisions_per_s']:,.0f} decisions/s with the garbage collector paused, "
        f"{eng['decisions_per_s_with_gc']:,.0f} with it on ({eng['decisions']:,.0f} decisions; "
        f"machine speed: {eng['baseline_loop_ns']:.0f} ns per trivial loop step)   target >= 250,000",
        flush=True,
    )
    eng = engine_bench.run(args.engine_tasks, features=True)
    print(
        f"engine with every feature on (fair share, keys, deadlines, timeouts, lease TTL, a semaphore and "
        f"a token bucket, the autoscaler): {eng['decisions_per_s']:,.0f} decisions/s with the garbage "
        f"collector paused, {eng['decisions_per_s_with_gc']:,.0f} with it on",
        flush=True,
    )
    small, large = engine_bench.backlog(1000), engine_bench.backlog(4000)
    print(
        f"engine, resource backlog behind a one-permit semaphore: 1,000 tasks {small:.3f} s, "
        f"4,000 tasks {large:.3f} s ({large / small:.1f}x for 4x the tasks: linear is 4x, quadratic 16x)",
        flush=True,
    )
    small, large = engine_bench.rate_limited(1000), engine_bench.rate_limited(4000)
    print(
        f"engine, rate-limited backlog behind a 1,000/s token bucket: 1,000 tasks {small:.3f} s, "
        f"4,000 tasks {large:.3f} s ({large / small:.1f}x for 4x the tasks: linear is 4x, quadratic 16x)",
        flush=True,
    )
    ceiling, server_us, client_us = grpc_ceiling.run(args.tasks)
    print(
        f"transport ceiling: raw grpc.aio Work-stream round trips between two processes: {ceiling:,.0f}/s, "
        f"CPU per round trip {server_us:.0f} us serving, {client_us:.0f} us as the client "
        "(no scheduler; the end-to-end drain cannot exceed this, nor its CPU per task go below it)",
        flush=True,
    )
    with tempfile.TemporaryDirectory() as tmp, running_server(Path(tmp), POOL_CONFIG) as server:
        d = on_loop(drain(server, args.tasks, args.slots))
        memory_rate = d["tasks_per_s"]
        print(
            f"end-to-end drain: {d['tasks']:,.0f} no-op tasks, SubmitBatch x1000, 1 worker x {args.slots} slots: "
            f"{d['tasks_per_s']:,.0f} tasks/s (submit {d['submit_s']:.2f} s, total {d['total_s']:.2f} s)"
            f"   target >= 5,000\n{cpu_figures(d)}   target <= 80 us in all",
            flush=True,
        )
        d = on_loop(drain(server, args.tasks, args.slots, launch=functools.partial(start_worker, plain=True)))
        print(
            f"the same drain over Workers.Work (one message per lease and per outcome, as workers without "
            f"the batched extension): {d['tasks_per_s']:,.0f} tasks/s (total {d['total_s']:.2f} s)\n"
            f"{cpu_figures(d)}",
            flush=True,
        )
        lat = on_loop(latency(server.target, args.rate, args.seconds))
        print(
            f"submit->start latency at {args.rate:.0f} tasks/s ({lat['tasks']} tasks): p50 {lat['p50_ms']:.2f} ms, "
            f"p99 {lat['p99_ms']:.2f} ms, max {lat['max_ms']:.2f} ms   target p99 <= 2 ms",
            flush=True,
        )
    floor = latency_floor.run(args.rate, args.seconds)
    print(
        f"transport floor of that latency: raw grpc.aio Submit -> Work-stream Lease across three processes "
        f"at {args.rate:.0f}/s: p50 {percentile(floor, 0.50) * 1e3:.2f} ms, p99 {percentile(floor, 0.99) * 1e3:.2f} ms "
        "(no scheduler; cronoq's latency cannot go below this)",
        flush=True,
    )
    lone_submit.report_memory()
    return memory_rate


if __name__ == "__main__":
    main()
