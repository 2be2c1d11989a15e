"""``limits.keepalive_interval_s`` and ``limits.keepalive_timeout_s`` against a real server.

The limits act inside the gRPC core, so they are watched on the wire: a hand-rolled HTTP/2 client on a
plain TCP socket (preface, SETTINGS, then only the frames a test asks for; no HPACK is needed because it
opens no stream) sees the server's PING and GOAWAY frames, and a TCP relay between a ``grpc.aio``
channel and the server counts the frames of a real client.

What grpc 1.85 does, as measured here:

* On a connection with no call (``keepalive_permit_without_calls`` is on) the server sends a PING
  ``keepalive_interval_s`` after it last heard from the client, then the next one ``keepalive_interval_s``
  after the ACK: every 0.50 s on an idle connection when acked at once. It sends no second keepalive
  ping while one is unanswered. (With a call open, the server also sends BDP pings as data arrives.)
* An unanswered ping closes the connection with GOAWAY ENHANCE_YOUR_CALM ``ping_timeout`` after
  ``grpc.http2.ping_timeout_ms``; ``grpc.keepalive_timeout_ms`` alone never arms its timer in this
  version (the connection lived 60 s, the default ping timeout), which is why the server sets both
  options to ``keepalive_timeout_s``.
* A client that ACKs pings keeps its connection, however long it stays idle.
"""

from __future__ import annotations

import asyncio
import contextlib
import statistics
import time
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass, field

import grpc
import pytest

from cronoq.v1 import cronoq_pb2 as pb
from cronoq.v1 import cronoq_pb2_grpc as pbg
from tests.ports import free_port

from .rawh2 import ACK, ENHANCE_YOUR_CALM, GOAWAY, PING, PREFACE, SETTINGS, encode
from .serverproc import ServerProcess, running_server
from .shardproc import ShardSpec, cluster_tables, router_process

pytestmark = pytest.mark.asyncio

INTERVAL = 0.5
TIMEOUT = 1.0
LONG_TIMEOUT = 2.5
WITHIN = 15.0  # the upper bound on waiting for any one event
EARLY = 0.15  # timers start when the server's write ends, a little before the frame is read here


def limits(interval: float, timeout: float) -> str:
    return f"[limits]\nkeepalive_interval_s = {interval}\nkeepalive_timeout_s = {timeout}\n"


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with running_server(tmp_path_factory.mktemp("keepalive"), limits(INTERVAL, TIMEOUT)) as proc:
        yield proc


