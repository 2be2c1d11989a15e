"""The server-wide ``[limits]`` both transports enforce around the request logic.

One :class:`RequestLimits` per process is shared by its gRPC server (:class:`LimitsInterceptor`) and its
HTTP application (:func:`limits_middleware`), so that a call counts the same whichever way it arrives:

- ``max_concurrent_requests``: calls in progress at once (every Tasks and Admin call, every HTTP
  request but ``/healthz``, ``/readyz``, ``/metrics`` and ``/v1/openapi.json``); one more is refused
  with RESOURCE_EXHAUSTED (HTTP 429). A Submit that waits, or a Wait, holds its place while it waits.
- ``max_concurrent_streams``: long-lived streams open at once (``Workers.Work``, ``Tasks.Watch`` and the
  HTTP ``/v1/watch`` event stream); one more is refused the same way. Workers reconnect with backoff.
- ``request_timeout_s``: how long a call may take, plus ``max_wait_s`` for the calls that wait (Submit,
  Wait); past it the call ends with DEADLINE_EXCEEDED (HTTP 504). Streams have no timeout.
- ``max_message_bytes`` (gRPC): a request message larger than the limit is refused with
  RESOURCE_EXHAUSTED naming the limit. The gRPC core itself cuts off messages above twice the limit
  (:func:`grpc_receive_limit`) before any of this code sees them, with its own message.

Every refusal is counted in the process's :class:`~cronoq.limit_hits.LimitHits`. gRPC's health and reflection
services are not limited.
"""

from __future__ import annotations

import asyncio
import inspect
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import asynccontextmanager, contextmanager
from time import perf_counter
from typing import Any

import grpc
from aiohttp import web
from aiohttp.typedefs import Middleware
from google.protobuf.message import Message
from prometheus_client.metrics_core import Metric

from cronoq.config.model import Limits
from cronoq.errors import ApiError, DeadlineExceeded, ResourceExhausted
from cronoq.histogram import Histogram, histogram_family, labelled_histograms, observe
from cronoq.limit_hits import LimitHits
from cronoq.prometheus import family
from cronoq.transport import grpc_status, take_first_message

GRPC_PREFIX = "/cronoq.v1."
UNLIMITED_PATHS = frozenset({"/healthz", "/readyz", "/metrics", "/v1/openapi.json"})
WATCH_PATH = "/v1/watch"
GRPC_MAX_MESSAGE = 2**31 - 1

Ctx = Any  # grpc.aio.ServicerContext
Handler = Callable[[web.Request], Any]


def grpc_receive_limit(max_message_bytes: int) -> int:
    """The gRPC core's own receive limit: twice ours, so that messages up to that size reach
    :class:`LimitsInterceptor` and are refused by name (and counted)."""
    return min(GRPC_MAX_MESSAGE, 2 * max_message_bytes)


def grpc_server_options(limits: Limits, streams_per_connection: int) -> list[tuple[str, Any]]:
    """The gRPC core options every cronoq listener (shard or router) takes from ``[limits]``: message
    sizes and HTTP/2 keepalive; and the streams one connection may have open
    (``server.grpc_max_streams_per_connection``).

    grpc core (1.85) closes a connection whose ping goes unanswered after ``grpc.http2.ping_timeout_ms``
    (60 s by default), not after ``keepalive_timeout_ms`` alone, so both are ``keepalive_timeout_s``.
    Values are floored at 1 ms: 0 would mean "off" or "default" to the core.

    ``grpc.max_concurrent_streams`` (``streams_per_connection``) is what bounds an HTTP/2
    rapid reset (HEADERS then RST_STREAM, over and over, on one connection): by default grpc core
    advertises no limit and hands every such stream to the application, which spends about 25 µs of
    CPU on each (200,000 cost 5 s here). With a limit, its overload protection counts a reset stream
    until the application has let go of it and refuses new streams beyond the limit in the transport
    (RST_STREAM REFUSED_STREAM), at a small fraction of that cost. That takes a limit below what the
    application drains while a burst arrives: with 1,000 or 2,000, 96 to 98 % of 200,000 pairs were
    refused (0.5 s of CPU); with 4,000 or 11,000, none. grpc core has no way to close a connection for
    resetting too much; tests/integration/test_rapid_reset.py measures what is left.
    """
    return [
        ("grpc.max_receive_message_length", grpc_receive_limit(limits.max_message_bytes)),
        ("grpc.max_send_message_length", limits.max_message_bytes),
        ("grpc.keepalive_time_ms", max(1, int(limits.keepalive_interval_s * 1000))),
        ("grpc.keepalive_timeout_ms", max(1, int(limits.keepalive_timeout_s * 1000))),
        ("grpc.http2.ping_timeout_ms", max(1, int(limits.keepalive_timeout_s * 1000))),
        ("grpc.keepalive_permit_without_calls", 1),
        ("grpc.http2.min_ping_interval_without_data_ms", 5000),
        ("grpc.so_reuseport", 0),
        ("grpc.max_concurrent_streams", streams_per_connection),
    ]


