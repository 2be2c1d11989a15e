"""Forwarding to a shard's leader (``cronoq.cluster.forward.Peers``) against a real shard Service served over
gRPC on loopback: which failures a forwarder may send again, judged by what the shard marked rather than
by the words of its message."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import grpc
import pytest

from cronoq.api.grpc_api import TasksServicer
from cronoq.auth import Principal, Role
from cronoq.cluster.forward import RETRIES, Peers, retry_safe
from cronoq.cluster.shards import Shard, ShardMap, WrongShard
from cronoq.config import parse_config
from cronoq.engine import Engine
from cronoq.engine.model import PoolConfig
from cronoq.errors import DeadlineExceeded, Unavailable
from cronoq.transport import NOT_RECEIVED_KEY, SUBMIT, UNAVAILABLE_SHARDS_KEY, never_received
from cronoq.v1 import cronoq_pb2 as pb
from cronoq.v1 import cronoq_pb2_grpc as pbg
from shard.outputs import OutputCache
from shard.runtime import Runtime
from shard.server import ShardServer
from shard.service import ShardService
from tests.shardkit import service_over

CALLER = Principal(Role.CLIENT)
KEYLESS_WAIT = pb.SubmitRequest(task=pb.TaskSpec(pool="a1"), wait=True)


@dataclass
class Leader:
    """A shard's leader as a forwarder sees it: its service and runtime, and Peers that reach it."""

    service: ShardService
    runtime: Runtime
    peers: Peers
    shard: Shard

    def submitted(self) -> int:
        return int(self.runtime.engine.snapshot(self.runtime.clock()).totals.submitted)

    async def until_submitted(self, count: int) -> None:
        """Until the forwarded call reached the engine (it went through a real socket)."""
        async with asyncio.timeout(5):
            while self.submitted() < count:  # noqa: ASYNC110 - the call travels through a real socket
                await asyncio.sleep(0.005)


class Search:
    """A leader search whose verdicts the test gives: a shard's calls go to its endpoint; ``on_suspect``
    runs when a call failed there; :meth:`go_silent` makes a URL silent, giving up the calls in flight."""

    def __init__(self, on_suspect: Callable[[], None] = lambda: None) -> None:
        self.on_suspect = on_suspect
        self.silenced: set[str] = set()
        self.in_flight: set[Callable[[], None]] = set()

    def endpoint(self, shard: Shard) -> str:
        return shard.endpoint

    def suspect(self, shard: Shard, url: str) -> None:
        self.on_suspect()

    def silent(self, shard: Shard, url: str) -> bool:
        return url in self.silenced

    def on_silence(self, shard: Shard, url: str, give_up: Callable[[], None]) -> Callable[[], None]:
        self.in_flight.add(give_up)
        return partial(self.in_flight.discard, give_up)

    def go_silent(self, url: str) -> None:
        self.silenced.add(url)
        for give_up in list(self.in_flight):
            give_up()


