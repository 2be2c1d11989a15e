"""The life of a server process (``cronoq-server``, ``cronoq-router``): start, serve until SIGTERM or
SIGINT, then shut down gracefully."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Awaitable, Callable


async def serve_until_signalled(
    start: Callable[[], Awaitable[None]],
    stop: Callable[[], Awaitable[None]],
    ended: asyncio.Event | None = None,
) -> None:
    """Start, then stop on SIGTERM or SIGINT, or when the server sets ``ended`` itself (a fatal
    failure it reports in its own way)."""
    await start()
    stopping = ended if ended is not None else asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stopping.set)
    await stopping.wait()
    await stop()
