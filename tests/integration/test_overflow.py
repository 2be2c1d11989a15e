"""Pool bounds against a real server: overflow = wait parks submissions, reject refuses them."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from cronoq.client import Client, ClientError, Lease

from .helpers import worker
from .serverproc import running_server

CONFIG = """
[limits]
request_timeout_s = 3

[[pools]]
name = "default"
max_pending = 2
overflow = "wait"

[[pools]]
name = "strict"
max_pending = 1
overflow = "reject"
"""

pytestmark = pytest.mark.asyncio


async def test_wait_parks_until_space_frees_and_times_out_when_it_never_does(tmp_path: Path) -> None:
    with running_server(tmp_path, CONFIG) as server:
        async with Client(server.target) as client:
            await client.submit(b"1")
            await client.submit(b"2")
            # Full and nobody serving: the parked submission gives up after request_timeout_s.
            with pytest.raises(ClientError) as err:
                await client.submit(b"3")
            assert err.value.code == "resource_exhausted" and "stayed full" in err.value.message
            assert (await client.snapshot()).totals.submitted == 2

            parked = asyncio.create_task(client.submit(b"3"))

            async def handler(lease: Lease) -> None:
                return None

            async with worker(server.target, handler):
                third = await asyncio.wait_for(parked, 10)
                assert (await client.wait(third.id, timeout=10)).status == "succeeded"


async def test_reject_refuses_at_once(tmp_path: Path) -> None:
    with running_server(tmp_path, CONFIG) as server:
        async with Client(server.target) as client:
            await client.submit(b"1", pool="strict")
            with pytest.raises(ClientError) as err:
                await client.submit(b"2", pool="strict")
            assert err.value.code == "resource_exhausted" and err.value.retryable
            assert (await client.snapshot()).totals.submitted == 1
