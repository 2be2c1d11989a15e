"""The HTTP listeners of a server or router, with bounded connections (``[server]`` ``http_*`` keys).

aiohttp (3.14) bounds nothing a client can hold open before it sends a request: its keep-alive timer
closes a connection that has sent no complete request head only after ``keepalive_timeout`` (3,630 s by
default), however slowly the head trickles in, and a listener accepts connections until the process
runs out of file descriptors, after which nothing in the process can open one (not the probes' answers,
not the gRPC listener, not the store). So each listener here serves its application with its own
connection class (:class:`_Connection`), and:

- a connection must deliver a complete request head within ``http_header_timeout_s`` of being accepted,
  or of the first byte of its next request on a kept-alive connection (counted from the first byte, as
  Go's ``ReadHeaderTimeout``, so that a slow head cannot shelter behind the idle timeout);
- a kept-alive connection may stay idle for ``http_idle_timeout_s`` after its last response;
- a listener holds at most ``http_max_connections`` connections. A connection accepted beyond that
  makes room by closing the one that has waited longest for a request head (a slow or idle client:
  a slowloris connection never completes one), so probes and real requests, which send their head at
  once, still get in; only when every open connection is busy with a request is the new one refused,
  with a 503 that says it was not received (safe to retry).

Busy connections are never closed here. A request in progress is bounded by ``limits.request_timeout_s``
(see :mod:`cronoq.api.limits`; ``/v1/watch`` streams by ``limits.max_concurrent_streams`` instead), a
body the handler did not read by aiohttp's lingering time (10 s). Writing an answer to a client that
does not read it is not bounded; the kernel's buffers take the answers an unauthenticated client can
ask for (the OpenAPI document is 32 KB). Every close is counted by reason in
``cronoq_http_connections_closed_total{listener,reason}``.

A connection is "waiting for a request head" exactly when aiohttp's request loop waits for its next
message; aiohttp has no public flag for that, so :func:`waiting_for_request` reads the future that loop
waits on, as aiohttp's own keep-alive timer does (tests/unit/test_http_listener.py pins it).
"""

from __future__ import annotations

import asyncio
import json
import ssl
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Final

from aiohttp import web
from aiohttp.web_protocol import RequestHandler
from aiohttp.web_request import BaseRequest
from aiohttp.web_response import StreamResponse
from prometheus_client.metrics_core import Metric

from cronoq.config.model import ServerSection
from cronoq.logs import get_logger
from cronoq.prometheus import family
from cronoq.transport import NOT_RECEIVED_KEY, unadmitted

from .http_api import error_body

HEADER_TIMEOUT: Final = "header_timeout"
IDLE_TIMEOUT: Final = "idle_timeout"
EVICTED: Final = "evicted"
REFUSED: Final = "refused"
REASONS = (HEADER_TIMEOUT, IDLE_TIMEOUT, EVICTED, REFUSED)
DRAIN_S = 5.0  # how long stopping waits for requests in progress
BACKLOG = 128  # aiohttp's TCPSite default
# The HTTP listeners together take at most this share of the open-file limit: the rest is for gRPC
# connections, the store, peers and the process itself.
HTTP_SHARE_OF_OPEN_FILES = 2
log = get_logger("cronoq.http")


def waiting_for_request(connection: RequestHandler) -> bool:
    """Whether an HTTP connection waits for its next request head (or its first): no request of it is in
    progress or parsed and queued. The test aiohttp's own keep-alive timer makes."""
    waiter = getattr(connection, "_waiter", None)
    return isinstance(waiter, asyncio.Future) and not waiter.done()


