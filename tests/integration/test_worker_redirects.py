"""Where a worker may be redirected, against a real ``cronoq-router`` (its configured target): the router
names the URLs of the shard it sends the worker to, and the worker follows redirects only among them,
or only where ``redirect_allow`` admits when given. A shard that forges a redirect is a scripted server
in this test, to which the router's own shard map points."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from cronoq.client import Client, Lease, Worker
from cronoq.errors import FailedPrecondition
from tests.ports import free_ports
from tests.unit.client.scripted import TIMEOUT, Refusal, WorkersServer, running, serve

from .helpers import token, worker
from .serverproc import ServerProcess
from .shardproc import ShardSpec, cluster_tables, running_cluster, running_router

pytestmark = pytest.mark.asyncio

SHARDS = (ShardSpec("a", 1, ("a1",)), ShardSpec("b", 2, ("b1",)))
WORKER_TOKEN = "worker-token-0123456789abcdef"
CLIENT_TOKEN = "client-token-0123456789abcdef"
TOKENS = token(WORKER_TOKEN, "worker") + token(CLIENT_TOKEN, "client")


async def echo(lease: Lease) -> str:
    return f"{lease.pool}:{lease.text()}"


async def never(lease: Lease) -> None:
    await asyncio.Event().wait()


async def test_a_worker_follows_the_router_to_a_shard_the_shard_map_names(tmp_path: Path) -> None:
    """The router's map reaches the shards as ``localhost`` while the worker targets the router at
    127.0.0.1: another host, so the worker follows only because the router named the URL."""
    extra = {spec.name: TOKENS for spec in SHARDS}
    with running_cluster(tmp_path, SHARDS, extra=extra) as shards:
        endpoints = {name: f"http://localhost:{proc.grpc_port}" for name, proc in shards.items()}
        with running_router(tmp_path, f"{TOKENS}\n{cluster_tables(SHARDS, endpoints)}") as front:
            async with (
                worker(front.target, echo, pool="a1", token=WORKER_TOKEN) as on_a,
                worker(front.target, echo, pool="b1", token=WORKER_TOKEN) as on_b,
                Client(front.target, token=CLIENT_TOKEN) as client,
            ):
                assert (on_a.connections, on_b.connections) == (1, 1)  # redirected, then registered
                for pool in ("a1", "b1"):
                    done = await client.submit(b"x", pool=pool, wait=True, wait_timeout=10)
                    assert done.result is not None and done.result.text() == f"{pool}:x"


@contextlib.asynccontextmanager
async def forging_shard(tmp_path: Path) -> AsyncIterator[tuple[ServerProcess, WorkersServer, WorkersServer]]:
    """A router whose map puts shard b at a scripted server that redirects every worker to a third
    (the collector), naming the collector as b's only endpoint: a compromised shard."""
    collector = WorkersServer()
    shard_b = WorkersServer()
    async with serve(collector), serve(shard_b):
        forged = (
            ("cronoq-shard", "b"),
            ("cronoq-shard-endpoint", collector.url),
            ("cronoq-shard-endpoints", collector.url),
        )
        shard_b.refusals = [Refusal(grpc.StatusCode.FAILED_PRECONDITION, "go there", forged)]
        (unused,) = free_ports(1)  # shard a is never asked: no a1 worker here
        endpoints = {"a": f"http://127.0.0.1:{unused}", "b": shard_b.url}
        with running_router(tmp_path, f"{TOKENS}\n{cluster_tables(SHARDS, endpoints)}") as front:
            yield front, shard_b, collector


async def test_a_shard_cannot_send_a_worker_where_the_router_did_not_name(tmp_path: Path) -> None:
    async with forging_shard(tmp_path) as (front, shard_b, collector):
        with pytest.raises(FailedPrecondition) as refused:
            await asyncio.wait_for(Worker(front.target, "b1", never, token=WORKER_TOKEN).run(), TIMEOUT)
    assert refused.value.message == (
        f"refusing shard redirect to {collector.url!r}: it is not one of the shard endpoints the "
        f"configured target named ({shard_b.url})"
    )
    assert (shard_b.connects, collector.connects) == (1, 0)  # the token never reached the collector
    assert shard_b.metadata[0]["authorization"] == f"Bearer {WORKER_TOKEN}"


async def test_redirect_allow_alone_decides_where_a_worker_goes(tmp_path: Path) -> None:
    """Given, redirect_allow admits what it names even when no server named it, and refuses what it
    does not name even when the router named it."""
    async with forging_shard(tmp_path) as (front, shard_b, collector):
        allowed = Worker(front.target, "b1", never, token=WORKER_TOKEN, redirect_allow=["127.0.0.1"])
        async with running(allowed):
            await (await collector.accept()).handshake()
            await allowed.wait_registered(TIMEOUT)
        assert (shard_b.connects, collector.connects) == (1, 1)

        narrow = Worker(front.target, "b1", never, token=WORKER_TOKEN, redirect_allow=["localhost"])
        with pytest.raises(FailedPrecondition, match="redirect_allow does not admit it"):
            await asyncio.wait_for(narrow.run(), TIMEOUT)
        assert (shard_b.connects, collector.connects) == (1, 1)  # refused at the router's redirect
