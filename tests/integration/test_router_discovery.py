"""Leader discovery (``cronoq.cluster.discovery``, used by the router and by sharded servers) against real
server processes: it finds a shard's leader among its members, follows a handover within 2 s, skips
members that are down, and re-checks at once when a forwarded call failed."""

from __future__ import annotations

import asyncio
import signal
import time
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path

import pytest

from cronoq.cluster.discovery import LeaderFinder
from cronoq.cluster.shards import Shard, ShardMap
from tests.ports import free_port

from .helpers import durable_config, sqlite_store
from .serverproc import ServerProcess, leader_and_standby, new_server

pytestmark = pytest.mark.asyncio

# The shard's load-balanced address: what the finder answers while it knows no serving member.
SERVICE = "http://cronoq-shard.invalid:50051"
TAKEOVER_BUDGET_S = 2.0  # forwarded calls must work again within this of the new leader being ready


def url(server: ServerProcess) -> str:
    return f"http://{server.target}"


def shard_of(*members: str) -> Shard:
    return Shard("s", 1, SERVICE, frozenset({"default"}), members=members)


@asynccontextmanager
async def finder_for(shard: Shard, interval: float = 0.5) -> AsyncIterator[LeaderFinder]:
    finder = LeaderFinder(ShardMap([shard]), interval=interval)
    await finder.start()
    try:
        yield finder
    finally:
        async with asyncio.timeout(5.0):  # close() must end the loop even just after a wake-up
            await finder.close()


async def until(condition: Callable[[], bool], timeout: float) -> float:
    """Wait (bounded) until ``condition`` holds; returns the monotonic time it was first seen to."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"not within {timeout} s"
        await asyncio.sleep(0.01)
    return time.monotonic()


async def measure_takeover(finder: LeaderFinder, shard: Shard, new_leader: ServerProcess) -> float:
    """Seconds from ``new_leader``'s /readyz turning 200 to the finder answering it (negative when the
    finder saw its health turn SERVING first)."""
    found = asyncio.create_task(until(lambda: finder.endpoint(shard) == url(new_leader), 10.0))
    await asyncio.to_thread(new_leader.wait_probe, "/readyz", 200, 10.0)
    ready = time.monotonic()
    found_at = await asyncio.wait_for(found, ready + TAKEOVER_BUDGET_S + 1.0 - time.monotonic())
    return found_at - ready


async def test_follows_a_handover_within_2_s_and_skips_a_member_that_is_down(tmp_path: Path) -> None:
    nobody = f"http://127.0.0.1:{free_port()}"
    with leader_and_standby(tmp_path, durable_config(sqlite_store(tmp_path / "cronoq.db"))) as (
        leader,
        standby,
    ):
        shard = shard_of(nobody, url(leader), url(standby))
        async with finder_for(shard) as finder:
            assert await finder.wait_leader(shard, 5.0) == url(leader)
            assert finder.endpoint(shard) == url(leader)

            leader.signal(signal.SIGTERM)  # a clean shutdown hands the lease over at once
            took = await measure_takeover(finder, shard, standby)
            print(f"handover detected {took:+.3f} s after the new leader's /readyz turned 200")
            assert took < TAKEOVER_BUDGET_S
            assert leader.wait(10) == 0
            await asyncio.sleep(0.6)  # a further round, with two members now down, keeps the leader
            assert finder.endpoint(shard) == url(standby)


async def test_a_member_that_was_down_is_found_when_it_takes_over(tmp_path: Path) -> None:
    with leader_and_standby(tmp_path, durable_config(sqlite_store(tmp_path / "cronoq.db"))) as (
        leader,
        standby,
    ):
        shard = shard_of(url(leader), url(standby))
        async with finder_for(shard) as finder:
            assert await finder.wait_leader(shard, 5.0) == url(leader)
            standby.kill()
            await asyncio.sleep(6.0)  # long enough for gRPC's default reconnect backoff to grow
            assert finder.endpoint(shard) == url(leader)

            await asyncio.to_thread(standby.start, ready=False)
            leader.signal(signal.SIGTERM)
            took = await measure_takeover(finder, shard, standby)
            print(f"restarted member's takeover detected {took:+.3f} s after its /readyz turned 200")
            assert took < TAKEOVER_BUDGET_S


async def test_suspect_stops_using_the_member_at_once_and_checks_again_now(tmp_path: Path) -> None:
    with leader_and_standby(tmp_path, durable_config(sqlite_store(tmp_path / "cronoq.db"))) as (
        leader,
        standby,
    ):
        shard = shard_of(url(leader), url(standby))
        async with finder_for(shard, interval=30.0) as finder:  # only a wake-up can re-check in time
            assert await finder.wait_leader(shard, 5.0) == url(leader)
            finder.suspect(shard, url(leader))
            assert finder.endpoint(shard) == SERVICE  # the standby is not serving: back to the Service
            began = time.monotonic()
            assert await finder.wait_leader(shard, 5.0) == url(leader)
            print(f"re-check after suspect() found the leader in {time.monotonic() - began:.3f} s")

            await asyncio.sleep(0.2)  # that round is over: the loop waits out its interval
            finder.suspect(shard, url(standby))  # a member that is not the leader: nothing changes
            assert finder.endpoint(shard) == url(leader)
        # ... and close() just after that wake-up still ends the loop (asyncio.wait_for on 3.11 would
        # swallow the cancel and wait out the 30 s interval).


async def test_of_two_serving_members_the_one_that_switched_last_wins(tmp_path: Path) -> None:
    """Memory-store servers lead at once, so two of them make the overlap of a failover."""
    first, second = new_server(tmp_path / "a"), new_server(tmp_path / "b")
    first.start()
    try:
        shard = shard_of(url(first), url(second))
        async with finder_for(shard) as finder:
            assert await finder.wait_leader(shard, 5.0) == url(first)
            await asyncio.sleep(0.6)  # a round that finds the second member down
            await asyncio.to_thread(second.start)
            await until(lambda: finder.endpoint(shard) == url(second), 3.0)
            await asyncio.sleep(0.6)  # and it stays the leader while both serve
            assert finder.endpoint(shard) == url(second)
            second.kill()
            await until(lambda: finder.endpoint(shard) == url(first), 3.0)
    finally:
        first.stop()
        second.stop()


async def test_a_shard_without_a_serving_member_answers_its_endpoint() -> None:
    alone = Shard("alone", 2, "http://alone.invalid:50051", frozenset({"other"}))
    down = shard_of(f"http://127.0.0.1:{free_port()}")
    finder = LeaderFinder(ShardMap([alone, down]), interval=0.1)
    await finder.start()
    try:
        assert finder.endpoint(alone) == alone.endpoint
        assert await finder.wait_leader(alone, 0.0) == alone.endpoint  # nothing to wait for
        assert finder.endpoint(down) == SERVICE
        assert await finder.wait_leader(down, 0.5) is None
        assert (finder.endpoint(alone), finder.endpoint(down)) == (alone.endpoint, SERVICE)
    finally:
        await finder.close()
