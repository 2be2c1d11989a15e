"""The alerts and the dashboards against a real Prometheus scraping a real cluster.

The cluster is the one users run (Compose, ``make cluster``): two shards, each a leader and a standby on
its own Postgres schema, a router in front, workers that start at the router. A ``prometheus`` process
of the test's own scrapes every server and the router each second and evaluates the shipped rules file,
with its ``for`` durations cut to 2 s and the wait threshold to 1 s (the production values are unit
tested by promtool, ``tests/deploy/alerts_test.yaml``). The test runs tasks, then makes each alert's
condition true in turn, checking first that the alert does not fire and then that it does: a task that
fails every attempt, a pool whose worker left while a task waited, a table lock that makes commits
fail, a shard leader killed, another paused. Then it asks Prometheus every query of every dashboard
panel, the dashboard's variables filled in from their own queries, and each must return series.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import signal
import threading
import time
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml

import cronoq
from cronoq.client import Client, Lease
from cronoq.errors import Unavailable
from tests.prometheus import PrometheusServer, running_prometheus

from .helpers import FAST_RETRY, toml_value, worker
from .serverproc import ServerProcess
from .shardproc import ShardSpec, routed_ha_cluster

pytestmark = [pytest.mark.asyncio, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[2]
RULES = REPO / "charts" / "cronoq" / "files" / "alerts.yaml"
DASHBOARDS = REPO / "dashboards"
# Two attempts, 50 ms apart: a task that fails both is dead-lettered within the test.
POOL_OPTIONS = "retry = " + toml_value({"max_attempts": 2, **FAST_RETRY})
SPECS = [ShardSpec("a", 1, ("jobs",), POOL_OPTIONS), ShardSpec("b", 2, ("batch",), POOL_OPTIONS)]
SHORT_FOR = "2s"  # long enough that a scrape that fails once does not fire anything
# Thresholds the test can reach in seconds, instead of the production ones.
THRESHOLDS = {"CronoqPoolWaitHigh": ("> 60", "> 1")}
WAIT_THRESHOLD_S = 1.0
RATE_INTERVAL = "1m"  # $__rate_interval: the test's whole history
ALERT_TIMEOUT_S = 20.0


def quick_rules() -> str:
    """The shipped rules, with the durations and thresholds the test can wait for."""
    document = yaml.safe_load(RULES.read_text())
    for group in document["groups"]:
        for rule in group["rules"]:
            if "for" in rule:
                rule["for"] = SHORT_FOR
            if rule["alert"] in THRESHOLDS:
                old, new = THRESHOLDS[rule["alert"]]
                assert rule["expr"].count(old) == 1, (rule["alert"], old)
                rule["expr"] = rule["expr"].replace(old, new)
    return yaml.safe_dump(document)


def scraped(proc: ServerProcess) -> str:
    """The process's scrape target, and so its ``instance`` label."""
    return f"127.0.0.1:{proc.http_port}"


def prometheus_config(router: ServerProcess, shards: dict[str, list[ServerProcess]]) -> str:
    """Jobs as in compose/prometheus/prometheus.yml, every second."""
    servers = [scraped(proc) for procs in shards.values() for proc in procs]
    config = {
        "global": {"scrape_interval": "1s", "scrape_timeout": "1s", "evaluation_interval": "1s"},
        "rule_files": ["alerts.yaml"],
        "scrape_configs": [
            {"job_name": "cronoq-server", "static_configs": [{"targets": servers}]},
            {"job_name": "cronoq-router", "static_configs": [{"targets": [scraped(router)]}]},
        ],
    }
    return yaml.safe_dump(config)


async def run(lease: Lease) -> object:
    body = lease.json()
    if "fail" in body:
        raise cronoq.Retryable(str(body["fail"]))
    return body


class Watch:
    """Asks the test's Prometheus, off the event loop (the SDK workers share it)."""

    def __init__(self, prometheus: PrometheusServer) -> None:
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


async def scraped_counter(proc: ServerProcess, sample: str) -> float:
    """One sample of a server's /metrics, read directly (not through Prometheus)."""

    def read() -> float:
        with urllib.request.urlopen(f"{proc.http}/metrics", timeout=5) as response:
            text = response.read().decode()
        for line in text.splitlines():
            if line.startswith(sample + " "):
                return float(line.split()[1])
        return 0.0

    return await asyncio.to_thread(read)


async def test_alerts_fire_and_dashboards_answer_on_a_real_cluster(
    tmp_path: Path, postgres_url: str, pg_schema: str, prometheus_binary: Path
) -> None:
    began = time.monotonic()
    with routed_ha_cluster(tmp_path / "cluster", SPECS, postgres_url, pg_schema) as (router, shards):
        (tmp_path / "prometheus").mkdir()
        (tmp_path / "prometheus" / "alerts.yaml").write_text(quick_rules())
        config = prometheus_config(router, shards)
        with running_prometheus(prometheus_binary, tmp_path / "prometheus", config) as prometheus:
            try:
                await scenario(Watch(prometheus), router, shards, postgres_url, pg_schema)
            finally:
                for procs in shards.values():
                    for proc in procs:  # a paused server would not stop
                        with contextlib.suppress(ProcessLookupError, AssertionError):
                            proc.signal(signal.SIGCONT)
    print(f"the live monitoring test took {time.monotonic() - began:.1f} s")


