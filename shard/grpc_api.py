"""The gRPC ``Workers`` servicer, and its ``BatchedWorkers`` extension: one
:class:`~shard.workers.WorkerStream` per Work call (the Tasks and Admin servicers are shared with the
router, in :mod:`cronoq.api.grpc_api`)."""

from __future__ import annotations

from collections.abc import Callable

from cronoq.api.grpc_api import Ctx, authorize_worker, call
from cronoq.auth import Principal
from cronoq.errors import ApiError
from cronoq.logs import get_logger
from cronoq.transport import grpc_status
from cronoq.v1 import cronoq_pb2_grpc as pbg

from .service import ShardService
from .workers import WorkerStream

log = get_logger("cronoq.grpc")


class WorkersServicer(pbg.WorkersServicer):
    def __init__(
        self, service: ShardService, make_stream: Callable[[Ctx, Principal, bool], WorkerStream]
    ) -> None:
        self.service = service
        self.make_stream = make_stream
        self.streams: set[WorkerStream] = set()

    # grpc.aio also serves a stream-stream method as a coroutine that reads and writes through the context,
    # which the generated servicer does not describe (it returns an iterator of ServerMessages).
    async def Work(self, request_iterator: object, context: Ctx) -> None:  # type: ignore[override]
        await self.serve(context, batched=False)

    async def serve(self, context: Ctx, *, batched: bool) -> None:
        """One Work call of either service (``batched``: BatchedWorkers.Work)."""

        async def run() -> None:
            caller = await authorize_worker(self.service, context)
            stream = self.make_stream(context, caller, batched)
            self.streams.add(stream)
            try:
                await stream.serve()
            except ApiError as err:
                log.info(
                    "worker_stream_refused", worker_id=stream.worker_id, code=err.code, error=err.message
                )
                # The status goes out when gRPC can send it, after the handler returned: a worker that
                # stopped reading may never take it, and awaiting it (abort) would keep this call, and
                # its place under limits.max_concurrent_streams, until the connection closes.
                context.set_code(grpc_status(err))
                context.set_details(err.message)
                if err.metadata:
                    context.set_trailing_metadata(err.metadata)
            finally:
                self.streams.discard(stream)

        await call(context, run)


class BatchedWorkersServicer(pbg.BatchedWorkersServicer):
    """``BatchedWorkers.Work``: served by the same streams as ``Workers.Work``, framed in batches."""

    def __init__(self, workers: WorkersServicer) -> None:
        self.workers = workers

    async def Work(self, request_iterator: object, context: Ctx) -> None:  # type: ignore[override]
        await self.workers.serve(context, batched=True)
