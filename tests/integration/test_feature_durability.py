"""Recurring schedules and blocked dependents are committed before they are acknowledged: with SQLite
they survive a crash (SIGKILL right after the answer) and the new leader picks up where the old one
stopped. (The memory store keeps nothing across a restart, by design.)"""

from __future__ import annotations

import asyncio
from datetime import datetime
from pathlib import Path

import pytest

from cronoq.client import Client, Lease

from .helpers import durable_config, sqlite_store, toml_table, worker
from .serverproc import new_server

pytestmark = pytest.mark.asyncio

GPU = toml_table("[resources]", kind="semaphore", name="gpu", permits=1)


def occurrence_start(key: str) -> float:
    """The start of a recurring occurrence from its key ``prefix@YYYY-MM-DDTHH:MM:SSZ``."""
    return datetime.fromisoformat(key.partition("@")[2].replace("Z", "+00:00")).timestamp()


async def test_schedules_and_blocked_dependents_survive_a_crash(tmp_path: Path) -> None:
    server = new_server(tmp_path / "a", durable_config(sqlite_store(tmp_path / "cronoq.db")) + GPU)
    await asyncio.to_thread(server.start)
    try:
        async with Client(server.target) as client:
            await client.add_recurring("yearly", "0 0 1 1 *", b"y", key="new-year", tz="Europe/Berlin")
            await client.add_recurring("ticker", "* * * * * *", b"t", key="tick", overlap="allow")
            parent = await client.submit(b"p", key="parent", resources={"gpu": 1})
            child = await client.submit(b"c", key="child", after="parent", resources={"gpu": 1})
            before = {s.name: s for s in await client.list_recurring()}
        server.kill()  # no shutdown: only what was committed before each answer is left

        await asyncio.to_thread(server.start)
        async with Client(server.target) as client:
            after = {s.name: s for s in await client.list_recurring()}
            assert set(after) == {"yearly", "ticker"}
            assert after["yearly"] == before["yearly"]  # same cron, zone, next start and occurrence
            assert after["yearly"].tz == "Europe/Berlin"
            occurrence = await client.get(after["yearly"].last_task_id or 0)
            assert occurrence.status == "scheduled" and (occurrence.key or "").startswith("new-year@")
            assert (await client.get("child")).status == "blocked"
            assert (await client.get("parent")).id == parent.id

            restarted = datetime.now().timestamp()
            ticks_after_restart = asyncio.Event()
            ran: list[str] = []

            async def handler(lease: Lease) -> str:
                key = lease.key or ""
                ran.append(key)
                if key.startswith("tick@") and occurrence_start(key) > restarted:
                    ticks_after_restart.set()
                return key

            async with worker(server.target, handler, slots=4):
                assert (await client.wait(child.id, timeout=15)).status == "succeeded"
                await asyncio.wait_for(ticks_after_restart.wait(), 10)  # the schedule kept running
            assert ran.index("parent") < ran.index("child")
            assert await client.remove_recurring("ticker")

        await asyncio.to_thread(server.stop)  # a clean restart: the removal was committed too
        await asyncio.to_thread(server.start)
        async with Client(server.target) as client:
            assert [s.name for s in await client.list_recurring()] == ["yearly"]
    finally:
        await asyncio.to_thread(server.stop)
