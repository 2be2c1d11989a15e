"""The alerts and the dashboards against a real Prometheus scraping a real cluster.

The cluster is ``make cluster``'s, started by its own functions (``deploy.cluster.running``), so it is
the topology of ``compose/`` and cannot drift from it: two shards, each a leader and a standby on its
own Postgres schema of a throwaway server, the router in front, the example workers of
``compose/worker.py`` (which fail a task on ``{"fail": ...}``), and its Prometheus, which evaluates the
shipped rules file as Compose mounts it. For this run only (``running``'s ``edit``), Prometheus scrapes
and evaluates every second instead of every 5, and the rules' ``for`` durations are cut to 2 s and the
wait threshold to 1 s (the production values are unit tested by promtool,
``tests/deploy/alerts_test.yaml``). The test runs tasks, then makes each alert's condition true in
turn, checking first that the alert does not fire and then that it does: a task that fails every
attempt, a pool whose workers were stopped while a task waited, a table lock that makes commits fail,
a shard leader killed, another paused. Then it asks Prometheus every query of every dashboard panel,
the dashboard's variables filled in from their own queries, and each must return series.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import subprocess
import threading
import time
import tomllib
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

from cronoq.client import Client
from cronoq.errors import Unavailable
from deploy.cluster import (
    CLUSTER_FILE,
    GRPC_PORT,
    HTTP_PORT,
    PROMETHEUS,
    PROMETHEUS_PORT,
    Cluster,
    cronoq_services,
    is_worker,
    router_service,
    running,
    servers_by_shard,
    tokens_by_role,
)
from tests.deploy.compose_model import COMPOSE_DIR
from tests.deploy.compose_run import LocalProcess, stop_all
from tests.postgres import server_programs
from tests.prometheus import PrometheusAPI

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "charts" / "cronoq" / "files" / "alerts.yaml"
PROMETHEUS_CONFIG = COMPOSE_DIR / "prometheus" / "prometheus.yml"
DASHBOARDS = REPO / "dashboards"
INTERVAL = "1s"  # scrapes and rule evaluations, instead of Compose's 5 s
SHORT_FOR = "2s"  # long enough that a scrape that fails once does not fire anything
# Thresholds the test can reach in seconds, instead of the production ones.
THRESHOLDS = {"CronoqPoolWaitHigh": ("> 60", "> 1")}
WAIT_THRESHOLD_S = 1.0
RATE_INTERVAL = "1m"  # $__rate_interval: the test's whole history
ALERT_TIMEOUT_S = 20.0
# Two attempts, 50 ms apart (the task's own policy; the pool's is 3 attempts from 1 s apart): a task
# that fails both is dead-lettered within the test.
FAIL_FAST = {"max_attempts": 2, "initial_backoff": 0.05, "multiplier": 1, "max_backoff": 0.05}


def quick_rules(text: str) -> str:
    """The shipped rules, with the durations and thresholds the test can wait for."""
    document = yaml.safe_load(text)
    for group in document["groups"]:
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = SHORT_FOR
            if rule["alert"] in THRESHOLDS:
                old, new = THRESHOLDS[rule["alert"]]
                assert rule["expr"].count(old) == 1, (rule["alert"], old)
                rule["expr"] = rule["expr"].replace(old, new)
    return yaml.safe_dump(document)


def every_second(text: str) -> str:
    """Compose's Prometheus configuration (as ``make cluster`` rewrote it), scraping and evaluating
    every :data:`INTERVAL`."""
    config = yaml.safe_load(text)
    config["global"] = {
        **config.get("global", {}),
        "scrape_interval": INTERVAL,
        "scrape_timeout": INTERVAL,
        "evaluation_interval": INTERVAL,
    }
    return yaml.safe_dump(config, sort_keys=False)


@dataclass(slots=True)
class QuickFiles:
    """``running``'s ``edit`` for this test: Prometheus's configuration and the shipped rules shortened,
    every other file as ``make cluster`` writes it. Remembers what it edited, so that the test knows
    the cluster's Prometheus read both files it means to change."""

    edited: set[Path] = field(default_factory=set)

    def __call__(self, source: Path, text: str) -> str:
        edits = {RULES: quick_rules, PROMETHEUS_CONFIG: every_second}
        if source not in edits:
            return text
        self.edited.add(source)
        return edits[source](text)


@dataclass(slots=True)
class Shard:
    """A shard of the cluster as the scenario uses it: its servers (by service), its first pool, the
    example workers serving that pool, and its Postgres schema."""

    name: str
    members: list[str]
    pool: str
    workers: list[LocalProcess]
    schema: str


