"""One chaos run: the cluster, producers and watchers, the seeded faults, then the verdict.

The run, in order:

1. start the cluster (:mod:`chaos.cluster`) with every shard led;
2. for ``seconds``: producers submit (:mod:`chaos.producer`), the watcher polls every server's role and
   lists the running tasks every 2 s, a supervisor restarts any process that ends on its own (as systemd
   or Kubernetes would: a server that steps down for good exits 1 for that), and the faults of the
   schedule (:mod:`chaos.schedule`) are injected at their offsets and healed after their durations;
3. heal whatever is still hurt, and drain: ``Get`` every acknowledged task until each is terminal or
   ``drain_s`` has passed, then read each success's output (``Wait``): the ``final`` records;
4. stop the cluster, merge the history (the run's records and each worker's), check it
   (:mod:`chaos.checker`) and write the report (:mod:`chaos.report`).

Every fault is printed as it is injected, with its offset, the seed and the process it hit.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import random
import shutil
import signal
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cronoq.client import Client
from cronoq.errors import ApiError, NotFound

from . import checker, report
from .cluster import DISK_POOL, DISK_SERVER, DISK_SHARD, LEASE_TTL_S, MAX_ATTEMPTS, ChaosCluster, running
from .history import TERMINAL, HistoryWriter, identity_in_message, read, write_all
from .producer import Producer
from .schedule import Fault, Topology, plan
from .watch import RoleWatcher, scrape

TAKEOVER_S = 12.0  # Postgres: a paused leader's lock session ends within 10 s; 0.5 s look, 1 s check
GRACE_S = 3.0  # scheduling slack on a busy 2-core machine
RUNNING_EVERY_S = 2.0
RESTART_AFTER_S = 1.0
# Faults on a store or its link: the report says how many commits failed (and were retried) during each.
STORE_KINDS = frozenset({"restart-postgres", "cut-link", "slow-link", "lossy-link", "fill-disk"})
FINAL_CONCURRENCY = 16


@dataclass(frozen=True, slots=True)
class Options:
    seconds: float
    seed: int
    out: Path
    kinds: frozenset[str] | None = None
    rate: float = 13.0  # submissions per second to the Compose cluster (through the router)
    disk_rate: float = 3.0  # and to the SQLite server
    mean_gap: float = 4.0
    drain_s: float = 60.0
    source: Path | None = None  # run the servers (and workers) from this tree's cronoq package
    label: str = "this checkout"
    keep_logs: bool = False


@dataclass(slots=True)
class Run:
    options: Options
    cluster: ChaosCluster
    history: HistoryWriter
    watcher: RoleWatcher
    busy: set[str] = field(default_factory=set)  # processes and links a fault holds now
    held: set[str] = field(default_factory=set)  # processes kept down: the supervisor leaves them
    rng: random.Random = field(default_factory=random.Random)
    started: float = 0.0
    last_heal: float = 0.0

    def say(self, text: str) -> None:
        print(f"chaos [{time.time() - self.started:7.1f} s] {text}", flush=True)

    # ---------------------------------------------------------------------------------- topology

    def pools_of(self, shards: list[str]) -> list[str]:
        return sorted(pool for pool, shard in self.cluster.shard_of_pool.items() if shard in shards)

    @property
    def main_shards(self) -> list[str]:
        return sorted({shard for shard in self.cluster.shard_of_pool.values() if shard != DISK_SHARD})

    def resolve(self, fault: Fault) -> tuple[str, list[str], list[str]] | str:
        """What the fault hits now: (process or link, the shards whose servers or store it hits, the
        pools it may interrupt), or why it is skipped."""
        kind, target = fault.kind, fault.target
        if kind.endswith("-leader") or kind.endswith("-standby"):
            found = self.watcher.leader(target) if kind.endswith("-leader") else self.watcher.standby(target)
            if found is None:
                return f"no server of shard {target} is seen {'leading' if kind.endswith('-leader') else 'standing by'}"
            hit: tuple[str, list[str], list[str]] = (found, [target], self.pools_of([target]))
        elif kind.endswith("-link"):
            hit = (f"link:{target}", [target], self.pools_of([target]))
        elif target == "router":
            hit = (self.cluster.router, [], self.pools_of(self.main_shards))
        elif kind.endswith("-worker"):
            hit = (target, [], [self.cluster.pool_of_worker[target]])
        elif target == "postgres":
            hit = ("postgres", self.main_shards, self.pools_of(self.main_shards))
        elif kind == "fill-disk":
            hit = ("tmpfs", [DISK_SHARD], [DISK_POOL])
        else:
            hit = (DISK_SERVER, [DISK_SHARD], [DISK_POOL])
        if hit[0] in self.busy or hit[0] in self.held:
            return f"{hit[0]} is already under a fault"
        return hit

    # ------------------------------------------------------------------------------------ faults

    async def inject(self, fault: Fault) -> None:
        await asyncio.sleep(max(self.started + fault.at - time.time(), 0))
        resolved = self.resolve(fault)
        common: dict[str, Any] = {
            "id": fault.number,
            "kind": fault.kind,
            "target": fault.target,
            "seed": self.options.seed,
        }
        if isinstance(resolved, str):
            self.history.write("fault", **common, skipped=resolved, duration_s=0, detail=fault.detail)
            self.say(f"seed {self.options.seed} fault {fault.describe()}: skipped, {resolved}")
            return
        name, shards, pools = resolved
        pid = self.cluster.pid(name) if name in self.cluster.processes else None
        self.busy.add(name)
        measured = fault.kind in STORE_KINDS
        before = await self.commit_failures(shards) if measured else {}
        try:
            self.history.write(
                "fault", **common, process=name, pid=pid, shards=shards, pools=pools,
                duration_s=fault.duration, detail=fault.detail,
            )  # fmt: skip
            self.say(
                f"seed {self.options.seed} fault {fault.describe()}: {name}"
                + (f" (pid {pid})" if pid else "")
            )
            await self.apply(fault, name)
        finally:
            self.busy.discard(name)
            self.last_heal = time.time()
            effect: dict[str, Any] = {}
            if measured:
                after = await self.commit_failures(shards)
                # of the servers that answered both times; one that restarted meanwhile counts from 0
                effect["commit_failures"] = sum(
                    count - before[server] if count >= before[server] else count
                    for server, count in after.items()
                    if server in before
                )
            self.history.write("heal", fault=fault.number, **effect)

    async def apply(self, fault: Fault, name: str) -> None:
        """Do the fault, hold it for its duration, undo it (also when the run ends meanwhile)."""
        cluster, kind, detail = self.cluster, fault.kind, fault.detail
        if kind == "hang-worker":
            for _ in range(int(detail["handlers"])):
                cluster.signal(name, signal.SIGUSR1)
            return
        undo: Callable[[], Awaitable[None] | None]
        if kind.startswith("kill-"):
            self.held.add(name)
            cluster.kill(name)

            def undo() -> None:
                cluster.start(name)
                self.held.discard(name)

        elif kind.startswith("pause-"):
            cluster.signal(name, signal.SIGSTOP)

            def undo() -> None:
                cluster.signal(name, signal.SIGCONT)

        elif kind == "restart-postgres":
            await asyncio.to_thread(cluster.postgres.stop_server, str(detail["mode"]))

            def undo() -> Awaitable[None]:
                return asyncio.to_thread(cluster.postgres.start_again)

        elif kind.endswith("-link"):
            link = name.removeprefix("link:")
            mode = kind.removesuffix("-link")
            cluster.proxies.set(
                link,
                mode,
                delay_ms=detail.get("delay_ms", 0),
                stall=detail.get("stall", 0),
                reset=detail.get("reset", 0),
            )

            def undo() -> None:
                cluster.proxies.heal(link)

        else:  # fill-disk
            await asyncio.to_thread(cluster.disk.fill, self.rng.randrange(0, 16384))

            def undo() -> None:
                cluster.disk.free()

        try:
            await asyncio.sleep(fault.duration)
        finally:
            done = undo()
            if done is not None:
                await done

    async def commit_failures(self, shards: list[str]) -> dict[str, float]:
        """Each server of ``shards``: its ``cronoq_store_commit_failures_total`` now (those that answer)."""
        servers = [name for name, shard in self.cluster.shard_of_server.items() if shard in shards]
        token = self.cluster.tokens["metrics"]
        counts = await asyncio.gather(
            *(
                scrape(self.cluster.http(name), token, "cronoq_store_commit_failures_total")
                for name in servers
            )
        )
        return {name: count for name, count in zip(servers, counts, strict=True) if count is not None}

    # -------------------------------------------------------------------------------- supervisor

    async def supervise(self, stop: asyncio.Event) -> None:
        """Restart, after a second, any process that ended while no fault holds it down."""
        while not stop.is_set():
            for name in list(self.cluster.processes):
                code = None if name in self.held else self.cluster.exited(name)
                if code is not None:
                    self.held.add(name)
                    self.history.write("exit", process=name, code=code)
                    self.say(f"{name} exited with status {code}: restarting it in {RESTART_AFTER_S:g} s")
                    asyncio.get_running_loop().call_later(RESTART_AFTER_S, self._restart, name)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), 0.25)

    def _restart(self, name: str) -> None:
        self.cluster.start(name)
        self.held.discard(name)
        self.history.write("restart", process=name)

    async def list_running(self, clients: list[Client], stop: asyncio.Event) -> None:
        """Every 2 s, the running tasks each cluster lists, for the checker's stuck rule."""
        while not stop.is_set():
            for client in clients:
                with contextlib.suppress(ApiError, TimeoutError):
                    async with asyncio.timeout(RUNNING_EVERY_S):
                        page = await client.list_tasks(statuses=["running"])
                    tasks = [[t.id, t.attempt, t.started_at] for t in page.tasks]
                    self.history.write("running", tasks=tasks)
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), RUNNING_EVERY_S)

    # ------------------------------------------------------------------------------------ final

    async def finals(self, client: Client, ids: set[int]) -> None:
        """Get each task until it is terminal (or the drain ends), then each success's output."""
        deadline = time.time() + self.options.drain_s
        gate = asyncio.Semaphore(FINAL_CONCURRENCY)
        last: dict[int, dict[str, Any]] = {}

        async def get(task_id: int) -> None:
            async with gate:
                last[task_id] = await _final(client, task_id)

        pending = set(ids)
        while pending:
            await asyncio.gather(*(get(task_id) for task_id in pending))
            pending = {
                i
                for i in pending
                if last[i].get("found") is not False and last[i].get("status") not in TERMINAL
            }
            if not pending or time.time() > deadline:
                break
            await asyncio.sleep(1.0)

        async def output(task_id: int) -> None:
            async with gate:
                with contextlib.suppress(ApiError, TimeoutError):
                    result = await client.wait(task_id, timeout=1.0)
                    if result.output is not None:
                        last[task_id]["output"] = json.loads(result.output)

        await asyncio.gather(*(output(i) for i, r in last.items() if r.get("status") == "succeeded"))
        for task_id, record in sorted(last.items()):
            self.history.write("final", record.pop("t"), task=task_id, **record)


