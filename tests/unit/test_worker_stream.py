"""The server's side of one Work stream, driven through a scripted context instead of gRPC: how it ends
when the transport fails under it."""

from __future__ import annotations

import asyncio
import gc
from typing import Any

import grpc

from cronoq.auth import Role
from cronoq.engine import Engine
from cronoq.engine.model import PoolConfig
from cronoq.v1 import cronoq_pb2 as pb
from shard.outputs import OutputCache
from shard.runtime import Runtime
from shard.workers import WorkerStream
from tests.shardkit import SPEC_LIMITS, service_over

NOW = 1_900_000_000.0


class StalledContext:
    """Hands the stream the worker's messages from ``inbox``; every write stays pending until ``fail``
    is set, then fails the way grpc's does once the call is gone."""

    def __init__(self) -> None:
        self.inbox: asyncio.Queue[Any] = asyncio.Queue()
        self.writing = asyncio.Event()
        self.fail = asyncio.Event()

    async def read(self) -> Any:
        return await self.inbox.get()

    async def write(self, message: pb.ServerMessage) -> None:
        self.writing.set()
        await self.fail.wait()
        raise RuntimeError('Failed "execute_batch"')  # what grpc.aio raises for a write to a dead call


async def test_a_write_failing_after_the_call_was_cancelled_is_collected_not_logged_as_lost() -> None:
    """A worker goes away while a message is being written: its call ends, the stream stops its writer,
    and the call is cancelled while that waits. The write fails afterwards; nobody is left to await the
    writer, and asyncio must not report its error as "never retrieved" (an error-level line with a
    traceback, for an everyday disconnect)."""
    unretrieved: list[dict[str, Any]] = []
    loop = asyncio.get_running_loop()
    loop.set_exception_handler(lambda _, context: unretrieved.append(context))
    try:
        pools = [PoolConfig("default")]
        runtime = Runtime(Engine(pools), OutputCache(10, 1 << 20), clock=lambda: NOW)
        service = service_over(runtime, pools)
        context = StalledContext()
        stream = WorkerStream(
            runtime,
            context,
            service.authorize(None, Role.WORKER),
            spec_limits=SPEC_LIMITS,
            max_message_bytes=1 << 20,
            connected={},
        )
        register = pb.Register(pool="default", slots=1, protocol_version=3)
        context.inbox.put_nowait(pb.WorkerMessage(register=register))
        serving = asyncio.create_task(stream.serve())
        await asyncio.wait_for(context.writing.wait(), 5)  # Registered is being written

        context.inbox.put_nowait(grpc.aio.EOF)  # the worker half-closes; the stream stops its writer
        for _ in range(20):  # let the stream run until it blocks (no time passes)
            await asyncio.sleep(0)
        assert not runtime.sessions and not serving.done(), "the stream is not waiting for its writer"
        serving.cancel()  # and grpc cancels the call meanwhile
        await asyncio.gather(serving, return_exceptions=True)
        assert serving.cancelled()

        context.fail.set()  # the pending write fails now
        writer = stream._writer
        assert writer is not None
        await asyncio.wait({writer})  # (which, unlike gather, leaves its error unretrieved)
        del writer, stream, serving
        gc.collect()  # a task whose error nobody retrieved reports it as it is freed
        assert unretrieved == []
        runtime.cancel_timer()
    finally:
        loop.set_exception_handler(None)