def shards(cluster: Cluster) -> list[Shard]:
    """The shards of compose/cronoq.toml, in its order."""
    config = tomllib.loads(CLUSTER_FILE.read_text())
    members = servers_by_shard(cluster.project)
    services = cronoq_services(cluster.project)
    found = []
    for shard in config["shards"]:
        pool = shard["pools"][0]
        workers = [
            process
            for name, service in services.items()
            if is_worker(service) and service.environment["CRONOQ_POOL"] == pool
            for process in cluster.processes[name]
        ]
        schema = config["store"]["schema"].replace("{shard}", shard["name"])
        found.append(Shard(shard["name"], members[shard["name"]], pool, workers, schema))
    return found


def server_process(cluster: Cluster, service: str) -> subprocess.Popen[bytes]:
    """The running process of a one-replica service (a server), to signal."""
    (only,) = cluster.processes[service]
    assert only.proc is not None and only.proc.poll() is None, f"{service} is not running"
    return only.proc


def leader(cluster: Cluster, shard: Shard) -> str:
    (leading,) = [name for name in shard.members if cluster.leads(name)]
    return leading


async def until_leads(cluster: Cluster, server: str) -> None:
    """Wait (bounded) until ``server`` leads its shard."""
    deadline = time.monotonic() + 30
    while not await asyncio.to_thread(cluster.leads, server):
        assert time.monotonic() < deadline, f"{server} does not lead after 30 s"
        await asyncio.sleep(0.2)


class Watch:
    """Asks the cluster's Prometheus, off the event loop (the client shares it)."""

    def __init__(self, prometheus: PrometheusAPI) -> None:
        self.prometheus = prometheus

    async def query(self, expr: str) -> list[dict[str, Any]]:
        return await asyncio.to_thread(self.prometheus.query, expr)

    async def until(self, expr: str, what: str, timeout: float = ALERT_TIMEOUT_S) -> None:
        """Wait (bounded) until ``expr`` returns series."""
        deadline = time.monotonic() + timeout
        while not await self.query(expr):
            assert time.monotonic() < deadline, f"{what}: {expr} returned nothing for {timeout} s"
            await asyncio.sleep(0.2)

    async def firing(self, alert: str, **labels: str) -> bool:
        return bool(await self.query(alerts(alert, "firing", labels)))

    async def fires(self, alert: str, **labels: str) -> float:
        """Wait until the alert fires for series with ``labels``; the seconds it took."""
        began = time.monotonic()
        await self.until(alerts(alert, "firing", labels), f"{alert} {labels} did not fire")
        return time.monotonic() - began

    def evaluations(self) -> float:
        """How many times Prometheus has evaluated the rules (its own counter)."""
        with urllib.request.urlopen(f"{self.prometheus.url}/metrics", timeout=5) as response:
            text = response.read().decode()
        found = re.search(r"^prometheus_rule_group_iterations_total\{[^}]*\} (\S+)$", text, re.MULTILINE)
        assert found is not None, "prometheus reports no rule group evaluations"
        return float(found[1])

    async def evaluated(self, times: int) -> None:
        """Wait until the rules have been evaluated ``times`` more times."""
        start = await asyncio.to_thread(self.evaluations)
        deadline = time.monotonic() + times + 10
        while await asyncio.to_thread(self.evaluations) < start + times:
            assert time.monotonic() < deadline, "prometheus stopped evaluating its rules"
            await asyncio.sleep(0.2)


def alerts(alert: str, state: str, labels: dict[str, str]) -> str:
    matchers = "".join(f', {name}="{value}"' for name, value in labels.items())
    return f'ALERTS{{alertname="{alert}", alertstate="{state}"{matchers}}}'


async def until_succeeds(call: Callable[[], Awaitable[object]], what: str) -> None:
    """Retry ``call`` while it fails UNAVAILABLE (a failover under way), within 20 s."""
    deadline = time.monotonic() + 20
    while True:
        try:
            await call()
            return
        except Unavailable:
            assert time.monotonic() < deadline, f"{what}: still unavailable after 20 s"
            await asyncio.sleep(0.1)


@contextlib.contextmanager
def tasks_table_locked(postgres_url: str, schema: str) -> Iterator[None]:
    """Hold an exclusive lock on a shard's task table from another session until the block ends: the
    leader's next commit waits on it until its 5 s limit, fails, and is retried."""
    locked = threading.Event()
    release = threading.Event()

    def hold() -> None:
        with psycopg.connect(postgres_url) as conn:
            conn.execute(f'LOCK TABLE "{schema}".cronoq_tasks IN ACCESS EXCLUSIVE MODE')
            locked.set()
            release.wait(60)
            conn.rollback()

    holder = threading.Thread(target=hold, daemon=True)
    holder.start()
    assert locked.wait(10), "could not lock the task table"
    try:
        yield
    finally:
        release.set()
        holder.join(10)