async def _final(client: Client, task_id: int) -> dict[str, Any]:
    """What ``Get`` says of a task now, retried while the cluster answers ``unavailable``."""
    for attempt in range(10):
        try:
            info = await client.get(task_id)
        except NotFound:
            return {"t": time.time(), "found": False}
        except (ApiError, TimeoutError) as err:
            if attempt == 9:
                return {"t": time.time(), "found": None, "error": str(err)[:300]}
            await asyncio.sleep(0.5)
            continue
        fields = {
            "t": time.time(), "found": True, "status": info.status, "attempt": info.attempt, "pool": info.pool,
            "key": info.key, "message": info.message[:500], "started_at": info.started_at,
        }  # fmt: skip
        ident = identity_in_message(info.message)
        if ident is not None:
            fields["failure"] = ident
        return fields
    raise AssertionError("unreachable")


def meta(options: Options, cluster: ChaosCluster, faults: list[Fault]) -> dict[str, Any]:
    clusters = {
        pool: ("sqlite" if shard == DISK_SHARD else "main") for pool, shard in cluster.shard_of_pool.items()
    }
    return {
        "seed": options.seed,
        "seconds": options.seconds,
        "source": options.label,
        "bounds": {"takeover_s": TAKEOVER_S, "grace_s": GRACE_S},
        "pools": {
            pool: {
                "shard": shard,
                "cluster": clusters[pool],
                "lease_ttl_s": LEASE_TTL_S,
                "max_attempts": MAX_ATTEMPTS,
            }
            for pool, shard in cluster.shard_of_pool.items()
        },
        "servers": dict(cluster.shard_of_server),
        "shards": dict(cluster.shard_numbers),
        "workers": dict(cluster.pool_of_worker),
        "sqlite": cluster.disk.why_not or "on a tmpfs",
        "schedule": [fault.describe() for fault in faults],
    }


