"""Where a call belongs and how it gets there: the routing both a shard server and the router do.

A shard server answers its own shard's calls itself and routes the rest; the router owns no shard, so it
routes everything. Both decide the same way (by the pool a call names, by the shard number in a task
id, by asking every shard about a key), forward through :class:`~cronoq.cluster.forward.Peers`, and fan reads
out to every shard with :mod:`cronoq.cluster.fanout`.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncGenerator, AsyncIterator, Awaitable, Callable, Sequence
from typing import Protocol

from cronoq.auth import Principal
from cronoq.errors import (
    AlreadyExists,
    ApiError,
    DataLoss,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    Unavailable,
    error_for,
    shown,
)
from cronoq.limit_hits import exceeded
from cronoq.transport import (
    GET,
    KEY_PROBE_KEY,
    LIST_RECURRING,
    LIST_TASKS,
    LIST_WORKERS,
    POOL_KEY,
    REMOVE_RECURRING,
    SNAPSHOT,
    Req,
    Resp,
    Rpc,
    unadmitted,
)
from cronoq.v1 import cronoq_pb2 as pb

from . import fanout
from .forward import Peers
from .shards import SHARD_SHIFT, Shard, ShardMap

Local = Callable[[Principal, Req], Resp]  # answers one fan-out part on this process's own shard
Match = tuple[Shard, int, str]  # a task found by key: its shard, id and pool
_PROBE = ((KEY_PROBE_KEY, "1"),)
_PROBES_AT_ONCE = 32  # keys of one submission probed on the other shards at a time (a batch has many)
LocalRemove = Callable[[Principal, pb.RemoveRecurringRequest], Awaitable[pb.RemoveRecurringResponse]]
LocalWatch = Callable[[Principal, pb.WatchRequest], AsyncIterator[pb.StatusEvent]]
WATCH_QUEUE = 10_000  # events from all shards not yet taken by the watcher (a shard buffers as many)


class LocalKeys(Protocol):
    """What a shard server's own engine and store know of a key, as (id, pool) of the task when the
    caller may see it (a router has no such thing)."""

    def held(self, caller: Principal, key: str) -> tuple[int, str] | None:
        """The task holding ``key`` in the engine (live, or finished while its key deduplicates)."""
        ...

    async def stored(self, caller: Principal, key: str) -> tuple[int, str] | None:
        """The newest task with ``key`` the engine or the store still keeps, finished ones included."""
        ...


def named_pool(caller: Principal, pool: str, known: Callable[[str], bool]) -> str:
    """The pool a caller named for the task it looks up (``POOL_KEY``, HTTP ``pool``), checked as a
    pool filter is: unknown NOT_FOUND, outside the caller's pools PERMISSION_DENIED. "" when none."""
    if pool:
        if not known(pool):
            raise NotFound(f"pool: unknown pool {shown(pool)}")
        if not caller.may_use_pool(pool):
            raise PermissionDenied(f"pool: this credential may not use pool {shown(pool)}")
    return pool


def ambiguous(field: str, key: str, found: Sequence[Match]) -> FailedPrecondition:
    """The refusal of a key that tasks on several shards hold: it names them (the caller may see each)
    and says how to name the one meant."""
    tasks = ", ".join(
        f"{task_id} in pool {shown(pool)} (shard '{shard.name}')" for shard, task_id, pool in found
    )
    return FailedPrecondition(
        f"{field}: key {shown(key)} is held by {len(found)} tasks on different shards: {tasks}; name the "
        f"pool (gRPC metadata '{POOL_KEY}', HTTP query parameter 'pool', the SDK's pool=) or use the "
        "task's id"
    )


class Watch(Protocol):
    """A Watch stream as the transports serve it: :meth:`open` returns once it is subscribed wherever it
    watches, raising a refusal as one server would; then :attr:`unavailable_shards` names the shards it
    could not reach, and iterating gives the events. :meth:`aclose` unsubscribes."""

    unavailable_shards: tuple[str, ...]

    async def open(self) -> None: ...

    def __aiter__(self) -> AsyncIterator[pb.StatusEvent]: ...

    def __anext__(self) -> Awaitable[pb.StatusEvent]: ...

    async def aclose(self) -> None: ...


class _Part(Protocol):
    """One shard's stream inside a :class:`MergedWatch` (an :class:`OwnWatch`, or a forwarded
    :class:`~cronoq.cluster.forward.PeerStream`)."""

    async def open(self) -> None: ...

    def __anext__(self) -> Awaitable[pb.StatusEvent]: ...

    async def aclose(self) -> None: ...