async def scraped_counter(address: str, token: str, sample: str) -> float:
    """One sample of a server's /metrics, read directly (not through Prometheus)."""

    def read() -> float:
        request = urllib.request.Request(
            f"http://{address}/metrics", headers={"authorization": f"Bearer {token}"}
        )
        with urllib.request.urlopen(request, timeout=5) as response:
            text = response.read().decode()
        for line in text.splitlines():
            if line.startswith(sample + " "):
                return float(line.split()[1])
        return 0.0

    return await asyncio.to_thread(read)


async def test_alerts_fire_and_dashboards_answer_on_make_cluster(prometheus_binary: Path) -> None:
    try:
        server_programs()
    except LookupError as err:
        pytest.skip(str(err))
    began = time.monotonic()
    files = QuickFiles()
    with running(published=False, prometheus=str(prometheus_binary), edit=files) as (cluster, _):
        assert files.edited == {RULES, PROMETHEUS_CONFIG}
        assert cluster.prometheus is not None
        url = f"http://{cluster.address(PROMETHEUS, PROMETHEUS_PORT)}"
        watch = Watch(PrometheusAPI(url))
        try:
            await scenario(watch, cluster)
        except BaseException:
            for each in cluster.every_process():
                print(f"----- {each.name} -----\n{each.logs()[-4000:]}")
            raise
        finally:
            for each in cluster.every_process():  # a paused server would not stop
                if each.proc is not None and each.proc.poll() is None:
                    each.proc.send_signal(signal.SIGCONT)
    print(f"the live monitoring test took {time.monotonic() - began:.1f} s")


async def scenario(watch: Watch, cluster: Cluster) -> None:
    first, second = shards(cluster)
    tokens = tokens_by_role(cluster)
    router = router_service(cluster.project)
    async with Client(cluster.address(router, GRPC_PORT), token=tokens["client"]) as client:
        # Tasks through the router, to both shards, run by the example workers.
        ran: dict[str, int] = {}
        for i in range(3):
            for shard in (first, second):
                done = await client.submit({"n": i}, pool=shard.pool, wait=True, wait_timeout=10)
                assert done.result is not None and done.result.ok
                ran[shard.name] = done.id

        # A healthy cluster, fully scraped: every target up, the workers of both pools and both
        # standbys seen, the router knowing both leaders. Then, after rules evaluations that cover
        # every `for`, no alert.
        servers = sum(len(shard.members) for shard in (first, second))
        for expr in (
            f"count(up == 1) == {servers + 1}",
            "count(cronoq_pool_workers_connected > 0) == 2",
            "count(cronoq_leader == 0) == 2",
            "count(cronoq_router_shard_leader == 1) == 2",
        ):
            await watch.until(expr, "the healthy cluster was not scraped")
        await watch.evaluated(4)
        assert await watch.query('ALERTS{alertstate="firing"}') == []

        # Dead letters: a task that fails both its attempts (compose/worker.py fails it on request).
        assert not await watch.firing("CronoqDeadLetters", pool=first.pool)
        done = await client.submit(
            {"fail": "on purpose"}, pool=first.pool, retry=FAIL_FAST, wait=True, wait_timeout=10
        )
        assert done.result is not None and done.result.status == "dead_lettered"
        took = await watch.fires("CronoqDeadLetters", pool=first.pool)
        print(f"CronoqDeadLetters fired {took:.1f} s later")

        # Work without workers, then a long wait: the second pool's workers are stopped, a task
        # waits, the workers start again.
        assert second.workers, f"no example worker serves pool {second.pool} in compose.yaml"
        await asyncio.to_thread(stop_all, second.workers)  # SIGTERM, and wait until they exit
        await watch.until(f'cronoq_pool_workers_connected{{pool="{second.pool}"}} == 0', "workers left")
        assert not await watch.firing("CronoqWorkWithoutWorkers", pool=second.pool)
        assert not await watch.firing("CronoqPoolWaitHigh", pool=second.pool)
        waiting = await client.submit({"n": "late"}, pool=second.pool)
        queued = time.monotonic()
        took = await watch.fires("CronoqWorkWithoutWorkers", pool=second.pool)
        print(f"CronoqWorkWithoutWorkers fired {took:.1f} s later")
        # The task has waited longer than the threshold; nothing dispatched yet, so no long wait either.
        await asyncio.sleep(max(0.0, queued + 2 * WAIT_THRESHOLD_S - time.monotonic()))
        assert not await watch.firing("CronoqPoolWaitHigh", pool=second.pool)
        for worker in second.workers:
            worker.start()
        assert (await client.wait(waiting.id, timeout=20)).ok
        took = await watch.fires("CronoqPoolWaitHigh", pool=second.pool)
        print(f"CronoqPoolWaitHigh fired {took:.1f} s later")

        # Commits failing: a lock on the first shard's task table holds a submission's commit past
        # its limit.
        leading = leader(cluster, first)
        instance = cluster.address(leading, HTTP_PORT)
        failures = 'cronoq_store_commit_failures_total{kind="retried"}'
        assert not await watch.firing("CronoqStoreCommitsFailing", instance=instance)
        with tasks_table_locked(cluster.database_url, first.schema):
            submitting = asyncio.ensure_future(
                client.submit({"n": "locked"}, pool=first.pool, call_timeout=60)
            )
            deadline = time.monotonic() + 20
            while await scraped_counter(instance, tokens["metrics"], failures) < 1:
                assert time.monotonic() < deadline, "no commit failed while the table was locked"
                await asyncio.sleep(0.2)
        await submitting  # committed once the lock went
        took = await watch.fires("CronoqStoreCommitsFailing", instance=instance)
        print(f"CronoqStoreCommitsFailing fired {took:.1f} s after the first failure")

        # A standby missing: the first shard's leader is killed, its standby takes over and has none
        # of its own. A lookup by id right away meets the dead leader: the router retries it (its
        # retry counters).
        assert not await watch.firing("CronoqStandbyMissing", shard=first.name)
        server_process(cluster, leading).kill()
        await until_succeeds(
            lambda: client.get(ran[first.name]), "a lookup on the first shard after its leader died"
        )
        (standby,) = [name for name in first.members if name != leading]
        await until_leads(cluster, standby)
        took = await watch.fires("CronoqStandbyMissing", shard=first.name)
        print(f"CronoqStandbyMissing fired {took:.1f} s later")

        # No leader, and a shard the router cannot reach: the second shard's leader is paused (its
        # standby takes over only when Postgres ends the paused leader's lock session, 10 s later),
        # then killed.
        assert not await watch.firing("CronoqShardWithoutLeader", shard=second.name)
        assert not await watch.firing("CronoqShardUnreachable", shard=second.name)
        paused = server_process(cluster, leader(cluster, second))
        paused.send_signal(signal.SIGSTOP)
        since = time.monotonic()
        for alert in ("CronoqShardWithoutLeader", "CronoqShardUnreachable"):
            await watch.fires(alert, shard=second.name)
            print(f"{alert} fired {time.monotonic() - since:.1f} s after the leader was paused")
        paused.kill()
        await until_succeeds(
            lambda: client.get(ran[second.name]), "a lookup on the second shard after its leader died"
        )

        # Every alert fired when its condition was made true. Now every dashboard panel, once
        # Prometheus has scraped both new leaders and the router's retries.
        await watch.until("count(cronoq_leader == 1) == 2", "the new leaders were not scraped")
        retried = f"count(count_over_time(cronoq_router_retries_total[{RATE_INTERVAL}]) >= 2) == 2"
        await watch.until(retried, "the router's retries were not scraped twice (for a rate)")
        await dashboards_answer(watch)


