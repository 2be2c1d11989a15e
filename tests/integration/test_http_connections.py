"""The HTTP listeners' connection bounds against a real server and a real router, over raw sockets:
``[server] http_header_timeout_s``, ``http_idle_timeout_s`` and ``http_max_connections``, and the
``cronoq_http_connections_*`` metrics that count what they did.

A slowloris client opens connections and sends a request head a little at a time (or nothing at all),
so that each connection stays open at no cost to it. aiohttp alone keeps such a connection for an hour
and accepts them until the process runs out of file descriptors; these tests watch a server close them
in time, make room for the probes and the API by closing the connection that has waited longest, and
refuse (503, not received) only when every connection is busy with a request.
"""

from __future__ import annotations

import asyncio
import contextlib
import resource
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import grpc
import pytest

from cronoq.v1 import cronoq_pb2 as pb
from cronoq.v1 import cronoq_pb2_grpc as pbg

from .helpers import Metrics, scrape_metrics, token
from .serverproc import ServerProcess, assert_clean_log, new_server
from .shardproc import ShardSpec, server_or_router

pytestmark = pytest.mark.asyncio

CLIENT = "client-conn-token-0123456789abcdef"
METRICS = "metrics-conn-token-0123456789abcdef"
ENV = {"CONN_CLIENT_TOKEN": CLIENT, "CONN_METRICS_TOKEN": METRICS}
TOKENS = token("CONN_CLIENT_TOKEN", "client", env=True) + token("CONN_METRICS_TOKEN", "metrics", env=True)
SHARDS = [ShardSpec("a", 1, ("default",))]

HEADER_S = 0.5
IDLE_S = 1.5  # longer than the header timeout: an idle connection outlives it
CAP = 20
LONG_S = 120.0  # timers that must not act during a test
WITHIN = 15.0  # the bound on waiting for anything the server should do
EARLY = 0.05  # a close measured from the client may precede the timer's due time by this much

SLOW_HEAD = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n"  # no blank line: the head never ends
HEALTHZ = b"GET /healthz HTTP/1.1\r\nHost: localhost\r\n\r\n"
CLOSED = "cronoq_http_connections_closed_total"


def bounds(header_s: float, idle_s: float, cap: int = 1000) -> str:
    return (
        f"[server]\nhttp_header_timeout_s = {header_s}\nhttp_idle_timeout_s = {idle_s}\n"
        f"http_max_connections = {cap}\n"
    )


@contextlib.contextmanager
def served(kind: str, directory: Path, table: str) -> Iterator[ServerProcess]:
    """``kind`` "server" (one server) or "router" (a router in front of one shard), both with ``table``."""
    with server_or_router(kind, directory, table + TOKENS, SHARDS, table + TOKENS, ENV) as proc:
        yield proc
    assert_clean_log(proc)


