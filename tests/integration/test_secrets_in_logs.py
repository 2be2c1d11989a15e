"""Secrets never reach the logs.

A real server (memory store, debug logging, stdout and stderr captured) gets its tokens from
``token_env``, posts its desired capacity to a webhook with a bearer token from ``token_env`` (and to a
second one whose URL carries a password), and is called over HTTP and gRPC with every credential it
knows, with a wrong token that looks like a real one, with tokens in the wrong places (a Basic header,
a query parameter, a header line the HTTP parser refuses) and by a worker. Afterwards neither the
secrets nor the wrong token appear anywhere in what the process wrote, in any common encoding.
``--check`` with bad credentials names the problem without printing the secret either.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import socket
import subprocess
import sys
import urllib.parse
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import grpc
import pytest
from aiohttp import web

from cronoq.client import Client, ClientError, Lease
from cronoq.v1 import cronoq_pb2 as pb
from cronoq.v1 import cronoq_pb2_grpc as pbg
from tests.ports import free_port

from .helpers import token, worker
from .serverproc import new_server

pytestmark = pytest.mark.asyncio

CLIENT = "cl-secret-7f3a9c1e5b2d4f60"
WORKER = "wk-secret-2b8e6d4a0c9f1e37"
METRICS = "mt-secret-9d1c7e3b5a2f8046"
ADMIN = "ad-secret-4e0b2f8c6a1d9e75"
WEBHOOK = "wh-secret-8a6c4e2f0b9d7135"
PASSWORD = "pw-secret-3c5e7a9b1d2f4068"
WRONG = "cl-secret-7f3a9c1e5b2d4f61"  # one character off the client token
SECRETS = {
    "client token": CLIENT,
    "worker token": WORKER,
    "metrics token": METRICS,
    "admin token": ADMIN,
    "webhook token": WEBHOOK,
    "webhook password": PASSWORD,
    "wrong token": WRONG,
}
ENV = {
    "S_CLIENT": CLIENT,
    "S_WORKER": WORKER,
    "S_METRICS": METRICS,
    "S_ADMIN": ADMIN,
    "S_WEBHOOK": WEBHOOK,
    "CRONOQ_LOG": "debug",
}


def config(port: int) -> str:
    tokens = "".join(
        token(f"S_{role.upper()}", role, env=True) for role in ("client", "worker", "metrics", "admin")
    )
    return f"""{tokens}
[[pools]]
name = "default"
max = 8
autoscale = true
drain_time_s = 1
scaler = {{ kind = "webhook", url = "http://127.0.0.1:{port}/hook", token_env = "S_WEBHOOK" }}