@contextlib.asynccontextmanager
async def leader(on_suspect: Callable[[ShardService, Runtime], None]) -> AsyncIterator[Leader]:
    """A leader of shard 'a' and Peers forwarding to it with retries; ``on_suspect`` runs when a call
    there failed UNAVAILABLE, before the retry (as a router learns of the new leader meanwhile)."""
    runtime = Runtime(Engine([PoolConfig("a1", max=4)]), OutputCache(100, 1 << 20))
    service = service_over(runtime, [PoolConfig("a1", max=4)], max_wait_s=0.5)
    server = grpc.aio.server()
    pbg.add_TasksServicer_to_server(TasksServicer(service), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    shard = Shard("a", 1, f"http://127.0.0.1:{port}", frozenset({"a1"}))
    search = Search(lambda: on_suspect(service, runtime))
    peers = Peers(ShardMap([shard]), insecure_peer_http=False, timeout=5.0, search=search, retries=3)
    try:
        yield Leader(service, runtime, peers, shard)
    finally:
        await peers.close()
        await server.stop(None)
        runtime.cancel_timer()


def lead_again(service: ShardService, runtime: Runtime) -> None:
    """The shard leads again at the same address by the time the forwarder retries."""
    runtime.accepting = True
    service.serve(runtime)


async def test_a_committed_submit_whose_wait_a_shutdown_ends_is_not_sent_again() -> None:
    async with leader(lead_again) as shard:
        call = asyncio.ensure_future(shard.peers.call(shard.shard, SUBMIT, KEYLESS_WAIT, CALLER))
        await shard.until_submitted(1)
        shard.runtime.accepting = False  # what a clean shutdown does to a waiting Submit
        shard.runtime.wake_waiters_unavailable()
        with pytest.raises(Unavailable, match="shutting down"):
            await call
        assert shard.submitted() == 1 and not shard.peers.retried


async def test_a_step_down_between_commit_and_wait_is_not_sent_again() -> None:
    async with leader(lead_again) as shard:
        committed = shard.runtime.sync

        async def step_down_after_commit() -> None:
            await committed()
            shard.service.serve(None)  # leadership lost before the Submit starts to wait

        shard.runtime.sync = step_down_after_commit  # type: ignore[method-assign]
        with pytest.raises(Unavailable, match="standby"):
            await shard.peers.call(shard.shard, SUBMIT, KEYLESS_WAIT, CALLER)
        assert shard.submitted() == 1 and not shard.peers.retried


async def test_a_refusal_before_admission_is_sent_again_even_without_a_key() -> None:
    async with leader(lead_again) as shard:

        def stand_by() -> None:
            shard.service.serve(None)

        def stop_admitting() -> None:
            shard.runtime.accepting = False

        for refuse in (stand_by, stop_admitting):  # a standby, then a leader that stopped admitting
            refuse()
            keyless = pb.SubmitRequest(task=pb.TaskSpec(pool="a1"))
            await shard.peers.call(shard.shard, SUBMIT, keyless, CALLER)
        assert shard.submitted() == 2 and shard.peers.retried[("a", "Submit")] == 2


async def test_a_sharded_server_retries_what_another_shards_standby_refused() -> None:
    """A shard server forwards like a router: through the leader search over the other shards' members
    (never its own), and sending again, a bounded number of times, a call that provably was not
    received, even a keyless Submit."""
    async with leader(lambda _service, _runtime: None) as other:
        other.service.serve(None)  # shard a's endpoint reaches a standby, which stays one
        config = parse_config(
            f"""
            [server]
            shard = "home"
            [[pools]]
            name = "a1"
            [[pools]]
            name = "h1"
            [[shards]]
            name = "a"
            number = 1
            endpoint = "{other.shard.endpoint}"
            members = ["{other.shard.endpoint}"]
            pools = ["a1"]
            [[shards]]
            name = "home"
            number = 2
            endpoint = "http://127.0.0.1:1"
            members = ["http://127.0.0.1:1"]
            pools = ["h1"]
            """
        )
        server = ShardServer(config)
        a, home = server.shards.get("a"), server.shards.get("home")
        assert server.peers is not None and a is not None and home is not None
        try:
            keyless = pb.SubmitRequest(task=pb.TaskSpec(pool="a1"))
            with pytest.raises(Unavailable, match="standby"):
                await server.peers.call(a, SUBMIT, keyless, CALLER)
            assert server.peers.retried[("a", "Submit")] == RETRIES and other.submitted() == 0
        finally:
            await server.peers.close()
        assert server.finder is not None
        assert server.finder.tracks(a) and not server.finder.tracks(home)


def rpc_error(
    details: str,
    trailing: tuple[tuple[str, str], ...] = (),
    code: grpc.StatusCode = grpc.StatusCode.UNAVAILABLE,
) -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(*trailing), details)


