"""gRPC adapters: thin Tasks and Admin servicers over a :class:`.handler.RequestHandler`.

Each method authenticates from the call's metadata, calls the shared request logic and renders an
:class:`~cronoq.errors.ApiError` as a gRPC status (with its metadata). The opening of a Workers.Work
call (or BatchedWorkers.Work), which a shard serves and the router redirects, is checked here for both.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from typing import Any, TypeVar

from cronoq.auth import Principal, Role
from cronoq.checks import MAX_POOL_LEN, check_text
from cronoq.cluster.routing import Watch, serving
from cronoq.errors import ApiError, FailedPrecondition, InvalidArgument
from cronoq.logs import get_logger
from cronoq.tracecontext import from_metadata, incoming_trace
from cronoq.transport import (
    KEY_PROBE_KEY,
    OUTPUT_TYPE_KEY,
    POOL_KEY,
    UNAVAILABLE_SHARDS_KEY,
    bearer,
    forwarded,
    grpc_status,
    metadata_value,
    take_first_message,
)
from cronoq.v1 import cronoq_pb2 as pb
from cronoq.v1 import cronoq_pb2_grpc as pbg

from .handler import RequestHandler

Ctx = Any  # grpc.aio.ServicerContext; grpc ships no type information
T = TypeVar("T")
log = get_logger("cronoq.grpc")


def authorize(service: RequestHandler, context: Ctx, role: Role) -> Principal:
    metadata = context.invocation_metadata()
    return service.authorize(bearer(metadata), role, forwarded(metadata), cert_dns_names(context))


async def authorize_worker(service: RequestHandler, context: Ctx) -> Principal:
    """``authorize`` for a Workers.Work call (shard or router): a refused worker has its Register taken
    first (``take_first_message``), so that it gets this status rather than INTERNAL."""
    try:
        return authorize(service, context, Role.WORKER)
    except ApiError:
        await take_first_message(context)
        raise


def frame_messages(frame: Any, batched: bool) -> Sequence[pb.WorkerMessage]:
    """The worker messages one frame read from a Work stream carries, in order: the frame itself on
    ``Workers.Work``, the messages of its ``WorkerBatch`` on ``BatchedWorkers.Work`` (never none)."""
    if not batched:
        return (frame,)
    messages: Sequence[pb.WorkerMessage] = frame.messages
    if not messages:
        raise InvalidArgument("messages: a batch carries at least one worker message")
    return messages


def registration(first: pb.WorkerMessage) -> pb.Register:
    """The ``Register`` a Work stream must open with (``first``, its first message), checked as far as
    it can be without knowing the pool: a shard and the router refuse a bad opening alike."""
    if first.WhichOneof("msg") != "register":
        raise FailedPrecondition("the first message on a Work stream must be register")
    register = first.register
    if not register.pool:
        raise InvalidArgument("register.pool: required")
    check_text("register.pool", register.pool, MAX_POOL_LEN)
    return register


def named_pool(context: Ctx) -> str:
    """The pool the caller named for the task it looks up (``POOL_KEY`` metadata; "" when none)."""
    pool = metadata_value(context.invocation_metadata(), POOL_KEY) or ""
    return check_text("pool", pool, MAX_POOL_LEN) if pool else ""


def cert_dns_names(context: Ctx) -> list[str]:
    """The DNS names of the caller's client certificate. gRPC reports a peer certificate only after
    verifying it against ``client_ca_path`` (mTLS), so these names can be trusted. Only DNS SANs
    (``peer_dns``): ``x509_subject_alternative_name`` mixes in URI, email and IP SANs, and a URI SAN
    spelled like a configured ``dns_name`` must not pass for it (HTTP reads DNS SANs only too)."""
    names = context.auth_context().get("peer_dns", [])
    return [n.decode() if isinstance(n, bytes) else str(n) for n in names]


async def call(context: Ctx, fn: Callable[[], Awaitable[T]]) -> T:
    try:
        return await fn()
    except ApiError as err:
        await context.abort(grpc_status(err), err.message, err.metadata)
        raise  # unreachable: abort raises


class TasksServicer(pbg.TasksServicer):
    def __init__(self, service: RequestHandler) -> None:
        self.service = service

    def _output_type(self, context: Ctx, result: pb.TaskResult) -> None:
        """Tell a forwarding server the output's content type (see OUTPUT_TYPE_KEY)."""
        if result.output_available:
            output_type = self.service.output_type(result.id)
            if output_type:
                context.set_trailing_metadata(((OUTPUT_TYPE_KEY, output_type),))

    def _caller(self, context: Ctx) -> Principal:
        return authorize(self.service, context, Role.CLIENT)

    async def Submit(self, request: pb.SubmitRequest, context: Ctx) -> pb.SubmitResponse:
        async def run() -> pb.SubmitResponse:
            caller = self._caller(context)
            with incoming_trace(from_metadata(context.invocation_metadata())):
                response = await self.service.submit(caller, request)
            self._output_type(context, response.result)
            return response

        return await call(context, run)

    async def SubmitBatch(self, request: pb.SubmitBatchRequest, context: Ctx) -> pb.SubmitBatchResponse:
        async def run() -> pb.SubmitBatchResponse:
            caller = self._caller(context)
            with incoming_trace(from_metadata(context.invocation_metadata())):
                return await self.service.submit_batch(caller, request)

        return await call(context, run)

    async def Cancel(self, request: pb.CancelRequest, context: Ctx) -> pb.CancelResponse:
        async def run() -> pb.CancelResponse:
            return await self.service.cancel(self._caller(context), request, named_pool(context))

        return await call(context, run)

    async def Get(self, request: pb.GetRequest, context: Ctx) -> pb.TaskInfo:
        async def run() -> pb.TaskInfo:
            caller = self._caller(context)
            if metadata_value(context.invocation_metadata(), KEY_PROBE_KEY) is not None:
                return await self.service.probe(caller, request)
            return await self.service.get(caller, request, named_pool(context))

        return await call(context, run)

    async def ListTasks(self, request: pb.ListTasksRequest, context: Ctx) -> pb.ListTasksResponse:
        async def run() -> pb.ListTasksResponse:
            return await self.service.list_tasks(self._caller(context), request)

        return await call(context, run)

    async def Wait(self, request: pb.WaitRequest, context: Ctx) -> pb.TaskResult:
        async def run() -> pb.TaskResult:
            response = await self.service.wait(self._caller(context), request, named_pool(context))
            self._output_type(context, response)
            return response

        return await call(context, run)

    async def Watch(self, request: pb.WatchRequest, context: Ctx) -> AsyncIterator[pb.StatusEvent]:
        """The initial metadata goes out as soon as the stream is subscribed (on every shard it covers),
        before any event: it names the shards that could not be reached (``UNAVAILABLE_SHARDS_KEY``), and
        it tells a forwarding server that this stream is open even while no event comes. A refusal comes
        before it, as a status alone."""
        watch: Watch | None = None
        try:
            watch = serving(self.service.watch(self._caller(context), request))
            await watch.open()
            await context.send_initial_metadata(
                ((UNAVAILABLE_SHARDS_KEY, ",".join(watch.unavailable_shards)),)
            )
            async for event in watch:
                yield event
        except ApiError as err:
            await context.abort(grpc_status(err), err.message, err.metadata)
        finally:
            if watch is not None:
                await watch.aclose()