class OwnWatch(AsyncIterator[pb.StatusEvent]):
    """One shard's own events, from its request handler's generator, which checks the request and
    subscribes before its first suspension (it never awaits before that). So :meth:`open` starts it and
    lets the loop run once: by then it is subscribed or has raised, with no event needed (a quiet shard
    must not look stuck). An event it already has is kept for the first :meth:`__anext__`."""

    unavailable_shards: tuple[str, ...] = ()

    def __init__(self, events: AsyncIterator[pb.StatusEvent]) -> None:
        self._events = events
        self._first: asyncio.Future[pb.StatusEvent] | None = None
        self._started = False

    async def open(self) -> None:
        if self._started:
            return
        self._started = True
        self._first = first = asyncio.ensure_future(anext(self._events))
        await asyncio.sleep(0)
        if first.done() and isinstance(first.exception(), ApiError):
            self._first = None
            first.result()

    async def __anext__(self) -> pb.StatusEvent:
        await self.open()
        first, self._first = self._first, None
        return await (first if first is not None else anext(self._events))

    async def aclose(self) -> None:
        first, self._first = self._first, None
        if first is not None and not first.done():
            first.cancel()
            await asyncio.wait({first})
        elif first is not None and not first.cancelled():
            first.exception()  # retrieved, so that asyncio does not log it as lost
        if isinstance(self._events, AsyncGenerator):
            await self._events.aclose()


def serving(events: AsyncIterator[pb.StatusEvent]) -> Watch:
    """What a request handler's ``watch`` returned, as a :class:`Watch`: a fan-out already is one; a
    single shard's own generator is wrapped in :class:`OwnWatch`."""
    return events if isinstance(events, MergedWatch) else OwnWatch(events)


class MergedWatch(AsyncIterator[pb.StatusEvent]):
    """Several shards' Watch streams as one, events interleaved as they come.

    :meth:`open` opens every shard's stream at once (a remote one within the forwarding timeout) and
    names those that could not be reached (UNAVAILABLE, DEADLINE_EXCEEDED) in
    :attr:`unavailable_shards`, as the unary fan-outs do (docs/operations.md, Sharding); any other error (a refusal) is
    raised, and so is UNAVAILABLE when no shard could be reached (there would be nothing to watch). A
    shard whose stream fails or ends after it opened ends the whole watch with an error naming it:
    silently missing that shard's events would be worse, and the client watches again."""

    def __init__(
        self,
        parts: Sequence[tuple[Shard, _Part]],
        on_open: Callable[[tuple[str, ...]], None] | None = None,
    ) -> None:
        self.unavailable_shards: tuple[str, ...] = ()
        self._parts = parts
        self._on_open = on_open  # told the unreachable shards once open (a router's metrics)
        self._queue: asyncio.Queue[pb.StatusEvent | ApiError] = asyncio.Queue()  # bounded in _pump
        self._pumps: list[asyncio.Task[None]] = []
        self._started = False

    async def open(self) -> None:
        if self._started:
            return
        self._started = True
        try:
            failures = await asyncio.gather(*(self._open_part(shard, part) for shard, part in self._parts))
        except BaseException:  # cancelled while opening: let go of the shards already opened
            await self.aclose()
            raise
        down = [
            (shard, err) for (shard, _), err in zip(self._parts, failures, strict=True) if err is not None
        ]
        refusal = next((err for _, err in down if not fanout.unreachable(err)), None)
        if refusal is not None or len(down) == len(self._parts):
            await self.aclose()
            if refusal is not None:
                raise refusal
            names = ", ".join(f"'{shard.name}'" for shard, _ in down)
            raise Unavailable(
                f"no shard could be watched: shard(s) {names} unreachable ({down[0][1].message})"
            )
        self.unavailable_shards = tuple(shard.name for shard, _ in down)
        if self._on_open is not None:
            self._on_open(self.unavailable_shards)

    async def _open_part(self, shard: Shard, part: _Part) -> ApiError | None:
        """Open one shard's stream and start taking its events at once: the others may take up to the
        forwarding timeout to open or fail, and meanwhile this shard's events must not pile up in its
        own bounded buffer (it would end the watch with DATA_LOSS)."""
        failure = await _opened(part)
        if failure is None:
            self._pumps.append(asyncio.get_running_loop().create_task(self._pump(shard, part)))
        return failure

    async def _pump(self, shard: Shard, part: _Part) -> None:
        """Move one shard's events to the merged queue until it fails or ends; then put the error that
        ends the whole watch (a watcher that fell :data:`WATCH_QUEUE` events behind gets DATA_LOSS,
        as from a single server)."""
        try:
            while True:
                event = await anext(part)
                if self._queue.qsize() >= WATCH_QUEUE:
                    error: ApiError = DataLoss(
                        f"watch consumer fell behind by more than {WATCH_QUEUE} events"
                    )
                    break
                self._queue.put_nowait(event)
        except StopAsyncIteration:
            error = Unavailable(f"shard '{shard.name}' ended its watch stream; watch again")
        except ApiError as err:
            error = err
            if f"shard '{shard.name}'" not in err.message:
                error = error_for(err.code, f"shard '{shard.name}': {err.message}")
                error.metadata = err.metadata
        except Exception as err:  # anything else must still end the watch, never drop a shard silently
            error = error_for("internal", f"shard '{shard.name}': its watch stream failed: {err!r}")
        self._queue.put_nowait(error)

    async def __anext__(self) -> pb.StatusEvent:
        await self.open()
        item = await self._queue.get()
        if isinstance(item, ApiError):
            raise item
        return item

    async def aclose(self) -> None:
        for task in self._pumps:
            task.cancel()
        if self._pumps:
            await asyncio.wait(self._pumps)
        await asyncio.gather(*(part.aclose() for _, part in self._parts))