@dataclass(frozen=True, slots=True)
class HttpBounds:
    """The bounds every HTTP listener of a process applies (``max_connections`` per listener)."""

    max_connections: int
    header_timeout_s: float
    idle_timeout_s: float

    @classmethod
    def from_config(cls, server: ServerSection, listeners: int, open_files: int | None) -> HttpBounds:
        """``[server]``'s bounds, the connection cap lowered (with a warning) so that ``listeners``
        listeners at their cap hold at most half of ``open_files`` (the soft RLIMIT_NOFILE; None:
        unlimited). A higher cap could not be reached: accepting would fail for want of descriptors, for
        the whole process, first."""
        cap = server.http_max_connections
        if open_files is not None:
            fits = max(1, open_files // HTTP_SHARE_OF_OPEN_FILES // listeners)
            if fits < cap:
                log.warning(
                    "http_max_connections_lowered",
                    configured=cap,
                    to=fits,
                    open_file_limit=open_files,
                    listeners=listeners,
                    hint="raise the open-file limit (ulimit -n, LimitNOFILE) to allow more",
                )
                cap = fits
        return cls(cap, server.http_header_timeout_s, server.http_idle_timeout_s)


def _busy_answer() -> bytes:
    """What a refused connection is told before it is closed: 503, not received (retry is safe)."""
    err = unadmitted(
        "server.http_max_connections: every connection of this listener is busy with a request; retry shortly"
    )
    body = json.dumps(error_body(err)).encode()
    head = (
        f"HTTP/1.1 {err.http_status} Service Unavailable\r\n"
        "Content-Type: application/json; charset=utf-8\r\n"
        f"Content-Length: {len(body)}\r\n"
        f"{NOT_RECEIVED_KEY}: 1\r\n"
        "Retry-After: 1\r\n"
        "Connection: close\r\n\r\n"
    )
    return head.encode() + body


BUSY = _busy_answer()


class Listener:
    """One listening address: its application, its open connections and what it closed, by reason."""

    def __init__(self, name: str, bounds: HttpBounds, runner: web.AppRunner) -> None:
        self.name = name  # the metrics label: the config key of its address, e.g. "http_addr"
        self.bounds = bounds
        self.runner = runner
        self.closed: Counter[str] = Counter(dict.fromkeys(REASONS, 0))
        # Open connections, the one that began waiting for a request head longest ago first.
        self._open: dict[_Connection, None] = {}
        self._server: asyncio.AbstractServer | None = None

    @property
    def open(self) -> int:
        return len(self._open)

    @property
    def connections(self) -> list[RequestHandler]:
        """Every connection aiohttp serves here (refused ones included until they are gone)."""
        server = self.runner.server
        return server.connections if server is not None else []

    async def start(self, host: str, port: int, ssl_context: ssl.SSLContext | None) -> None:
        manager = self.runner.server
        assert manager is not None, "runner.setup() first"
        loop = asyncio.get_running_loop()
        self._server = await loop.create_server(
            lambda: _Connection(self, manager, loop),
            host,
            port,
            ssl=ssl_context,
            backlog=BACKLOG,
            # A TLS handshake happens before a connection is handed to _Connection: bound it alike.
            ssl_handshake_timeout=self.bounds.header_timeout_s if ssl_context is not None else None,
        )

    async def close(self) -> None:
        """Stop accepting, let requests in progress finish (at most ``DRAIN_S``), close the rest."""
        if self._server is not None:
            self._server.close()
        await self.runner.cleanup()
        if self._server is not None:
            await self._server.wait_closed()

    def admit(self, connection: _Connection) -> bool:
        """Make room for a new connection, or say it must be refused (every open one is busy)."""
        if len(self._open) >= self.bounds.max_connections:
            victim = next((c for c in self._open if waiting_for_request(c)), None)
            if victim is None:
                self.closed[REFUSED] += 1
                return False
            self.close_one(victim, EVICTED)
        self._open[connection] = None
        return True

    def close_one(self, connection: _Connection, reason: str) -> None:
        self.closed[reason] += 1
        self.gone(connection)
        connection.force_close()

    def waits_again(self, connection: _Connection) -> None:
        """``connection`` finished a response and waits for its next request: last in eviction order."""
        if connection in self._open:
            del self._open[connection]
            self._open[connection] = None

    def gone(self, connection: _Connection) -> None:
        self._open.pop(connection, None)


class _Connection(RequestHandler):
    """aiohttp's HTTP/1.1 connection, with the header and idle timers and the listener's cap.

    One timer runs at a time: the header timer from accept, or from the first byte after a response;
    the idle timer from the end of a response. When it fires, the connection is closed if it still
    waits for a request head, and left alone if a request is in progress (the next response starts
    the idle timer again)."""

    __slots__ = ("_listener", "_phase", "_timer")

    def __init__(self, listener: Listener, manager: web.Server, loop: asyncio.AbstractEventLoop) -> None:
        bounds = listener.bounds
        # aiohttp's own keep-alive timer stays as a backstop that never fires before these timers.
        super().__init__(
            manager,
            loop=loop,
            access_log=None,  # type: ignore[arg-type]  # off, as web.AppRunner(access_log=None) has it
            keepalive_timeout=bounds.header_timeout_s + bounds.idle_timeout_s,
        )
        self._listener = listener
        self._timer: asyncio.TimerHandle | None = None
        self._phase = HEADER_TIMEOUT  # the bound the running timer enforces

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        if self._listener.admit(self):
            self._start(HEADER_TIMEOUT, self._listener.bounds.header_timeout_s)
        else:
            if self.transport is not None:
                self.transport.write(BUSY)
            self.force_close()  # the transport closes once BUSY is written

    def data_received(self, data: bytes) -> None:
        if data and self._phase == IDLE_TIMEOUT:  # the first byte of the next request
            self._start(HEADER_TIMEOUT, self._listener.bounds.header_timeout_s)
        super().data_received(data)

    async def finish_response(
        self, request: BaseRequest, resp: StreamResponse, start_time: float | None
    ) -> tuple[StreamResponse, bool]:
        try:
            return await super().finish_response(request, resp, start_time)
        finally:
            if self.transport is not None:
                self._listener.waits_again(self)
                self._start(IDLE_TIMEOUT, self._listener.bounds.idle_timeout_s)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        self._listener.gone(self)
        super().connection_lost(exc)

    def _start(self, phase: str, seconds: float) -> None:
        if self._timer is not None:
            self._timer.cancel()
        self._phase = phase
        self._timer = self._loop.call_later(seconds, self._expired)

    def _expired(self) -> None:
        self._timer = None
        if waiting_for_request(self):
            self._listener.close_one(self, self._phase)


class HttpListeners:
    """A process's HTTP listeners (the API's and the metrics one) and their ``/metrics`` families."""

    def __init__(self, bounds: HttpBounds) -> None:
        self.bounds = bounds
        self.listeners: list[Listener] = []

    async def open(
        self, key: str, addr: str, app: web.Application, ssl_context: ssl.SSLContext | None
    ) -> Listener:
        """Serve ``app`` on ``addr`` (the value of config key ``key``); a failure names the key."""
        # A request whose client went away is cancelled, so that it stops holding one of
        # limits.max_concurrent_requests (a Wait could otherwise hold it for max_wait_s).
        runner = web.AppRunner(app, shutdown_timeout=DRAIN_S, handler_cancellation=True)
        await runner.setup()
        listener = Listener(key.rpartition(".")[2], self.bounds, runner)
        host, _, port = addr.rpartition(":")
        try:
            await listener.start(host.strip("[]"), int(port), ssl_context)
        except OSError as err:
            await runner.cleanup()
            raise OSError(f"{key}: cannot listen on {addr} ({err.strerror})") from err
        self.listeners.append(listener)
        return listener

    async def close(self) -> None:
        for listener in self.listeners:
            await listener.close()
        self.listeners.clear()

    def families(self) -> Iterator[Metric]:
        yield family(
            "cronoq_http_connections_open",
            "gauge",
            "HTTP connections open, by listener.",
            [({"listener": x.name}, float(x.open)) for x in self.listeners],
        )
        yield family(
            "cronoq_http_connections_max",
            "gauge",
            "Most HTTP connections a listener holds (server.http_max_connections, after the open-file fit).",
            [({"listener": x.name}, float(x.bounds.max_connections)) for x in self.listeners],
        )
        yield family(
            "cronoq_http_connections_closed_total",
            "counter",
            "HTTP connections the server closed or refused, by listener and reason.",
            [
                ({"listener": x.name, "reason": reason}, float(x.closed[reason]))
                for x in self.listeners
                for reason in REASONS
            ],
        )


__all__ = ["HttpBounds", "HttpListeners", "Listener", "waiting_for_request"]
