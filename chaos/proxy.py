"""TCP proxies between each shard's servers and Postgres, which the run cuts, slows or makes lossy.

Each shard's servers reach Postgres through a proxy of their own (their ``DATABASE_URL`` names the
proxy's port), so one shard's link can fail while the other's works. The proxies run on an event loop
in a thread of their own: the run's other work (starting processes, which blocks) never delays the bytes
they carry. A link is:

- ``open``: bytes pass as they come;
- ``cut``: a partition. Nothing passes either way and new connections get no further than the proxy,
  but nothing is closed: when the cut heals, what waited flows on, as TCP delivers what it retransmits
  across a partition that healed before it gave up. A side that closed meanwhile is closed across once
  the cut heals;
- ``slow``: every chunk waits ``delay_ms`` before it passes, in order;
- ``lossy``: a chunk is held back 0.2 to 1 s with probability ``stall`` (a retransmission), and a
  connection is reset with probability ``reset`` per chunk (both ends see it end at once).
"""

from __future__ import annotations

import asyncio
import contextlib
import random
import threading
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

T = TypeVar("T")
CHUNK = 65536


class _Reset(Exception):
    """A lossy link drops this connection."""


@dataclass(slots=True)
class LinkState:
    mode: str = "open"
    delay_s: float = 0.0
    stall: float = 0.0
    reset: float = 0.0


class LinkProxy:
    """One listening port that forwards each connection to ``upstream``, through the link's state."""

    def __init__(self, name: str, upstream: tuple[str, int], seed: int) -> None:
        self.name = name
        self.upstream = upstream
        self.state = LinkState()
        self.port = 0
        self._flowing = asyncio.Event()
        self._flowing.set()
        self._rng = random.Random(seed)
        self._server: asyncio.Server | None = None
        self._connections: set[asyncio.Task[None]] = set()

    async def start(self, port: int = 0) -> None:
        """Listen on loopback ``port`` (0: one the system picks, then in :attr:`port`)."""
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", port)
        self.port = self._server.sockets[0].getsockname()[1]

    def apply(self, state: LinkState) -> None:
        self.state = state
        if state.mode == "cut":
            self._flowing.clear()
        else:
            self._flowing.set()

    async def close(self) -> None:
        if self._server is not None:
            self._server.close()
        self._flowing.set()
        for task in list(self._connections):
            task.cancel()
        await asyncio.gather(*self._connections, return_exceptions=True)

    async def _serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._connections.add(task)
        upstream_w: asyncio.StreamWriter | None = None
        try:
            await self._flowing.wait()  # across a cut, a new connection reaches nothing
            upstream_r, upstream_w = await asyncio.open_connection(*self.upstream)
            ends = (client_w, upstream_w)
            await asyncio.gather(
                self._pipe(client_r, upstream_w, ends), self._pipe(upstream_r, client_w, ends)
            )
        except (OSError, asyncio.CancelledError):
            pass
        finally:
            for writer in (client_w, upstream_w):
                if writer is not None:
                    writer.transport.abort()
            self._connections.discard(task)

    async def _pipe(
        self,
        reader: asyncio.StreamReader,
        writer: asyncio.StreamWriter,
        ends: tuple[asyncio.StreamWriter, asyncio.StreamWriter],
    ) -> None:
        try:
            while data := await reader.read(CHUNK):
                await self._pass()
                writer.write(data)
                await writer.drain()
            await self._flowing.wait()  # a close crosses a cut link once it heals
            if writer.can_write_eof():
                writer.write_eof()
        except _Reset:
            for end in ends:
                end.transport.abort()
        except OSError:
            for end in ends:
                end.transport.abort()

    async def _pass(self) -> None:
        """Hold a chunk as the link's state says, or reset its connection."""
        await self._flowing.wait()
        state = self.state
        if state.mode == "slow":
            await asyncio.sleep(state.delay_s)
        elif state.mode == "lossy":
            if self._rng.random() < state.reset:
                raise _Reset
            if self._rng.random() < state.stall:
                await asyncio.sleep(self._rng.uniform(0.2, 1.0))
        await self._flowing.wait()


class Proxies:
    """The run's link proxies, one per name, on a loop in a thread of their own; every method may be
    called from any thread."""

    def __init__(self, upstream: tuple[str, int], names: list[str], seed: int) -> None:
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="chaos-proxies", daemon=True)
        self._thread.start()
        self.links = {name: LinkProxy(name, upstream, seed + number) for number, name in enumerate(names)}
        for link in self.links.values():
            self._run(link.start())

    def port(self, name: str) -> int:
        return self.links[name].port

    def set(self, name: str, mode: str, *, delay_ms: float = 0, stall: float = 0, reset: float = 0) -> None:
        """Put the link in ``mode``; it holds when this returns."""
        state = LinkState(mode, delay_ms / 1000, stall, reset)
        self._run(self._apply(self.links[name], state))

    def heal(self, name: str) -> None:
        self.set(name, "open")

    def close(self) -> None:
        with contextlib.suppress(RuntimeError):
            for link in self.links.values():
                self._run(link.close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(10)
        self._loop.close()

    @staticmethod
    async def _apply(link: LinkProxy, state: LinkState) -> None:
        link.apply(state)

    def _run(self, coroutine: Coroutine[Any, Any, T]) -> T:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(30)