class RequestLimits:
    """Server-wide gates and the request timeout, shared by the gRPC and HTTP transports."""

    def __init__(self, limits: Limits, hits: LimitHits) -> None:
        self.hits = hits
        self.max_requests = limits.max_concurrent_requests
        self.max_streams = limits.max_concurrent_streams
        self.request_timeout_s = limits.request_timeout_s
        self.max_wait_s = limits.max_wait_s
        self.max_message_bytes = limits.max_message_bytes
        self.requests = 0  # calls in progress (streams excluded)
        self.streams = 0  # streams open
        # Latency of the calls that passed the gates, by (transport, method): cronoq_request_duration_seconds.
        self.latency: dict[tuple[str, str], Histogram] = {}

    def observe(self, transport: str, method: str, seconds: float) -> None:
        """A call (a unary gRPC method, an HTTP route) that was admitted took ``seconds``, answered or not."""
        observe(self.latency, (transport, method), seconds)

    def acquire_request(self) -> None:
        if self.requests >= self.max_requests:
            raise self.hits.refuse(
                "max_concurrent_requests",
                ResourceExhausted(
                    f"limits.max_concurrent_requests: this server is already handling {self.requests} "
                    "requests; retry shortly"
                ),
            )
        self.requests += 1

    def release_request(self) -> None:
        self.requests -= 1

    def acquire_stream(self) -> None:
        if self.streams >= self.max_streams:
            raise self.hits.refuse(
                "max_concurrent_streams",
                ResourceExhausted(
                    f"limits.max_concurrent_streams: {self.streams} streams (Work, Watch) are already open "
                    "on this server; retry shortly"
                ),
            )
        self.streams += 1

    def release_stream(self) -> None:
        self.streams -= 1

    @contextmanager
    def request(self) -> Iterator[None]:
        self.acquire_request()
        try:
            yield
        finally:
            self.release_request()

    @contextmanager
    def stream(self) -> Iterator[None]:
        self.acquire_stream()
        try:
            yield
        finally:
            self.release_stream()

    def timeout_s(self, waits: bool) -> float:
        return self.request_timeout_s + (self.max_wait_s if waits else 0.0)

    @asynccontextmanager
    async def deadline(self, waits: bool) -> AsyncIterator[None]:
        """Bound the block by ``request_timeout_s`` (plus ``max_wait_s`` when the call waits); past it
        the block is cancelled and DEADLINE_EXCEEDED raised."""
        scope = asyncio.timeout(self.timeout_s(waits))
        try:
            async with scope:
                yield
        except TimeoutError:
            if not scope.expired():
                raise
            also = f" plus limits.max_wait_s ({self.max_wait_s:g} s) for a call that waits" if waits else ""
            raise self.hits.refuse(
                "request_timeout_s",
                DeadlineExceeded(
                    f"limits.request_timeout_s: the call did not finish within "
                    f"{self.request_timeout_s:g} s{also}"
                ),
            ) from None

    def families(self) -> Iterator[Metric]:
        """Gauges of what the gates hold now, and the latency of the calls they let through."""
        yield histogram_family(
            "cronoq_request_duration_seconds",
            "Time from admission to answer of unary gRPC calls and HTTP requests (probes and /metrics "
            "excepted), by transport and method (gRPC method name, or HTTP method and route).",
            ("transport", "method"),
            labelled_histograms(self.latency, ("transport", "method")),
        )
        yield family(
            "cronoq_requests_in_flight",
            "gauge",
            "Calls in progress (bounded by limits.max_concurrent_requests).",
            [({}, float(self.requests))],
        )
        yield family(
            "cronoq_streams_open",
            "gauge",
            "Work and Watch streams open (bounded by limits.max_concurrent_streams).",
            [({}, float(self.streams))],
        )

    def oversized(self, size: int) -> ResourceExhausted:
        return self.hits.refuse(
            "max_message_bytes",
            ResourceExhausted(
                f"limits.max_message_bytes: a message of {size} bytes is larger than "
                f"{self.max_message_bytes} bytes"
            ),
        )


