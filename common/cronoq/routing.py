"""Where a call belongs and how it gets there: the routing both a shard server and the router do.

A shard server answers its own shard's calls itself and routes the rest; the router owns no shard, so it
routes everything. Both decide the same way (by the pool a call names, by the shard number in a task
id, by asking every shard about a key), forward through :class:`~cronoq.forward.Peers`, and fan reads
out to every shard with :mod:`cronoq.fanout`.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from . import fanout
from .auth import Principal
from .errors import ApiError, InvalidArgument, NotFound, Unavailable
from .forward import Peers
from .limits import exceeded
from .shards import SHARD_SHIFT, Shard, ShardMap
from .v1 import cronoq_pb2 as pb

Local = Callable[[Principal, Any], Any]  # answers one fan-out part on this process's own shard
LocalRemove = Callable[[Principal, pb.RemoveRecurringRequest], Awaitable[pb.RemoveRecurringResponse]]
LocalWatch = Callable[[Principal, pb.WatchRequest], AsyncIterator[pb.StatusEvent]]
WATCH_QUEUE = 1024  # events in flight from all shards to one watcher


def check_batch(req: pb.SubmitBatchRequest, max_tasks_per_batch: int) -> None:
    """A batch must hold 1 to ``limits.max_tasks_per_batch`` tasks (checked before any routing)."""
    if not req.tasks:
        raise InvalidArgument("tasks: at least one task is required")
    if len(req.tasks) > max_tasks_per_batch:
        raise exceeded(
            "max_tasks_per_batch",
            InvalidArgument(
                f"tasks: {len(req.tasks)} tasks exceed limits.max_tasks_per_batch ({max_tasks_per_batch})"
            ),
        )


class Routing:
    """The routing decisions and moves of one process. ``on_output`` keeps the content type of an
    output that a forwarded Submit(wait)/Wait brought back, so that HTTP can render it."""

    def __init__(
        self,
        shards: ShardMap,
        peers: Peers,
        default_pool: str,
        *,
        max_wait_s: float,
        max_list: int,
        on_output: Callable[[int, bytes, str], None],
    ) -> None:
        self.shards = shards
        self.peers = peers
        self.default_pool = default_pool
        self.max_wait_s = max_wait_s
        self.max_list = max_list
        self.on_output = on_output

    def remote(self, shard: Shard | None) -> Shard | None:
        """``shard`` when another process's shard owns the call, None when this one does (or nobody)."""
        return None if self.shards.is_local(shard) else shard

    def pool_owner(self, pool: str) -> Shard | None:
        return self.remote(self.shards.by_pool(pool or self.default_pool))

    def batch_owner(self, req: pb.SubmitBatchRequest) -> Shard | None:
        """The shard of a whole batch; a batch spanning shards is refused, naming its first stray task."""
        owners = [self.shards.by_pool(msg.pool or self.default_pool) for msg in req.tasks]
        first = owners[0] if owners else None
        for i, owner in enumerate(owners):
            if owner is not first and owner is not None and first is not None:
                raise InvalidArgument(
                    f"tasks[{i}].pool: pool '{req.tasks[i].pool or self.default_pool}' is served by shard "
                    f"'{owner.name}', tasks[0]'s by shard '{first.name}': a batch goes to one shard"
                )
        return self.remote(first)

    async def ref_owner(
        self, caller: Principal, field: str, ref: pb.TaskRef, known_here: Callable[[str], bool]
    ) -> Shard | None:
        """The other shard holding the task ``ref`` names, or None when it is (or would be) here: by the
        shard number in an id, or, for a key not ``known_here``, by asking the other shards."""
        if ref.WhichOneof("target") == "id":
            shard = self.shards.by_id(ref.id)
            if shard is None:
                raise NotFound(f"{field}: no task {ref.id!r} (no shard has number {ref.id >> SHARD_SHIFT})")
            return self.remote(shard)
        if caller.forwarded or not ref.key or known_here(ref.key):
            return None
        others = [s for s in self.shards if not self.shards.is_local(s)]
        answers = await self.peers.fan_out(
            others, "tasks", "Get", [pb.GetRequest(task=ref)] * len(others), caller
        )
        for shard, answer in zip(others, answers, strict=True):
            if isinstance(answer, pb.TaskInfo):
                return shard
        return None

    async def forward(
        self, shard: Shard, method: str, req: Any, caller: Principal, *, service: str = "tasks"
    ) -> Any:
        """Forward one Tasks (or, with ``service="admin"``, Admin) call; calls that wait for a task get
        the longest wait added to their deadline."""
        waits = method == "Wait" or (method == "Submit" and req.wait)
        response, output_type = await self.peers.call(
            shard, service, method, req, caller, wait=self.max_wait_s if waits else 0.0
        )
        if output_type is not None and waits:
            result = response.result if method == "Submit" else response
            if result.output_available:
                self.on_output(result.id, result.output, output_type)
        return response

    async def fan_out(
        self, caller: Principal, service: str, method: str, parts: list[tuple[Shard, Any]], local: Local
    ) -> list[tuple[Shard, Any]]:
        """Ask every shard in ``parts``: this process's own by ``local(caller, request)``, the others
        over the network; a shard that fails (unreachable, standby) gives its ApiError instead."""
        remote = [(shard, part) for shard, part in parts if not self.shards.is_local(shard)]
        answers = iter(
            await self.peers.fan_out([s for s, _ in remote], service, method, [r for _, r in remote], caller)
        )
        results: list[tuple[Shard, Any]] = []
        for shard, part in parts:
            if self.shards.is_local(shard):
                try:
                    results.append((shard, local(caller, part)))
                except Unavailable as err:
                    results.append((shard, err))
            else:
                results.append((shard, next(answers)))
        return results

    async def list_tasks(
        self, caller: Principal, req: pb.ListTasksRequest, local: Local
    ) -> pb.ListTasksResponse:
        parts = fanout.split_list(self.shards, req)
        answers = await self.fan_out(caller, "tasks", "ListTasks", parts, local)
        return fanout.merge_pages(answers, min(req.limit or 100, self.max_list))

    async def snapshot(self, caller: Principal, local: Local) -> pb.SnapshotResponse:
        parts = [(shard, pb.Empty()) for shard in self.shards]
        return fanout.merge_snapshots(await self.fan_out(caller, "admin", "Snapshot", parts, local))

    async def list_workers(self, caller: Principal, local: Local) -> pb.ListWorkersResponse:
        parts = [(shard, pb.Empty()) for shard in self.shards]
        return fanout.merge_workers(await self.fan_out(caller, "admin", "ListWorkers", parts, local))

    async def list_recurring(self, caller: Principal, local: Local) -> pb.ListRecurringResponse:
        parts = [(shard, pb.Empty()) for shard in self.shards]
        return fanout.merge_recurring(await self.fan_out(caller, "admin", "ListRecurring", parts, local))

    async def remove_recurring(
        self, caller: Principal, req: pb.RemoveRecurringRequest, local: LocalRemove | None
    ) -> pb.RemoveRecurringResponse:
        """Remove the schedule of that name from every shard (names are per shard): removed if any
        shard removed one; when none did and some shard did not answer, that shard's error."""

        async def here(shard: Shard) -> pb.RemoveRecurringResponse | ApiError:
            assert local is not None
            try:
                return await local(caller, req)
            except Unavailable as err:
                return err

        others = [s for s in self.shards if not self.shards.is_local(s)]
        mine = [s for s in self.shards if self.shards.is_local(s)]
        remote, *local_answers = await asyncio.gather(
            self.peers.fan_out(others, "admin", "RemoveRecurring", [req] * len(others), caller),
            *(here(shard) for shard in mine),
        )
        answers = [*zip(mine, local_answers, strict=True), *zip(others, remote, strict=True)]
        return fanout.merge_removed(answers)

    async def watch(
        self, caller: Principal, req: pb.WatchRequest, local: LocalWatch | None
    ) -> AsyncIterator[pb.StatusEvent]:
        """Every relevant shard's events, interleaved as they come (this process's own from ``local``);
        the first shard to fail ends the watch with its error, and the client watches again."""
        for pool in req.pools:
            if self.shards.by_pool(pool) is None:
                raise NotFound(f"pools: unknown pool '{pool}'")
        shards = [s for s in self.shards if not req.pools or any(p in s.pools for p in req.pools)]
        queue: asyncio.Queue[pb.StatusEvent | ApiError] = asyncio.Queue(maxsize=WATCH_QUEUE)

        async def pump(shard: Shard) -> None:
            part = pb.WatchRequest()
            part.CopyFrom(req)
            if req.pools:
                del part.pools[:]
                part.pools.extend(p for p in req.pools if p in shard.pools)
            if self.shards.is_local(shard):
                assert local is not None
                events = local(caller, part)
            else:
                events = self.peers.stream(shard, "Watch", part, caller)
            try:
                async for event in events:
                    await queue.put(event)
            except ApiError as err:
                await queue.put(err)

        pumps = [asyncio.get_running_loop().create_task(pump(shard)) for shard in shards]
        try:
            while True:
                item = await queue.get()
                if isinstance(item, ApiError):
                    raise item
                yield item
        finally:
            for task in pumps:
                task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.gather(*pumps, return_exceptions=True)