@pytest.fixture(scope="module", params=["server", "router"])
def timed(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    with served(
        request.param, tmp_path_factory.mktemp(f"timed-{request.param}"), bounds(HEADER_S, IDLE_S)
    ) as proc:
        yield proc


@pytest.fixture(scope="module", params=["server", "router"])
def capped(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    table = bounds(LONG_S, LONG_S, CAP)
    with served(request.param, tmp_path_factory.mktemp(f"capped-{request.param}"), table) as proc:
        yield proc


# ------------------------------------------------------------------------------------- raw HTTP


@dataclass
class Raw:
    """One client connection on a plain socket, saying exactly what a test writes."""

    reader: asyncio.StreamReader
    writer: asyncio.StreamWriter

    @classmethod
    async def open(cls, port: int) -> Raw:
        reader, writer = await asyncio.wait_for(asyncio.open_connection("127.0.0.1", port), WITHIN)
        return cls(reader, writer)

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def response(self) -> tuple[int, dict[str, str], bytes]:
        """One response: status, headers (lower-case names), body (by Content-Length)."""
        head = await asyncio.wait_for(self.reader.readuntil(b"\r\n\r\n"), WITHIN)
        status_line, *lines = head.decode("latin-1").split("\r\n")
        headers = {}
        for line in filter(None, lines):
            name, _, value = line.partition(":")
            headers[name.strip().lower()] = value.strip()
        body = await self.reader.readexactly(int(headers.get("content-length", "0")))
        return int(status_line.split()[1]), headers, body

    async def until_closed(self) -> bytes:
        """What the server sends until it closes the connection (failing after ``WITHIN``)."""
        try:
            return await asyncio.wait_for(self.reader.read(), WITHIN)
        except ConnectionResetError:  # closed while the client was still writing
            return b""
        except TimeoutError:
            pytest.fail(f"the server kept the connection open for {WITHIN} s")

    def close(self) -> None:
        self.writer.close()


@contextlib.asynccontextmanager
async def connections(port: int, count: int, first: bytes = SLOW_HEAD) -> AsyncIterator[list[Raw]]:
    """``count`` connections opened one after another, each having sent ``first``."""
    opened: list[Raw] = []
    try:
        for _ in range(count):
            conn = await Raw.open(port)
            opened.append(conn)
            await conn.send(first)
        yield opened
    finally:
        for conn in opened:
            conn.close()


async def scrape(proc: ServerProcess) -> Metrics:
    """``/metrics``, asked again while the listener refuses: connections whose clients just left may
    still count as busy for a moment."""
    deadline = time.monotonic() + WITHIN
    while True:
        try:
            return await scrape_metrics(proc, METRICS)
        except (AssertionError, aiohttp.ClientError):
            if time.monotonic() > deadline:
                raise
        await asyncio.sleep(0.05)


async def closed(proc: ServerProcess, reason: str) -> float:
    return (await scrape(proc)).get(CLOSED, listener="http_addr", reason=reason)


async def trickle(conn: Raw) -> None:
    """Send a header line every 0.1 s, forever: the head never completes, data keeps coming."""
    with contextlib.suppress(OSError):
        while True:
            await asyncio.sleep(0.1)
            await conn.send(b"X-Slow: 1\r\n")


# ----------------------------------------------------------------------------------------- tests


@pytest.mark.parametrize("first", [b"", SLOW_HEAD], ids=["silent", "trickling"])
async def test_a_connection_without_a_whole_head_is_closed_after_the_header_timeout(
    timed: ServerProcess, first: bytes
) -> None:
    """From accept, whether the client says nothing or keeps sending header lines (which must not
    reset the timer)."""
    before = await closed(timed, "header_timeout")
    conn = await Raw.open(timed.http_port)
    opened = time.monotonic()
    dripping = asyncio.create_task(trickle(conn)) if first else None
    try:
        await conn.send(first)
        assert await conn.until_closed() == b""
        waited = time.monotonic() - opened
    finally:
        if dripping is not None:
            dripping.cancel()
        conn.close()
    assert waited >= HEADER_S - EARLY, waited
    assert await closed(timed, "header_timeout") == before + 1


async def test_an_idle_keep_alive_connection_is_closed_after_the_idle_timeout(timed: ServerProcess) -> None:
    """After a response the connection may stay idle for ``http_idle_timeout_s`` (longer than the
    header timeout here, so the close is the idle timer's), then it is closed."""
    before = await closed(timed, "idle_timeout")
    conn = await Raw.open(timed.http_port)
    try:
        await conn.send(HEALTHZ)
        status, headers, _ = await conn.response()
        answered = time.monotonic()
        assert status == 200 and headers.get("connection", "keep-alive").lower() != "close"
        assert await conn.until_closed() == b""
        waited = time.monotonic() - answered
    finally:
        conn.close()
    assert waited >= IDLE_S - EARLY, waited
    assert await closed(timed, "idle_timeout") == before + 1


async def test_the_next_head_is_timed_from_its_first_byte(timed: ServerProcess) -> None:
    """A kept-alive client may start its next request late (within the idle timeout); that request's
    head then gets ``http_header_timeout_s`` from its first byte."""
    conn = await Raw.open(timed.http_port)
    try:
        await conn.send(HEALTHZ)
        assert (await conn.response())[0] == 200
        await asyncio.sleep(HEADER_S + 0.3)  # idle for longer than a head may take
        await conn.send(HEALTHZ)
        assert (await conn.response())[0] == 200  # still open
        await conn.send(SLOW_HEAD)
        started = time.monotonic()
        assert await conn.until_closed() == b""
        waited = time.monotonic() - started
    finally:
        conn.close()
    assert waited >= HEADER_S - EARLY, waited


async def test_slow_connections_beyond_the_cap_make_room_for_probes_and_submits(
    capped: ServerProcess,
) -> None:
    """Twice ``http_max_connections`` slowloris connections: each new one closes the one that has
    waited longest for a head, so the first ``CAP`` are closed, the listener never holds more than
    ``CAP``, and probes and authenticated submits still get in and are answered."""
    before = await closed(capped, "evicted")
    # Two more than twice the cap: room for connections of earlier tests the server may not have seen
    # closed yet (they are older, so closed first).
    async with connections(capped.http_port, 2 * CAP + 2) as slow:
        oldest = await asyncio.gather(*(conn.until_closed() for conn in slow[:CAP]))
        assert oldest == [b""] * CAP
        for i in range(5):
            probe = await Raw.open(capped.http_port)
            try:
                await probe.send(HEALTHZ)
                assert (await probe.response())[0] == 200
                body = f'{{"key": "while-slowloris-{i}"}}'.encode()
                await probe.send(
                    b"POST /v1/tasks HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                    + f"Authorization: Bearer {CLIENT}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                    + body
                )
                status, _, answer = await probe.response()
                assert status == 200, answer
            finally:
                probe.close()
        metrics = await scrape(capped)
    assert metrics("cronoq_http_connections_open", listener="http_addr") <= CAP
    assert metrics("cronoq_http_connections_max", listener="http_addr") == CAP
    # Every slow connection beyond the cap closed one (probes found room left by the one before, or
    # closed one more).
    assert metrics(CLOSED, listener="http_addr", reason="evicted") >= before + CAP + 2


async def test_a_connection_is_refused_only_when_every_connection_is_busy(capped: ServerProcess) -> None:
    """``CAP`` open watch streams hold every connection with a request: the next connection is told
    503, not received (safe to retry), and closed; the streams are not disturbed."""
    before = await closed(capped, "refused")
    watch = f"GET /v1/watch HTTP/1.1\r\nHost: localhost\r\nAuthorization: Bearer {CLIENT}\r\n\r\n".encode()
    async with connections(capped.http_port, CAP, watch) as streams:
        for stream in streams:
            head = await asyncio.wait_for(stream.reader.readuntil(b"\r\n\r\n"), WITHIN)
            assert head.startswith(b"HTTP/1.1 200"), head
        refused = await Raw.open(capped.http_port)
        try:
            answer = await refused.until_closed()
        finally:
            refused.close()
        assert all(not stream.reader.at_eof() for stream in streams)
    head, _, body = answer.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 503"), answer
    assert b"\r\ncronoq-not-received: 1\r\n" in head
    assert b'"code": "unavailable"' in body and b"server.http_max_connections" in body
    assert await closed(capped, "refused") >= before + 1  # and any scrape refused while streams closed


# ------------------------------------------------------------------- the default bounds, 1,024 files

SLOWLORIS = 1_100
FEW_FILES = 1_024


def _enough_files_here(count: int) -> None:
    """This test process opens ``count`` connections itself: raise its own soft limit if it must."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < count:
        if hard != resource.RLIM_INFINITY and hard < count:
            pytest.skip(f"this test opens {count} connections; the open-file limit here is {hard}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (count if hard == resource.RLIM_INFINITY else hard, hard))


async def test_defaults_keep_the_server_answering_under_a_slowloris_at_1024_open_files(
    tmp_path: Path,
) -> None:
    """The issue's case: a server limited to 1,024 open files (soft and hard: nothing to raise) and
    1,100 slowloris connections. The default cap is fitted to the limit, so accepting never runs out of
    descriptors: probes, authenticated HTTP submits and gRPC submits are all answered."""
    _enough_files_here(SLOWLORIS + 200)
    server = new_server(tmp_path, TOKENS, env=ENV)
    server.open_files = (FEW_FILES, FEW_FILES)
    server.start()
    try:
        async with connections(server.http_port, SLOWLORIS):
            for i in range(10):
                assert await asyncio.to_thread(server.probe, "/healthz") == 200
                probe = await Raw.open(server.http_port)
                try:
                    body = f'{{"key": "at-1024-{i}"}}'.encode()
                    await probe.send(
                        b"POST /v1/tasks HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"
                        + f"Authorization: Bearer {CLIENT}\r\nContent-Length: {len(body)}\r\n\r\n".encode()
                        + body
                    )
                    assert (await probe.response())[0] == 200
                finally:
                    probe.close()
            async with grpc.aio.insecure_channel(server.target) as channel:
                tasks = pbg.TasksStub(channel)
                for i in range(10):
                    request = pb.SubmitRequest(task=pb.TaskSpec(pool="default", key=f"grpc-at-1024-{i}"))
                    await tasks.Submit(request, metadata=(("authorization", f"Bearer {CLIENT}"),), timeout=10)
            metrics = await scrape_metrics(server, METRICS)
    finally:
        server.stop()
    # Half the limit for the HTTP listeners (one here), the rest for gRPC, the store and the process.
    assert metrics("cronoq_http_connections_max", listener="http_addr") == FEW_FILES // 2
    assert metrics(CLOSED, listener="http_addr", reason="evicted") >= SLOWLORIS - FEW_FILES // 2
    assert '"event": "http_max_connections_lowered"' in server.logs()
    assert_clean_log(server)  # nor did accepting ever fail for want of a descriptor


@pytest.mark.skipif(not Path("/proc/self/limits").exists(), reason="reads /proc/<pid>/limits")
async def test_the_soft_open_file_limit_is_raised_to_the_hard_limit(tmp_path: Path) -> None:
    server = new_server(tmp_path)
    server.open_files = (FEW_FILES, 4 * FEW_FILES)
    server.start()
    try:
        assert server.proc is not None
        limits = await asyncio.to_thread(Path(f"/proc/{server.proc.pid}/limits").read_text)
        metrics: Metrics = await scrape_metrics(server)
    finally:
        server.stop()
    line = next(row for row in limits.splitlines() if row.startswith("Max open files"))
    assert line.split()[3:5] == [str(4 * FEW_FILES), str(4 * FEW_FILES)], line
    assert metrics("cronoq_http_connections_max", listener="http_addr") == 1000  # the default: it fits
    assert '"event": "open_file_limit_raised"' in server.logs()
