"""Scripted gRPC servers on real loopback sockets, standing in for cronoq-server in SDK tests.

A test drives the server side by hand: it takes each accepted Work stream from ``WorkersServer.streams``,
sends ``ServerMessage``s and waits for the worker's messages by kind. ``ApiServer`` records every Tasks
and Admin request and answers from a table the test fills in.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from typing import Any

import grpc

from cronoq.client import Worker
from cronoq.v1 import cronoq_pb2 as pb
from cronoq.v1 import cronoq_pb2_grpc as pb_grpc

TIMEOUT = 5.0  # upper bound for anything a test waits for; reached only when the SDK misbehaves


@dataclass(frozen=True)
class Refusal:
    """A status a server ends a stream (or call) with, plus trailing metadata."""

    code: grpc.StatusCode
    details: str = ""
    metadata: tuple[tuple[str, str], ...] = ()


def redirect_to(url: str) -> Refusal:
    return Refusal(
        grpc.StatusCode.FAILED_PRECONDITION,
        "pool is served by shard b",
        (("cronoq-shard", "b"), ("cronoq-shard-endpoint", url)),
    )


class WorkStream:
    """The server end of one Work stream."""

    def __init__(self, context: Any) -> None:
        self.context = context
        self.log: list[pb.WorkerMessage] = []  # every message received, in order
        self.half_closed = asyncio.Event()
        self._taken: set[int] = set()
        self._arrived = asyncio.Condition()
        self._end: asyncio.Future[Refusal | None] = asyncio.get_running_loop().create_future()
        self.end_on_half_close = True

    async def send(self, **message: Any) -> None:
        await self.context.write(pb.ServerMessage(**message))

    async def next(self, kind: str) -> Any:
        """The oldest not yet taken message of this kind (``register``, ``complete``, ...)."""
        async with asyncio.timeout(TIMEOUT), self._arrived:
            while True:
                for index, message in enumerate(self.log):
                    if index not in self._taken and message.WhichOneof("msg") == kind:
                        self._taken.add(index)
                        return getattr(message, kind)
                await self._arrived.wait()

    def kinds(self) -> list[str | None]:
        return [message.WhichOneof("msg") for message in self.log]

    async def handshake(
        self, *, slots: int | None = None, ttl: float | None = None, protocol: int = 3, max_bytes: int = 0
    ) -> pb.Register:
        """Reads Register and answers Registered (granting what was asked unless ``slots``)."""
        register: pb.Register = await self.next("register")
        registered = pb.Registered(
            worker_id=42,
            lease_ttl_s=ttl,
            slots=register.slots if slots is None else slots,
            protocol_version=protocol,
            max_message_bytes=max_bytes,
        )
        await self.send(registered=registered)
        return register

    async def lease(self, lease_id: int, payload: bytes = b"", **fields: Any) -> None:
        await self.send(
            lease=pb.Lease(lease=lease_id, task_id=1000 + lease_id, attempt=1, payload=payload, **fields)
        )

    def end(self, refusal: Refusal | None = None) -> None:
        """Ends the stream with OK or with ``refusal``."""
        if not self._end.done():
            self._end.set_result(refusal)

    async def _read(self) -> None:
        while (message := await self.context.read()) is not grpc.aio.EOF:
            async with self._arrived:
                self.log.append(message)
                self._arrived.notify_all()
        self.half_closed.set()
        if self.end_on_half_close:  # like cronoq-server
            self.end()

    async def serve(self) -> None:
        reader = asyncio.create_task(self._read())
        try:
            refusal = await self._end
        finally:
            reader.cancel()
        if refusal is not None:
            await self.context.abort(refusal.code, refusal.details, trailing_metadata=refusal.metadata)


class WorkersServer:
    """``Workers.Work``: each connection first takes the next entry of ``refusals`` (ending the stream
    with it before any message is sent back), then behaves as a scripted ``WorkStream``."""

    def __init__(self) -> None:
        self.streams: asyncio.Queue[WorkStream] = asyncio.Queue()
        self.refusals: list[Refusal | None] = []
        self.end_on_half_close = True
        self.connects = 0
        self.connected = asyncio.Event()  # set by the first connection
        self.metadata: list[dict[str, str]] = []
        self.target = ""
        # BatchedWorkers.Work calls, when serve() is asked to count them (``batch_probes=True``): answered
        # UNIMPLEMENTED, as a server without the extension does. Otherwise the method is not served at all.
        self.batch_probes = 0

    @property
    def url(self) -> str:
        return f"http://{self.target}"

    async def Work(self, request_iterator: Any, context: Any) -> None:
        self.connects += 1
        self.connected.set()
        self.metadata.append({key: value for key, value in context.invocation_metadata()})
        refusal = self.refusals.pop(0) if self.refusals else None
        if refusal is not None:
            await context.read()
            await context.abort(refusal.code, refusal.details, trailing_metadata=refusal.metadata)
        stream = WorkStream(context)
        stream.end_on_half_close = self.end_on_half_close
        self.streams.put_nowait(stream)
        await stream.serve()

    async def accept(self) -> WorkStream:
        async with asyncio.timeout(TIMEOUT):
            return await self.streams.get()


class _BatchProbes(pb_grpc.BatchedWorkersServicer):
    def __init__(self, workers: WorkersServer) -> None:
        self.workers = workers

    async def Work(self, request_iterator: Any, context: Any) -> None:  # type: ignore[override]
        self.workers.batch_probes += 1
        await context.abort(grpc.StatusCode.UNIMPLEMENTED, "Method not found!")


@dataclass
class Call:
    method: str
    request: Any
    metadata: dict[str, str]
    time_remaining: float | None


@dataclass
class ApiServer:
    """Tasks and Admin: records each call; answers with ``responses[method]`` (a message, a
    ``Refusal``, or a callable of the request returning one). ``Watch`` streams ``events``, then, if
    ``watch_feed`` is set, what the test puts there until ``None``, and then ends with ``watch_end``,
    after sending ``watch_metadata`` as its initial metadata. ``watch_ended`` is set when a Watch
    handler ends, whether it finished or the client cancelled the call."""

    responses: dict[str, Any] = field(default_factory=dict)
    calls: list[Call] = field(default_factory=list)
    events: list[pb.StatusEvent] = field(default_factory=list)
    watch_end: Refusal | None = None
    watch_metadata: tuple[tuple[str, str], ...] = ()
    watch_feed: asyncio.Queue[pb.StatusEvent | None] | None = None
    watch_ended: asyncio.Event = field(default_factory=asyncio.Event)
    target: str = ""

    def last(self, method: str) -> Call:
        return [call for call in self.calls if call.method == method][-1]

    async def _answer(self, method: str, request: Any, context: Any) -> Any:
        self.calls.append(
            Call(method, request, dict(context.invocation_metadata()), context.time_remaining())
        )
        answer = self.responses.get(method)
        if callable(answer) and not isinstance(answer, Refusal):
            answer = answer(request)
        if isinstance(answer, Refusal):
            await context.abort(answer.code, answer.details, trailing_metadata=answer.metadata)
        if asyncio.iscoroutine(answer):
            answer = await answer
        return answer

    def __getattr__(self, method: str) -> Callable[[Any, Any], Any]:
        if not method[:1].isupper():
            raise AttributeError(method)

        async def unary(request: Any, context: Any) -> Any:
            return await self._answer(method, request, context)

        return unary

    async def Watch(self, request: pb.WatchRequest, context: Any) -> AsyncIterator[pb.StatusEvent]:
        self.calls.append(Call("Watch", request, dict(context.invocation_metadata()), None))
        try:
            await context.send_initial_metadata(self.watch_metadata)
            for event in self.events:
                yield event
            while self.watch_feed is not None and (fed := await self.watch_feed.get()) is not None:
                yield fed
            if self.watch_end is not None:
                await context.abort(self.watch_end.code, self.watch_end.details)
        finally:
            self.watch_ended.set()


@asynccontextmanager
async def serve(
    servicer: Any,
    port: int = 0,
    credentials: Any = None,
    options: list[tuple[str, Any]] | None = None,
    *,
    batch_probes: bool = False,
) -> AsyncIterator[str]:
    """Serves ``servicer`` on 127.0.0.1 (``port`` 0 picks a free one, ``credentials`` means TLS,
    ``options`` are grpc server options); yields ``host:port``. ``batch_probes``: a WorkersServer counts
    the BatchedWorkers.Work calls it refuses."""
    server = grpc.aio.server(options=options)
    if isinstance(servicer, WorkersServer):
        # Served as a WorkersServicer, whose Work grpc.aio calls, without deriving from one: its Work is a
        # coroutine writing through the context, which the generated stub does not describe.
        pb_grpc.add_WorkersServicer_to_server(servicer, server)  # type: ignore[arg-type]
        if batch_probes:
            pb_grpc.add_BatchedWorkersServicer_to_server(_BatchProbes(servicer), server)
    else:
        pb_grpc.add_TasksServicer_to_server(servicer, server)
        pb_grpc.add_AdminServicer_to_server(servicer, server)
    address = f"127.0.0.1:{port}"
    if credentials is None:
        bound = server.add_insecure_port(address)
    else:
        bound = server.add_secure_port(address, credentials)
    await server.start()
    servicer.target = f"127.0.0.1:{bound}"
    try:
        yield servicer.target
    finally:
        await server.stop(None)


@asynccontextmanager
async def running(worker: Worker) -> AsyncIterator[asyncio.Task[None]]:
    """Runs the worker for the block; stops it (grace 0) on the way out unless it already ended."""
    task = asyncio.create_task(worker.run())
    try:
        yield task
    finally:
        if not task.done():
            await asyncio.wait_for(worker.stop(grace=0), TIMEOUT)
        task.cancel()
        with contextlib.suppress(BaseException):
            await task