# --------------------------------------------------------------------------------------------- gRPC


class _Oversized:
    """What the checking deserializer hands over instead of a message larger than the limit."""

    __slots__ = ("size",)

    def __init__(self, size: int) -> None:
        self.size = size


class _Context:
    """A servicer context whose ``read`` refuses an oversized message; everything else is delegated."""

    def __init__(self, context: Ctx, limits: RequestLimits) -> None:
        self._context = context
        self._limits = limits

    def __getattr__(self, name: str) -> Any:
        value = getattr(self._context, name)
        setattr(self, name, value)  # found directly next time: ``write`` runs once per lease
        return value

    async def read(self) -> Any:
        message = await self._context.read()
        if isinstance(message, _Oversized):
            raise self._limits.oversized(message.size)
        return message


async def _checked(
    requests: AsyncIterator[Message | _Oversized], limits: RequestLimits
) -> AsyncIterator[Message]:
    async for message in requests:
        if isinstance(message, _Oversized):
            raise limits.oversized(message.size)
        yield message


def _waits(method: str, request: Message) -> bool:
    """Whether a unary call waits for a task (so may take up to ``max_wait_s`` more)."""
    return method.endswith("/Wait") or (method.endswith("/Submit") and bool(getattr(request, "wait", False)))


async def _abort(context: Ctx, err: ApiError) -> None:
    await context.abort(grpc_status(err), err.message, err.metadata)


async def _refuse(context: Ctx, err: ApiError, reads: bool) -> None:
    """End a streaming call refused as it opens; ``reads``: the client streams into it, so its first
    message is taken first (see ``take_first_message``)."""
    if reads:
        await take_first_message(context)
    await _abort(context, err)


