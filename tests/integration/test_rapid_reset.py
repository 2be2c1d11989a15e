"""HTTP/2 rapid reset (CVE-2023-44487) against the gRPC listener of a real server and a real router.

One connection opens streams and resets them at once, HEADERS then RST_STREAM, as fast as it can. An
HTTP/2 server's limit on concurrent streams does not see such streams (each is closed as soon as it
opens), so without more the server starts a call for every one of them: grpc 1.85 with its defaults
handed each to the application, and 200,000 pairs cost the server 4 to 6 s of CPU here (about 25 µs a
pair) while the connection stayed open.

``server.grpc_max_streams_per_connection`` sets ``grpc.max_concurrent_streams``, and with it grpc core's
overload protection counts a reset stream until the application has let go of it: once a connection
has that many, new streams are refused in the transport (RST_STREAM REFUSED_STREAM) without reaching
the application. Measured here with the default (1,000): 195,705 of 200,000 pairs refused, 0.5 s of
CPU. grpc core cannot close a connection for resetting too much, and a client that reads and answers
what the server sends keeps its connection: what is bounded is the work it causes, which is no more
than a client with that many calls in flight. (A client that does not read is closed by the keepalive
ping timeout, see test_keepalive.py.)

The attacker here is the hardest kind: it answers SETTINGS and PINGs and reads everything.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from .rawh2 import (
    ACK,
    GOAWAY,
    PING,
    PREFACE,
    REFUSED_STREAM,
    RST_STREAM,
    SETTINGS,
    encode,
    header_block,
    reset_pair,
)
from .serverproc import ServerProcess
from .shardproc import ShardSpec, server_or_router

pytestmark = pytest.mark.asyncio

PAIRS = 20_000
BATCH = 500
WITHIN = 30.0
SHARDS = [ShardSpec("a", 1, ("default",))]


@pytest.fixture(scope="module", params=["server", "router"])
def target(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    """A server, or a router in front of one shard, with the default configuration."""
    directory = Path(tmp_path_factory.mktemp(f"rapid-reset-{request.param}"))
    with server_or_router(request.param, directory, "", SHARDS, "") as proc:
        yield proc


class Attacker:
    """A raw HTTP/2 connection that reads every frame, answers SETTINGS and PINGs, and counts the
    streams the server refused."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader = reader
        self.writer = writer
        self.refused = 0
        self.goaway = False
        self.settled = asyncio.Event()  # both sides' SETTINGS acknowledged
        self.changed = asyncio.Condition()
        self._settings = 0  # the server's SETTINGS answered, and its ACK of ours: 2 when settled

    @classmethod
    @contextlib.asynccontextmanager
    async def connect(cls, port: int) -> AsyncIterator[Attacker]:
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        conn = cls(reader, writer)
        writer.write(PREFACE + encode(SETTINGS, 0, 0))
        reading = asyncio.create_task(conn._read())
        try:
            await asyncio.wait_for(conn.settled.wait(), WITHIN)
            yield conn
        finally:
            reading.cancel()
            writer.close()
            with contextlib.suppress(OSError):
                await writer.wait_closed()

    async def _read(self) -> None:
        with contextlib.suppress(asyncio.IncompleteReadError, ConnectionError):
            while True:
                head = await self.reader.readexactly(9)
                payload = await self.reader.readexactly(int.from_bytes(head[:3], "big"))
                kind, flags = head[3], head[4]
                if kind == SETTINGS:
                    if not flags & ACK:
                        self.writer.write(encode(SETTINGS, ACK, 0))
                    self._settings += 1
                    if self._settings == 2:
                        self.settled.set()
                elif kind == PING and not flags & ACK:
                    self.writer.write(encode(PING, ACK, 0, payload))
                elif kind == RST_STREAM and int.from_bytes(payload, "big") == REFUSED_STREAM:
                    self.refused += 1
                elif kind == GOAWAY:
                    self.goaway = True
                if kind in (RST_STREAM, GOAWAY):
                    async with self.changed:
                        self.changed.notify_all()

    async def reset_streams(self, pairs: int, path: str) -> None:
        block = header_block(path)
        for first in range(0, pairs, BATCH):
            self.writer.write(b"".join(reset_pair(2 * i + 1, block) for i in range(first, first + BATCH)))
            await self.writer.drain()

    async def refusals(self, count: int) -> None:
        """Wait until the server has refused ``count`` streams."""
        async with self.changed:
            await asyncio.wait_for(self.changed.wait_for(lambda: self.refused >= count), WITHIN)


async def test_a_rapid_reset_is_refused_in_the_transport(target: ServerProcess) -> None:
    """Most of the reset streams are refused by the transport instead of becoming calls, and the server
    goes on answering."""
    async with Attacker.connect(target.grpc_port) as conn:
        await conn.reset_streams(PAIRS, "/cronoq.v1.Admin/Snapshot")
        try:
            await conn.refusals(PAIRS // 2)
        except TimeoutError:
            pytest.fail(f"the server refused {conn.refused} of {PAIRS} reset streams in {WITHIN} s")
    async with grpc.aio.insecure_channel(target.target) as channel:
        answer = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), timeout=10)
    assert answer.status == health_pb2.HealthCheckResponse.SERVING
    assert await asyncio.to_thread(target.probe, "/readyz") == 200
