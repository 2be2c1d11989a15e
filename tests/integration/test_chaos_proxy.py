"""The chaos suite's link proxy (``chaos/proxy.py``) over real sockets: it passes bytes both ways, holds
them (and a close) while cut and lets them through once healed, delays them when slow, and resets
connections when lossy. The cut is checked by order, never by a timeout: what was sent during the cut
must arrive after the heal."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Iterator

import pytest

from chaos.proxy import Proxies

pytestmark = pytest.mark.asyncio


class Upstream:
    """An echo server that notes when each chunk arrived; ``close_all`` closes its connections."""

    def __init__(self) -> None:
        self.arrivals: list[tuple[float, bytes]] = []
        self.writers: list[asyncio.StreamWriter] = []
        self.server: asyncio.Server | None = None

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.writers.append(writer)
        while data := await reader.read(1024):
            self.arrivals.append((time.monotonic(), data))
            writer.write(data)
            await writer.drain()
        writer.close()

    def close_all(self) -> None:
        for writer in self.writers:
            writer.close()


@pytest.fixture
async def upstream() -> AsyncIterator[tuple[Upstream, int]]:
    echo = Upstream()
    echo.server = await asyncio.start_server(echo.serve, "127.0.0.1", 0)
    yield echo, echo.server.sockets[0].getsockname()[1]
    echo.server.close()


@pytest.fixture
def proxies(upstream: tuple[Upstream, int]) -> Iterator[Proxies]:
    running = Proxies(("127.0.0.1", upstream[1]), ["a"], seed=1)
    try:
        yield running
    finally:
        running.close()


async def connect(proxies: Proxies) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    return await asyncio.open_connection("127.0.0.1", proxies.port("a"))


async def test_an_open_link_passes_bytes_both_ways(proxies: Proxies) -> None:
    reader, writer = await connect(proxies)
    writer.write(b"ping")
    assert await asyncio.wait_for(reader.readexactly(4), 10) == b"ping"
    writer.close()


async def test_a_cut_link_holds_bytes_and_closes_until_it_heals(
    proxies: Proxies, upstream: tuple[Upstream, int]
) -> None:
    echo, _ = upstream
    reader, writer = await connect(proxies)
    writer.write(b"one")
    assert await asyncio.wait_for(reader.readexactly(3), 10) == b"one"
    proxies.set("a", "cut")
    writer.write(b"two")
    await asyncio.sleep(0.3)  # room for the bytes to leak through a broken cut
    healed = time.monotonic()
    proxies.heal("a")
    assert await asyncio.wait_for(reader.readexactly(3), 10) == b"two"
    assert echo.arrivals[-1][1] == b"two" and echo.arrivals[-1][0] >= healed
    # A close from the far side crosses a cut link only once it heals, too.
    proxies.set("a", "cut")
    echo.close_all()
    await asyncio.sleep(0.3)
    assert not reader.at_eof()
    proxies.heal("a")
    assert await asyncio.wait_for(reader.read(), 10) == b""


async def test_a_slow_link_delays_each_chunk(proxies: Proxies) -> None:
    proxies.set("a", "slow", delay_ms=200)
    reader, writer = await connect(proxies)
    began = time.monotonic()
    writer.write(b"ping")
    assert await asyncio.wait_for(reader.readexactly(4), 10) == b"ping"
    assert time.monotonic() - began >= 0.4  # there and back: two chunks, each held 200 ms
    writer.close()


async def test_a_lossy_link_resets_connections(proxies: Proxies) -> None:
    proxies.set("a", "lossy", reset=1.0)
    reader, writer = await connect(proxies)
    writer.write(b"ping")
    with pytest.raises((ConnectionResetError, asyncio.IncompleteReadError)):
        await asyncio.wait_for(reader.readexactly(4), 10)
