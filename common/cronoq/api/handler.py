"""What the transports need from the request logic behind them (a shard's ShardService, or the router's RouterService)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Protocol

from cronoq.auth import Principal, Role
from cronoq.v1 import cronoq_pb2 as pb


class RequestHandler(Protocol):
    """Every Tasks and Admin operation, taking and returning wire messages; errors are ApiErrors."""

    @property
    def ready(self) -> bool:
        """Serving (``/readyz`` 200): a leader not shutting down, or a router."""
        ...

    def authorize(
        self, authorization: str | None, role: Role, forwarded: bool = False, cert_names: Sequence[str] = ()
    ) -> Principal:
        """The caller, from its bearer token or else the DNS names of its verified client certificate."""
        ...

    def output_type(self, task_id: int) -> str:
        """The content type of a task's output when known here ("" otherwise); the wire TaskResult has
        no field for it, and HTTP renders JSON outputs as JSON."""
        ...

    async def submit(self, caller: Principal, req: pb.SubmitRequest) -> pb.SubmitResponse: ...

    async def submit_batch(self, caller: Principal, req: pb.SubmitBatchRequest) -> pb.SubmitBatchResponse: ...

    # ``pool``: the pool of the task named, when the caller named one (``cronoq.transport.POOL_KEY``).
    async def cancel(self, caller: Principal, req: pb.CancelRequest, pool: str = "") -> pb.CancelResponse: ...

    async def get(self, caller: Principal, req: pb.GetRequest, pool: str = "") -> pb.TaskInfo: ...

    async def probe(self, caller: Principal, req: pb.GetRequest) -> pb.TaskInfo:
        """A Get marked ``cronoq.transport.KEY_PROBE_KEY``: whether a task here holds the key."""
        ...

    async def list_tasks(self, caller: Principal, req: pb.ListTasksRequest) -> pb.ListTasksResponse: ...

    async def wait(self, caller: Principal, req: pb.WaitRequest, pool: str = "") -> pb.TaskResult: ...

    def watch(self, caller: Principal, req: pb.WatchRequest) -> AsyncIterator[pb.StatusEvent]: ...

    async def snapshot(self, caller: Principal) -> pb.SnapshotResponse: ...

    async def list_workers(self, caller: Principal) -> pb.ListWorkersResponse: ...

    async def add_recurring(self, caller: Principal, req: pb.RecurringRequest) -> pb.Empty: ...

    async def remove_recurring(
        self, caller: Principal, req: pb.RemoveRecurringRequest
    ) -> pb.RemoveRecurringResponse: ...

    async def list_recurring(self, caller: Principal) -> pb.ListRecurringResponse: ...