class AdminServicer(pbg.AdminServicer):
    def __init__(self, service: RequestHandler) -> None:
        self.service = service

    async def Snapshot(self, request: pb.Empty, context: Ctx) -> pb.SnapshotResponse:
        async def run() -> pb.SnapshotResponse:
            return await self.service.snapshot(authorize(self.service, context, Role.METRICS))

        return await call(context, run)

    async def ListWorkers(self, request: pb.Empty, context: Ctx) -> pb.ListWorkersResponse:
        async def run() -> pb.ListWorkersResponse:
            caller = authorize(self.service, context, Role.METRICS)
            return await self.service.list_workers(caller)

        return await call(context, run)

    async def AddRecurring(self, request: pb.RecurringRequest, context: Ctx) -> pb.Empty:
        async def run() -> pb.Empty:
            return await self.service.add_recurring(authorize(self.service, context, Role.ADMIN), request)

        return await call(context, run)

    async def RemoveRecurring(
        self, request: pb.RemoveRecurringRequest, context: Ctx
    ) -> pb.RemoveRecurringResponse:
        async def run() -> pb.RemoveRecurringResponse:
            caller = authorize(self.service, context, Role.ADMIN)
            return await self.service.remove_recurring(caller, request)

        return await call(context, run)

    async def ListRecurring(self, request: pb.Empty, context: Ctx) -> pb.ListRecurringResponse:
        async def run() -> pb.ListRecurringResponse:
            return await self.service.list_recurring(authorize(self.service, context, Role.METRICS))

        return await call(context, run)