@pytest.fixture(scope="module")
def router(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    """A ``cronoq-router`` takes the same keepalive limits; its shard need not be up for that."""
    tables = cluster_tables([ShardSpec("a", 1, ("default",))], {"a": f"http://127.0.0.1:{free_port()}"})
    proc = router_process(tmp_path_factory.mktemp("router"), limits(INTERVAL, TIMEOUT) + tables)
    proc.start(ready=False)
    try:
        yield proc
    finally:
        proc.stop()


@pytest.fixture(scope="module")
def patient(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with running_server(tmp_path_factory.mktemp("patient"), limits(INTERVAL, LONG_TIMEOUT)) as proc:
        yield proc


# ---------------------------------------------------------------------------------- raw HTTP/2


@dataclass(frozen=True)
class Frame:
    kind: int
    flags: int
    stream: int
    payload: bytes
    at: float  # time.monotonic() when it was read
    quiet_for: float  # how long the client had written nothing by then

    @property
    def goaway_code(self) -> int:
        return int.from_bytes(self.payload[4:8], "big")

    @property
    def goaway_debug(self) -> bytes:
        return self.payload[8:]


class RawH2:
    """A client connection that says only what HTTP/2 requires: the preface and SETTINGS (and their ACK).
    It ACKs the server's PINGs only when ``ack_pings``."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, ack_pings: bool) -> None:
        self.reader = reader
        self.writer = writer
        self.ack_pings = ack_pings
        self.quiet_since = time.monotonic()

    @classmethod
    @contextlib.asynccontextmanager
    async def connect(cls, port: int, *, ack_pings: bool) -> AsyncIterator[RawH2]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        conn = cls(reader, writer, ack_pings)
        try:
            await conn.send(PREFACE + encode(SETTINGS, 0, 0))
            yield conn
        finally:
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()
        self.quiet_since = time.monotonic()

    async def next(self) -> Frame | None:
        """The next frame from the server (None at EOF), answering SETTINGS, and PINGs if asked to."""
        try:
            head = await asyncio.wait_for(self.reader.readexactly(9), WITHIN)
            payload = await asyncio.wait_for(self.reader.readexactly(int.from_bytes(head[:3], "big")), WITHIN)
        except asyncio.IncompleteReadError as err:
            assert not err.partial, f"connection closed inside a frame: {err.partial!r}"
            return None
        except ConnectionResetError:
            return None
        except TimeoutError:
            pytest.fail(f"no frame from the server within {WITHIN} s")
        now = time.monotonic()
        stream = int.from_bytes(head[5:9], "big") & 0x7FFFFFFF
        frame = Frame(head[3], head[4], stream, payload, now, now - self.quiet_since)
        if frame.kind == SETTINGS and not frame.flags & ACK:
            await self.send(encode(SETTINGS, ACK, 0))
        if frame.kind == PING and not frame.flags & ACK and self.ack_pings:
            await self.send(encode(PING, ACK, 0, frame.payload))
        return frame

    async def pings(self, count: int) -> list[Frame]:
        """Read until the server has sent ``count`` PINGs (failing on a GOAWAY or EOF first)."""
        pings: list[Frame] = []
        while len(pings) < count:
            frame = await self.next()
            assert frame is not None, f"connection closed after {len(pings)} pings"
            assert frame.kind != GOAWAY, f"GOAWAY {frame.goaway_debug!r} after {len(pings)} pings"
            if frame.kind == PING and not frame.flags & ACK:
                pings.append(frame)
        return pings


# ---------------------------------------------------------------------------------------- tests


async def test_pings_every_interval_on_an_idle_connection(server: ServerProcess) -> None:
    """No call, no data: the server pings ``keepalive_interval_s`` after the client went quiet, and again
    ``keepalive_interval_s`` after each ACK."""
    async with RawH2.connect(server.grpc_port, ack_pings=True) as conn:
        pings = await conn.pings(6)
    # The first comes after the ACK of the server's SETTINGS, each other one after the ACK of the last.
    quiet = [ping.quiet_for for ping in pings]
    assert all(INTERVAL - EARLY <= q <= INTERVAL + 1.5 for q in quiet), quiet  # one slow outlier at most
    assert statistics.median(quiet) <= INTERVAL + 0.25, quiet  # the interval, not the timeout (1 s)


@pytest.mark.parametrize("which", ["server", "patient", "router"])
async def test_unanswered_ping_closes_the_connection(which: str, request: pytest.FixtureRequest) -> None:
    """The client never ACKs: ``keepalive_timeout_s`` after the ping the server sends GOAWAY and closes.
    Two timeouts (1 s and 2.5 s), so that the close is seen to follow the limit, not a constant; and
    the router, whose listener takes the same options."""
    proc: ServerProcess = request.getfixturevalue(which)
    timeout = LONG_TIMEOUT if which == "patient" else TIMEOUT
    async with RawH2.connect(proc.grpc_port, ack_pings=False) as conn:
        frames: list[Frame] = []
        while (frame := await conn.next()) is not None:
            frames.append(frame)
        eof = time.monotonic()
    pings = [f for f in frames if f.kind == PING and not f.flags & ACK]
    goaways = [f for f in frames if f.kind == GOAWAY]
    assert pings and goaways, [(f.kind, f.flags) for f in frames]
    ping, goaway = pings[0], goaways[0]
    assert goaway.goaway_code == ENHANCE_YOUR_CALM
    assert goaway.goaway_debug in (b"ping_timeout", b"keepalive_timeout"), goaway.goaway_debug
    assert goaway.at > ping.at
    waited = goaway.at - ping.at
    # Windows narrower than the two timeouts' difference (1.5 s): a constant cannot satisfy both.
    assert timeout - EARLY <= waited <= timeout + 1.0, waited
    assert eof - goaway.at <= 3.0  # and the socket closes right after the GOAWAY


async def test_acked_pings_keep_the_connection(server: ServerProcess) -> None:
    """A client that ACKs every ping stays connected for many timeouts and still gets answers."""
    async with RawH2.connect(server.grpc_port, ack_pings=True) as conn:
        pings = await conn.pings(6)
        # Unanswered, the first ping would have closed the connection TIMEOUT after it.
        assert pings[-1].at - pings[0].at > TIMEOUT + INTERVAL
        await conn.send(encode(PING, 0, 0, b"cronoq!!"))
        while (frame := await conn.next()) is not None:
            assert frame.kind != GOAWAY, frame.goaway_debug
            if frame.kind == PING and frame.flags & ACK:
                assert frame.payload == b"cronoq!!"
                break
        assert frame is not None, "connection closed instead of answering the client's PING"


# ------------------------------------------------------------------- a grpc client, through a tap


@dataclass
class FrameTap:
    """A TCP relay to the gRPC port that reads the HTTP/2 frames passing through each way."""

    upstream: int
    port: int = 0
    connections: int = 0
    server_pings: list[float] = field(default_factory=list)  # PINGs from the server, when relayed
    client_acks: list[float] = field(default_factory=list)  # their ACKs from the client
    goaways: list[bytes] = field(default_factory=list)
    changed: asyncio.Condition = field(default_factory=asyncio.Condition)
    writers: list[asyncio.StreamWriter] = field(default_factory=list)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.port}"

    async def serve(self, client_r: asyncio.StreamReader, client_w: asyncio.StreamWriter) -> None:
        self.connections += 1
        server_r, server_w = await asyncio.open_connection("127.0.0.1", self.upstream)
        self.writers += [client_w, server_w]
        await asyncio.gather(
            self.pump(client_r, server_w, from_client=True),
            self.pump(server_r, client_w, from_client=False),
        )

    async def pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, *, from_client: bool
    ) -> None:
        buffer = b""
        skip = len(PREFACE) if from_client else 0
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
                buffer += data
                if skip:
                    taken = min(skip, len(buffer))
                    buffer, skip = buffer[taken:], skip - taken
                while len(buffer) >= 9 and len(buffer) >= 9 + (length := int.from_bytes(buffer[:3], "big")):
                    await self.seen(buffer[3], buffer[4], buffer[9 : 9 + length], from_client)
                    buffer = buffer[9 + length :]
        except OSError:
            pass
        finally:
            writer.close()

    async def seen(self, kind: int, flags: int, payload: bytes, from_client: bool) -> None:
        async with self.changed:
            if kind == PING and not from_client and not flags & ACK:
                self.server_pings.append(time.monotonic())
            elif kind == PING and from_client and flags & ACK:
                self.client_acks.append(time.monotonic())
            elif kind == GOAWAY and not from_client:
                self.goaways.append(payload[8:])
            self.changed.notify_all()

    async def wait(self, predicate: Callable[[], bool]) -> None:
        async with self.changed:
            await asyncio.wait_for(self.changed.wait_for(predicate), WITHIN)


@contextlib.asynccontextmanager
async def frame_tap(upstream: int) -> AsyncIterator[FrameTap]:
    tap = FrameTap(upstream)
    relay = await asyncio.start_server(tap.serve, "127.0.0.1", 0)
    tap.port = relay.sockets[0].getsockname()[1]
    try:
        yield tap
    finally:
        relay.close()
        for writer in tap.writers:
            writer.close()
        await relay.wait_closed()


async def test_grpc_client_keeps_its_connection_while_idle(server: ServerProcess) -> None:
    """A ``grpc.aio`` channel makes a call, stays idle while the server pings it, and calls again: the
    client answered the pings, so the second call goes over the same connection, with no GOAWAY."""
    async with frame_tap(server.grpc_port) as tap, grpc.aio.insecure_channel(tap.target) as channel:
        admin = pbg.AdminStub(channel)
        await admin.Snapshot(pb.Empty(), timeout=10)
        idle_since = time.monotonic()
        await tap.wait(lambda: sum(t > idle_since for t in tap.client_acks) >= 6)
        acks = [t for t in tap.client_acks if t > idle_since]
        # Had it not answered, its first idle ping would have closed the connection by this time.
        assert acks[-1] - idle_since > INTERVAL + TIMEOUT
        assert channel.get_state() == grpc.ChannelConnectivity.READY
        await admin.Snapshot(pb.Empty(), timeout=10)
    assert tap.connections == 1 and tap.goaways == []