async def _drive(options: Options, cluster: ChaosCluster, history: HistoryWriter) -> None:
    servers = {name: (shard, cluster.http(name)) for name, shard in cluster.shard_of_server.items()}
    watcher = RoleWatcher(history, servers)
    await watcher.poll()
    run = Run(options, cluster, history, watcher, rng=random.Random(options.seed))
    topology = Topology(
        tuple(run.main_shards), tuple(sorted(cluster.pool_of_worker)), sqlite=cluster.disk.mount is not None
    )
    faults = plan(options.seed, options.seconds, topology, options.kinds, mean_gap=options.mean_gap)
    history.write("meta", **meta(options, cluster, faults))
    token = cluster.tokens["client"]
    main = Client(cluster.grpc(cluster.router), token=token)
    disk = Client(cluster.grpc(DISK_SERVER), token=token) if DISK_SERVER in cluster.addresses else None
    rng = random.Random(options.seed)
    main_pools = {pool: 1.0 for pool in run.pools_of(run.main_shards)}
    producers = [Producer("p", main, history, main_pools, options.rate, random.Random(rng.random()), "k-")]
    if disk is not None:
        producers.append(
            Producer(
                "d", disk, history, {DISK_POOL: 1.0}, options.disk_rate, random.Random(rng.random()), "dk-"
            )
        )
    stop = asyncio.Event()
    run.started = time.time()
    run.say(
        f"seed {options.seed}: {len(faults)} faults over {options.seconds:g} s; servers from {options.label}"
    )
    background = [
        asyncio.create_task(watcher.run(stop)),
        asyncio.create_task(run.supervise(stop)),
        asyncio.create_task(run.list_running([c for c in (main, disk) if c is not None], stop)),
    ]
    injecting = [asyncio.create_task(run.inject(fault)) for fault in faults]
    until = run.started + options.seconds
    await asyncio.gather(*(producer.run(until) for producer in producers))
    for task in injecting:
        task.cancel()
    for failed in await asyncio.gather(*injecting, return_exceptions=True):
        if isinstance(failed, Exception):
            raise failed
    cluster.resume_all()
    run.say(f"faults healed; draining {sum(len(p.acked) for p in producers)} acknowledged tasks")
    for producer in producers:
        await run.finals(producer.client, producer.acked)
    history.write("end", faults_ended=run.last_heal or run.started)
    stop.set()
    await asyncio.gather(*background, return_exceptions=True)
    for client in (main, disk):
        if client is not None:
            await client.close()


