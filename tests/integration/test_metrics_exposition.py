"""``/metrics`` of a real server (its API port and ``server.metrics_addr``) and a real router, as
prometheus-client writes it: text format 0.0.4 by default, OpenMetrics to a scraper that asks for it
(the same samples, strictly valid OpenMetrics), with the standard process and Python families and
``cronoq_build_info``."""

from __future__ import annotations

from pathlib import Path

import aiohttp
import pytest
from prometheus_client import parser

from cronoq import __version__
from cronoq.client import Client, Lease
from cronoq.engine import compiled
from tests.ports import free_port
from tests.prometheus import openmetrics_families

from .helpers import sqlite_store, worker
from .serverproc import running_server
from .shardproc import ShardSpec, routed_cluster

pytestmark = pytest.mark.asyncio

OPENMETRICS = "application/openmetrics-text; version=1.0.0"
TEXT_0_0_4 = "text/plain; version=0.0.4; charset=utf-8"
Samples = set[tuple[str, frozenset[tuple[str, str]]]]


async def echo(lease: Lease) -> bytes:
    return lease.payload


async def fetch(url: str, accept: str | None = None) -> tuple[str, str]:
    """Content type and page of ``url`` asked with ``accept`` (none: no Accept header)."""
    headers = {"Accept": accept} if accept is not None else {}
    async with aiohttp.ClientSession() as http, http.get(url, headers=headers) as resp:
        assert resp.status == 200
        return resp.headers["Content-Type"], await resp.text()


async def both_formats(url: str) -> tuple[Samples, Samples, dict[str, str]]:
    """The samples (names and labels) of the 0.0.4 page and of the OpenMetrics page, each parsed by
    prometheus-client's parser for its format (OpenMetrics strictly: counter and summary rules,
    ``# EOF``), and the labels of ``cronoq_build_info``."""
    content_type, text = await fetch(url)
    assert content_type == TEXT_0_0_4
    assert not text.rstrip().endswith("# EOF")
    content_type, openmetrics = await fetch(url, OPENMETRICS)
    assert content_type.startswith("application/openmetrics-text; version=1.0.0; charset=utf-8")
    assert openmetrics.endswith("\n# EOF\n")
    families = openmetrics_families(openmetrics)
    # OpenMetrics: a counter's family has no _total, its samples do; the build info is an info family.
    assert families["cronoq_limit_hits"].type == "counter"
    assert {s.name for s in families["cronoq_limit_hits"].samples} == {"cronoq_limit_hits_total"}
    assert families["cronoq_build"].type == "info"
    [build] = families["cronoq_build"].samples
    assert "_created" not in openmetrics and "_created" not in text
    return (
        {
            (s.name, frozenset(s.labels.items()))
            for f in parser.text_string_to_metric_families(text)
            for s in f.samples
        },
        {(s.name, frozenset(s.labels.items())) for f in families.values() for s in f.samples},
        build.labels,
    )


def names(samples: Samples) -> set[str]:
    return {name for name, _ in samples}


async def test_a_server_answers_openmetrics_on_request_on_both_ports(tmp_path: Path) -> None:
    port = free_port()
    body = f'[server]\nmetrics_addr = "127.0.0.1:{port}"\n{sqlite_store(tmp_path / "state.db")}'
    with running_server(tmp_path, body) as server:
        async with worker(server.target, echo), Client(server.target) as client:
            done = await client.submit(b"x", wait=True, wait_timeout=10)
            assert done.result is not None and done.result.ok
        async with aiohttp.ClientSession() as http, http.get(f"{server.http}/v1/tasks/{done.id}") as resp:
            assert resp.status == 200
        for url in (f"{server.http}/metrics", f"http://127.0.0.1:{port}/metrics"):
            text, openmetrics, build = await both_formats(url)
            assert text == openmetrics
            # The histograms: the submit and the HTTP read timed by method, the attempt's wait, commits.
            for labels in (
                {("transport", "grpc"), ("method", "Submit")},
                {("transport", "http"), ("method", "GET /v1/tasks/{ref}")},
            ):
                assert ("cronoq_request_duration_seconds_count", frozenset(labels)) in text, labels
            wait = frozenset({("pool", "default"), ("priority", "normal"), ("le", "+Inf")})
            assert ("cronoq_pool_dispatch_wait_seconds_bucket", wait) in text
            assert ("cronoq_store_commit_duration_seconds_count", frozenset({("store", "sqlite")})) in text
            assert ("cronoq_tasks_total", frozenset({("pool", "default"), ("outcome", "succeeded")})) in text
            assert {"cronoq_store_commit_seconds", "cronoq_leader", "cronoq_pool_pending"} <= names(text)
            assert build == {
                "version": __version__,
                "engine": "compiled" if compiled() else "python",
                "store": "sqlite",
            }
            assert {
                "process_cpu_seconds_total",
                "process_resident_memory_bytes",
                "process_open_fds",
                "python_info",
                "python_gc_collections_total",
            } <= names(text)


async def test_a_router_answers_openmetrics_on_request(tmp_path: Path) -> None:
    with routed_cluster(tmp_path, [ShardSpec("a", 1, ("default",))], "") as (router, shards):
        async with Client(router.target) as client:
            await client.submit(b"x")
        text, openmetrics, build = await both_formats(f"{router.http}/metrics")
    assert text == openmetrics
    endpoint = f"http://{shards['a'].target}"
    assert ("cronoq_router_shard_leader", frozenset({("shard", "a"), ("endpoint", endpoint)})) in text
    assert (
        "cronoq_router_forwarded_total",
        frozenset({("shard", "a"), ("method", "Submit"), ("outcome", "ok")}),
    ) in text
    submit = {("shard", "a"), ("method", "Submit")}
    assert ("cronoq_router_forward_duration_seconds_count", frozenset(submit)) in text
    assert build["store"] == "none" and build["version"] == __version__
    assert {"process_resident_memory_bytes", "python_info"} <= names(text)
