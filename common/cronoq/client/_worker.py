"""``Worker``: serves one pool over a ``Workers.Work`` stream (worker protocol version 3), or over
the ``BatchedWorkers.Work`` extension where the server has it (``docs/worker-protocol.md``).

A :class:`Worker` owns the connection life cycle (register, reconnect with backoff, follow shard
redirects, drain on stop); each stream is a :class:`_Session`, which owns the leases that arrived on it,
because a lease means nothing on any other stream: when a stream ends the server retries its leases
elsewhere, so their handlers are cancelled rather than reported.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import inspect
from collections import deque
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar, cast

import grpc

from cronoq.client._codec import decode_json, decode_text, encode
from cronoq.client._connect import (
    CHANNEL_DEFAULTS,
    HOST_BOUND_OPTIONS,
    Redirect,
    Redirects,
    allowed_hosts,
    auth_metadata,
    shard_redirect,
    with_defaults,
)
from cronoq.client._tracing import handling
from cronoq.client._wire import duration, optional_seconds, priority_name
from cronoq.errors import (
    MAX_REPORT_CHARS,
    ApiError,
    CronoqError,
    FailedPrecondition,
    Permanent,
    Retryable,
    error_for,
)
from cronoq.transport import ChannelOptions, Endpoint, api_error, framed_size, open_channel
from cronoq.v1 import cronoq_pb2 as pb
from cronoq.v1 import cronoq_pb2_grpc as pb_grpc

T = TypeVar("T")
PROTOCOL_VERSION = 3
"""The worker protocol version this SDK speaks."""
MAX_REDIRECTS = 3
"""Shard redirects followed in a row before :meth:`Worker.run` gives up."""
# After the server says it is no longer the leader, the new one is usually serving within a second or
# two (a standby's poll plus recovery): retry UNAVAILABLE this often, for this long, before backing off.
LEADER_HUNT_S = 15.0
LEADER_HUNT_DELAY_S = 0.1

# Statuses retrying cannot fix: run() raises them instead of reconnecting.
FATAL_CODES = frozenset(
    {
        "unauthenticated",
        "permission_denied",
        "not_found",
        "failed_precondition",
        "invalid_argument",
        "unimplemented",
    }
)
DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024  # gRPC's default, for servers that do not say
OUTPUT_HEADROOM = 1024  # room for the Complete message around the output bytes
MIN_HEARTBEAT_INTERVAL = 0.01
CLOSE_WAIT = 5.0  # how long stop() waits for the server to end the stream after the half-close


class Reject(CronoqError):
    """Raised by a handler to hand its lease back unrun.

    The server offers it to another worker of the pool (same attempt, not counted as a retry), or fails
    the attempt as retryable when no other worker can take it. ``reason`` goes through ``str()``, like
    the message of ``Retryable`` and ``Permanent``.
    """

    def __init__(self, reason: object = "") -> None:
        super().__init__(reason)
        self.reason = str(reason)


class CancelTask(CronoqError):
    """Raised by a handler to end its task as cancelled, without retries."""


@dataclass(slots=True, eq=False)
class Lease:
    """One attempt of a task, handed to the handler.

    ``deadline`` is the task's soft deadline in Unix seconds, ``timeout`` the per-attempt limit and
    ``lease_ttl`` the heartbeat bound (the worker heartbeats for the handler). ``cancelled`` is set when
    the server aborts the attempt, just before the handler's task is cancelled; sync handlers, which
    cannot be cancelled, should poll it.
    """

    id: int
    task_id: int
    attempt: int
    payload: bytes
    content_type: str
    kind: str
    key: str | None
    tags: dict[str, str]
    timeout: float | None
    deadline: float | None
    pool: str
    priority: str | None
    lease_ttl: float | None
    cancelled: asyncio.Event = field(default_factory=asyncio.Event)

    def json(self) -> Any:
        """The payload parsed as JSON (``None`` for an empty payload)."""
        return decode_json(self.payload)

    def text(self) -> str:
        """The payload as UTF-8 text."""
        return decode_text(self.payload)

    @classmethod
    def from_proto(cls, msg: pb.Lease, registered_ttl: float | None) -> Lease:
        """A TTL on the lease itself takes precedence over the one from registration."""
        return cls(
            id=msg.lease,
            task_id=msg.task_id,
            attempt=msg.attempt,
            payload=msg.payload,
            content_type=msg.content_type,
            kind=msg.kind,
            key=msg.key or None,
            tags=dict(msg.tags),
            timeout=msg.timeout_s if msg.HasField("timeout_s") else None,
            deadline=optional_seconds(msg, "deadline_unix_ns"),
            pool=msg.pool,
            priority=priority_name(msg.priority),
            lease_ttl=msg.lease_ttl_s if msg.HasField("lease_ttl_s") else registered_ttl,
        )


Handler = Callable[[Lease], object]
"""An async function of a :class:`Lease` (a plain function runs in the loop's default executor)."""


class Worker:
    """Runs ``handler`` for the leases of ``pool``, at most ``slots`` at a time (or fewer if the server
    grants fewer).

    The handler's return value completes the task (bytes, str, None or JSON, encoded like payloads);
    ``Retryable``/``Permanent`` fail the attempt; :class:`Reject` hands the lease back; :class:`CancelTask`
    cancels the task; any other exception is a retryable failure "TypeName: message".

    Connection settings are as for ``Client``, keepalive pings included: a worker attached to a server
    that froze or was cut off notices, and reconnects (to the new leader after a failover).
    ``reconnect`` keeps the worker connected across dropped streams, waiting ``backoff`` (initial,
    maximum) seconds, doubling. ``grace`` is how long :meth:`stop` lets running handlers finish.
    ``labels`` register the worker for tasks requiring them. ``batches`` uses the server's
    ``BatchedWorkers`` extension, which carries what is queued each way in one message (much less CPU per
    task under load), and falls back to ``Workers.Work`` by itself on a server without it. A shard redirect is followed only to a
    URL the configured target named for the shard, or, with ``redirect_allow`` (URLs, host names,
    ``*.suffix``), only to what that admits; ``insecure_redirect_http`` lets redirects send the token
    over plain http to other hosts (see :class:`~cronoq.client._connect.Redirects`).

    The public attributes describe the latest registration: ``worker_id``, ``lease_ttl``,
    ``granted_slots``, ``server_protocol``, ``max_message_bytes`` and ``batched`` (whether the stream is
    the batched extension); ``connections`` counts registrations,
    ``last_shutdown`` holds the reason of the server's last Shutdown and ``running`` is true inside
    :meth:`run`.
    """

    def __init__(
        self,
        target: str,
        pool: str,
        handler: Handler,
        *,
        slots: int = 1,
        token: str | None = None,
        name: str = "",
        tls: bool = False,
        credentials: Any = None,
        reconnect: bool = True,
        backoff: tuple[float, float] = (0.1, 5.0),
        grace: float = 10.0,
        options: ChannelOptions | None = None,
        labels: Mapping[str, str] | None = None,
        insecure_redirect_http: bool = False,
        redirect_allow: Iterable[str] | None = None,
        batches: bool = True,
    ) -> None:
        if isinstance(slots, bool) or not isinstance(slots, int) or slots < 1:
            raise ValueError(f"slots must be an integer >= 1 (got {slots!r})")
        initial, ceiling = (duration("backoff", b) for b in backoff)
        if not initial or ceiling is None or ceiling < initial:
            raise ValueError(
                f"backoff must be (initial, maximum) with 0 < initial <= maximum (got {backoff!r})"
            )
        self.pool = pool
        self.slots = slots
        self.name = name
        self.labels = {str(k): str(v) for k, v in (labels or {}).items()}
        self.reconnect = reconnect
        self.batches = batches
        # Endpoints that answered BatchedWorkers.Work with UNIMPLEMENTED, until a stream with them ends:
        # a server upgraded meanwhile gets the extension asked for again.
        self._unbatched: set[Endpoint] = set()
        self.backoff = (initial, ceiling)
        self.grace = duration("grace", grace) or 0.0
        self._handler = handler
        self._handler_is_async = inspect.iscoroutinefunction(handler) or inspect.iscoroutinefunction(
            getattr(handler, "__call__", None)  # noqa: B004 - an object whose __call__ is async
        )
        self._home = Endpoint.parse(target, secure=tls or credentials is not None)
        self._credentials = credentials
        self._options = with_defaults(tuple(options or ()), CHANNEL_DEFAULTS)
        self._metadata = auth_metadata(token)
        self._redirects = Redirects(
            self._home,
            sends_token=bool(self._metadata),
            allow_http=insecure_redirect_http,
            allow=allowed_hosts(redirect_allow),
        )

        self.running = False
        self.worker_id: int | None = None
        self.lease_ttl: float | None = None
        self.granted_slots = 0
        self.server_protocol = 0
        self.max_message_bytes = 0
        self.batched = False
        self.last_shutdown: str | None = None
        self.connections = 0

        self._stopping = False
        # stop() before run() started: the coroutine may already be scheduled, so the next run() must
        # return without serving rather than serve until a stop() that already happened.
        self._stop_requested = False
        self._session: _Session | None = None
        self._stop_task: asyncio.Task[None] | None = None
        self._signals: _Signals | None = None

    # ------------------------------------------------------------------------------- public API

    async def run(self) -> None:
        """Serves the pool until :meth:`stop`; raises an ``ApiError`` for problems retrying cannot fix
        (rejected token, unknown pool, refused or too many redirects), or any error once ``reconnect``
        is off. Returns at once, without connecting, after a :meth:`stop` made while not running."""
        if self.running:
            raise RuntimeError("the worker is already running")
        signals = self._signals_here()
        signals.registered.clear()
        signals.wake.clear()
        signals.finished.clear()
        self.running = True
        self._stopping, self._stop_requested = self._stop_requested, False
        self._stop_task = None
        try:
            await self._serve(signals)
        finally:
            self.running = False
            signals.finished.set()

    async def stop(self, grace: float | None = None) -> None:
        """Stops taking leases (SetSlots 0), lets running handlers finish for up to ``grace`` seconds
        (default: the constructor's), cancels the rest, half-closes the stream and waits for
        :meth:`run` to return. Concurrent calls share one stop. On a worker that is not running it makes
        the next :meth:`run` return at once (that run may be a task that has not started yet)."""
        if not self.running:
            self._stop_requested = True
            return
        if self._stop_task is None:
            limit = self.grace if grace is None else duration("grace", grace) or 0.0
            self._stop_task = asyncio.create_task(self._drain(limit))
        await asyncio.shield(self._stop_task)

    async def wait_registered(self, timeout: float | None = None) -> None:
        """Waits until the worker is registered with the server.

        ``TimeoutError`` after ``timeout`` seconds; ``RuntimeError`` if :meth:`run` ends first.
        """
        signals = self._signals_here()
        waiters = [
            asyncio.create_task(signals.registered.wait()),
            asyncio.create_task(signals.finished.wait()),
        ]
        try:
            done, _ = await asyncio.wait(waiters, timeout=timeout, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for waiter in waiters:
                waiter.cancel()
        if signals.registered.is_set():
            return
        if not done:
            raise TimeoutError(f"the worker did not register within {timeout} s")
        raise RuntimeError("the worker stopped before it registered")

    # --------------------------------------------------------------------------------- internals

    def _signals_here(self) -> _Signals:
        """Events of the running loop; a worker can run again on another loop after it stopped."""
        loop = asyncio.get_running_loop()
        if self._signals is None or self._signals.loop is not loop:
            self._signals = _Signals(loop)
        return self._signals

    async def _serve(self, signals: _Signals) -> None:
        loop = asyncio.get_running_loop()
        endpoint = self._home
        delay = self.backoff[0]
        redirects = 0
        hunt_until = 0.0  # after Shutdown{not_leader}: look for the new leader briskly until then
        channel: grpc.aio.Channel | None = None  # kept from a stream refused for want of batches
        while not self._stopping:
            batched = self.batches and endpoint not in self._unbatched
            session = _Session(self, endpoint, signals, batched, channel)
            self._session = session
            began = loop.time()
            unbatched = False
            try:
                await session.run()
                unbatched = session.refused_batches()
            finally:
                self._session = None
                if not unbatched or self._stopping:
                    await session.close()
            if self._stopping:
                return
            if unbatched:  # a server without the extension: Workers.Work at once, on the same connection
                self._unbatched.add(endpoint)
                channel = session.channel
                continue
            channel = None
            if not batched and session.registered:
                self._unbatched.discard(endpoint)
            if loop.time() - began > 10 * self.backoff[1]:
                delay = self.backoff[0]
            error = session.error
            if error is not None and session.redirect is not None:
                redirects += 1
                if redirects > MAX_REDIRECTS:
                    raise FailedPrecondition(
                        f"gave up after {MAX_REDIRECTS} shard redirects in a row (the last pointed to "
                        f"{session.redirect.url!r})"
                    )
                endpoint = self._redirects.follow(endpoint, session.redirect)
                continue
            redirects = 0
            if error is not None and (error.code in FATAL_CODES or not self.reconnect):
                raise error
            if not self.reconnect:
                return
            if error is not None and error.code == "unavailable":
                endpoint = self._home  # a redirected-to shard is down: ask the configured target again
            if session.shutdown is not None and session.shutdown.not_leader:
                hunt_until = loop.time() + LEADER_HUNT_S
                continue  # leadership moved: the new leader is ready now, or in a moment
            if error is not None and error.code == "unavailable" and loop.time() < hunt_until:
                await self._pause(LEADER_HUNT_DELAY_S)  # a standby, or the new leader still recovering
                continue
            await self._pause(delay)
            delay = min(delay * 2, self.backoff[1])

    async def _pause(self, delay: float) -> None:
        """The reconnect backoff, cut short by :meth:`stop`."""
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._signals_here().wake.wait(), delay)

    async def _drain(self, grace: float) -> None:
        self._stopping = True
        signals = self._signals_here()
        signals.wake.set()
        if self._session is not None:
            await self._session.drain(grace)
        await signals.finished.wait()

    def _options_for(self, endpoint: Endpoint) -> ChannelOptions:
        if endpoint == self._home:
            return self._options
        return tuple(option for option in self._options if option[0] not in HOST_BOUND_OPTIONS)


class _Signals:
    """The events of one event loop; asyncio events cannot be shared between loops."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.registered = asyncio.Event()
        self.finished = asyncio.Event()
        self.wake = asyncio.Event()


@dataclass(eq=False, slots=True)
class _Attempt:
    lease: Lease
    task: asyncio.Task[None] | None = None
    # A loop timer, not a task: one per running lease, so it must cost next to nothing to arm and cancel.
    heartbeat: asyncio.TimerHandle | None = None

    def stop_heartbeat(self) -> None:
        if self.heartbeat is not None:
            self.heartbeat.cancel()
            self.heartbeat = None

    def cancel(self) -> None:
        self.lease.cancelled.set()
        self.stop_heartbeat()
        if self.task is not None:
            self.task.cancel()


class _Session:
    """One Work stream (``batched``: a BatchedWorkers.Work stream). After :meth:`run` returns, ``error``,
    ``redirect`` and ``shutdown`` say why the stream ended."""

    def __init__(
        self,
        worker: Worker,
        endpoint: Endpoint,
        signals: _Signals,
        batched: bool,
        channel: grpc.aio.Channel | None,
    ) -> None:
        self._worker = worker
        self.batched = batched
        self._signals = signals
        self._attempts: dict[int, _Attempt] = {}
        self._outbox: deque[pb.WorkerMessage] = deque()  # not yet handed to grpc
        self._outbox_filled = asyncio.Event()
        self._half_close = False  # set by drain(): end the requests once the outbox is empty
        self._closed = asyncio.Event()
        self.registered = False
        self.error: ApiError | None = None
        self.redirect: Redirect | None = None
        self.shutdown: pb.Shutdown | None = None
        self._send(
            pb.WorkerMessage(
                register=pb.Register(
                    pool=worker.pool,
                    slots=worker.slots,
                    worker_name=worker.name,
                    protocol_version=PROTOCOL_VERSION,
                    labels=worker.labels,
                )
            )
        )
        self.channel = channel or open_channel(endpoint, worker._credentials, worker._options_for(endpoint))
        self._call: Any
        if batched:
            self._call = pb_grpc.BatchedWorkersStub(self.channel).Work(
                self._frames(self._take_batch), metadata=worker._metadata
            )
        else:
            self._call = pb_grpc.WorkersStub(self.channel).Work(
                self._frames(self._outbox.popleft), metadata=worker._metadata
            )

    async def run(self) -> None:
        try:
            if self.batched:
                async for batch in self._call:
                    for message in batch.messages:
                        if self._ends(message):
                            return
            else:
                async for message in self._call:
                    if self._ends(message):
                        return
        except grpc.aio.AioRpcError as err:
            self.error = api_error(err)
            if err.code() == grpc.StatusCode.FAILED_PRECONDITION:
                self.redirect = shard_redirect(err)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise
            # Otherwise drain() cancelled the call after the server did not close it in time.
        finally:
            for attempt in self._attempts.values():
                attempt.cancel()
            self._attempts.clear()
            self._signals.registered.clear()
            self._end_requests()
            self._closed.set()

    async def close(self) -> None:
        await self.channel.close()

    def refused_batches(self) -> bool:
        """Whether the stream ended because the server has no BatchedWorkers.Work (UNIMPLEMENTED before
        anything else; a server that has it never answers so)."""
        return (
            self.batched
            and not self.registered
            and self.error is not None
            and self.error.code == "unimplemented"
        )

    async def drain(self, grace: float) -> None:
        """Stops taking leases, gives running ones up to ``grace`` seconds, then half-closes."""
        self._send(pb.WorkerMessage(set_slots=pb.SetSlots(slots=0)))
        running = [attempt.task for attempt in self._attempts.values() if attempt.task is not None]
        if running:
            await asyncio.wait(running, timeout=grace)
        for lease_id, attempt in list(self._attempts.items()):
            del self._attempts[lease_id]
            attempt.cancel()
            self._send(
                self._fail(lease_id, f"the worker stopped; the handler did not finish within {grace} s")
            )
        self._half_close = True
        self._outbox_filled.set()
        try:
            await asyncio.wait_for(self._closed.wait(), CLOSE_WAIT)
        except TimeoutError:
            self._call.cancel()
            await self._closed.wait()

    # ----------------------------------------------------------------------------- server messages

    def _ends(self, message: pb.ServerMessage) -> bool:
        """Act on one message from the server; whether it ends the stream (a Shutdown, or a protocol
        error recorded in ``error``)."""
        kind = message.WhichOneof("msg")
        if kind == "registered":
            self._on_registered(message.registered)
        elif kind == "shutdown":
            self.shutdown = message.shutdown
            self._worker.last_shutdown = message.shutdown.reason
            return True
        elif not self.registered:
            self.error = error_for("internal", f"the server sent {kind} before registered")
            return True
        elif kind == "lease":
            self._on_lease(message.lease)
        elif kind == "abort":
            self._on_abort(message.abort)
        return False

    def _on_registered(self, msg: pb.Registered) -> None:
        worker = self._worker
        worker.worker_id = msg.worker_id
        worker.lease_ttl = msg.lease_ttl_s if msg.HasField("lease_ttl_s") else None
        # Servers before protocol 1 sent 0 slots: they granted what was asked.
        worker.granted_slots = min(msg.slots, worker.slots) if msg.slots else worker.slots
        worker.server_protocol = msg.protocol_version
        worker.max_message_bytes = msg.max_message_bytes or DEFAULT_MAX_MESSAGE_BYTES
        worker.batched = self.batched
        worker.connections += 1
        self.registered = True
        self._signals.registered.set()

    def _on_lease(self, msg: pb.Lease) -> None:
        worker = self._worker
        if worker._stopping:
            self._send(self._give_back(msg.lease, "the worker is stopping"))
            return
        if len(self._attempts) >= worker.granted_slots:
            self._send(self._give_back(msg.lease, f"all {worker.granted_slots} slots of the worker are busy"))
            return
        attempt = _Attempt(Lease.from_proto(msg, worker.lease_ttl))
        self._attempts[attempt.lease.id] = attempt
        attempt.task = asyncio.create_task(self._execute(attempt))
        ttl = attempt.lease.lease_ttl
        if ttl:
            self._beat_later(attempt, max(ttl / 3, MIN_HEARTBEAT_INTERVAL))

    def _on_abort(self, msg: pb.Abort) -> None:
        # The server already freed the slot and expects nothing more for this lease.
        attempt = self._attempts.pop(msg.lease, None)
        if attempt is not None:
            attempt.cancel()

    # ---------------------------------------------------------------------------------- attempts

    async def _execute(self, attempt: _Attempt) -> None:
        lease_id = attempt.lease.id
        try:
            outcome = await self._outcome(attempt.lease)
        except Exception as err:
            # The handler ended, but its report could not be built (an output that breaks the encoder, an
            # exception with a broken attribute). The lease must be answered all the same: unanswered,
            # it would be heartbeated, and its slot held, for as long as the stream lasts.
            outcome = self._fail(
                lease_id, f"the worker could not report how the handler ended: {_describe(err)}"
            )
        # Gone from the table means aborted, drained or the stream ended: the outcome is not wanted.
        if self._attempts.pop(lease_id, None) is attempt:
            attempt.stop_heartbeat()
            self._send(outcome)

    async def _outcome(self, lease: Lease) -> pb.WorkerMessage:
        """The message reporting how the handler ended; raises when the message cannot be built."""
        try:
            value = await self._invoke(lease)
        except asyncio.CancelledError:
            current = asyncio.current_task()
            if current is not None and current.cancelling():
                raise  # cancelled by this worker (abort, stop, stream end)
            return self._fail(lease.id, "CancelledError: raised by the handler")
        except Reject as err:
            return self._give_back(lease.id, err.reason)
        except CancelTask:
            return pb.WorkerMessage(cancelled=pb.Cancelled(lease=lease.id))
        except Retryable as err:
            return self._fail(lease.id, err.message, retry_after=err.retry_after)
        except Permanent as err:
            return self._fail(lease.id, err.message, permanent=True)
        except Exception as err:
            return self._fail(lease.id, _describe(err))
        return self._complete(lease.id, value)

    async def _invoke(self, lease: Lease) -> object:
        """The handler's result, run in its span (with OpenTelemetry, see :mod:`._tracing`); a plain
        function runs in the executor in a copy of this context, so that the span is its current one."""
        handler = self._worker._handler
        with handling(lease):
            if self._worker._handler_is_async:
                return await cast(Awaitable[object], handler(lease))
            run = contextvars.copy_context().run
            result = await asyncio.get_running_loop().run_in_executor(None, run, handler, lease)
            # A plain function may still hand back a coroutine (a lambda around an async function).
            return await result if inspect.isawaitable(result) else result

    def _complete(self, lease_id: int, value: object) -> pb.WorkerMessage:
        try:
            output, content_type = encode(value)
        except (TypeError, ValueError, RecursionError) as err:  # RecursionError: nested too deeply
            return self._fail(lease_id, f"the handler's output is not JSON-encodable: {err}", permanent=True)
        limit = self._worker.max_message_bytes - OUTPUT_HEADROOM
        if len(output) > limit:
            return self._fail(
                lease_id,
                f"the handler's output is {len(output)} bytes; the server accepts at most {limit}",
                permanent=True,
            )
        return pb.WorkerMessage(
            complete=pb.Complete(lease=lease_id, output=output, content_type=content_type)
        )

    def _fail(
        self, lease_id: int, message: str, *, permanent: bool = False, retry_after: object = None
    ) -> pb.WorkerMessage:
        """A ``fail`` the server accepts whatever ``retry_after`` holds. An invalid one (NaN, negative,
        not a number: it can be set on a ``Retryable`` after construction) is left out and named in the
        message: the server would answer it by ending the stream, failing every other lease on it."""
        try:
            seconds = Retryable.retry_after_seconds(retry_after)
        except ValueError as err:
            seconds, message = None, f"{message} (retry_after not sent: {err})"
        text = self._wire_text(message)
        return pb.WorkerMessage(
            fail=pb.Fail(lease=lease_id, message=text, permanent=permanent, retry_after_s=seconds)
        )

    def _wire_text(self, text: str) -> str:
        """``text`` as a report carries it: valid UTF-8 (an exception about an undecodable file name
        carries lone surrogates, which would make building the message raise; they are sent escaped
        instead), cut to what a server keeps (:data:`~cronoq.errors.MAX_REPORT_CHARS`) and to what fits
        in the server's message limit, saying how long it was. A handler's exception text can be any
        length, and a report over that limit would end the stream and retry every lease on it."""
        text = text.encode("utf-8", "backslashreplace").decode("utf-8")
        max_bytes = self._worker.max_message_bytes - OUTPUT_HEADROOM
        if len(text) <= MAX_REPORT_CHARS and (len(text) * 4 <= max_bytes or len(text.encode()) <= max_bytes):
            return text
        cut = f"... (cut: {len(text):,} characters)"
        kept = text[: MAX_REPORT_CHARS - len(cut)].encode()[: max_bytes - len(cut)]
        return kept.decode(errors="ignore") + cut

    def _give_back(self, lease_id: int, reason: str) -> pb.WorkerMessage:
        """Nack; servers older than protocol 2 have none, a retryable failure is the closest."""
        if self._worker.server_protocol >= 2:
            return pb.WorkerMessage(nack=pb.Nack(lease=lease_id, reason=self._wire_text(reason)))
        return self._fail(lease_id, reason)

    def _beat_later(self, attempt: _Attempt, interval: float) -> None:
        attempt.heartbeat = asyncio.get_running_loop().call_later(interval, self._beat, attempt, interval)

    def _beat(self, attempt: _Attempt, interval: float) -> None:
        if self._attempts.get(attempt.lease.id) is not attempt:
            return
        self._send(pb.WorkerMessage(heartbeat=pb.Heartbeat(lease=attempt.lease.id)))
        self._beat_later(attempt, interval)

    # --------------------------------------------------------------------------------- outbound

    def _send(self, message: pb.WorkerMessage) -> None:
        self._outbox.append(message)
        self._outbox_filled.set()

    def _end_requests(self) -> None:
        """End :meth:`_frames` once the call is over. grpc.aio reads it in a task of its own, which a
        call ended by the server (an error status, a lost connection) leaves waiting for the next message:
        the task would be destroyed pending and the generator's close fail, both logged by asyncio as
        errors. What is still queued goes first (after a ``shutdown`` the server may still read it)."""
        self._half_close = True
        self._outbox_filled.set()

    async def _frames(self, take: Callable[[], T]) -> AsyncIterator[T]:
        """The frames to the server, each ``take()`` from the outbox, in order. The stream is half-closed
        only once :meth:`drain` asked for it and nothing is left to send, so that a nack for a lease that
        arrived in the meantime (sent before the server read SetSlots 0) still reaches the server, which
        would otherwise fail it."""
        while True:
            if self._outbox:
                yield take()
                continue
            if self._half_close:
                return
            self._outbox_filled.clear()
            await self._outbox_filled.wait()

    def _take_batch(self) -> pb.WorkerBatch:
        """A frame of a batched stream: what is queued when grpc takes the next frame (it never waits
        for more), within the server's ``max_message_bytes``."""
        outbox = self._outbox
        limit = self._worker.max_message_bytes or DEFAULT_MAX_MESSAGE_BYTES
        first = outbox.popleft()
        messages = [first]
        size = framed_size(first)
        while outbox:
            size += framed_size(outbox[0])
            if size > limit:
                break
            messages.append(outbox.popleft())
        return pb.WorkerBatch(messages=messages)


def _describe(err: BaseException) -> str:
    """``TypeName: message`` for a report; just the type's name when the exception cannot be shown."""
    try:
        return f"{type(err).__name__}: {err}"
    except Exception:
        return type(err).__name__
