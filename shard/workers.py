"""One remote worker's ``Workers.Work`` stream (protocol version 3), or its ``BatchedWorkers.Work``
extension (``docs/worker-protocol.md``): the same messages, many to a frame.

The stream is read by the RPC handler and written by a separate task draining a bounded queue: the
runtime only ever does a non-blocking put, so a worker that stops reading cannot stall the scheduler; when
its queue fills it is disconnected and its leases are retried elsewhere. On a batched stream the writer
sends everything queued by the time gRPC can take a message as one frame: it never waits for more, so a
lone lease goes out as soon as it would alone, and under load the per-message cost of gRPC (most of the
CPU a task costs the server) is paid once per frame instead of once per lease.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import grpc

from cronoq.api.grpc_api import frame_messages, registration
from cronoq.auth import Principal
from cronoq.checks import check_text
from cronoq.cluster.shards import Shard, ShardMap, WrongShard
from cronoq.engine.model import Abort, Dispatch
from cronoq.errors import (
    MAX_REPORT_CHARS,
    ApiError,
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
)
from cronoq.limit_hits import LimitHits
from cronoq.logs import get_logger
from cronoq.transport import framed_size
from cronoq.v1 import cronoq_pb2 as pb

from .convert import NS, SpecLimits, check_map, priority_to_wire
from .runtime import Runtime

PROTOCOL_VERSION = 3
MAX_WORKER_NAME = 256
WRITER_STOP_S = 5.0
_STOP = pb.ServerMessage()  # sentinel (by identity) that ends the writer
log = get_logger("cronoq.workers")


class Overflowed(ApiError):
    """The worker did not read its stream fast enough (its outbound queue filled)."""

    code = "resource_exhausted"


def _queue_limit(slots: int) -> int:
    """Outbound messages a worker may have pending: a lease and an abort per slot, plus control."""
    return 2 * slots + 16


def _worker_text(value: str) -> str:
    """Messages from workers are stored, not rejected: NUL becomes U+FFFD, length is capped."""
    return value.replace("\x00", "\ufffd")[:MAX_REPORT_CHARS]


class WorkerStream:
    """Serves one Work stream from its ``register`` to its end."""

    def __init__(
        self,
        runtime: Runtime,
        context: Any,
        caller: Principal,
        *,
        spec_limits: SpecLimits,
        max_message_bytes: int,
        connected: dict[int, tuple[str, int]],
        shards: ShardMap | None = None,
        locate: Callable[[Shard], str] | None = None,
        limit_hits: LimitHits | None = None,
        batched: bool = False,
    ) -> None:
        self.batched = batched
        self.limit_hits = limit_hits if limit_hits is not None else LimitHits()
        self.shards = shards if shards is not None else ShardMap([])
        # Where another shard's leader serves, as last found (default: the shard's endpoint).
        self.locate = locate
        self.runtime = runtime
        self.context = context
        self.caller = caller
        self.spec_limits = spec_limits
        self.max_message_bytes = max_message_bytes
        self.connected = connected
        self.worker_id = 0
        self.pool = ""  # set by register
        self.leases: dict[int, int] = {}  # lease id -> task id, for leases this worker holds
        self.queue: asyncio.Queue[pb.ServerMessage] = asyncio.Queue()
        self.queue_limit = 64
        self.failure: ApiError | None = None
        self._writer: asyncio.Task[None] | None = None
        # The task serving this stream while it waits for the worker's next message: a failure raised
        # elsewhere (a slow reader) interrupts that wait, so the call ends and frees its stream slot
        # rather than waiting for a message the stuck worker may never send.
        self._reading: asyncio.Task[Any] | None = None

    # ------------------------------------------------------------------------------ runtime sink

    def _put(self, msg: pb.ServerMessage) -> None:
        if self.failure is not None:
            return
        if self.queue.qsize() >= self.queue_limit:
            self.failure = Overflowed("worker did not read its stream (outbound buffer full); disconnected")
            log.warning("worker_disconnected_slow_reader", worker_id=self.worker_id)
            asyncio.get_running_loop().call_soon(self.runtime.detach, self.worker_id)
            if self._reading is not None:
                self._reading.cancel()
            return
        self.queue.put_nowait(msg)

    def send_lease(self, action: Dispatch) -> None:
        task = action.task
        spec = task.spec
        self.leases[action.lease] = task.id
        tracing = self.runtime.tracing
        lease = pb.Lease(
            lease=action.lease,
            task_id=task.id,
            attempt=action.attempt,
            payload=spec.payload,
            content_type=spec.content_type,
            kind=spec.kind,
            key=spec.key,
            tags=spec.tags if tracing is None else tracing.attempt(action),
            pool=spec.pool,
            priority=priority_to_wire(spec.priority),
        )
        if spec.timeout is not None:
            lease.timeout_s = spec.timeout
        if spec.deadline is not None:
            lease.deadline_unix_ns = int(spec.deadline * NS)
        if action.lease_ttl is not None:
            lease.lease_ttl_s = action.lease_ttl
        self._put(pb.ServerMessage(lease=lease))

    def send_abort(self, action: Abort) -> None:
        self.leases.pop(action.lease, None)
        self._put(pb.ServerMessage(abort=pb.Abort(lease=action.lease, reason=action.reason)))

    def send_shutdown(self, reason: str, not_leader: bool) -> None:
        self.queue.put_nowait(pb.ServerMessage(shutdown=pb.Shutdown(reason=reason, not_leader=not_leader)))

    # ----------------------------------------------------------------------------------- stream

    async def _write_loop(self) -> None:
        context = self.context
        queue = self.queue
        while (msg := await queue.get()) is not _STOP and self.failure is None:
            await context.write(msg)
            queue.task_done()

    async def _write_batches(self) -> None:
        """The writer of a batched stream: each frame holds what is queued when gRPC can take the next
        one, within ``max_message_bytes`` (the server's own send limit), so a frame is never larger than
        the one message that would otherwise go alone. A message that does not fit waits for the next."""
        context = self.context
        queue = self.queue
        limit = self.max_message_bytes
        carried: pb.ServerMessage | None = None
        while True:
            msg = carried if carried is not None else await queue.get()
            carried = None
            if msg is _STOP or self.failure is not None:
                return
            messages = [msg]
            size = framed_size(msg)
            while not queue.empty():
                following = queue.get_nowait()
                if following is not _STOP:
                    size += framed_size(following)
                    if size <= limit:
                        messages.append(following)
                        continue
                carried = following
                break
            await context.write(pb.ServerBatch(messages=messages))
            for _ in messages:
                queue.task_done()

    async def _stop_writer(self) -> None:
        """End the writer after its current write: gRPC cannot finish a call while a write is pending
        (cancelling one mid-flight leaves the call unable to send its status)."""
        writer = self._writer
        if writer is None:
            return
        if not writer.done():
            while not self.queue.empty():
                self.queue.get_nowait()
                self.queue.task_done()
            self.queue.put_nowait(_STOP)
            with contextlib.suppress(Exception):  # a failed write is reported by _writer_done
                await asyncio.wait_for(asyncio.shield(writer), WRITER_STOP_S)
            if not writer.done():
                writer.cancel()  # the peer stopped reading; the call ends when its connection does

    def _writer_done(self, writer: asyncio.Task[None]) -> None:
        """A write fails when the worker went away (cancelled its call, lost its connection) while a
        message was on its way: nothing to report to anyone, but the error must be collected, or asyncio
        logs it with a traceback as "never retrieved". Collected here, when the writer ends, rather than
        by whoever stops it: a call cancelled while ``_stop_writer`` waits never gets back to it (and
        ``shield`` then drops its own interest in the writer's outcome)."""
        error = None if writer.cancelled() else writer.exception()
        if error is not None:
            log.info("worker_write_failed", worker_id=self.worker_id, error=type(error).__name__)

    def _register(self, msg: pb.WorkerMessage) -> tuple[str, int, dict[str, str]]:
        reg = registration(msg)
        check_text("register.worker_name", reg.worker_name, MAX_WORKER_NAME)
        labels = check_map("register.labels", reg.labels, self.spec_limits)
        owner = self.shards.by_pool(reg.pool)
        if not self.shards.is_local(owner):
            assert owner is not None
            raise WrongShard(
                owner,
                f"register.pool: pool '{reg.pool}' is served by another shard",
                self.locate(owner) if self.locate is not None else None,
            )
        if not self.runtime.engine.has_pool(reg.pool):
            raise NotFound(f"register.pool: unknown pool '{reg.pool}'")
        if not self.caller.may_use_pool(reg.pool):
            raise PermissionDenied(f"register.pool: this credential may not serve pool '{reg.pool}'")
        allowed = self.caller.labels
        if allowed is not None:
            refused = [f"{k}={v}" for k, v in sorted(labels.items()) if allowed.get(k) != v]
            if refused:
                raise PermissionDenied(
                    f"register.labels: this credential may not claim {', '.join(refused)} "
                    f"(it allows {', '.join(f'{k}={v}' for k, v in sorted(allowed.items())) or 'no labels'})"
                )
        if reg.slots < 1:
            raise InvalidArgument("register.slots: must be at least 1")
        return reg.pool, reg.slots, labels

    async def serve(self) -> None:
        context = self.context
        frame = await context.read()
        if frame is grpc.aio.EOF:
            return
        first, *following = frame_messages(frame, self.batched)
        with self.limit_hits.counting():  # labels beyond limits.max_tags / max_tag_len
            pool, requested, labels = self._register(first)
        runtime = self.runtime
        self.worker_id = worker_id = runtime.new_worker_id()
        self.pool = pool
        granted = runtime.engine.grant(pool, requested)
        self._count_slot_cap(pool, requested, granted)
        self.queue_limit = _queue_limit(granted)
        cfg = runtime.engine.pool_config(pool)
        registered = pb.Registered(
            worker_id=worker_id,
            slots=granted,
            protocol_version=PROTOCOL_VERSION,
            max_message_bytes=self.max_message_bytes,
        )
        if cfg.lease_ttl is not None:
            registered.lease_ttl_s = cfg.lease_ttl
        self.queue.put_nowait(pb.ServerMessage(registered=registered))
        self._writer = asyncio.create_task(self._write_batches() if self.batched else self._write_loop())
        self._writer.add_done_callback(self._writer_done)
        self.connected[worker_id] = (first.register.worker_name, time.time_ns())
        log.info(
            "worker_registered",
            worker_id=worker_id,
            pool=pool,
            slots=granted,
            name=first.register.worker_name,
        )
        runtime.attach(worker_id, self, pool, granted, labels)
        try:
            if following:  # a batch may go on after its register
                self._handle(following)
            while self.failure is None:
                self._reading = asyncio.current_task()
                try:
                    msg = await context.read()
                except asyncio.CancelledError:
                    if self.failure is None or self._reading is None:
                        raise  # the call itself was cancelled
                    self._reading.uncancel()  # interrupted by the failure: end the call with it
                    break
                finally:
                    self._reading = None
                if msg is grpc.aio.EOF:
                    break
                self._handle(frame_messages(msg, self.batched))
        finally:
            self.connected.pop(worker_id, None)
            runtime.detach(worker_id)
            await self._stop_writer()
            log.info("worker_disconnected", worker_id=worker_id)
        if self.failure is not None:
            raise self.failure

    def _count_slot_cap(self, pool: str, requested: int, granted: int) -> None:
        """A worker granted fewer slots than it asked because of ``max_slots_per_worker`` (not because
        of the pool's ``max``) is a hit of that limit."""
        cap = self.runtime.engine.pool_config(pool).max_slots_per_worker
        if cap is not None and granted == cap < requested:
            self.limit_hits.hit("max_slots_per_worker")

    async def finish_writes(self, timeout: float) -> None:
        """Wait (bounded) until queued messages, e.g. a Shutdown, were handed to gRPC."""
        if self._writer is not None and not self._writer.done():
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.queue.join(), timeout)

    def _handle(self, messages: Sequence[pb.WorkerMessage]) -> None:
        """Apply ``messages`` in order, then deliver what they set off. A message the server refuses
        ends the stream; those before it in its batch stand, as they would have sent one by one."""
        if self.failure is not None:  # the stream is ending; the engine may have dropped the worker
            return
        runtime = self.runtime
        now = runtime.clock()
        acted = False
        try:
            for msg in messages:
                acted = self._apply(msg, now) or acted
        finally:
            if acted:
                runtime.flush()

    def _apply(self, msg: pb.WorkerMessage, now: float) -> bool:
        """Hand one message to the engine; whether it may have set off actions (a heartbeat never does)."""
        runtime = self.runtime
        engine = runtime.engine
        wid = self.worker_id
        which = msg.WhichOneof("msg")
        if which == "heartbeat":
            engine.heartbeat(wid, msg.heartbeat.lease, now)
            return False
        if which == "complete":
            c = msg.complete
            task_id = self.leases.pop(c.lease, None)
            if engine.complete(wid, c.lease, now) and task_id is not None:
                runtime.record_output(task_id, c.output, _worker_text(c.content_type)[:128])
        elif which == "fail":
            f = msg.fail
            retry_after: float | None = None
            if f.HasField("retry_after_s"):
                retry_after = f.retry_after_s
                if not math.isfinite(retry_after) or retry_after < 0:
                    raise InvalidArgument(
                        f"fail.retry_after_s: must be a finite number >= 0 (got {retry_after!r})"
                    )
            self.leases.pop(f.lease, None)
            engine.fail(wid, f.lease, _worker_text(f.message), f.permanent, retry_after, now)
        elif which == "nack":
            self.leases.pop(msg.nack.lease, None)
            engine.nack(wid, msg.nack.lease, _worker_text(msg.nack.reason), now)
        elif which == "cancelled":
            self.leases.pop(msg.cancelled.lease, None)
            engine.cancelled(wid, msg.cancelled.lease, now)
        elif which == "set_slots":
            granted = engine.set_worker_slots(wid, msg.set_slots.slots, now)
            self._count_slot_cap(self.pool, msg.set_slots.slots, granted)
            self.queue_limit = max(self.queue_limit, _queue_limit(granted))
        elif which == "register":
            raise FailedPrecondition("register may be sent only once per stream")
        else:
            raise InvalidArgument("worker message has no field set (expected heartbeat, complete, fail, ...)")
        return True
