"""The router's request logic: every call goes to the shard that owns it, reads fan out to all shards.

The router owns no shard and keeps no state, so any number of replicas can stand behind one Service. It
authenticates like a server (a bad token is refused here), then presents the caller's own token to the
owning shard's leader, which authenticates it again and decides by its own configuration.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import AsyncIterator, Sequence
from dataclasses import replace
from functools import partial
from typing import TYPE_CHECKING, NoReturn, TypeVar

from google.protobuf.message import Message

from cronoq.api.output_types import OutputTypes
from cronoq.auth import Authenticator, Principal, Role
from cronoq.cluster.forward import Peers
from cronoq.cluster.routing import Routing, check_batch, named_pool
from cronoq.cluster.shards import Shard, ShardMap
from cronoq.errors import FailedPrecondition, InvalidArgument, NotFound, shown
from cronoq.limit_hits import LimitHits
from cronoq.telemetry import traced
from cronoq.transport import ADD_RECURRING, CANCEL, GET, SUBMIT, SUBMIT_BATCH, WAIT, Resp, Rpc
from cronoq.v1 import cronoq_pb2 as pb

if TYPE_CHECKING:
    from cronoq.otel import ServerTracing

DEFAULT_PAGE = 100  # ListTasks without a limit
# Answers that name unreachable shards (Watch in its initial metadata).
FAN_OUTS = ("ListTasks", "Snapshot", "ListWorkers", "ListRecurring", "Watch")
Lookup = TypeVar("Lookup", pb.CancelRequest, pb.GetRequest, pb.WaitRequest)  # a request naming one task


def _never_local(caller: Principal, request: Message) -> NoReturn:
    raise AssertionError("the router serves no shard of its own")


class RouterService:
    """Tasks and Admin operations of a router (a :class:`cronoq.api.handler.RequestHandler`)."""

    def __init__(
        self,
        pools: Sequence[str],
        auth: Authenticator,
        shards: ShardMap,
        peers: Peers,
        *,
        max_tasks_per_batch: int,
        max_wait_s: float,
        max_list: int,
        max_message_bytes: int,
        tracing: ServerTracing | None = None,
    ) -> None:
        self.auth = auth
        self.tracing = tracing  # None: the router does not trace (cronoq.telemetry)
        self.shards = shards
        self.max_tasks_per_batch = max_tasks_per_batch
        self.max_list = max_list
        self.limit_hits = LimitHits()  # [limits] hits at the router (cronoq_limit_hits_total)
        self.default_pool = "default" if "default" in pools else pools[0]
        self._types = OutputTypes()  # of recently forwarded outputs, for HTTP rendering
        self.routing = Routing(
            shards,
            peers,
            self.default_pool,
            max_wait_s=max_wait_s,
            max_list=max_list,
            max_message_bytes=max_message_bytes,
            on_output=self._keep_type,
        )
        self.peers = peers
        # For /metrics: fan-out answers that named unreachable shards, by method (and by shard), and
        # worker streams sent to their shard, by (shard, pool).
        self.partial: Counter[str] = Counter(dict.fromkeys(FAN_OUTS, 0))
        self.unavailable: Counter[tuple[str, str]] = Counter(
            dict.fromkeys(((s.name, m) for s in shards for m in FAN_OUTS), 0)
        )
        self.redirects: Counter[tuple[str, str]] = Counter(
            dict.fromkeys(((s.name, pool) for s in shards for pool in s.pools), 0)
        )

    def _count_partial(self, method: str, unavailable_shards: Sequence[str]) -> None:
        if unavailable_shards:
            self.partial[method] += 1
            for name in unavailable_shards:
                self.unavailable[(name, method)] += 1

    @property
    def ready(self) -> bool:
        return True

    def authorize(
        self, authorization: str | None, role: Role, forwarded: bool = False, cert_names: Sequence[str] = ()
    ) -> Principal:
        # A forwarded call's certificate is a peer's, not the caller's (see ShardService.authorize).
        principal = self.auth.require(authorization, role, () if forwarded else cert_names)
        return replace(principal, credential=authorization or "", forwarded=forwarded)

    def _keep_type(self, task_id: int, output: bytes, content_type: str) -> None:
        self._types.record(task_id, content_type)

    def output_type(self, task_id: int) -> str:
        return self._types.get(task_id)

    def _owner(self, field: str, pool: str) -> Shard:
        owner = self.routing.pool_owner(pool)
        if owner is None:
            raise NotFound(f"{field}: unknown pool {shown(pool or self.default_pool)}")
        return owner

    async def _ref_owner(self, caller: Principal, ref: pb.TaskRef, pool: str) -> Shard:
        if ref.WhichOneof("target") is None:
            raise InvalidArgument("task: set either id or key")
        if ref.WhichOneof("target") == "key" and not ref.key:
            raise InvalidArgument("task.key: must not be empty")
        owner = await self.routing.ref_owner(caller, "task", ref, None, pool)
        if owner is None:
            raise NotFound(f"task: no task {shown(ref.key)}")
        return owner

    async def _lookup(self, caller: Principal, rpc: Rpc[Lookup, Resp], req: Lookup, pool: str) -> Resp:
        """Get, Cancel or Wait: to the shard holding the task (of ``pool``, when the caller named one)."""
        pool = named_pool(caller, pool, lambda name: self.shards.by_pool(name) is not None)
        return await self.routing.forward(
            await self._ref_owner(caller, req.task, pool), rpc, req, caller, pool=pool
        )

    # ------------------------------------------------------------------------------------ tasks

    async def submit(self, caller: Principal, req: pb.SubmitRequest) -> pb.SubmitResponse:
        owner = self._owner("task.pool", req.task.pool)
        return await traced(
            self.tracing,
            ("Submit", req.task.pool or self.default_pool),
            lambda _: self.routing.forward(owner, SUBMIT, req, caller),
            lambda answer: [answer.id],
        )

    async def submit_batch(self, caller: Principal, req: pb.SubmitBatchRequest) -> pb.SubmitBatchResponse:
        with self.limit_hits.counting():
            check_batch(req, self.max_tasks_per_batch)
        owner = self.routing.batch_owner(req)
        pool = req.tasks[0].pool or self.default_pool
        if owner is None:
            raise NotFound(f"tasks[0].pool: unknown pool {shown(pool)}")
        return await traced(
            self.tracing,
            ("SubmitBatch", pool),
            lambda _: self.routing.forward(owner, SUBMIT_BATCH, req, caller),
            lambda answer: [t.id for t in answer.tasks],
        )

    async def cancel(self, caller: Principal, req: pb.CancelRequest, pool: str = "") -> pb.CancelResponse:
        return await self._lookup(caller, CANCEL, req, pool)

    async def get(self, caller: Principal, req: pb.GetRequest, pool: str = "") -> pb.TaskInfo:
        return await self._lookup(caller, GET, req, pool)

    async def wait(self, caller: Principal, req: pb.WaitRequest, pool: str = "") -> pb.TaskResult:
        return await self._lookup(caller, WAIT, req, pool)

    async def probe(self, caller: Principal, req: pb.GetRequest) -> pb.TaskInfo:
        """Key probes are one shard's question to another; a router holds no task to answer one with."""
        raise FailedPrecondition("a key probe is answered by a shard server, not by a router")

    async def list_tasks(self, caller: Principal, req: pb.ListTasksRequest) -> pb.ListTasksResponse:
        if (req.limit or DEFAULT_PAGE) > self.max_list:
            self.limit_hits.hit("max_list")  # the page is cut to it (the shards see forwarded parts)
        answer = await self.routing.list_tasks(caller, req, _never_local)
        self._count_partial("ListTasks", answer.unavailable_shards)
        return answer

    def watch(self, caller: Principal, req: pb.WatchRequest) -> AsyncIterator[pb.StatusEvent]:
        return self.routing.watch(caller, req, None, partial(self._count_partial, "Watch"))

    # ------------------------------------------------------------------------------------ admin

    async def snapshot(self, caller: Principal) -> pb.SnapshotResponse:
        answer = await self.routing.snapshot(caller, _never_local)
        self._count_partial("Snapshot", answer.unavailable_shards)
        return answer

    async def list_workers(self, caller: Principal) -> pb.ListWorkersResponse:
        answer = await self.routing.list_workers(caller, _never_local)
        self._count_partial("ListWorkers", answer.unavailable_shards)
        return answer

    async def add_recurring(self, caller: Principal, req: pb.RecurringRequest) -> pb.Empty:
        """To the shard owning the template's pool, which validates and keeps the schedule."""
        owner = self._owner("template.pool", req.template.pool)
        return await self.routing.forward(owner, ADD_RECURRING, req, caller)

    async def remove_recurring(
        self, caller: Principal, req: pb.RemoveRecurringRequest
    ) -> pb.RemoveRecurringResponse:
        if not req.name:
            raise InvalidArgument("name: required")
        return await self.routing.remove_recurring(caller, req, None)

    async def list_recurring(self, caller: Principal) -> pb.ListRecurringResponse:
        answer = await self.routing.list_recurring(caller, _never_local)
        self._count_partial("ListRecurring", answer.unavailable_shards)
        return answer
