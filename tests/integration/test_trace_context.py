"""The caller's W3C trace context travels with its task without any tracing configured: from a Submit's
gRPC metadata or HTTP headers, kept as the task's ``traceparent``/``tracestate`` tags (by a durable
store too: a restarted server still hands it out), to the worker with each lease. A malformed one is
ignored, not refused. And a server told to trace without the ``otel`` extra refuses to start, saying
what to install, while one that is not told to serves without ever importing OpenTelemetry."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import aiohttp
import grpc
import pytest

from cronoq.client import Lease
from cronoq.v1 import cronoq_pb2 as pb
from cronoq.v1 import cronoq_pb2_grpc as pbg

from .helpers import sqlite_store, worker
from .serverproc import new_server, running_server

PARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
STATE = "vendor=opaque"


@asynccontextmanager
async def leases(target: str) -> AsyncIterator[asyncio.Queue[Lease]]:
    """A worker of pool ``default`` that puts every lease it gets here."""
    got: asyncio.Queue[Lease] = asyncio.Queue()

    async def handler(lease: Lease) -> None:
        got.put_nowait(lease)

    async with worker(target, handler):
        yield got


async def submit(
    target: str, metadata: tuple[tuple[str, str], ...], tags: dict[str, str] | None = None
) -> int:
    async with grpc.aio.insecure_channel(target) as channel:
        answer = await pbg.TasksStub(channel).Submit(
            pb.SubmitRequest(task=pb.TaskSpec(payload=b"x", tags=tags or {})), metadata=metadata
        )
        return int(answer.id)


async def lease_of(got: asyncio.Queue[Lease], task_id: int) -> Lease:
    async with asyncio.timeout(10):
        while (lease := await got.get()).task_id != task_id:
            pass
        return lease


async def test_the_context_of_a_submit_reaches_the_worker(tmp_path: Path) -> None:
    with running_server(tmp_path) as server:
        async with leases(server.target) as got:
            both = await submit(server.target, (("traceparent", PARENT), ("tracestate", STATE)))
            assert (await lease_of(got, both)).tags == {"traceparent": PARENT, "tracestate": STATE}
            # W3C: a malformed traceparent is ignored (and its tracestate with it); the call succeeds.
            for bad in (
                "00-xyz",
                PARENT.replace("-01", "-01-"),
                "ff" + PARENT[2:],
                PARENT[:3] + "0" * 32 + PARENT[35:],
            ):
                task_id = await submit(server.target, (("traceparent", bad), ("tracestate", STATE)))
                assert (await lease_of(got, task_id)).tags == {}, bad
            # A producer's own traceparent tag is the task's context; its other tags stay as they are.
            own = "00-11111111111111111111111111111111-2222222222222222-00"
            task_id = await submit(server.target, (("traceparent", PARENT),), {"traceparent": own, "a": "b"})
            assert (await lease_of(got, task_id)).tags == {"traceparent": own, "a": "b"}
            # Over HTTP, from the headers of the same names.
            async with aiohttp.ClientSession() as http:
                for headers, tags in (
                    (
                        {"traceparent": PARENT, "tracestate": STATE},
                        {"traceparent": PARENT, "tracestate": STATE},
                    ),
                    ({"traceparent": "not-a-traceparent", "tracestate": STATE}, {}),
                ):
                    async with http.post(f"{server.http}/v1/tasks", json={}, headers=headers) as r:
                        assert r.status == 200, await r.text()
                        task_id = (await r.json())["id"]
                    assert (await lease_of(got, int(task_id))).tags == tags


async def test_a_durable_store_keeps_the_context(tmp_path: Path) -> None:
    config = sqlite_store(tmp_path / "cronoq.db")
    server = new_server(tmp_path / "server", config)
    server.start()
    try:
        task_id = await submit(server.target, (("traceparent", PARENT),))
        server.stop()
        server.start()  # the task is recovered from the file, with its tags
        async with leases(server.target) as got:
            assert (await lease_of(got, task_id)).tags == {"traceparent": PARENT}
    finally:
        server.stop()


def without_extra(tmp_path: Path) -> dict[str, str]:
    """An environment whose ``opentelemetry`` is an empty package ahead of the installed one, as if the
    ``otel`` extra were not installed."""
    shadow = tmp_path / "no-otel" / "opentelemetry"
    shadow.mkdir(parents=True)
    (shadow / "__init__.py").write_text("")
    return {"PYTHONPATH": str(shadow.parent)}


@pytest.mark.parametrize(
    ("body", "env", "named"),
    [
        ("[telemetry]\nenabled = true\n", {}, "telemetry.enabled"),
        ("", {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317"}, "OTEL_EXPORTER_OTLP_ENDPOINT"),
    ],
)
def test_tracing_without_the_extra_refuses_to_start(
    tmp_path: Path, body: str, env: dict[str, str], named: str
) -> None:
    server = new_server(tmp_path, body, {**without_extra(tmp_path), **env})
    command = [sys.executable, "-m", "cronoq.shard.main", "--config", str(server.config_path)]
    environ = {"PATH": "/usr/bin:/bin", **server.env}
    done = subprocess.run(command, env=environ, capture_output=True, text=True, timeout=30)
    assert done.returncode == 1
    assert named in done.stderr and "pip install 'cronoq[otel]'" in done.stderr, done.stderr
    checked = subprocess.run([*command, "--check"], env=environ, capture_output=True, text=True, timeout=30)
    assert checked.returncode == 0, checked.stderr  # the file is fine; the installation is what lacks


async def test_without_the_extra_everything_else_works(tmp_path: Path) -> None:
    with running_server(tmp_path, "", without_extra(tmp_path)) as server:
        async with leases(server.target) as got:
            task_id = await submit(server.target, (("traceparent", PARENT),))
            assert (await lease_of(got, task_id)).tags == {"traceparent": PARENT}


def test_nothing_of_opentelemetry_is_imported_unless_tracing() -> None:
    """A server, a router or the SDK that do not trace import nothing of OpenTelemetry (installed here)."""
    probe = (
        "import sys, cronoq.shard.server, cronoq.router.server, cronoq.client, cronoq.shard.main;"
        "print(sorted(m for m in sys.modules if m.startswith('opentelemetry')))"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=30, check=True
    )
    assert done.stdout == "[]\n"
