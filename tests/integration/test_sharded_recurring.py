"""Recurring schedules in a sharded cluster (two shard processes and a router, on loopback): a schedule
lives on the shard owning its template's pool (adding it anywhere forwards it there), removal asks
every shard, and listings fan out and name the shards that did not answer."""

from __future__ import annotations

import asyncio
from pathlib import Path

import aiohttp
import pytest

from cronoq.client import Client
from cronoq.cluster.shards import SHARD_SHIFT
from cronoq.errors import NotFound, Unavailable

from .shardproc import ShardSpec, cluster_tables, router_process, running_cluster

pytestmark = pytest.mark.asyncio

SHARDS = (ShardSpec("a", 1, ("a1",)), ShardSpec("b", 2, ("b1",)))


async def test_recurring_schedules_across_shards(tmp_path: Path) -> None:
    with running_cluster(tmp_path / "cluster", SHARDS) as procs:
        a, b = procs["a"], procs["b"]
        tables = cluster_tables(SHARDS, {name: f"http://{proc.target}" for name, proc in procs.items()})
        router = router_process(tmp_path / "router", tables)
        await asyncio.to_thread(router.start)
        try:
            async with (
                Client(a.target) as via_a,
                Client(router.target) as via_router,
                aiohttp.ClientSession() as http,
            ):
                await via_a.add_recurring("on-b", "0 0 * * *", b"x", pool="b1")  # forwarded to shard b
                await via_router.add_recurring("on-a", "0 0 * * *", b"x", pool="a1")
                await via_a.add_recurring("twice", "0 12 * * *", b"x", pool="a1")
                body = {"name": "twice", "cron": "0 12 * * *", "template": {"pool": "b1"}}
                async with http.post(f"{router.http}/v1/recurring", json=body) as resp:
                    assert resp.status == 200, await resp.text()
                with pytest.raises(NotFound):
                    await via_router.add_recurring("nowhere", "0 0 * * *", pool="nope")

                for client in (via_a, via_router):
                    listed = await client.list_recurring()
                    assert sorted((s.name, s.pool) for s in listed) == [
                        ("on-a", "a1"),
                        ("on-b", "b1"),
                        ("twice", "a1"),
                        ("twice", "b1"),
                    ]
                    # Each schedule's occurrences are created by the shard that owns its pool.
                    for s in listed:
                        assert (s.last_task_id or 0) >> SHARD_SHIFT == (1 if s.pool == "a1" else 2)

                # A name is removed from every shard that has it.
                assert await via_router.remove_recurring("twice")
                assert not await via_a.remove_recurring("twice")
                assert sorted(s.name for s in await via_a.list_recurring()) == ["on-a", "on-b"]

                # A shard that does not answer is named, not fatal, for listings; a removal that could
                # not ask it says so rather than answer "not removed".
                await asyncio.to_thread(b.stop)
                async with http.get(f"{router.http}/v1/recurring") as resp:
                    page = await resp.json()
                assert [s["name"] for s in page["schedules"]] == ["on-a"]
                assert page["unavailable_shards"] == ["b"]
                with pytest.raises(Unavailable, match="shard"):
                    await via_a.remove_recurring("on-b")
                assert await via_a.remove_recurring("on-a")  # removed here: shard b cannot change that
        finally:
            await asyncio.to_thread(router.stop)
