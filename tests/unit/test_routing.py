"""Routing decisions that depend on what the other shards answered (``cronoq.routing.Routing``), from a
router and from a shard server, with shards scripted behind :class:`~cronoq.forward.Peers`."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from cronoq.auth import Authenticator, Principal, Role
from cronoq.errors import (
    ApiError,
    DeadlineExceeded,
    FailedPrecondition,
    NotFound,
    PermissionDenied,
    Unavailable,
)
from cronoq.forward import Peers
from cronoq.routing import MergedWatch, Routing
from cronoq.shards import Shard, ShardMap
from cronoq.v1 import cronoq_pb2 as pb
from router.service import RouterService

A = Shard("a", 1, "http://127.0.0.1:1", frozenset({"a1"}))
B = Shard("b", 2, "http://127.0.0.1:2", frozenset({"b1"}))
C = Shard("c", 3, "http://127.0.0.1:3", frozenset({"c1"}))
CALLER = Principal(Role.CLIENT)
DOWN = Unavailable("shard 'c' is unavailable")
MAX_MESSAGE_BYTES = 4 * 1024 * 1024


class Scripted(Peers):
    """Peers whose shards answer each method from a script: a response, or an error they fail with."""

    def __init__(self, shards: ShardMap, script: dict[tuple[str, str], Any]) -> None:
        super().__init__(shards, insecure_peer_http=False, timeout=1.0)
        self.script = script

    async def call(
        self,
        shard: Shard,
        service: str,
        method: str,
        request: Any,
        caller: Principal,
        *,
        wait: float = 0.0,
        budget: float | None = None,
    ) -> tuple[Any, str | None]:
        answer = self.script[(shard.name, method)]
        if isinstance(answer, ApiError):
            raise answer
        return answer, None


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

    def nowhere_here(key: str) -> bool:
        return False

    with pytest.raises(Unavailable, match=r"shard\(s\) 'c' could not be asked"):
        await router({("a", "Get"): missing, ("b", "Get"): missing, ("c", "Get"): DOWN}).get(CALLER, by_key)
    slow_and_down = on_shard_a({("b", "Get"): DeadlineExceeded("slow"), ("c", "Get"): DOWN})
    with pytest.raises(Unavailable, match=r"task.key: .* shard\(s\) 'b', 'c'"):
        await slow_and_down.ref_owner(CALLER, "task", by_key.task, nowhere_here)

    # Found on a shard that answered, or missing on every shard: as before.
    on_b = {("a", "Get"): missing, ("b", "Get"): pb.TaskInfo(id=2 << 56), ("c", "Get"): DOWN}
    assert (await router(on_b).get(CALLER, by_key)).id == 2 << 56
    assert await on_shard_a(on_b).ref_owner(CALLER, "task", by_key.task, nowhere_here) is B
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