def run(options: Options) -> int:
    """Run, check and report; 0 when the checker found nothing, 1 when it found violations."""
    options.out.mkdir(parents=True, exist_ok=True)
    directory = options.out / "run"
    print(f"chaos: seed {options.seed}, {options.seconds:g} s, output in {options.out}", flush=True)
    with running(directory, options.seed, options.source) as cluster:
        history = HistoryWriter(cluster.history_dir / "run.jsonl")
        try:
            asyncio.run(_drive(options, cluster, history))
        finally:
            history.close()
    records = read(sorted((directory / "history").glob("*.jsonl")))
    merged = options.out / "history.jsonl"
    write_all(merged, records)
    verdict = checker.check(records)
    text = report.render(records, verdict)
    (options.out / "report.txt").write_text(text)
    (options.out / "report.json").write_text(json.dumps(report.summary(records, verdict), indent=2) + "\n")
    print(text, flush=True)
    if verdict.violations or options.keep_logs:
        logs = options.out / "logs"
        logs.mkdir(exist_ok=True)
        for log in directory.glob("*/output.log"):
            shutil.copy(log, logs / f"{log.parent.name}.log")
        print(f"chaos: process logs in {logs}", file=sys.stderr)
    shutil.rmtree(directory, ignore_errors=True)
    return 1 if verdict.violations else 0
