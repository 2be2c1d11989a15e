"""The HTTP/JSON gateway of a real ``cronoq-server`` process, with a real gRPC SDK worker.

The server runs without credentials (the default), so the loopback Host guard is on: the test client
addresses it as 127.0.0.1, which is allowed.
"""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import aiohttp
import pytest

from cronoq.client import Lease

from .helpers import token, toml_table, worker
from .serverproc import ServerProcess, new_server, running_server

pytestmark = pytest.mark.asyncio


@pytest.fixture
async def http(server: ServerProcess) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(base_url=server.http) as session:
        yield session


async def doubler(lease: Lease) -> dict[str, int]:
    return {"doubled": lease.json()["n"] * 2}


async def test_http_submit_grpc_worker_http_result(
    server: ServerProcess, http: aiohttp.ClientSession
) -> None:
    async with worker(server.target, doubler):
        async with http.post(
            "/v1/tasks", json={"payload": {"n": 21}, "key": "double-21", "wait": True}
        ) as resp:
            assert resp.status == 200, await resp.text()
            submitted = await resp.json()
        assert isinstance(submitted["id"], str) and not submitted["duplicate"]
        assert submitted["result"]["status"] == "succeeded"
        assert submitted["result"]["output"] == {"doubled": 42}

        async with http.get(f"/v1/tasks/{submitted['id']}/result") as resp:
            assert (await resp.json())["output"] == {"doubled": 42}
        async with http.get("/v1/tasks/double-21") as resp:
            info = await resp.json()
        assert info["status"] == "succeeded" and info["attempt"] == 1 and info["finished_at"]
        async with http.get("/v1/tasks", params={"status": "succeeded"}) as resp:
            assert submitted["id"] in [t["id"] for t in (await resp.json())["tasks"]]


async def test_watch_sees_a_task_finish(server: ServerProcess, http: aiohttp.ClientSession) -> None:
    async with worker(server.target, doubler), http.get("/v1/watch", params={"key": "watched"}) as stream:
        assert stream.status == 200 and stream.content_type == "text/event-stream"
        async with http.post("/v1/tasks", json={"payload": {"n": 1}, "key": "watched"}) as resp:
            task_id = (await resp.json())["id"]
        while not (line := await asyncio.wait_for(stream.content.readline(), 10)).startswith(b"data: "):
            pass
        event = json.loads(line.removeprefix(b"data: "))
        assert (event["id"], event["status"], event["key"]) == (task_id, "succeeded", "watched")


async def test_probes_openapi_and_errors(http: aiohttp.ClientSession) -> None:
    for path in ("/healthz", "/readyz"):
        async with http.get(path) as resp:
            assert (resp.status, await resp.json()) == (200, {"status": "ok"})
        async with http.head(path) as resp:  # load balancers probe with HEAD
            assert (resp.status, resp.content_type, await resp.read()) == (200, "application/json", b"")
    async with http.get("/v1/openapi.json") as resp:
        document = await resp.json()
    assert document["openapi"].startswith("3.0.") and document["servers"] == [{"url": "/"}]
    async with http.post("/v1/tasks", json={"pool": "default", "colour": "red"}) as resp:
        assert (resp.status, await resp.json()) == (
            400,
            {"error": "colour: unknown field", "code": "invalid_argument"},
        )
    async with http.get("/v1/tasks/no-such-task") as resp:
        assert resp.status == 404 and (await resp.json())["code"] == "not_found"


async def test_without_credentials_only_loopback_hosts_are_answered(http: aiohttp.ClientSession) -> None:
    async with http.get("/v1/tasks", headers={"Host": "rebound.example"}) as resp:
        assert resp.status == 403 and (await resp.json())["code"] == "permission_denied"
    async with http.get("/v1/tasks", headers={"Host": "localhost"}) as resp:
        assert resp.status == 200
    async with http.get("/readyz", headers={"Host": "rebound.example"}) as resp:
        assert resp.status == 200


async def test_a_listener_opened_with_insecure_no_auth_answers_any_host(tmp_path: Path) -> None:
    """On a network listener without credentials (``insecure_no_auth``) callers name the server by its
    network name: the loopback Host guard, which would refuse them all, applies to loopback listeners."""
    server = new_server(tmp_path, "[server]\ninsecure_no_auth = true\n")
    text = server.config_path.read_text()
    server.config_path.write_text(text.replace('http_addr = "127.0.0.1:', 'http_addr = "0.0.0.0:'))
    server.start()
    try:
        async with (
            aiohttp.ClientSession(f"http://127.0.0.1:{server.http_port}") as http,
            http.get("/v1/tasks", headers={"Host": "cronoq.lan:7071"}) as resp,
        ):
            assert resp.status == 200, await resp.text()
    finally:
        server.stop()


async def test_an_announced_oversized_body_is_refused_unread(server: ServerProcess) -> None:
    reader, writer = await asyncio.open_connection("127.0.0.1", server.http_port)
    try:
        writer.write(
            b"POST /v1/tasks HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            b"Content-Length: 1000000000000\r\n\r\n"
        )
        await writer.drain()
        head = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
    finally:
        writer.close()
    assert head.startswith(b"HTTP/1.1 413 ")


CLIENT = "gateway-client-token-0123456789"
SECURED = toml_table("limits", max_http_body_bytes=4096) + token("GATEWAY_CLIENT_TOKEN", "client", env=True)


@pytest.fixture
def secured(tmp_path: Path) -> Iterator[ServerProcess]:
    with running_server(tmp_path, SECURED, env={"GATEWAY_CLIENT_TOKEN": CLIENT}) as proc:
        yield proc


async def expecting_continue(server: ServerProcess, token: str, length: int) -> list[bytes]:
    """POST /v1/tasks announcing a ``length``-byte body and holding it back for ``100 Continue``: the
    status lines answered. The body (``{}`` padded with spaces) is sent only if the server invites it."""
    reader, writer = await asyncio.open_connection("127.0.0.1", server.http_port)
    try:
        writer.write(
            b"POST /v1/tasks HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
            + f"Authorization: Bearer {token}\r\nContent-Length: {length}\r\n".encode()
            + b"Expect: 100-continue\r\n\r\n"
        )
        await writer.drain()
        first = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
        lines = [first.split(b"\r\n", 1)[0]]
        if first.startswith(b"HTTP/1.1 100 "):
            writer.write(b"{}" + b" " * (length - 2))
            final = await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 10)
            lines.append(final.split(b"\r\n", 1)[0])
        return lines
    finally:
        writer.close()


async def test_expect_100_continue_comes_only_after_authentication_and_the_size_check(
    secured: ServerProcess,
) -> None:
    assert await expecting_continue(secured, "not-a-known-token-at-all", 2) == [b"HTTP/1.1 401 Unauthorized"]
    # (The reason phrase is the Python version's: "Content Too Large" from 3.13 on.)
    [refused] = await expecting_continue(secured, CLIENT, 4097)
    assert refused.startswith(b"HTTP/1.1 413 ")
    assert await expecting_continue(secured, CLIENT, 2) == [b"HTTP/1.1 100 Continue", b"HTTP/1.1 200 OK"]
