"""The watcher: every server's role, from its ``/readyz``, polled every ``interval`` seconds.

``/readyz`` answers 200 only on a server that leads its shard, and a server leads only after it took
over (bumping the store's epoch), so a server seen ``standby`` or ``down`` and then ``leading`` took
over in between: the checker's stale-leader rule rests on that. A poll that gets no answer within
``PROBE_TIMEOUT_S`` is ``silent`` (a paused or hung process): it says nothing of the role, so a
server seen leading, then silent, then leading again did not take over.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass

from .history import HistoryWriter

PROBE_TIMEOUT_S = 0.5


@dataclass(slots=True)
class Seen:
    state: str = "unknown"
    at: float = 0.0  # the last poll that showed ``state``
    since: float = 0.0  # when it was first seen in ``state``


async def probe(address: str, timeout: float = PROBE_TIMEOUT_S) -> str:
    """``leading``, ``standby``, ``down`` or ``silent``: one ``GET /readyz`` of ``host:port``."""
    host, _, port = address.rpartition(":")
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(host, int(port))
            try:
                writer.write(f"GET /readyz HTTP/1.0\r\nHost: {address}\r\n\r\n".encode())
                status = await reader.readline()
            finally:
                writer.close()
    except TimeoutError:
        return "silent"
    except OSError:
        return "down"
    parts = status.split()
    if len(parts) >= 2 and parts[1] == b"200":
        return "leading"
    return "standby" if parts else "down"


async def scrape(address: str, token: str, name: str, timeout: float = 2.0) -> float | None:
    """The sum of every sample of the metric ``name`` on ``host:port``'s ``/metrics`` (None: no answer)."""
    host, _, port = address.rpartition(":")
    try:
        async with asyncio.timeout(timeout):
            reader, writer = await asyncio.open_connection(host, int(port))
            try:
                writer.write(
                    f"GET /metrics HTTP/1.0\r\nHost: {address}\r\nAuthorization: Bearer {token}\r\n\r\n".encode()
                )
                text = (await reader.read()).decode(errors="replace")
            finally:
                writer.close()
    except (OSError, TimeoutError):
        return None
    if not text.startswith("HTTP/1.") or text.split(None, 2)[1] != "200":
        return None
    samples = [line.rsplit(None, 1) for line in text.splitlines() if line.startswith(name)]
    return sum(float(value) for key, value in samples if key == name or key.startswith(name + "{"))


class RoleWatcher:
    """Polls the servers (name -> (shard, HTTP address)) and records each change of role."""

    def __init__(self, history: HistoryWriter, servers: dict[str, tuple[str, str]], interval: float = 0.2):
        self.history = history
        self.servers = servers
        self.interval = interval
        self.seen = {name: Seen() for name in servers}

    def leader(self, shard: str) -> str | None:
        """The server of ``shard`` seen leading most recently (two may answer 200 for a moment: a
        paused leader that resumed, before it finds it was deposed)."""
        leading = [
            (self.seen[name].since, name)
            for name, (of, _) in self.servers.items()
            if of == shard and self.seen[name].state == "leading"
        ]
        return max(leading)[1] if leading else None

    def standby(self, shard: str) -> str | None:
        waiting = [
            name
            for name, (of, _) in self.servers.items()
            if of == shard and self.seen[name].state == "standby"
        ]
        return waiting[0] if waiting else None

    async def poll(self) -> None:
        names = list(self.servers)
        states = await asyncio.gather(*(probe(self.servers[name][1]) for name in names))
        now = time.time()
        for name, state in zip(names, states, strict=True):
            seen = self.seen[name]
            if state != seen.state:
                self.history.write(
                    "role", now, server=name, shard=self.servers[name][0], state=state, since=seen.at or None
                )
                seen.since = now
            seen.state, seen.at = state, now

    async def run(self, stop: asyncio.Event) -> None:
        while not stop.is_set():
            await self.poll()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(stop.wait(), self.interval)