[[pools]]
name = "basic"
max = 8
autoscale = true
drain_time_s = 1
scaler = {{ kind = "webhook", url = "http://hook:{PASSWORD}@127.0.0.1:{port}/basic" }}
"""


def encodings(secret: str) -> set[str]:
    """The forms a secret could take in a log line."""
    return {
        secret,
        secret[4:],  # the random part alone
        base64.b64encode(secret.encode()).decode().rstrip("="),
        base64.b64encode(f"hook:{secret}".encode()).decode().rstrip("="),
        urllib.parse.quote(secret),
        secret.encode().hex(),
    }


def assert_no_secret(text: str, where: str) -> None:
    for name, secret in SECRETS.items():
        for form in encodings(secret):
            assert form not in text, f"the {name} appears in {where} (as {form!r})"


class Receiver:
    """The webhook: records the Authorization header of each call; the first call is answered 500."""

    def __init__(self) -> None:
        self.calls: list[tuple[str, str | None]] = []
        self.arrived = asyncio.Event()

    async def hook(self, request: web.Request) -> web.Response:
        self.calls.append((request.path, request.headers.get("Authorization")))
        self.arrived.set()
        if len(self.calls) == 1:
            return web.Response(status=500, text="not now")
        return web.json_response({"ok": True})

    async def until(self, path: str, count: int) -> None:
        async def wait() -> None:
            while sum(p == path for p, _ in self.calls) < count:
                self.arrived.clear()
                await self.arrived.wait()

        await asyncio.wait_for(wait(), 20)


@contextlib.asynccontextmanager
async def receiving() -> AsyncIterator[tuple[Receiver, int]]:
    receiver = Receiver()
    app = web.Application()
    app.router.add_post("/hook", receiver.hook)
    app.router.add_post("/basic", receiver.hook)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield receiver, port
    finally:
        await runner.cleanup()


async def http_calls(base: str) -> None:
    """Every HTTP credential on a route it may use and on one it may not; wrong and misplaced tokens."""

    async def call(
        method: str,
        path: str,
        authorization: str | None,
        expected: int,
        body: object = None,
        echo: bool = False,
    ) -> None:
        """``echo``: the request itself carries a secret in the path, which the answer may name."""
        headers = {"authorization": authorization} if authorization is not None else {}
        async with (
            aiohttp.ClientSession() as session,
            session.request(method, base + path, headers=headers, json=body) as response,
        ):
            text = await response.text()
            assert response.status == expected, (method, path, response.status, text)
            if not echo:
                assert_no_secret(text, f"the answer to {method} {path}")

    bearer = {role: f"Bearer {token}" for role, token in (("c", CLIENT), ("m", METRICS), ("a", ADMIN))}
    await call("POST", "/v1/tasks", bearer["c"], 200, {"payload": 1, "pool": "basic"})
    await call("GET", "/v1/tasks?limit=5", bearer["c"], 200)
    await call("GET", "/v1/snapshot", bearer["c"], 403)
    await call("GET", "/v1/snapshot", bearer["m"], 200)
    await call("GET", "/metrics", bearer["m"], 200)
    await call("POST", "/v1/recurring", bearer["m"], 403, {"name": "r", "cron": "0 3 * * *"})
    await call("POST", "/v1/recurring", bearer["a"], 200, {"name": "r", "cron": "0 3 * * *"})
    await call("DELETE", "/v1/recurring/r", bearer["a"], 200)
    await call("GET", "/v1/workers", f"Bearer {WORKER}", 403)
    await call("GET", "/v1/tasks", f"Bearer {WRONG}", 401)
    await call("GET", "/v1/tasks", f"bearer {WRONG}", 401)
    await call("GET", "/v1/tasks", WRONG, 401)
    await call("GET", "/v1/tasks", "Basic " + base64.b64encode(f"user:{CLIENT}".encode()).decode(), 401)
    await call("GET", "/v1/tasks", f"Bearer {CLIENT} {WRONG}", 401)
    await call("GET", "/v1/tasks", None, 401)
    await call("GET", f"/v1/tasks?access_token={CLIENT}", bearer["c"], 400)
    await call("GET", f"/v1/tasks/{CLIENT}", bearer["c"], 404, echo=True)  # a key nobody has


def raw_http(port: int, request: bytes) -> bytes:
    """A request the HTTP parser refuses (a control character after the token)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as conn:
        conn.sendall(request)
        return conn.recv(65536)


async def grpc_calls(target: str) -> None:
    async with Client(target, token=CLIENT) as client:
        submitted = await client.submit(b"x", pool="default")
        await client.get(submitted.id)
        await client.list_tasks(limit=5)
        with pytest.raises(ClientError) as err:
            await client.snapshot()
        assert err.value.code == "permission_denied"
        assert_no_secret(str(err.value), "a PERMISSION_DENIED message")
    async with Client(target, token=WRONG) as stranger:
        with pytest.raises(ClientError) as err:
            await stranger.submit(b"x")
        assert err.value.code == "unauthenticated"
        assert_no_secret(str(err.value), "an UNAUTHENTICATED message")
    async with Client(target, token=METRICS) as metrics:
        await metrics.snapshot()
        await metrics.list_workers()

    # A worker with the wrong token is refused; one with the worker token runs the task.
    async with grpc.aio.insecure_channel(target) as channel:
        call = pbg.WorkersStub(channel).Work(metadata=[("authorization", f"Bearer {WRONG}")])
        await call.write(pb.WorkerMessage(register=pb.Register(pool="default", slots=1, protocol_version=3)))
        with contextlib.suppress(grpc.aio.AioRpcError):
            async for _ in call:
                pass
        assert await call.code() == grpc.StatusCode.UNAUTHENTICATED
        assert_no_secret(await call.details(), "a refused worker's status")

    async def handler(lease: Lease) -> bytes:
        # A run time the autoscaler cannot call negligible: it is the pool's service time from here on,
        # and with a no-op's (well under a millisecond over a batched stream) the twelve tasks queued
        # later would be less than a hundredth of a worker's demand, changing no target.
        await asyncio.sleep(0.05)
        return b"done"

    async with Client(target, token=CLIENT) as client, worker(target, handler, token=WORKER):
        result = await client.wait(submitted.id, timeout=10)
        assert result.status == "succeeded"


