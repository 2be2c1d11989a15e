"""A standby does not keep clients: it closes every connection about a second after accepting it, over
gRPC and HTTP alike, so that balancers and the SDK connect again and reach the leader. The leader keeps
idle connections open. Real processes on one SQLite file (the second one stands by)."""

from __future__ import annotations

import asyncio
import signal
import socket
import time
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from .helpers import durable_config, sqlite_store
from .serverproc import ServerProcess, leader_and_standby

pytestmark = pytest.mark.asyncio

READY = grpc.ChannelConnectivity.READY
CLOSED_WITHIN_S = 2.0  # "about a second" after accepting, with room for a loaded machine
KEPT_FOR_S = 2.5  # how long the leader must keep an idle connection in these tests


def _request(sock: socket.socket, path: str = "/healthz") -> bytes:
    """One HTTP/1.1 request on an open connection; the response head and body as far as read."""
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".encode())
    return sock.recv(65536)


def _seconds_until_eof(sock: socket.socket, began: float) -> float:
    """Read until the server closes the connection; seconds since ``began``."""
    sock.settimeout(CLOSED_WITHIN_S + 3)
    while sock.recv(65536):
        pass
    return time.monotonic() - began


def _http_connection(server: ServerProcess) -> socket.socket:
    return socket.create_connection(("127.0.0.1", server.http_port), timeout=5)


async def _health(channel: grpc.aio.Channel) -> int:
    stub = health_pb2_grpc.HealthStub(channel)
    answer = await stub.Check(health_pb2.HealthCheckRequest(service=""), timeout=5)
    return int(answer.status)


async def _seconds_until_not_ready(channel: grpc.aio.Channel, began: float) -> float:
    while channel.get_state() == READY:
        assert time.monotonic() - began < CLOSED_WITHIN_S + 3, "the standby kept the gRPC connection"
        await asyncio.sleep(0.02)
    return time.monotonic() - began


async def _assert_keeps_grpc(server: ServerProcess) -> None:
    async with grpc.aio.insecure_channel(server.target) as channel:
        assert await _health(channel) == health_pb2.HealthCheckResponse.SERVING
        await asyncio.sleep(KEPT_FOR_S)
        assert channel.get_state() == READY, "the leader closed an idle gRPC connection"


def _assert_keeps_http(server: ServerProcess) -> None:
    with _http_connection(server) as sock:
        first = _request(sock)
        assert first.startswith(b"HTTP/1.1 200") and b"Connection: close" not in first
        time.sleep(KEPT_FOR_S)
        assert _request(sock).startswith(b"HTTP/1.1 200"), "the leader closed an idle HTTP connection"


async def test_a_standby_closes_connections_about_a_second_after_accepting_them(tmp_path: Path) -> None:
    with leader_and_standby(tmp_path, durable_config(sqlite_store(tmp_path / "cronoq.db"))) as (
        leader,
        standby,
    ):
        # HTTP: a connection that never sends a request, and one whose request was answered.
        began = time.monotonic()
        with _http_connection(standby) as idle:
            closed_after = _seconds_until_eof(idle, began)
        print(f"standby closed an idle HTTP connection after {closed_after:.2f} s")
        assert 0.5 <= closed_after <= CLOSED_WITHIN_S
        with _http_connection(standby) as used:
            answer = _request(used)
            assert answer.startswith(b"HTTP/1.1 200") and b"Connection: close" in answer  # /healthz
            _seconds_until_eof(used, time.monotonic())

        # gRPC: the standby answers (NOT_SERVING), then sends GOAWAY; the next call connects again.
        async with grpc.aio.insecure_channel(standby.target) as channel:
            began = time.monotonic()
            assert await _health(channel) == health_pb2.HealthCheckResponse.NOT_SERVING
            assert channel.get_state() == READY
            closed_after = await _seconds_until_not_ready(channel, began)
            print(f"standby closed a gRPC connection after {closed_after:.2f} s")
            assert 0.5 <= closed_after <= CLOSED_WITHIN_S
            assert await _health(channel) == health_pb2.HealthCheckResponse.NOT_SERVING  # reconnects

        # The leader keeps idle connections, on both listeners.
        await _assert_keeps_grpc(leader)
        _assert_keeps_http(leader)

        # Taking over swaps the standby's gRPC server for a leader's on the same port.
        async with grpc.aio.insecure_channel(standby.target) as channel:
            await _health(channel)
            leader.signal(signal.SIGTERM)
            assert leader.wait(20) == 0
            standby.wait_probe("/readyz", 200, timeout=10)
            assert await _health(channel) == health_pb2.HealthCheckResponse.SERVING
        await _assert_keeps_grpc(standby)
        _assert_keeps_http(standby)