LABEL_VALUES = re.compile(r"label_values\((.*),\s*(\w+)\)")


def fill(text: str, values: dict[str, str]) -> str:
    return re.sub(r"\$(\w+)", lambda m: values.get(m[1], m[0]), text)


async def assignments(watch: Watch, dashboard: dict[str, Any]) -> list[dict[str, str]]:
    """The dashboard's variables as Grafana fills them from their own queries: a multi-value variable
    at All (its ``allValue``, else every value it lists, as a regex), a single-value one at each of its
    values in turn (one assignment each)."""
    found: list[dict[str, str]] = [{"__rate_interval": RATE_INTERVAL}]
    for variable in dashboard["templating"]["list"]:
        if variable["type"] != "query":
            continue
        filled: list[dict[str, str]] = []
        for values in found:
            match = LABEL_VALUES.fullmatch(fill(variable["query"]["query"], values))
            assert match is not None, variable["query"]
            listed = await asyncio.to_thread(watch.prometheus.label_values, match[2], match[1])
            if variable["multi"]:
                assert listed or "allValue" in variable, f"${variable['name']} lists nothing: {match[0]}"
                # Grafana's regex of the values, escaped for a PromQL string.
                every = "(" + "|".join(re.escape(v).replace("\\", "\\\\") for v in listed) + ")"
                filled.append({**values, variable["name"]: variable.get("allValue", every)})
            else:
                assert listed, f"${variable['name']} lists nothing: {match[0]}"
                filled += [{**values, variable["name"]: value} for value in listed]
        found = filled
    return found


async def dashboards_answer(watch: Watch) -> None:
    asked = 0
    for path in sorted(DASHBOARDS.glob("*.json")):
        dashboard = json.loads(path.read_text())
        for values in await assignments(watch, dashboard):
            for panel in dashboard["panels"]:
                for target in panel.get("targets", []):
                    expr = fill(target["expr"], values)
                    assert "$" not in expr, expr
                    assert await watch.query(expr), f"{path.name} / {panel['title']} ({values}): {expr}"
                    asked += 1
    print(f"{asked} panel queries answered")
    assert asked > 60