async def scenario(
    watch: Watch,
    router: ServerProcess,
    shards: dict[str, list[ServerProcess]],
    postgres_url: str,
    pg_schema: str,
) -> None:
    (a_leader, a_standby), (b_leader, _) = shards["a"], shards["b"]
    async with contextlib.AsyncExitStack() as stack:
        client = await stack.enter_async_context(Client(router.target))
        await stack.enter_async_context(worker(router.target, run, pool="jobs"))
        batch_worker = contextlib.AsyncExitStack()
        await batch_worker.enter_async_context(worker(router.target, run, pool="batch"))
        stack.push_async_callback(batch_worker.aclose)

        # Tasks through the router, to both shards.
        ran: dict[str, int] = {}
        for i in range(3):
            for pool in ("jobs", "batch"):
                done = await client.submit({"n": i}, pool=pool, wait=True, wait_timeout=10)
                assert done.result is not None and done.result.ok
                ran[pool] = done.id

        # A healthy cluster, fully scraped: every target up, both workers and both standbys seen, the
        # router knowing both leaders. Then, after rules evaluations that cover every `for`, no alert.
        for expr in (
            "count(up == 1) == 5",
            "count(cronoq_pool_workers_connected > 0) == 2",
            "count(cronoq_leader == 0) == 2",
            "count(cronoq_router_shard_leader == 1) == 2",
        ):
            await watch.until(expr, "the healthy cluster was not scraped")
        await watch.evaluated(4)
        assert await watch.query('ALERTS{alertstate="firing"}') == []

        # Dead letters: a task that fails both its attempts.
        assert not await watch.firing("CronoqDeadLetters", pool="jobs")
        done = await client.submit({"fail": "on purpose"}, pool="jobs", wait=True, wait_timeout=10)
        assert done.result is not None and done.result.status == "dead_lettered"
        print(f"CronoqDeadLetters fired {await watch.fires('CronoqDeadLetters', pool='jobs'):.1f} s later")

        # Work without workers, then a long wait: batch's worker leaves, a task waits, a worker comes back.
        await batch_worker.aclose()
        await watch.until('cronoq_pool_workers_connected{pool="batch"} == 0', "batch's worker left")
        assert not await watch.firing("CronoqWorkWithoutWorkers", pool="batch")
        assert not await watch.firing("CronoqPoolWaitHigh", pool="batch")
        waiting = await client.submit({"n": "late"}, pool="batch")
        queued = time.monotonic()
        took = await watch.fires("CronoqWorkWithoutWorkers", pool="batch")
        print(f"CronoqWorkWithoutWorkers fired {took:.1f} s later")
        # The task has waited longer than the threshold; nothing dispatched yet, so no long wait either.
        await asyncio.sleep(max(0.0, queued + 2 * WAIT_THRESHOLD_S - time.monotonic()))
        assert not await watch.firing("CronoqPoolWaitHigh", pool="batch")
        await batch_worker.enter_async_context(worker(router.target, run, pool="batch"))
        assert (await client.wait(waiting.id, timeout=10)).ok
        print(f"CronoqPoolWaitHigh fired {await watch.fires('CronoqPoolWaitHigh', pool='batch'):.1f} s later")

        # Commits failing: a lock on shard a's task table holds a submission's commit past its limit.
        failures = 'cronoq_store_commit_failures_total{kind="retried"}'
        assert not await watch.firing("CronoqStoreCommitsFailing", instance=scraped(a_leader))
        with tasks_table_locked(postgres_url, f"{pg_schema}_a"):
            submitting = asyncio.ensure_future(client.submit({"n": "locked"}, pool="jobs", call_timeout=60))
            deadline = time.monotonic() + 20
            while await scraped_counter(a_leader, failures) < 1:
                assert time.monotonic() < deadline, "no commit failed while the table was locked"
                await asyncio.sleep(0.2)
        await submitting  # committed once the lock went
        took = await watch.fires("CronoqStoreCommitsFailing", instance=scraped(a_leader))
        print(f"CronoqStoreCommitsFailing fired {took:.1f} s after the first failure")

        # A standby missing: shard a's leader is killed, its standby takes over and has none of its own.
        # A lookup by id right away meets the dead leader: the router retries it (its retry counters).
        assert not await watch.firing("CronoqStandbyMissing", shard="a")
        a_leader.kill()
        await until_succeeds(lambda: client.get(ran["jobs"]), "a lookup on shard a after its leader died")
        await asyncio.to_thread(a_standby.wait_probe, "/readyz", 200, 30)
        print(
            f"CronoqStandbyMissing fired {await watch.fires('CronoqStandbyMissing', shard='a'):.1f} s later"
        )

        # No leader, and a shard the router cannot reach: shard b's leader is paused (its standby takes
        # over only when Postgres ends the paused leader's lock session, 10 s later), then killed.
        assert not await watch.firing("CronoqShardWithoutLeader", shard="b")
        assert not await watch.firing("CronoqShardUnreachable", shard="b")
        b_leader.signal(signal.SIGSTOP)
        paused = time.monotonic()
        for alert in ("CronoqShardWithoutLeader", "CronoqShardUnreachable"):
            await watch.fires(alert, shard="b")
            print(f"{alert} fired {time.monotonic() - paused:.1f} s after the leader was paused")
        b_leader.kill()
        await until_succeeds(lambda: client.get(ran["batch"]), "a lookup on shard b after its leader died")

        # Every alert fired when its condition was made true. Now every dashboard panel, once Prometheus
        # has scraped both new leaders and the router's retries.
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
