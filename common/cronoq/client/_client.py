"""``Client``: the producer and operator side of the gRPC API (Tasks and Admin services)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Iterable, Sequence
from dataclasses import dataclass
from types import TracebackType
from typing import Any, Unpack

import grpc

from cronoq import transport
from cronoq.client._connect import CHANNEL_DEFAULTS, auth_metadata, with_defaults
from cronoq.client._models import (
    Event,
    RecurringInfo,
    Result,
    Snapshot,
    Submitted,
    TaskInfo,
    TaskPage,
    WorkerInfo,
)
from cronoq.client._spec import Ref, TaskOptions, task
from cronoq.client._tracing import outgoing
from cronoq.client._wire import duration, overlap_value, status_value, task_ref
from cronoq.errors import Cancelled
from cronoq.transport import (
    POOL_KEY,
    UNAVAILABLE_SHARDS_KEY,
    ChannelOptions,
    Endpoint,
    Req,
    Resp,
    Rpc,
    api_error,
    metadata_value,
    open_channel,
)
from cronoq.v1 import cronoq_pb2 as pb
from cronoq.v1 import cronoq_pb2_grpc as pb_grpc

# Added to a waiting call's own deadline so the server's answer (result or DEADLINE_EXCEEDED) arrives
# before the client gives up on the call.
WAIT_MARGIN = 5.0


class Client:
    """Submits, inspects, waits for and cancels tasks; reads snapshots; manages recurring schedules.

    ``target`` is ``host:port`` or an ``http://``/``https://``/``grpc://`` URL; https, ``tls=True`` or
    ``credentials`` (``grpc.ssl_channel_credentials``, for mTLS) select TLS. ``token`` is sent as a
    bearer token. ``options`` are grpc channel options, each replacing the same-named entry of
    :data:`~cronoq.client._connect.CHANNEL_DEFAULTS`: the channel takes messages of any size (the server
    bounds them) and sends keepalive pings while a call is open, so a Wait or Watch on a server that froze
    fails rather than hangs. The channel opens on first use in the running event loop (and again if the client is used from another loop); ``async with``
    or :meth:`close` releases it.

    Every failed call raises a :class:`~cronoq.errors.ApiError` subclass (``ClientError``) named for
    its gRPC status; waits that run out raise ``TimeoutError``.
    """

    def __init__(
        self,
        target: str,
        *,
        token: str | None = None,
        tls: bool = False,
        credentials: Any = None,
        options: ChannelOptions | None = None,
    ) -> None:
        self._endpoint = Endpoint.parse(target, secure=tls or credentials is not None)
        self._credentials = credentials
        self._options = with_defaults(tuple(options or ()), CHANNEL_DEFAULTS)
        self._metadata = auth_metadata(token)
        self._channel: Any = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stubs_for_channel: _Stubs | None = None

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        """Closes the channel; a later call opens a new one."""
        channel, loop = self._channel, self._loop
        self._channel = self._loop = self._stubs_for_channel = None
        # A channel belongs to its loop; one left behind on another loop is dropped with that loop.
        if channel is not None and loop is asyncio.get_running_loop():
            await channel.close()

    def _stubs(self) -> _Stubs:
        """The stubs of a channel on the running loop, opening one if needed."""
        loop = asyncio.get_running_loop()
        if self._stubs_for_channel is None or self._loop is not loop:
            self._channel = open_channel(self._endpoint, self._credentials, self._options)
            self._loop = loop
            self._stubs_for_channel = _Stubs(
                tasks=pb_grpc.TasksStub(self._channel), admin=pb_grpc.AdminStub(self._channel)
            )
        return self._stubs_for_channel

    async def _call(
        self,
        rpc: Rpc[Req, Resp],
        request: Req,
        *,
        deadline: float | None = None,
        waits: bool = False,
        pool: str | None = None,
        traced: bool = False,
    ) -> Resp:
        """One unary call; ``pool`` names the pool of the task a lookup names (``POOL_KEY``). For calls
        that wait for a task (``waits``), DEADLINE_EXCEEDED, from the server's wait limit or the call's
        own deadline, means the wait ran out: TimeoutError. A ``traced`` call (a Submit) carries the
        current OpenTelemetry context, if any (:mod:`._tracing`)."""
        stubs = self._stubs()
        metadata = self._metadata if not pool else (*self._metadata, (POOL_KEY, pool))
        if traced:
            metadata = (*metadata, *outgoing())
        try:
            response: Resp = await rpc.on(stubs.tasks, stubs.admin)(
                request, metadata=metadata, timeout=deadline
            )
            return response
        except grpc.aio.AioRpcError as err:
            if waits and err.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                raise TimeoutError(err.details() or "timed out waiting for the task") from err
            raise api_error(err) from err

    # ------------------------------------------------------------------------------------ tasks

    async def submit(
        self,
        payload: object = None,
        *,
        wait: bool = False,
        wait_timeout: float | None = None,
        call_timeout: float | None = None,
        **task_opts: Unpack[TaskOptions],
    ) -> Submitted:
        """Submits one task (``payload`` and options as for :func:`task`, or a prebuilt spec).

        With ``wait=True`` the call returns once the task has finished, with ``result`` set; the server
        caps the wait, ``wait_timeout`` shortens it. ``call_timeout`` bounds the whole call (default
        ``wait_timeout`` + 5 s); when it runs out ``TimeoutError`` is raised and the task stays submitted.
        """
        if wait_timeout is not None and not wait:
            raise ValueError("wait_timeout needs wait=True")
        wait_s = duration("wait_timeout", wait_timeout)
        if call_timeout is None and wait_s is not None:
            call_timeout = wait_s + WAIT_MARGIN
        request = pb.SubmitRequest(task=_spec(payload, task_opts), wait=wait, wait_timeout_s=wait_s)
        deadline = duration("call_timeout", call_timeout)
        response = await self._call(transport.SUBMIT, request, deadline=deadline, waits=True, traced=True)
        return Submitted.from_proto(response)

    async def submit_batch(self, specs: Iterable[pb.TaskSpec]) -> list[Submitted]:
        """Submits specs built with :func:`task` atomically: all are accepted or none. Results are in
        input order; specs may depend on keys defined in the same batch."""
        response = await self._call(
            transport.SUBMIT_BATCH, pb.SubmitBatchRequest(tasks=list(specs)), traced=True
        )
        return [Submitted.from_proto(item) for item in response.tasks]

    # ``pool`` on a lookup names the task's pool: in a sharded cluster a key two shards hold (two
    # submissions racing on different shards) is refused with FailedPrecondition until it is named.

    async def get(self, ref: Ref, *, pool: str | None = None) -> TaskInfo:
        """The task with this id or key (of ``pool``, if given); ``NotFound`` if the server does not
        know (or no longer keeps) it."""
        request = pb.GetRequest(task=task_ref(ref))
        return TaskInfo.from_proto(await self._call(transport.GET, request, pool=pool))

    async def cancel(self, ref: Ref, *, pool: str | None = None) -> bool:
        """Cancels a live task (of ``pool``, if given); False when it had already finished."""
        request = pb.CancelRequest(task=task_ref(ref))
        response = await self._call(transport.CANCEL, request, pool=pool)
        return bool(response.cancelled)

    async def wait(self, ref: Ref, timeout: float | None = None, *, pool: str | None = None) -> Result:
        """Waits until the task (of ``pool``, if given) is terminal. The server caps the wait
        (``limits.max_wait_s``); ``TimeoutError`` when it runs out, ``Unavailable`` if the leader
        changes meanwhile."""
        timeout_s = duration("timeout", timeout)
        request = pb.WaitRequest(task=task_ref(ref), timeout_s=timeout_s)
        deadline = None if timeout_s is None else timeout_s + WAIT_MARGIN
        return Result.from_proto(
            await self._call(transport.WAIT, request, deadline=deadline, waits=True, pool=pool)
        )

    async def list_tasks(
        self,
        *,
        pools: Iterable[str] = (),
        statuses: Iterable[str] = (),
        after: int = 0,
        limit: int = 0,
    ) -> TaskPage:
        """Tasks with ids above ``after`` in id order, filtered by pool and status names.
        ``limit`` 0 means the server's page size (100, capped by ``limits.max_list``)."""
        request = pb.ListTasksRequest(
            pools=_names(pools),
            statuses=[status_value(s) for s in _names(statuses)],
            after=after,
            limit=limit,
        )
        return TaskPage.from_proto(await self._call(transport.LIST_TASKS, request))

    async def iter_tasks(
        self, *, pools: Iterable[str] = (), statuses: Iterable[str] = (), page_size: int = 0
    ) -> AsyncIterator[TaskInfo]:
        """Every matching task, fetching pages of ``page_size`` as it goes."""
        after = 0
        while True:
            page = await self.list_tasks(pools=pools, statuses=statuses, after=after, limit=page_size)
            for info in page.tasks:
                yield info
            if not page.next_after:
                return
            after = page.next_after

    def watch(
        self,
        pools: Iterable[str] | None = None,
        *,
        ids: Iterable[int] | None = None,
        keys: Iterable[str] | None = None,
        all_transitions: bool = False,
    ) -> EventStream:
        """Status changes as they happen: terminal ones only unless ``all_transitions``.

        Iterate the returned :class:`EventStream` with ``async for``. The stream ends with
        ``Unavailable`` when the server shuts down or loses leadership, and with ``DataLoss`` when this
        consumer falls too far behind. Through a sharded cluster, ``await stream.unavailable_shards()``
        names the shards that could not be reached, whose events the stream does not carry.
        """
        request = pb.WatchRequest(
            pools=_names(pools or ()),
            ids=list(ids or ()),
            keys=_names(keys or ()),
            all_transitions=all_transitions,
        )
        return EventStream(self._stubs().tasks.Watch(request, metadata=self._metadata))

    # ------------------------------------------------------------------------------------ admin

    async def snapshot(self) -> Snapshot:
        """Pools, capacity and counters (needs a metrics or admin token)."""
        return Snapshot.from_proto(await self._call(transport.SNAPSHOT, pb.Empty()))

    async def list_workers(self) -> list[WorkerInfo]:
        """Connected workers (needs a metrics or admin token)."""
        response = await self._call(transport.LIST_WORKERS, pb.Empty())
        return [WorkerInfo.from_proto(w) for w in response.workers]

    async def add_recurring(
        self,
        name: str,
        cron: str,
        payload: object = None,
        *,
        tz: str | None = None,
        overlap: str = "skip",
        **opts: Unpack[TaskOptions],
    ) -> None:
        """Adds (or replaces) a cron schedule whose occurrences are tasks built from ``payload`` and
        ``opts`` or from a prebuilt spec. ``overlap`` is skip, allow, queue or queue_on_success
        (needs an admin token)."""
        request = pb.RecurringRequest(
            name=name, cron=cron, tz=tz or "", template=_spec(payload, opts), overlap=overlap_value(overlap)
        )
        await self._call(transport.ADD_RECURRING, request)

    async def remove_recurring(self, name: str) -> bool:
        """Removes a schedule; False if there was none by that name (needs an admin token)."""
        response = await self._call(transport.REMOVE_RECURRING, pb.RemoveRecurringRequest(name=name))
        return bool(response.removed)

    async def list_recurring(self) -> list[RecurringInfo]:
        """Recurring schedules (needs a metrics or admin token)."""
        response = await self._call(transport.LIST_RECURRING, pb.Empty())
        return [RecurringInfo.from_proto(s) for s in response.schedules]


