"""The webhook scaler against a real server: it POSTs ``{"pool", "desired"}`` with the bearer token to a
receiver (an aiohttp app in the test) whenever the autoscaler's target changes; a failed request is
logged without the token and the next change is sent all the same."""

from __future__ import annotations

import asyncio
import contextlib
import re
import urllib.request
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from cronoq.client import Client, task
from tests.ports import free_port

from .serverproc import ServerProcess, new_server

pytestmark = pytest.mark.asyncio

SCALER_TOKEN = "scaler-token-0123456789abcdef"


class Receiver:
    """An HTTP endpoint that records each webhook call; the first one is answered 500."""

    def __init__(self) -> None:
        self.calls: list[tuple[str | None, Any]] = []
        self.changed = asyncio.Event()

    async def hook(self, request: web.Request) -> web.Response:
        self.calls.append((request.headers.get("Authorization"), await request.json()))
        self.changed.set()
        if len(self.calls) == 1:
            return web.Response(status=500, text="not now")
        return web.json_response({"ok": True})

    async def until(self, predicate: Any, timeout: float = 20.0) -> None:
        """Wait (on calls arriving, not on a clock) until ``predicate(calls)`` holds."""

        async def wait() -> None:
            while not predicate(self.calls):
                self.changed.clear()
                await self.changed.wait()

        await asyncio.wait_for(wait(), timeout)


@contextlib.asynccontextmanager
async def receiving() -> AsyncIterator[tuple[Receiver, int]]:
    receiver = Receiver()
    app = web.Application()
    app.router.add_post("/hook", receiver.hook)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield receiver, port
    finally:
        await runner.cleanup()


def desired_metric(server: ServerProcess) -> int:
    with urllib.request.urlopen(f"{server.http}/metrics", timeout=5) as response:
        text = response.read().decode()
    match = re.search(r'^cronoq_pool_desired_workers\{pool="default"\} (\S+)$', text, re.MULTILINE)
    assert match is not None, text
    return int(float(match.group(1)))


async def test_desired_changes_are_posted_with_the_token(tmp_path: Path) -> None:
    async with receiving() as (receiver, port):
        config = f"""
[[pools]]
name = "default"
min = 1
max = 40
autoscale = true
drain_time_s = 1
scaler = {{ kind = "webhook", url = "http://127.0.0.1:{port}/hook", token_env = "SCALER_TOKEN" }}
"""
        server = new_server(tmp_path, config, env={"SCALER_TOKEN": SCALER_TOKEN})
        await asyncio.to_thread(server.start)  # blocking: the receiver must keep running meanwhile
        try:
            # A new leader states the current target once (min, nothing queued); it is refused (500).
            await receiver.until(lambda calls: len(calls) >= 1)
            assert receiver.calls[0] == (f"Bearer {SCALER_TOKEN}", {"pool": "default", "desired": 1})

            # Queue pressure (20 tasks, no worker) raises the target; each change is posted.
            async with Client(server.target) as client:
                await client.submit_batch([task(str(i)) for i in range(20)])
            await receiver.until(lambda calls: any(body["desired"] > 1 for _, body in calls[1:]))
            for authorization, body in receiver.calls:
                assert authorization == f"Bearer {SCALER_TOKEN}"
                assert set(body) == {"pool", "desired"} and body["pool"] == "default"
            # The exported metric is the same target; the receiver hears that value too.
            exported = await asyncio.to_thread(desired_metric, server)
            assert exported > 1
            await receiver.until(lambda calls: any(body["desired"] == exported for _, body in calls))

            logs = server.logs()
            assert "scaler_webhook_failed" in logs and "scaler_webhook_sent" in logs
            assert SCALER_TOKEN not in logs
        finally:
            await asyncio.to_thread(server.stop)
