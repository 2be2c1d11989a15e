"""Pool bounds against a real server: overflow = wait parks submissions, reject refuses them."""

from __future__ import annotations

import asyncio
import signal
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


async def test_a_parked_submission_is_refused_unavailable_when_the_server_shuts_down(tmp_path: Path) -> None:
    """Shutdown (like a step-down) stops admitting: a submission parked for room is told UNAVAILABLE
    (retryable, and never admitted) at once, not CANCELLED when the listener closes under it."""
    body = CONFIG.replace("request_timeout_s = 3", "request_timeout_s = 60")
    with running_server(tmp_path, body) as server:
        async with Client(server.target) as client:
            await client.submit(b"1")
            await client.submit(b"2")
            parked = asyncio.create_task(client.submit(b"3", key="parked"))
            deadline = asyncio.get_running_loop().time() + 10
            while server.metric("cronoq_requests_in_flight") != 1:  # the Submit waits for room
                assert asyncio.get_running_loop().time() < deadline, "the Submit never reached the server"
                await asyncio.sleep(0.02)
            server.signal(signal.SIGTERM)
            with pytest.raises(ClientError) as err:
                await asyncio.wait_for(parked, 20)
        assert err.value.code == "unavailable" and "shutting down" in err.value.message, err.value
        assert server.wait() == 0