def test_only_a_marked_refusal_or_what_grpc_itself_ended_counts_as_never_received() -> None:
    marked = rpc_error("this server is a standby, not the leader", ((NOT_RECEIVED_KEY, "1"),))
    assert never_received(marked)
    refused = "failed to connect to all addresses; last error: UNKNOWN: ipv4:127.0.0.1:1: Connection refused"
    assert never_received(rpc_error(refused))
    # The server's gRPC core cancelled it before handing it over (its listener closed).
    assert never_received(rpc_error("CANCELLED", code=grpc.StatusCode.CANCELLED))
    assert not never_received(rpc_error(refused, code=grpc.StatusCode.INTERNAL))
    # A server's words prove nothing: a committed Submit(wait) hears these too.
    assert not never_received(rpc_error("server is shutting down; retry against the new leader"))
    assert not never_received(rpc_error("this server is a standby, not the leader; retry against the leader"))
    assert not never_received(rpc_error("store failure: connection refused; this server stepped down"))


def test_only_calls_that_cannot_run_twice_are_retried() -> None:
    keyed = pb.SubmitRequest(task=pb.TaskSpec(key="k"))
    assert retry_safe("Get", pb.GetRequest(), True) and retry_safe("Cancel", pb.CancelRequest(), True)
    assert retry_safe("Submit", keyed, True)  # the key makes a second run a duplicate
    assert not retry_safe("Submit", pb.SubmitRequest(), True)
    batch = pb.SubmitBatchRequest(tasks=[pb.TaskSpec(key="k"), pb.TaskSpec()])
    assert not retry_safe("SubmitBatch", batch, True)
    assert retry_safe("Submit", pb.SubmitRequest(), False)  # refused before anything ran
    assert retry_safe("ListRecurring", pb.Empty(), True)
    assert not retry_safe("AddRecurring", pb.RecurringRequest(name="n"), True)


def test_a_redirect_names_every_url_of_the_shard() -> None:
    """Besides the URL to go to (the leader found), every URL the map gives the shard, which workers
    check redirects against: its endpoint, then its members, each once."""
    members = ("https://b-0:7070", "https://b:7070", "https://b-1:7070")
    shard = Shard("b", 2, "https://b:7070", frozenset({"b1"}), members)
    assert dict(WrongShard(shard, "go there", "https://b-1:7070").metadata) == {
        "cronoq-shard": "b",
        "cronoq-shard-endpoint": "https://b-1:7070",
        "cronoq-shard-endpoints": "https://b:7070,https://b-0:7070,https://b-1:7070",
    }


async def test_calls_to_a_shard_open_another_connection_when_those_open_are_nearly_full() -> None:
    """A shard holds back calls beyond its streams per connection, and a router's Watches hold theirs
    for as long as they last: forwarded calls go over another connection once one carries nine tenths
    of the limit, and back over the first as soon as it has room."""
    shard = Shard("b", 2, "http://127.0.0.1:1", frozenset({"b1"}))
    peers = Peers(ShardMap([shard]), insecure_peer_http=False, timeout=1.0, streams_per_connection=10)
    try:
        first = [peers._connection(shard.endpoint) for _ in range(9)]
        assert len({id(c) for c in first}) == 1 and first[0].open == 9
        second = peers._connection(shard.endpoint)
        assert second is not first[0] and second.channel is not first[0].channel
        first[0].open -= 1  # one call on the first ended
        assert peers._connection(shard.endpoint) is first[0]
    finally:
        await peers.close()


class Hung(pbg.TasksServicer):
    """A shard's leader that takes calls and never answers them (a paused process, as its peers see it:
    the connection stays open). A Watch opens, then sends nothing."""

    def __init__(self) -> None:
        self.arrived = 0
        self._never = asyncio.Event()

    async def Submit(self, request: pb.SubmitRequest, context: Any) -> pb.SubmitResponse:
        self.arrived += 1
        await self._never.wait()
        raise AssertionError("never answers")

    async def Watch(self, request: pb.WatchRequest, context: Any) -> None:  # type: ignore[override]
        await context.send_initial_metadata(((UNAVAILABLE_SHARDS_KEY, ""),))
        await self._never.wait()

    async def until_arrived(self, count: int) -> None:
        async with asyncio.timeout(5):
            while self.arrived < count:  # noqa: ASYNC110 - the calls travel through a real socket
                await asyncio.sleep(0.005)