class LimitsInterceptor(grpc.aio.ServerInterceptor):  # type: ignore[misc]
    """Wraps every ``cronoq.v1`` method: size check of each request message, the concurrency gates,
    the request timeout of unary calls; oversized responses (which the gRPC core refuses to send) are
    counted too."""

    def __init__(self, limits: RequestLimits) -> None:
        self.limits = limits
        # gRPC asks for every call's handler; a method's is the same each time, so it is wrapped once.
        self._wrapped: dict[str, tuple[Any, Any]] = {}  # method -> (its handler, the wrapped one)

    async def intercept_service(self, continuation: Callable[[Any], Any], details: Any) -> Any:
        handler = await continuation(details)
        method = details.method
        if handler is None or not method.startswith(GRPC_PREFIX):
            return handler
        cached = self._wrapped.get(method)
        if cached is None or cached[0] is not handler:
            cached = self._wrapped[method] = (handler, self._wrap(handler, method))
        return cached[1]

    def _deserializer(self, inner: Callable[[bytes], Any] | None) -> Callable[[bytes], Any]:
        limit = self.limits.max_message_bytes

        def deserialize(raw: bytes) -> Any:
            if len(raw) > limit:
                return _Oversized(len(raw))
            return inner(raw) if inner is not None else raw

        return deserialize

    def _serializer(self, inner: Callable[[Any], bytes] | None) -> Callable[[Any], bytes]:
        limits = self.limits

        def serialize(message: Any) -> bytes:
            data: bytes = inner(message) if inner is not None else message
            if len(data) > limits.max_message_bytes:
                limits.hits.hit("max_message_bytes")  # the gRPC core refuses to send it
            return data

        return serialize

    def _wrap(self, handler: Any, method: str) -> Any:
        limits = self.limits
        kw = {
            "request_deserializer": self._deserializer(handler.request_deserializer),
            "response_serializer": self._serializer(handler.response_serializer),
        }
        if not handler.request_streaming and not handler.response_streaming:
            return grpc.unary_unary_rpc_method_handler(self._unary(handler.unary_unary, method), **kw)
        if not handler.request_streaming:
            inner_us = handler.unary_stream

            def open_us(request: Any, context: Ctx) -> Any:
                if isinstance(request, _Oversized):
                    raise limits.oversized(request.size)
                return inner_us(request, context)

            return grpc.unary_stream_rpc_method_handler(self._streaming(inner_us, open_us, False), **kw)
        if handler.response_streaming:
            inner_ss = handler.stream_stream

            def open_ss(requests: Any, context: Ctx) -> Any:
                return inner_ss(_checked(requests, limits), _Context(context, limits))

            return grpc.stream_stream_rpc_method_handler(self._streaming(inner_ss, open_ss, True), **kw)
        return handler  # client-streaming unary calls: cronoq.v1 has none

    def _streaming(
        self, inner: Any, open_call: Callable[[Any, Ctx], Any], reads: bool
    ) -> Callable[[Any, Ctx], Any]:
        """A streaming behaviour of the same form as ``inner`` (an async generator, or a coroutine that
        writes to the context) run holding a stream slot; a refusal (no slot, an oversized request) ends
        the call with its status. ``reads``: the client streams its requests (see ``_refuse``)."""
        limits = self.limits
        if inspect.isasyncgenfunction(inner):

            async def generator(request: Any, context: Ctx) -> AsyncIterator[Any]:
                try:
                    limits.acquire_stream()
                except ApiError as err:
                    await _refuse(context, err, reads)
                    return
                try:
                    async for item in open_call(request, context):
                        yield item
                except ApiError as err:
                    await _abort(context, err)
                finally:
                    limits.release_stream()

            return generator

        async def coroutine(request: Any, context: Ctx) -> None:
            try:
                limits.acquire_stream()
            except ApiError as err:
                await _refuse(context, err, reads)
                return
            try:
                await open_call(request, context)
            except ApiError as err:
                await _abort(context, err)
            finally:
                limits.release_stream()

        return coroutine

    def _unary(self, inner: Callable[[Any, Ctx], Any], method: str) -> Callable[[Any, Ctx], Any]:
        limits = self.limits
        name = method.rpartition("/")[2]  # "Submit" of /cronoq.v1.Tasks/Submit

        async def unary_unary(request: Any, context: Ctx) -> Any:
            try:
                if isinstance(request, _Oversized):
                    raise limits.oversized(request.size)
                limits.acquire_request()
            except ApiError as err:
                await _abort(context, err)
                return None  # unreachable: abort raises
            started = perf_counter()
            try:
                async with limits.deadline(_waits(method, request)):
                    return await inner(request, context)
            except ApiError as err:
                await _abort(context, err)
                return None
            finally:
                limits.release_request()
                limits.observe("grpc", name, perf_counter() - started)

        return unary_unary


# --------------------------------------------------------------------------------------------- HTTP


def _http_waits(request: web.Request) -> bool:
    """Submit (which may wait) and the result route take up to ``max_wait_s`` more."""
    path = request.path
    return (request.method == "POST" and path == "/v1/tasks") or (
        path.startswith("/v1/tasks/") and path.endswith("/result")
    )


def _route(request: web.Request) -> str:
    """The route a request matched, as a label: ``GET /v1/tasks/{ref}`` (never the path itself, whose ids
    and keys would make a series each), or ``unmatched``."""
    resource = request.match_info.route.resource
    return f"{request.method} {resource.canonical}" if resource is not None else "unmatched"


def limits_middleware(limits: RequestLimits) -> Middleware:
    """The gates and the request timeout for an aiohttp application (inside the middleware that renders
    ApiErrors). The probes and ``/metrics`` are not limited, so a saturated server can still be watched."""

    @web.middleware
    async def limited(request: web.Request, handler: Handler) -> web.StreamResponse:
        path = request.path
        if path in UNLIMITED_PATHS:
            response: web.StreamResponse = await handler(request)
            return response
        if path == WATCH_PATH:
            with limits.stream():
                response = await handler(request)
                return response
        with limits.request():
            started = perf_counter()
            try:
                async with limits.deadline(_http_waits(request)):
                    response = await handler(request)
                    return response
            finally:
                limits.observe("http", _route(request), perf_counter() - started)

    return limited


__all__ = ["LimitsInterceptor", "RequestLimits", "grpc_receive_limit", "limits_middleware"]
