"""Routing decisions that depend on what the other shards answered (``cronoq.cluster.routing.Routing``), from a
router and from a shard server, with shards scripted behind :class:`~cronoq.cluster.forward.Peers`."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from cronoq.auth import Authenticator, Principal, Role
from cronoq.cluster.forward import Metadata, Peers
from cronoq.cluster.routing import MergedWatch, Routing
from cronoq.cluster.shards import Shard, ShardMap
from cronoq.errors import (
    AlreadyExists,
    ApiError,
    DeadlineExceeded,
    FailedPrecondition,
    NotFound,
    PermissionDenied,
    Unavailable,
)
from cronoq.transport import KEY_PROBE_KEY, NOT_RECEIVED_KEY, POOL_KEY, Req, Resp, Rpc
from cronoq.v1 import cronoq_pb2 as pb
from router.service import RouterService

A = Shard("a", 1, "http://127.0.0.1:1", frozenset({"a1"}))
B = Shard("b", 2, "http://127.0.0.1:2", frozenset({"b1"}))
C = Shard("c", 3, "http://127.0.0.1:3", frozenset({"c1"}))
CALLER = Principal(Role.CLIENT)
DOWN = Unavailable("shard 'c' is unavailable")
MAX_MESSAGE_BYTES = 4 * 1024 * 1024


class Scripted(Peers):
    """Peers whose shards answer each method from a script: a response, or an error they fail with. A
    Get marked as a key probe is scripted as "Probe" (missing from the script: as the Get); every call
    is recorded as (shard, method, metadata sent besides the caller's, last hop)."""

    def __init__(self, shards: ShardMap, script: dict[tuple[str, str], Any]) -> None:
        super().__init__(shards, insecure_peer_http=False, timeout=1.0)
        self.script = script
        self.sent: list[tuple[str, str, Metadata, bool]] = []

    async def call(
        self,
        shard: Shard,
        rpc: Rpc[Req, Resp],
        request: Req,
        caller: Principal,
        *,
        wait: float = 0.0,
        budget: float | None = None,
        extra: Metadata = (),
        last_hop: bool = False,
    ) -> tuple[Resp, str | None]:
        method = rpc.method
        self.sent.append((shard.name, method, extra, last_hop))
        if (KEY_PROBE_KEY, "1") in extra:
            answer = self.script.get((shard.name, "Probe")) or self.script[(shard.name, method)]
        else:
            answer = self.script[(shard.name, method)]
        if isinstance(answer, ApiError):
            raise answer
        return answer, None


class Here:
    """Shard a's own engine and store (``cronoq.cluster.routing.LocalKeys``): what they hold of each key."""

    def __init__(self, held: dict[str, int] | None = None, stored: dict[str, int] | None = None) -> None:
        self._held = held or {}
        self._stored = stored or {}

    def held(self, caller: Principal, key: str) -> tuple[int, str] | None:
        return (self._held[key], "a1") if key in self._held else None

    async def stored(self, caller: Principal, key: str) -> tuple[int, str] | None:
        return (self._stored[key], "a1") if key in self._stored else None


NOWHERE_HERE = Here()


def router(script: dict[tuple[str, str], Any]) -> RouterService:
    shards = ShardMap([A, B, C])
    return RouterService(
        ["a1", "b1", "c1"],
        Authenticator([]),
        shards,
        Scripted(shards, script),
        max_tasks_per_batch=8,
        max_wait_s=1.0,
        max_list=100,
        max_message_bytes=MAX_MESSAGE_BYTES,
    )


def on_shard_a(script: dict[tuple[str, str], Any]) -> Routing:
    """The routing of shard a's server (b and c are its peers)."""
    shards = ShardMap([A, B, C], local="a")
    return Routing(
        shards,
        Scripted(shards, script),
        "a1",
        max_wait_s=1.0,
        max_list=100,
        max_message_bytes=MAX_MESSAGE_BYTES,
        on_output=print,
    )


async def test_a_shard_refusing_a_listing_refuses_it_rather_than_look_unavailable() -> None:
    scoped = pb.ListTasksRequest(pools=["b1"])
    refused = router({("b", "ListTasks"): PermissionDenied("pools: this credential may not use pool 'b1'")})
    with pytest.raises(PermissionDenied, match="pool 'b1'"):
        await refused.list_tasks(CALLER, scoped)
    down = router({("b", "ListTasks"): Unavailable("shard 'b' is unavailable")})
    assert list((await down.list_tasks(CALLER, scoped)).unavailable_shards) == ["b"]
    slow = router(
        {
            ("b", "Snapshot"): DeadlineExceeded("too slow"),
            **dict.fromkeys([("a", "Snapshot"), ("c", "Snapshot")], pb.SnapshotResponse()),
        }
    )
    assert list((await slow.snapshot(CALLER)).unavailable_shards) == ["b"]


async def test_a_key_no_reachable_shard_holds_is_unavailable_while_a_shard_is_down() -> None:
    by_key = pb.GetRequest(task=pb.TaskRef(key="k"))
    missing = NotFound("task: no task 'k'")
    with pytest.raises(Unavailable, match=r"shard\(s\) 'c' could not be asked"):
        await router({("a", "Get"): missing, ("b", "Get"): missing, ("c", "Get"): DOWN}).get(CALLER, by_key)
    slow_and_down = on_shard_a({("b", "Get"): DeadlineExceeded("slow"), ("c", "Get"): DOWN})
    with pytest.raises(Unavailable, match=r"task.key: .* shard\(s\) 'b', 'c'"):
        await slow_and_down.ref_owner(CALLER, "task", by_key.task, NOWHERE_HERE)

    # Found on a shard that answered, or missing on every shard: as before.
    on_b = {("a", "Get"): missing, ("b", "Get"): pb.TaskInfo(id=2 << 56), ("c", "Get"): DOWN}
    assert (await router(on_b).get(CALLER, by_key)).id == 2 << 56
    assert await on_shard_a(on_b).ref_owner(CALLER, "task", by_key.task, NOWHERE_HERE) is B
    with pytest.raises(NotFound):
        await router({("a", "Get"): missing, ("b", "Get"): missing, ("c", "Get"): missing}).get(
            CALLER, by_key
        )


async def test_a_shard_refusing_a_key_lookup_refuses_it_rather_than_say_not_found() -> None:
    """A shard that will not answer this caller (a certificate caller a forwarder may not stand in for,
    a token it does not know) is not a shard without the task: its refusal is the answer."""
    by_key = pb.GetRequest(task=pb.TaskRef(key="k"))
    refused = FailedPrecondition("shard 'b' must be called directly by a client-certificate caller")
    answers = {("a", "Get"): NotFound("task: no task 'k'"), ("b", "Get"): refused, ("c", "Get"): DOWN}
    with pytest.raises(FailedPrecondition, match="called directly"):
        await router(answers).get(CALLER, by_key)


async def test_a_key_two_shards_hold_is_refused_naming_both_and_how_to_name_the_pool() -> None:
    """Never settled by whichever shard answers first: from a router, and from a shard holding it too."""
    by_key = pb.GetRequest(task=pb.TaskRef(key="k"))
    both: dict[tuple[str, str], object] = {
        ("a", "Get"): pb.TaskInfo(id=1 << 56, pool="a1"),
        ("b", "Get"): pb.TaskInfo(id=2 << 56, pool="b1"),
    }
    both[("c", "Get")] = NotFound("task: no task 'k'")
    for lookup in (
        router(both).get(CALLER, by_key),
        on_shard_a(both).ref_owner(CALLER, "task", by_key.task, Here(held={"k": 1 << 56})),
    ):
        with pytest.raises(FailedPrecondition) as refused:
            await lookup
        message = refused.value.message
        assert f"{1 << 56} in pool 'a1' (shard 'a')" in message and f"{2 << 56} in pool 'b1'" in message
        assert POOL_KEY in message and "query parameter 'pool'" in message, message


async def test_a_key_is_looked_up_in_the_stores_only_when_no_shard_holds_it() -> None:
    """A finished task whose key no longer deduplicates is found by a plain Get; a task holding the key
    (asked for first, by probe) wins over it, as the newest task of a key does on one server."""
    by_key = pb.TaskRef(key="k")
    missing = NotFound("task.key: no task holds key 'k'")
    stored_on_b = {("b", "Probe"): missing, ("b", "Get"): pb.TaskInfo(id=2 << 56, pool="b1")}
    stored_on_b |= {("c", "Probe"): missing, ("c", "Get"): NotFound("task: no task 'k'")}
    routing = on_shard_a(stored_on_b)
    assert await routing.ref_owner(CALLER, "task", by_key, NOWHERE_HERE) is B
    assert await routing.ref_owner(CALLER, "task", by_key, Here(held={"k": 1 << 56})) is None
    with pytest.raises(FailedPrecondition, match="held by 2 tasks"):  # two finished ones: still ambiguous
        await routing.ref_owner(CALLER, "task", by_key, Here(stored={"k": 1 << 56}))
    # A holder of a pool the caller may not see (the probe's ALREADY_EXISTS) is no answer to a lookup.
    hidden = {**stored_on_b, ("b", "Probe"): AlreadyExists("task.key: key 'k' is held by a task outside")}
    assert await on_shard_a(hidden).ref_owner(CALLER, "task", by_key, NOWHERE_HERE) is B


async def test_a_named_pool_sends_a_lookup_to_its_shard_alone() -> None:
    scripted = router({("b", "Get"): pb.TaskInfo(id=2 << 56, pool="b1")})
    assert (await scripted.get(CALLER, pb.GetRequest(task=pb.TaskRef(key="k")), pool="b1")).id == 2 << 56
    peers = scripted.routing.peers
    assert isinstance(peers, Scripted)
    assert peers.sent == [("b", "Get", ((POOL_KEY, "b1"),), False)]
    with pytest.raises(NotFound, match="pool: unknown pool 'nope'"):
        await scripted.get(CALLER, pb.GetRequest(task=pb.TaskRef(key="k")), pool="nope")
    scoped = Principal(Role.CLIENT, pools=frozenset({"a1"}))
    with pytest.raises(PermissionDenied, match="pool: this credential may not use pool 'b1'"):
        await scripted.cancel(scoped, pb.CancelRequest(task=pb.TaskRef(key="k")), pool="b1")


async def test_a_submitted_key_held_on_another_shard_is_its_duplicate_or_refused() -> None:
    """Keys are one namespace across shards: a key another shard holds for this caller is answered as
    that task's duplicate; held there by a pool outside the caller's pools, the submission is refused;
    a shard that cannot be asked blocks only a caller that may not use all of its pools."""
    keys = [("task", "k")]
    held = on_shard_a({("b", "Probe"): pb.TaskInfo(id=2 << 56, pool="b1"), ("c", "Get"): NotFound("no")})
    assert {k: (s.name, t.id) for k, (s, t) in (await held.held_elsewhere(CALLER, keys)).items()} == {
        "k": ("b", 2 << 56)
    }
    peers = held.peers
    assert isinstance(peers, Scripted)
    assert {(shard, extra, last_hop) for shard, _, extra, last_hop in peers.sent} == {
        (name, ((KEY_PROBE_KEY, "1"),), True) for name in ("b", "c")
    }
    hidden = on_shard_a({("b", "Probe"): AlreadyExists("held outside"), ("c", "Get"): NotFound("no")})
    with pytest.raises(PermissionDenied, match=r"task.key: key 'k' is held by a task outside"):
        await hidden.held_elsewhere(CALLER, keys)

    c_down = on_shard_a({("b", "Get"): NotFound("no"), ("c", "Get"): DOWN})
    assert await c_down.held_elsewhere(CALLER, keys) == {}  # may use every pool: passed over
    may_use_c = Principal(Role.CLIENT, pools=frozenset({"a1", "c1"}))
    assert await c_down.held_elsewhere(may_use_c, keys) == {}
    only_a1 = Principal(Role.CLIENT, pools=frozenset({"a1"}))
    with pytest.raises(Unavailable, match="shard 'c' could not be asked") as refused:
        await c_down.held_elsewhere(only_a1, keys)
    assert (NOT_RECEIVED_KEY, "1") in refused.value.metadata  # nothing was admitted: a router may retry

    on_two = on_shard_a({("b", "Get"): pb.TaskInfo(id=2 << 56), ("c", "Get"): pb.TaskInfo(id=3 << 56)})
    with pytest.raises(FailedPrecondition, match="held by 2 tasks"):
        await on_two.held_elsewhere(CALLER, keys)


class Part:
    """One shard's Watch stream in a fan-out: it opens or fails with ``fails``, then gives ``events``."""

    def __init__(self, fails: ApiError | None = None, events: tuple[pb.StatusEvent, ...] = ()) -> None:
        self.fails = fails
        self.events = list(events)
        self.closed = False

    async def open(self) -> None:
        if self.fails is not None:
            raise self.fails

    async def __anext__(self) -> pb.StatusEvent:
        if self.events:
            return self.events.pop(0)
        await asyncio.Event().wait()  # a quiet shard
        raise AssertionError("unreachable")

    async def aclose(self) -> None:
        self.closed = True


async def test_a_shard_refusing_a_watch_refuses_it_and_one_that_is_down_is_named() -> None:
    parts = [Part(), Part(PermissionDenied("pools: this credential may not use pool 'b1'")), Part(DOWN)]
    refused = MergedWatch(list(zip((A, B, C), parts, strict=True)))
    with pytest.raises(PermissionDenied, match="pool 'b1'"):
        await refused.open()
    assert all(part.closed for part in parts)  # nothing stays subscribed

    all_down = MergedWatch([(B, Part(DeadlineExceeded("too slow"))), (C, Part(DOWN))])
    with pytest.raises(Unavailable, match=r"no shard could be watched: shard\(s\) 'b', 'c'"):
        await all_down.open()

    watch = MergedWatch([(A, Part(events=(pb.StatusEvent(id=1),))), (C, Part(DOWN))])
    await watch.open()
    assert watch.unavailable_shards == ("c",)
    assert (await anext(watch)).id == 1
    await watch.aclose()


class SlowToOpen(Part):
    """A shard whose stream opens only when the test says so."""

    def __init__(self) -> None:
        super().__init__()
        self.opened = asyncio.Event()

    async def open(self) -> None:
        await self.opened.wait()


class Broken(Part):
    """A shard stream that fails with something other than an ApiError after opening."""

    async def __anext__(self) -> pb.StatusEvent:
        raise RuntimeError("metadata could not be decoded")


async def test_a_shard_that_opened_is_read_while_another_is_still_opening() -> None:
    """Its events are taken at once, not left to pile up in its own bounded buffer until the slowest
    shard opens (up to the forwarding timeout), which ended busy watches with DATA_LOSS."""
    fast = Part(events=tuple(pb.StatusEvent(id=i) for i in range(1, 4)))
    slow = SlowToOpen()
    watch = MergedWatch([(A, fast), (B, slow)])
    opening = asyncio.create_task(watch.open())
    for _ in range(20):  # let every runnable task run until it blocks; no clock involved
        await asyncio.sleep(0)
    assert not opening.done() and fast.events == []  # all three taken while b still opens
    slow.opened.set()
    await opening
    assert [(await anext(watch)).id for _ in range(3)] == [1, 2, 3]
    await watch.aclose()


async def test_a_shard_stream_failing_unexpectedly_ends_the_watch_naming_it() -> None:
    watch = MergedWatch([(A, Part()), (B, Broken())])
    await watch.open()
    with pytest.raises(ApiError, match="shard 'b': its watch stream failed") as failed:
        await anext(watch)
    assert failed.value.code == "internal"
    await watch.aclose()