async def _opened(part: _Part) -> ApiError | None:
    """Open one shard's stream: None when it opened, else the error it failed with."""
    try:
        await part.open()
    except ApiError as err:
        return err
    return None


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
        max_message_bytes: int,
        on_output: Callable[[int, bytes, str], None],
    ) -> None:
        self.shards = shards
        self.peers = peers
        self.default_pool = default_pool
        self.max_wait_s = max_wait_s
        self.max_list = max_list
        self.max_message_bytes = max_message_bytes
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
        self, caller: Principal, field: str, ref: pb.TaskRef, here: LocalKeys | None, pool: str = ""
    ) -> Shard | None:
        """The other shard holding the task ``ref`` names, or None when it is (or would be) here: by the
        shard number in an id, by the ``pool`` the caller named (checked by :func:`named_pool`), or, for
        a key, by asking every shard, this one (``here``) included.

        Keys are one namespace across the cluster (submissions check every shard, see
        :meth:`held_elsewhere`), but two submissions racing on two shards, or one made while a shard
        could not be asked, can leave a key with a task on each. So a lookup by key is never settled
        by whichever shard answers first: a key two shards hold for this caller is refused, naming the
        tasks and how to name the pool. Tasks whose key still deduplicates are asked for first (what
        each engine holds); only when no shard holds it are finished tasks kept in the stores looked
        up. A key that no shard answering holds, while some shard could not be asked, is UNAVAILABLE
        naming those shards: one of them may hold it. One held where the others answered is taken."""
        if ref.WhichOneof("target") == "id":
            shard = self.shards.by_id(ref.id)
            if shard is None:
                raise NotFound(f"{field}: no task {ref.id!r} (no shard has number {ref.id >> SHARD_SHIFT})")
            return self.remote(shard)
        if pool:
            return self.remote(self.shards.by_pool(pool))
        if caller.forwarded or not ref.key:
            return None
        found, down = await self._find(caller, field, ref.key, here, held=True)
        if not found and not down:
            found, down = await self._find(caller, field, ref.key, here, held=False)
        if len(found) > 1:
            raise ambiguous(f"{field}.key", ref.key, found)
        if found:
            return self.remote(found[0][0])
        if down:
            names = ", ".join(f"'{shard.name}'" for shard, _ in down)
            raise Unavailable(
                f"{field}.key: no shard that answered holds task {shown(ref.key)}, and shard(s) {names} "
                f"could not be asked ({down[0][1].message}); retry"
            )
        return None

    async def _find(
        self, caller: Principal, field: str, key: str, here: LocalKeys | None, *, held: bool
    ) -> tuple[list[Match], list[tuple[Shard, ApiError]]]:
        """The tasks of ``key`` this caller may see on every shard, and the shards that could not be
        asked: with ``held``, the tasks holding the key (each engine's, by a key probe); otherwise
        finished tasks found anywhere, stores included (a plain Get)."""
        others = [s for s in self.shards if not self.shards.is_local(s)]
        request = pb.GetRequest(task=pb.TaskRef(key=key))
        remote, local = await asyncio.gather(
            self.peers.fan_out(others, GET, [request] * len(others), caller, extra=_PROBE if held else ()),
            self._here(caller, key, here, held),
        )
        found: list[Match] = [] if local is None else [local]
        down: list[tuple[Shard, ApiError]] = []
        for shard, answer in zip(others, remote, strict=True):
            if isinstance(answer, pb.TaskInfo):
                found.append((shard, answer.id, answer.pool))
            elif fanout.unreachable(answer):
                down.append((shard, answer))
            elif not isinstance(answer, NotFound | AlreadyExists):
                raise answer  # a refusal (FAILED_PRECONDITION for a certificate caller, ...) is the answer
        return found, down

    async def _here(self, caller: Principal, key: str, here: LocalKeys | None, held: bool) -> Match | None:
        if here is None:
            return None
        task = here.held(caller, key) if held else await here.stored(caller, key)
        assert self.shards.local is not None  # a shard server's own lookups: it serves a shard
        return None if task is None else (self.shards.local, *task)

    async def held_elsewhere(
        self, caller: Principal, keys: Sequence[tuple[str, str]]
    ) -> dict[str, tuple[Shard, pb.TaskInfo]]:
        """Of the ``keys`` (field, key) a submission on this shard brings, those another shard holds for
        this caller, with the shard and the task: a submission answers them as duplicates, as one
        server answers a key it holds. Keys are one namespace across the cluster, so a key held there
        by a task of a pool outside the caller's pools is refused (PERMISSION_DENIED, as on one server).
        A shard that cannot be asked (unreachable, or refusing the probe) is passed over for a caller
        that may use every pool it serves, whose own duplicate a later lookup would find ambiguous,
        but refuses the submission (UNAVAILABLE, never admitted) for one scoped to fewer: it could
        otherwise shadow a key of a pool it may not see."""
        held: dict[str, tuple[Shard, pb.TaskInfo]] = {}
        answers = await self._probe([key for _, key in keys], caller)
        for (field, key), per_shard in zip(keys, answers, strict=True):
            found = [(shard, a) for shard, a in per_shard if isinstance(a, pb.TaskInfo)]
            for shard, answer in per_shard:
                if isinstance(answer, AlreadyExists):
                    raise PermissionDenied(
                        f"{field}.key: key {shown(key)} is held by a task outside this credential's pools"
                    )
                if isinstance(answer, ApiError) and not isinstance(answer, NotFound):
                    self._unasked(caller, field, key, shard, answer)
            if len(found) > 1:
                raise ambiguous(f"{field}.key", key, [(s, a.id, a.pool) for s, a in found])
            if found:
                held[key] = found[0]
        return held

    async def held_by_others(self, caller: Principal, keys: Sequence[str]) -> dict[str, tuple[Shard, int]]:
        """Of ``keys``, those a task of another shard holds for this caller, with that shard and task id.
        A shard that cannot be asked is passed over, and a task outside the caller's pools is not
        found, as a lookup would not find it: what a submission's dependencies on keys need to know,
        since a task can depend only on tasks of its own shard."""
        held: dict[str, tuple[Shard, int]] = {}
        for key, per_shard in zip(keys, await self._probe(keys, caller), strict=True):
            for shard, answer in per_shard:
                if isinstance(answer, pb.TaskInfo):
                    held.setdefault(key, (shard, answer.id))
        return held

    async def _probe(
        self, keys: Sequence[str], caller: Principal
    ) -> list[list[tuple[Shard, pb.TaskInfo | ApiError]]]:
        """Each key's answers from every other shard to a key probe (what its engine holds), as the
        last hop, at most :data:`_PROBES_AT_ONCE` keys at a time."""
        others = [s for s in self.shards if not self.shards.is_local(s)]
        gate = asyncio.Semaphore(_PROBES_AT_ONCE)

        async def probe(key: str) -> list[tuple[Shard, pb.TaskInfo | ApiError]]:
            async with gate:
                request = pb.GetRequest(task=pb.TaskRef(key=key))
                answers = await self.peers.fan_out(
                    others, GET, [request] * len(others), caller, extra=_PROBE, last_hop=True
                )
            return list(zip(others, answers, strict=True))

        return list(await asyncio.gather(*(probe(key) for key in keys)))

    @staticmethod
    def _unasked(caller: Principal, field: str, key: str, shard: Shard, err: ApiError) -> None:
        """A shard that could not be asked about a submission's key: passed over, unless it serves a
        pool the caller may not use (see :meth:`held_elsewhere`)."""
        hidden = [p for p in shard.pools if not caller.may_use_pool(p)]
        if hidden:
            raise unadmitted(
                f"{field}.key: shard '{shard.name}' could not be asked whether a task of a pool outside "
                f"this credential's pools holds key {shown(key)} ({err.message}); retry"
            )

    async def forward(
        self,
        shard: Shard,
        rpc: Rpc[Req, Resp],
        req: Req,
        caller: Principal,
        *,
        pool: str = "",
        last_hop: bool = False,
    ) -> Resp:
        """Forward one Tasks or Admin call, with the ``pool`` its caller named for the task it looks up
        (``POOL_KEY``); ``last_hop`` as in :meth:`~cronoq.cluster.forward.Peers.check`. Calls that wait
        for a task (Wait, Submit with ``wait``) get the longest wait added to their deadline."""
        waits = isinstance(req, pb.WaitRequest) or (isinstance(req, pb.SubmitRequest) and req.wait)
        response, output_type = await self.peers.call(
            shard,
            rpc,
            req,
            caller,
            wait=self.max_wait_s if waits else 0.0,
            extra=((POOL_KEY, pool),) if pool else (),
            last_hop=last_hop,
        )
        if output_type is not None and waits:
            result = response.result if isinstance(response, pb.SubmitResponse) else response
            if isinstance(result, pb.TaskResult) and result.output_available:
                self.on_output(result.id, result.output, output_type)
        return response

    async def fan_out(
        self,
        caller: Principal,
        rpc: Rpc[Req, Resp],
        parts: list[tuple[Shard, Req]],
        local: Local[Req, Resp],
    ) -> list[tuple[Shard, Resp | ApiError]]:
        """Ask every shard in ``parts``: this process's own by ``local(caller, request)``, the others
        over the network; a shard that fails (unreachable, standby) gives its ApiError instead."""
        remote = [(shard, part) for shard, part in parts if not self.shards.is_local(shard)]
        answers = iter(await self.peers.fan_out([s for s, _ in remote], rpc, [r for _, r in remote], caller))
        results: list[tuple[Shard, Resp | ApiError]] = []
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
        self,
        caller: Principal,
        req: pb.ListTasksRequest,
        local: Local[pb.ListTasksRequest, pb.ListTasksResponse],
    ) -> pb.ListTasksResponse:
        parts = fanout.split_list(self.shards, req)
        answers = await self.fan_out(caller, LIST_TASKS, parts, local)
        merged = fanout.merge_pages(answers, min(req.limit or 100, self.max_list))
        return fanout.fit_page(merged, self.max_message_bytes)

    async def snapshot(
        self, caller: Principal, local: Local[pb.Empty, pb.SnapshotResponse]
    ) -> pb.SnapshotResponse:
        parts = [(shard, pb.Empty()) for shard in self.shards]
        return fanout.merge_snapshots(await self.fan_out(caller, SNAPSHOT, parts, local))

    async def list_workers(
        self, caller: Principal, local: Local[pb.Empty, pb.ListWorkersResponse]
    ) -> pb.ListWorkersResponse:
        parts = [(shard, pb.Empty()) for shard in self.shards]
        return fanout.merge_workers(await self.fan_out(caller, LIST_WORKERS, parts, local))

    async def list_recurring(
        self, caller: Principal, local: Local[pb.Empty, pb.ListRecurringResponse]
    ) -> pb.ListRecurringResponse:
        parts = [(shard, pb.Empty()) for shard in self.shards]
        return fanout.merge_recurring(await self.fan_out(caller, LIST_RECURRING, parts, local))

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
        remote, local_answers = await asyncio.gather(
            self.peers.fan_out(others, REMOVE_RECURRING, [req] * len(others), caller),
            asyncio.gather(*(here(shard) for shard in mine)),
        )
        answers = [*zip(mine, local_answers, strict=True), *zip(others, remote, strict=True)]
        return fanout.merge_removed(answers)

    def watch(
        self,
        caller: Principal,
        req: pb.WatchRequest,
        local: LocalWatch | None,
        on_open: Callable[[tuple[str, ...]], None] | None = None,
    ) -> MergedWatch:
        """Every relevant shard's events as one stream (:class:`MergedWatch`), this process's own shard's
        from ``local``; nothing is sent until the transport opens it, and then ``on_open`` learns the
        shards it could not reach."""
        for pool in req.pools:
            if self.shards.by_pool(pool) is None:
                raise NotFound(f"pools: unknown pool {shown(pool)}")
        parts: list[tuple[Shard, _Part]] = []
        for shard in self.shards:
            if req.pools and not any(p in shard.pools for p in req.pools):
                continue
            part = pb.WatchRequest()
            part.CopyFrom(req)
            if req.pools:
                del part.pools[:]
                part.pools.extend(p for p in req.pools if p in shard.pools)
            if self.shards.is_local(shard):
                assert local is not None
                parts.append((shard, OwnWatch(local(caller, part))))
            else:
                parts.append((shard, self.peers.watch(shard, part, caller)))
        return MergedWatch(parts, on_open)
