"""Watch across shards over real gRPC on loopback: a shard's Watch says it is open before any event (its
initial metadata), so a router or a sharded server can tell a quiet shard from a stuck one; a fan-out
serves the reachable shards' events and names the unreachable ones in ``cronoq-unavailable-shards``
(gRPC initial metadata, HTTP header) instead of failing (docs/operations.md, Sharding)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import dataclass
from typing import Any

import grpc
import pytest
from aiohttp.test_utils import TestClient, TestServer

from cronoq.api.grpc_api import TasksServicer
from cronoq.api.http_api import build_http_app
from cronoq.auth import Authenticator
from cronoq.cluster.forward import Peers
from cronoq.cluster.shards import Shard, ShardMap
from cronoq.engine import Engine
from cronoq.engine.model import PoolConfig
from cronoq.errors import Unavailable
from cronoq.v1 import cronoq_pb2 as pb
from cronoq.v1 import cronoq_pb2_grpc as pbg
from router.service import RouterService
from shard.outputs import OutputCache
from shard.runtime import Runtime
from tests.shardkit import service_over

UNAVAILABLE_SHARDS = "cronoq-unavailable-shards"  # the wire name clients read
DOWN = "http://127.0.0.1:1"  # nothing listens: connection refused
PROMPT_S = 5.0  # bound on every wait below; things happen in milliseconds


@dataclass
class Cluster:
    """Shard a (a real Service over gRPC), and a router in front of it and of ``others``."""

    runtime: Runtime
    shard_target: str
    router: RouterService
    router_target: str


async def serve_grpc(servicer: Any) -> tuple[grpc.aio.Server, str]:
    server = grpc.aio.server()
    pbg.add_TasksServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    return server, f"127.0.0.1:{port}"


@contextlib.asynccontextmanager
async def cluster(*others: Shard, timeout: float = 2.0) -> AsyncIterator[Cluster]:
    runtime = Runtime(Engine([PoolConfig("a1", max=4)]), OutputCache(100, 1 << 20))
    service = service_over(runtime, [PoolConfig("a1", max=4)], max_wait_s=0.5)
    shard_server, shard_target = await serve_grpc(TasksServicer(service))
    shards = ShardMap([Shard("a", 1, f"http://{shard_target}", frozenset({"a1"})), *others])
    peers = Peers(shards, insecure_peer_http=False, timeout=timeout)
    pools = [pool for shard in shards for pool in sorted(shard.pools)]
    router = RouterService(
        pools,
        Authenticator([]),
        shards,
        peers,
        max_tasks_per_batch=8,
        max_wait_s=1.0,
        max_list=100,
        max_message_bytes=4 * 1024 * 1024,
    )
    router_server, router_target = await serve_grpc(TasksServicer(router))
    try:
        yield Cluster(runtime, shard_target, router, router_target)
    finally:
        await router_server.stop(None)
        await peers.close()
        await shard_server.stop(None)
        runtime.cancel_timer()


async def opened(call: Any) -> dict[str, str]:
    """The initial metadata of a Watch call, which must come without any event."""
    return dict(await asyncio.wait_for(call.initial_metadata(), PROMPT_S))


async def submit(target: str) -> int:
    async with grpc.aio.insecure_channel(target) as channel:
        answer = await pbg.TasksStub(channel).Submit(pb.SubmitRequest(task=pb.TaskSpec(pool="a1")))
    return int(answer.id)


async def test_a_quiet_shard_opens_its_watch_before_any_event() -> None:
    async with cluster() as c, grpc.aio.insecure_channel(c.shard_target) as channel:
        call = pbg.TasksStub(channel).Watch(pb.WatchRequest(all_transitions=True))
        assert (await opened(call))[UNAVAILABLE_SHARDS] == ""  # open, and nothing has happened yet
        assert not call.done()
        task_id = await submit(c.shard_target)
        assert (await asyncio.wait_for(call.read(), PROMPT_S)).id == task_id

        # A refusal is a status alone, with no initial metadata saying the stream opened.
        refused = pbg.TasksStub(channel).Watch(pb.WatchRequest(pools=["nope"]))
        assert UNAVAILABLE_SHARDS not in await opened(refused)
        assert await refused.code() == grpc.StatusCode.NOT_FOUND


async def test_a_watch_through_a_router_names_a_down_shard_and_serves_the_others() -> None:
    down = Shard("c", 3, DOWN, frozenset({"c1"}))
    async with cluster(down) as c, grpc.aio.insecure_channel(c.router_target) as channel:
        call = pbg.TasksStub(channel).Watch(pb.WatchRequest(all_transitions=True))
        assert (await opened(call))[UNAVAILABLE_SHARDS] == "c"
        task_id = await submit(c.router_target)
        event = await asyncio.wait_for(call.read(), PROMPT_S)
        assert (event.id, event.pool) == (task_id, "a1")
        assert c.router.peers.calls[("c", "Watch", "unavailable")] == 1

        # Watching only the down shard's pool leaves nothing to watch: that is UNAVAILABLE, naming it.
        only_c = pbg.TasksStub(channel).Watch(pb.WatchRequest(pools=["c1"]))
        assert UNAVAILABLE_SHARDS not in await opened(only_c)
        assert await only_c.code() == grpc.StatusCode.UNAVAILABLE
        assert "shard(s) 'c'" in await only_c.details()


async def test_the_http_watch_names_a_down_shard_in_a_header() -> None:
    down = Shard("c", 3, DOWN, frozenset({"c1"}))
    async with cluster(down) as c:
        app = build_http_app(c.router, max_body_bytes=1 << 20, loopback_only_guard=True)
        async with (
            TestClient(TestServer(app, host="127.0.0.1")) as http,
            http.get("/v1/watch?all=true") as resp,
        ):
            assert resp.status == 200
            assert resp.headers["Cronoq-Unavailable-Shards"] == "c"
            assert await asyncio.wait_for(resp.content.readline(), PROMPT_S) == b": watching\n"
            task_id = await submit(c.router_target)
            while not (line := await asyncio.wait_for(resp.content.readline(), PROMPT_S)).startswith(
                b"data:"
            ):
                pass
            assert f'"id":"{task_id}"'.encode() in line


async def test_a_shard_stream_that_fails_after_opening_ends_the_watch_naming_it() -> None:
    down = Shard("c", 3, DOWN, frozenset({"c1"}))
    async with cluster(down) as c, grpc.aio.insecure_channel(c.router_target) as channel:
        call = pbg.TasksStub(channel).Watch(pb.WatchRequest())
        assert (await opened(call))[UNAVAILABLE_SHARDS] == "c"
        c.runtime.close_watchers(Unavailable("server is shutting down"))  # shard a stops serving it
        with pytest.raises(grpc.aio.AioRpcError) as failed:
            await asyncio.wait_for(call.read(), PROMPT_S)
        assert failed.value.code() == grpc.StatusCode.UNAVAILABLE
        assert failed.value.details() == "shard 'a': server is shutting down"


class SilentTasks(pbg.TasksServicer):
    """A shard whose Watch neither answers nor opens (stuck, or sending no headers before an event)."""

    async def Watch(self, request: pb.WatchRequest, context: Any) -> AsyncIterator[pb.StatusEvent]:
        await asyncio.Event().wait()
        yield pb.StatusEvent()  # pragma: no cover - never reached


async def test_a_shard_that_does_not_open_its_watch_in_time_is_named() -> None:
    # The generated base class answers the methods not written here UNIMPLEMENTED; its stub calls them abstract.
    silent_server, silent_target = await serve_grpc(SilentTasks())  # type: ignore[abstract]
    silent = Shard("s", 4, f"http://{silent_target}", frozenset({"s1"}))
    try:
        async with cluster(silent, timeout=0.3) as c, grpc.aio.insecure_channel(c.router_target) as channel:
            call = pbg.TasksStub(channel).Watch(pb.WatchRequest(all_transitions=True))
            assert (await opened(call))[UNAVAILABLE_SHARDS] == "s"  # after the forwarding timeout
            task_id = await submit(c.shard_target)  # not through the router: its timeout is short here
            assert (await asyncio.wait_for(call.read(), PROMPT_S)).id == task_id
            assert c.router.peers.calls[("s", "Watch", "deadline_exceeded")] == 1
    finally:
        await silent_server.stop(None)