@contextlib.asynccontextmanager
async def hung_shard(timeout: float = 30.0) -> AsyncIterator[tuple[Hung, Shard, Search, Peers]]:
    # The generated base class answers the methods not written here UNIMPLEMENTED; its stub calls them abstract.
    hung = Hung()  # type: ignore[abstract]
    server = grpc.aio.server()
    pbg.add_TasksServicer_to_server(hung, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    shard = Shard("a", 1, f"http://127.0.0.1:{port}", frozenset({"a1"}))
    search = Search()
    peers = Peers(ShardMap([shard]), insecure_peer_http=False, timeout=timeout, search=search, retries=3)
    try:
        yield hung, shard, search, peers
    finally:
        await peers.close()
        await server.stop(None)


async def test_calls_in_flight_at_a_member_gone_silent_are_given_up_and_none_is_sent_there() -> None:
    """A paused leader answers nothing within the 30 s forwarding timeout: once the leader search finds
    it silent, a keyless Submit in flight there fails UNAVAILABLE naming the shard (it may have run, so
    it is unmarked and not sent again); a keyed one is retried, but never sent to the silent member: it
    fails UNAVAILABLE marked not received."""
    async with hung_shard() as (hung, shard, search, peers):
        keyless = asyncio.ensure_future(peers.call(shard, SUBMIT, pb.SubmitRequest(), CALLER))
        keyed = asyncio.ensure_future(
            peers.call(shard, SUBMIT, pb.SubmitRequest(task=pb.TaskSpec(key="k")), CALLER)
        )
        await hung.until_arrived(2)
        search.go_silent(shard.endpoint)
        async with asyncio.timeout(5):
            with pytest.raises(
                Unavailable,
                match=r"^unavailable: shard 'a': .* given up in flight \(one that changes something may have run\)$",
            ) as in_flight:
                await keyless
            with pytest.raises(
                Unavailable, match=r"^unavailable: shard 'a': .* nothing was sent, retry$"
            ) as not_sent:
                await keyed
        assert not in_flight.value.metadata and not_sent.value.metadata == ((NOT_RECEIVED_KEY, "1"),)
        assert hung.arrived == 2 and peers.retried == {("a", "Submit"): RETRIES}
        assert peers.calls[("a", "Submit", "unavailable")] == 2


async def test_a_watch_whose_member_goes_silent_ends_unavailable_naming_the_shard() -> None:
    async with hung_shard() as (_, shard, search, peers):
        stream = peers.watch(shard, pb.WatchRequest(), CALLER)
        await stream.open()
        search.go_silent(shard.endpoint)
        async with asyncio.timeout(5):
            with pytest.raises(Unavailable, match=r"^unavailable: shard 'a': .* given up in flight"):
                await anext(stream)
        assert peers.calls[("a", "Watch", "unavailable")] == 1
        with pytest.raises(Unavailable, match="nothing was sent"):
            await peers.watch(shard, pb.WatchRequest(), CALLER).open()  # not opened there again


async def test_a_call_that_runs_out_of_time_names_the_shard_and_has_its_leader_looked_for() -> None:
    """gRPC ends a call past its deadline with a bare "Deadline Exceeded": the forwarder says which shard
    did not answer, and has the leader search look again (a stuck member is no better than a down one)."""
    async with hung_shard(timeout=0.3) as (hung, shard, search, peers):
        suspected: list[str] = []
        search.on_suspect = lambda: suspected.append(shard.endpoint)
        with pytest.raises(
            DeadlineExceeded, match=rf"^deadline_exceeded: shard 'a' at {shard.endpoint} did not"
        ):
            await peers.call(shard, SUBMIT, pb.SubmitRequest(task=pb.TaskSpec(key="k")), CALLER)
        assert hung.arrived == 1 and suspected == [shard.endpoint] and not peers.retried
