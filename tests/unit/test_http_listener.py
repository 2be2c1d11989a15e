"""cronoq.api.http_listener: the cap fitted to the open-file limit, and the one aiohttp internal the
listener reads (whether a connection waits for a request head), pinned on a live aiohttp server so that
an aiohttp upgrade that changes it fails here, by name, rather than as timers that never fire."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable

import pytest
from aiohttp import web

from cronoq.api.http_listener import HttpBounds, HttpListeners, Listener, waiting_for_request
from cronoq.config.model import ServerSection
from tests.ports import free_port

SERVER = ServerSection(http_max_connections=1000, http_header_timeout_s=10, http_idle_timeout_s=75)


@pytest.mark.parametrize(
    ("open_files", "listeners", "cap"),
    [
        (None, 2, 1000),  # unlimited
        (1_048_576, 2, 1000),
        (1024, 1, 512),  # half of the limit for the HTTP listeners together
        (1024, 2, 256),
        (3, 2, 1),  # never 0
    ],
)
def test_the_cap_fits_half_the_open_file_limit(open_files: int | None, listeners: int, cap: int) -> None:
    bounds = HttpBounds.from_config(SERVER, listeners, open_files)
    assert bounds == HttpBounds(cap, 10, 75)


@pytest.fixture
async def listener() -> AsyncIterator[tuple[Listener, int, asyncio.Event, asyncio.Event]]:
    """A listener whose only route, ``/hold``, answers once ``release`` is set (``entered`` is set
    while it waits)."""
    entered, release = asyncio.Event(), asyncio.Event()

    async def hold(request: web.Request) -> web.Response:
        entered.set()
        await release.wait()
        return web.Response(text="done")

    app = web.Application()
    app.router.add_get("/hold", hold)
    listeners = HttpListeners(HttpBounds(10, 10, 75))
    port = free_port()
    served = await listeners.open("server.http_addr", f"127.0.0.1:{port}", app, None)
    try:
        yield served, port, entered, release
    finally:
        release.set()
        await listeners.close()


async def until(condition: Callable[[], bool]) -> None:
    """Poll the server's state (in this process) until ``condition`` holds, for at most 5 s."""
    deadline = asyncio.get_running_loop().time() + 5
    while not condition():
        assert asyncio.get_running_loop().time() < deadline, "not within 5 s"
        await asyncio.sleep(0.01)


async def test_a_connection_waits_for_a_request_head_only_between_requests(
    listener: tuple[Listener, int, asyncio.Event, asyncio.Event],
) -> None:
    served, port, entered, release = listener
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        await until(lambda: len(served.connections) == 1 and waiting_for_request(served.connections[0]))
        (conn,) = served.connections
        writer.write(b"GET /hold HTTP/1.1\r\nHost: localhost\r\n\r\n")
        await asyncio.wait_for(entered.wait(), 5)
        assert not waiting_for_request(conn)  # a request in progress
        release.set()
        assert (await asyncio.wait_for(reader.readuntil(b"done"), 5)).startswith(b"HTTP/1.1 200")
        await until(lambda: waiting_for_request(conn))  # kept alive, waiting for the next one
        assert served.open == 1
    finally:
        writer.close()
