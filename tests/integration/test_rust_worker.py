"""The Rust SDK (sdk/rust): its worker (``cronoq::worker::run_worker``) in the scenarios of
:mod:`.sdkworkers`, driving sdk/rust/examples/testworker.rs (the Go test worker's flags, payloads and
JSON lines; see :mod:`.rustsdk`); the crate's unit tests; and its generated messages."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest

from cronoq.v1 import cronoq_pb2 as pb

from .rustsdk import GENERATED, RustWorker, built_testworker, cargo, generate
from .sdkworkers import *  # noqa: F403 (the shared tests, collected here)
from .sdkworkers import Sdk


@pytest.fixture(scope="module")
def sdk() -> Sdk:
    # rustls 0.20 checks DNS names only: to the server's IP address, the name its certificate also has.
    return Sdk(RustWorker, built_testworker, cancelled="cancelled", ip_tls=("-domain", "localhost"))


async def test_the_crates_unit_tests_pass() -> None:
    tested = cargo("test", "--lib")
    assert tested.returncode == 0, tested.stdout[-3000:] + tested.stderr[-3000:]


async def test_the_generated_messages_are_current(tmp_path: Path) -> None:
    generate(tmp_path)
    assert (tmp_path / GENERATED.name).read_text() == GENERATED.read_text(), "run `make sdk-rust-proto`"


async def test_without_cargo_the_tests_are_skipped_saying_why(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no cargo on it, nor in ~/.cargo/bin
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(pytest.skip.Exception, match="cargo is not installed"):
        built_testworker.__wrapped__()  # not the session's cached build


async def test_not_leader_reconnects_at_once_to_a_server_without_batches(tmp_path: Path) -> None:
    """A scripted server with Workers.Work only (as the reference server): the worker falls back to it
    from BatchedWorkers.Work, and when the stream ends with Shutdown(not_leader) it registers again at
    once, not after its backoff (30 s here)."""
    registrations: list[pb.Register] = []
    done = asyncio.Event()

    async def work(
        requests: AsyncIterator[pb.WorkerMessage], context: grpc.aio.ServicerContext[Any, Any]
    ) -> AsyncIterator[pb.ServerMessage]:
        first = await anext(aiter(requests))
        registrations.append(first.register)
        yield pb.ServerMessage(
            registered=pb.Registered(worker_id=len(registrations), slots=1, protocol_version=3)
        )
        if len(registrations) == 1:
            yield pb.ServerMessage(shutdown=pb.Shutdown(reason="leadership moved", not_leader=True))
        else:
            await done.wait()

    server = grpc.aio.server()
    handler = grpc.stream_stream_rpc_method_handler(
        work,
        request_deserializer=pb.WorkerMessage.FromString,
        response_serializer=pb.ServerMessage.SerializeToString,
    )
    server.add_generic_rpc_handlers(
        (grpc.method_handlers_generic_handler("cronoq.v1.Workers", {"Work": handler}),)
    )
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        with RustWorker(f"127.0.0.1:{port}", "-backoff", "30s", "-name", "scripted", registered=False) as w:
            first = await asyncio.to_thread(w.expect, "registered", 20)
            second = await asyncio.to_thread(w.expect, "registered", 10)  # well within the backoff
            assert (first["batched"], second["batched"], second["worker_id"]) == (False, False, 2)
            assert [r.worker_name for r in registrations] == ["scripted", "scripted"]
            done.set()
    finally:
        await server.stop(None)