async def test_no_secret_is_ever_logged(tmp_path: Path) -> None:
    async with receiving() as (receiver, port):
        server = new_server(tmp_path, config(port), env=ENV)
        await asyncio.to_thread(server.start)
        try:
            # Both webhooks hear the first target of their pool (the first call is refused: a logged
            # failure); each with its credential, which must reach the receiver and nothing else.
            await receiver.until("/hook", 1)
            await receiver.until("/basic", 1)
            await http_calls(server.http)
            for head in (
                f"GET /v1/tasks HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {CLIENT}\x01\r\n\r\n",
                f"GET /v1/tasks HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {WRONG}\x00\r\n\r\n",
                f"GET /v1/tasks?{ADMIN}\x7f HTTP/1.1\r\nHost: x\r\n\r\n",
            ):
                answer = await asyncio.to_thread(raw_http, server.http_port, head.encode())
                assert answer.split(b" ", 2)[1] == b"400", answer
            await grpc_calls(server.target)
            # Queue pressure changes the targets: more webhook calls, now answered 200.
            async with Client(server.target, token=CLIENT) as client:
                for pool in ("default", "basic"):
                    for i in range(12):
                        await client.submit(str(i).encode(), pool=pool)
            await receiver.until("/hook", 2)
            await receiver.until("/basic", 2)
        finally:
            await asyncio.to_thread(server.stop)
    assert {auth for path, auth in receiver.calls if path == "/hook"} == {f"Bearer {WEBHOOK}"}
    basic = "Basic " + base64.b64encode(f"hook:{PASSWORD}".encode()).decode()
    assert {auth for path, auth in receiver.calls if path == "/basic"} == {basic}

    logs = server.logs()
    # The log is not empty: requests, workers and the webhook's failure and successes were logged.
    for event in ("worker_registered", "scaler_webhook_failed", "scaler_webhook_sent", "stopped"):
        assert event in logs, event
    assert_no_secret(logs, "the server log")


@pytest.mark.parametrize(
    ("entry", "env", "named"),
    [
        ('token = "{secret}"', {}, "auth.tokens[0].token"),  # too short
        ('token_env = "S_SHORT"', {"S_SHORT": "{secret}"}, "S_SHORT"),  # too short, from the environment
    ],
    ids=["short literal", "short from env"],
)
async def test_check_names_bad_credentials_without_printing_them(
    tmp_path: Path, entry: str, env: dict[str, str], named: str
) -> None:
    secret = "short-7a1c"  # shorter than 16 characters: refused
    path = tmp_path / "cronoq.toml"
    path.write_text(f'[[auth.tokens]]\n{entry.format(secret=secret)}\nrole = "client"\n')
    result = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "cronoq.shard.main", "--config", str(path), "--check"],
        capture_output=True,
        text=True,
        env={k: v.format(secret=secret) for k, v in env.items()} | {"PATH": "/usr/bin:/bin"},
        timeout=30,
    )
    output = result.stdout + result.stderr
    assert result.returncode == 1, output
    assert named in output, output
    assert secret not in output and secret[6:] not in output, output