@dataclass(frozen=True, slots=True)
class _Stubs:
    tasks: pb_grpc.TasksStub
    admin: pb_grpc.AdminStub


def _spec(payload: object, options: TaskOptions) -> pb.TaskSpec:
    """A prebuilt ``TaskSpec`` as is, otherwise one built by :func:`task`."""
    if isinstance(payload, pb.TaskSpec):
        if options:
            raise ValueError("task options cannot be combined with a prebuilt TaskSpec")
        return payload
    return task(payload, **options)


class EventStream:
    """The events of one ``Watch`` call, in order; an async iterator of :class:`Event`.

    A server that serves a sharded cluster answers before any event with the shards it could not reach
    (they can be named only then, since a quiet shard sends nothing); :meth:`unavailable_shards` reads
    them. :meth:`aclose` cancels the call, and so does dropping the stream.

    A read that is cancelled while it waits (``asyncio.timeout`` around ``anext(stream)``) leaves the
    stream usable: the next read returns the event the cancelled one would have. grpc.aio cancels the
    whole call when one of its reads is cancelled, so the read from grpc runs in a task of its own, which
    the caller's cancellation does not reach. One read at a time: reading from two tasks at once raises
    ``RuntimeError``.
    """

    def __init__(self, call: Any) -> None:  # a grpc.aio UnaryStreamCall (grpc ships no type information)
        self._call = call
        self._messages: AsyncIterator[pb.StatusEvent] = call.__aiter__()
        self._closed = False
        # The read from grpc, kept across cancelled reads.
        self._read: asyncio.Task[pb.StatusEvent | None] | None = None
        self._reading = False  # a caller is waiting in __anext__

    def __aiter__(self) -> EventStream:
        return self

    async def __anext__(self) -> Event:
        if self._closed:
            raise StopAsyncIteration
        if self._reading:
            raise RuntimeError("another task is already reading this EventStream")
        if self._read is None:
            self._read = asyncio.ensure_future(anext(self._messages, None))
            self._read.add_done_callback(_retrieved)
        read = self._read
        self._reading = True
        try:
            message = await asyncio.shield(read)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # this caller was cancelled: the read, running or done, is the next caller's
            # The read itself was cancelled: the call was, on this side.
            self._read = None
            if self._closed:  # aclose() while this read waited
                raise StopAsyncIteration from None
            raise Cancelled("the Watch call was cancelled on this side (was its client closed?)") from None
        except grpc.aio.AioRpcError as err:
            self._read = None
            raise api_error(err) from err
        finally:
            self._reading = False
        self._read = None
        if message is None:
            raise StopAsyncIteration
        return Event.from_proto(message)

    async def unavailable_shards(self) -> list[str]:
        """Names of the shards whose events this stream does not carry because they could not be
        reached when it opened; empty when every shard answered (and always from a single server).
        Waits for the server to accept the call."""
        try:
            metadata = await self._call.initial_metadata()
        except grpc.aio.AioRpcError as err:
            raise api_error(err) from err
        value = metadata_value(metadata, UNAVAILABLE_SHARDS_KEY) or ""
        return [name for name in value.split(",") if name]

    async def aclose(self) -> None:
        """Cancel the call; iterating afterwards ends at once."""
        self._closed = True
        self._call.cancel()

    def __del__(self) -> None:
        # A read left running by a cancelled __anext__ keeps the call referenced from grpc's side, so grpc
        # would no longer cancel it when the stream is dropped: do it here.
        read = getattr(self, "_read", None)  # absent if __init__ failed
        if read is not None and not read.done():
            self._call.cancel()


def _retrieved(read: asyncio.Task[object]) -> None:
    """Marks the outcome of a read as seen, so that a read nobody awaits any more (its reader was
    cancelled, then dropped the stream) is not logged as "exception was never retrieved"."""
    if not read.cancelled():
        read.exception()


def _names(names: str | Iterable[str]) -> Sequence[str]:
    """A single name is one name, not its characters."""
    return [names] if isinstance(names, str) else list(names)
