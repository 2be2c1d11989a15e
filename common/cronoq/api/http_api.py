"""The HTTP/JSON gateway (docs/http-api.md): aiohttp routes as thin adapters over :class:`~cronoq.api.handler.RequestHandler`.

Every API route does the same steps, written once in :func:`_authorized`: authenticate the
``authorization`` header for the route's role (before any body byte is read), refuse what the route does
not read (query parameters, a body: :meth:`_Gateway._admit`), translate the request into the wire message
(:mod:`cronoq.api.http_codec`), call the very ShardService or RouterService method the gRPC servicer calls, and render the answer
as JSON. An :class:`~cronoq.errors.ApiError` raised anywhere becomes ``{"error", "code"}`` with its HTTP
status in one middleware, which also turns aiohttp's own 404/405 into that shape and, when authentication
is off, refuses non-loopback ``Host`` headers (DNS rebinding).

``Expect: 100-continue`` is answered by the gateway, not by aiohttp (:func:`_defer_continue`): only a
request that passed every check that can be made without its body is invited to send it.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Awaitable, Callable, Iterator
from typing import TypeVar

from aiohttp import HttpVersion11, hdrs, web
from aiohttp.typedefs import Middleware

from cronoq.auth import Principal, Role
from cronoq.cluster.routing import Watch, serving
from cronoq.errors import (
    ApiError,
    Internal,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    Unauthenticated,
    Unavailable,
)
from cronoq.hosts import is_loopback_host_header
from cronoq.limit_hits import LimitHits
from cronoq.logs import get_logger
from cronoq.prometheus import Exposition
from cronoq.tracecontext import from_headers, incoming_trace
from cronoq.transport import FORWARDED_KEY, UNAVAILABLE_SHARDS_KEY
from cronoq.v1 import cronoq_pb2 as pb

from . import http_codec as codec
from .handler import RequestHandler
from .limits import RequestLimits, limits_middleware
from .openapi import OPENAPI

SSE_KEEPALIVE_S = 15.0
PROBES = frozenset({"/healthz", "/readyz"})
OPENAPI_JSON = codec.dump_json(OPENAPI)
log = get_logger("cronoq.http")

T = TypeVar("T")
Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
Endpoint = Callable[[Principal, web.Request], Awaitable[codec.JsonObject | web.StreamResponse]]


class BodyTooLarge(ApiError):
    """The request body exceeds ``limits.max_http_body_bytes``; refused before (or while) reading it."""

    code = "resource_exhausted"
    http_status = 413


class UnsupportedMediaType(ApiError):
    """A JSON body sent without ``content-type: application/json``.

    Insisting on it is what keeps a web page from posting tasks to a loopback server without auth: a
    browser sends ``text/plain`` cross-origin without asking, but needs a CORS preflight (which we never
    grant) for ``application/json``.
    """

    code = "invalid_argument"
    http_status = 415


class BodyNotAllowed(InvalidArgument):
    """A body sent to a route that reads none (a lookup, a cancel, a listing): refused unread rather than
    ignored, so that nothing a caller sends is silently dropped."""


class MethodNotAllowed(ApiError):
    """A known path asked with another method; gRPC has no such status, and ``unimplemented`` is the
    code gateways commonly pair with HTTP 405."""

    code = "unimplemented"
    http_status = 405


def error_body(err: ApiError) -> codec.JsonObject:
    return {"error": err.message, "code": err.code}


@contextlib.contextmanager
def _http_names() -> Iterator[None]:
    """Around a call into the shared request logic: its errors name fields by their wire names
    (``task.start_unix_ns``, ``pools``); they are renamed to the HTTP API's (:func:`codec.http_message`).
    Only there: the gateway's own messages already speak HTTP and may quote any name a caller sent.

    The error is renamed in place. That is safe for an error raised to other callers as well (a stream
    closed on shutdown): the renaming changes only messages that name a wire field, which are those of
    one request, and renaming twice changes nothing more."""
    try:
        yield
    except ApiError as err:
        err.message = codec.http_message(err.message)
        raise


async def _ask(call: Awaitable[T]) -> T:
    """The answer of a call into the shared request logic, its errors in HTTP names (:func:`_http_names`)."""
    with _http_names():
        return await call


def error_response(err: ApiError) -> web.Response:
    response = _json(error_body(err), err.http_status)
    for key, value in err.metadata:
        response.headers[key] = value
    if isinstance(err, Unavailable):
        # A standby (or a server shutting down) closes the connection so that the client's next request
        # goes through its load balancer again, to the leader.
        response.force_close()
    return response


def cert_dns_names(request: web.Request) -> list[str]:
    """The DNS names of the caller's client certificate. The TLS layer hands over a certificate only
    after verifying it against ``client_ca_path``, so these names can be trusted."""
    transport = request.transport
    cert = transport.get_extra_info("peercert") if transport is not None else None
    if not cert:
        return []
    return [value for kind, value in cert.get("subjectAltName", ()) if kind == "DNS"]


def _json(body: object, status: int = 200) -> web.Response:
    return web.Response(text=codec.dump_json(body), status=status, content_type=codec.JSON_TYPE)


async def _prometheus(exposition: Exposition, request: web.Request) -> web.Response:
    """The page in the format the request's ``Accept`` asks for."""
    body, content_type = await exposition.render(request.headers.get(hdrs.ACCEPT, ""))
    return web.Response(body=body, headers={hdrs.CONTENT_TYPE: content_type})


async def _defer_continue(request: web.Request) -> None:
    """The expect handler of every route, in place of aiohttp's, which answers ``100 Continue`` as soon
    as the route matches: that invites the body before authentication and before the size check. Here
    nothing is sent; :meth:`_Gateway._body` sends ``100 Continue`` once the request passed both, and every
    refusal before that (401, 403, 413, 415, 503, ...) is the final answer, given without the body.
    Expectations other than 100-continue are ignored, which RFC 9110 (10.1.1) allows."""


async def _send_continue(request: web.Request) -> None:
    """Invite the body a client holds back for ``Expect: 100-continue`` (HTTP/1.1 only, RFC 9110)."""
    if request.version == HttpVersion11 and request.headers.get(hdrs.EXPECT, "").lower() == "100-continue":
        await request.writer.write(b"HTTP/1.1 100 Continue\r\n\r\n")
        request.writer.output_size = 0  # the interim answer is not the response (as aiohttp's own does)


def _add_route(router: web.UrlDispatcher, method: str, path: str, handler: Handler) -> None:
    """Register ``handler``; a GET route also answers HEAD (load balancers probe with it), and no route
    answers ``100 Continue`` on its own (:func:`_defer_continue`)."""
    if method == hdrs.METH_GET:
        router.add_get(path, handler, expect_handler=_defer_continue)
    else:
        router.add_route(method, path, handler, expect_handler=_defer_continue)


def _middleware(loopback_only_guard: bool, require_client_cert: bool = False) -> Middleware:
    @web.middleware
    async def errors_and_host_guard(request: web.Request, handler: Handler) -> web.StreamResponse:
        try:
            if require_client_cert and request.path not in PROBES:
                transport = request.transport
                if transport is None or not transport.get_extra_info("peercert"):
                    raise Unauthenticated(
                        "a client certificate signed by the server's client CA is required (mTLS)"
                    )
            host = request.headers.get(hdrs.HOST)
            if loopback_only_guard and request.path not in PROBES and not is_loopback_host_header(host):
                raise PermissionDenied(
                    f"Host {host!r} is not a loopback name: without credentials configured this server "
                    "answers only requests addressed to localhost, 127.0.0.1 or [::1]"
                )
            response = await handler(request)
        except ApiError as err:
            response = error_response(err)
        except web.HTTPNotFound:
            response = error_response(NotFound(f"no route {request.method} {request.path}"))
        except web.HTTPMethodNotAllowed as exc:
            allowed = ", ".join(sorted(exc.allowed_methods))
            response = error_response(
                MethodNotAllowed(f"{request.method} is not allowed on {request.path}; use {allowed}")
            )
            response.headers[hdrs.ALLOW] = allowed
        except Exception:
            log.exception("http_internal_error", method=request.method, path=request.path)
            response = error_response(Internal("internal error; see the server log"))
        if request.can_read_body:
            # Answered without reading the body (refused, or sent to a route that reads none): it is
            # not drained, and a client holding it back for 100 Continue may never send it.
            response.force_close()
        return response

    return errors_and_host_guard


class _Gateway:
    """The endpoints of one application; each translates, calls the service and renders."""

    def __init__(
        self,
        service: RequestHandler,
        *,
        max_body_bytes: int | None,
        metrics: Exposition | None,
        sse_keepalive_s: float,
        limit_hits: LimitHits | None = None,
    ) -> None:
        self.service = service
        self.limit_hits = limit_hits
        self.max_body_bytes = max_body_bytes  # None: a listener without routes that read a body
        self.exposition = metrics
        self.sse_keepalive_s = sse_keepalive_s

    def _authorized(self, role: Role, endpoint: Endpoint) -> Handler:
        """The shared request path: authenticate first, then run the endpoint, render JSON answers."""

        async def handle(request: web.Request) -> web.StreamResponse:
            caller = self.service.authorize(
                request.headers.get(hdrs.AUTHORIZATION),
                role,
                FORWARDED_KEY in request.headers,
                cert_dns_names(request),
            )
            answer = await endpoint(caller, request)
            return answer if isinstance(answer, web.StreamResponse) else _json(answer)

        return handle

    def _strict(self, endpoint: Endpoint, *, query: bool = False, body: bool = False) -> Endpoint:
        """``endpoint``, which reads query parameters if ``query`` and a JSON body if ``body``, refusing
        first whatever else a request brings (:meth:`_admit`)."""

        async def admitted(caller: Principal, request: web.Request) -> codec.JsonObject | web.StreamResponse:
            self._admit(request, query=query, body=body)
            return await endpoint(caller, request)

        return admitted

    def _public(self, handler: Handler) -> Handler:
        """A route without credentials (the probes, the OpenAPI document, the metrics listener's
        ``/metrics``), which reads neither query parameters nor a body."""

        async def handle(request: web.Request) -> web.StreamResponse:
            self._admit(request, query=False, body=False)
            return await handler(request)

        return handle

    def _admit(self, request: web.Request, *, query: bool, body: bool) -> None:
        """Refuse, before the endpoint acts, the query parameters (400 naming the first) and the body
        (413 over the size limit, else 400) of a route that does not read them: a filter or an option it
        would ignore is a caller's mistake, and must not pass as applied."""
        if not query:
            codec.Query(request.query).finish()
        if not body and request.body_exists:
            self._check_length(request.content_length)
            raise BodyNotAllowed(f"request body: {request.method} {request.path} takes no body")

    def _check_length(self, size: int | None) -> None:
        """Refuse (413) a body of ``size`` bytes (None: not known yet) over ``limits.max_http_body_bytes``,
        counting the hit."""
        limit = self.max_body_bytes
        if size is None or limit is None or size <= limit:
            return
        err = BodyTooLarge(f"request body: larger than limits.max_http_body_bytes ({limit} bytes)")
        raise err if self.limit_hits is None else self.limit_hits.refuse("max_http_body_bytes", err)

    async def _body(self, request: web.Request) -> object:
        """The JSON body, refused with 413 from Content-Length alone, or as soon as a chunked body
        passes the limit, so an oversized body is never buffered. It must be UTF-8 (RFC 8259): another
        declared charset is a 415, other bytes a 400. A client waiting for ``100 Continue`` gets it here,
        once everything that can be checked without the body passed."""
        self._check_length(request.content_length)
        if codec.media_type(request.headers.get(hdrs.CONTENT_TYPE, "")) != codec.JSON_TYPE:
            raise UnsupportedMediaType("request body: send it as JSON with content-type: application/json")
        if (request.charset or "utf-8").lower() not in ("utf-8", "utf8"):
            raise UnsupportedMediaType(
                f"request body: JSON must be UTF-8, not {request.charset}; send content-type: "
                "application/json without a charset (or with charset=utf-8)"
            )
        await _send_continue(request)
        body = bytearray()
        async for chunk in request.content.iter_any():
            body += chunk
            self._check_length(len(body))
        try:
            return codec.parse_json(bytes(body))
        except codec.FieldError as err:
            raise InvalidArgument(str(err)) from None
        except ValueError as err:
            raise InvalidArgument(f"request body: invalid JSON: {err}") from None

    def _content_type(self, task_id: int) -> str:
        """The stored content type of a task's output (the wire TaskResult carries none)."""
        return self.service.output_type(task_id)

    # ------------------------------------------------------------------------------------ tasks

    async def submit(self, caller: Principal, request: web.Request) -> codec.JsonObject:
        req = codec.submit_request(await self._body(request))
        with incoming_trace(from_headers(request.headers)):
            answer = await _ask(self.service.submit(caller, req))
        return codec.submit_response(answer, self._content_type)

    async def submit_batch(self, caller: Principal, request: web.Request) -> codec.JsonObject:
        req = codec.submit_batch_request(await self._body(request))
        with incoming_trace(from_headers(request.headers)):
            return codec.submit_batch_response(await _ask(self.service.submit_batch(caller, req)))

    async def get(self, caller: Principal, request: web.Request) -> codec.JsonObject:
        req = pb.GetRequest(task=codec.task_ref(request.match_info["ref"]))
        pool = codec.named_pool(codec.Query(request.query), finish=True)
        return codec.task_info(await _ask(self.service.get(caller, req, pool)))

    async def cancel(self, caller: Principal, request: web.Request) -> codec.JsonObject:
        req = pb.CancelRequest(task=codec.task_ref(request.match_info["ref"]))
        pool = codec.named_pool(codec.Query(request.query), finish=True)
        return {"cancelled": (await _ask(self.service.cancel(caller, req, pool))).cancelled}

    async def result(self, caller: Principal, request: web.Request) -> codec.JsonObject:
        query = codec.Query(request.query)
        pool = codec.named_pool(query, finish=False)
        req = codec.wait_request(request.match_info["ref"], query)
        return codec.task_result(await _ask(self.service.wait(caller, req, pool)), self._content_type)

    async def list_tasks(self, caller: Principal, request: web.Request) -> codec.JsonObject:
        req = codec.list_request(codec.Query(request.query))
        return codec.list_response(await _ask(self.service.list_tasks(caller, req)))

    async def watch(self, caller: Principal, request: web.Request) -> web.StreamResponse:
        """Server-Sent Events: one ``data:`` line of StatusEvent JSON per event, a comment every
        ``sse_keepalive_s`` (keeps proxies from timing out and finds vanished clients), and
        ``event: error`` before closing when the stream fails (shutdown, consumer too slow). The response
        starts once the stream is subscribed on every shard it covers; its ``Cronoq-Unavailable-Shards``
        header names those that could not be reached, as gRPC's initial metadata does. HEAD gets the
        headers only: the request is judged and the stream opened as for GET, then closed."""
        req = codec.watch_request(codec.Query(request.query))
        with _http_names():
            reader = _EventReader(serving(self.service.watch(caller, req)))
        try:
            unavailable = await _ask(reader.open())
            response = web.StreamResponse(
                headers={
                    hdrs.CONTENT_TYPE: "text/event-stream",
                    hdrs.CACHE_CONTROL: "no-cache",
                    "X-Accel-Buffering": "no",
                    UNAVAILABLE_SHARDS_KEY: ",".join(unavailable),
                }
            )
            await response.prepare(request)
            if request.method == hdrs.METH_HEAD:
                return response
            with contextlib.suppress(ConnectionResetError):
                await response.write(b": watching\n\n")
                while True:
                    try:
                        event = await _ask(reader.next(self.sse_keepalive_s))
                    except StopAsyncIteration:
                        break
                    except ApiError as err:
                        error = codec.dump_json(error_body(err))
                        await response.write(f"event: error\ndata: {error}\n\n".encode())
                        break
                    if event is None:
                        await response.write(b": keepalive\n\n")
                    else:
                        await response.write(
                            f"data: {codec.dump_json(codec.status_event(event))}\n\n".encode()
                        )
            return response
        finally:
            await reader.close()

    # ------------------------------------------------------------------------------------ admin

    async def snapshot(self, caller: Principal, request: web.Request) -> codec.JsonObject:
        return codec.snapshot(await _ask(self.service.snapshot(caller)))

    async def workers(self, caller: Principal, request: web.Request) -> codec.JsonObject:
        return codec.workers(await _ask(self.service.list_workers(caller)))

    async def list_recurring(self, caller: Principal, request: web.Request) -> codec.JsonObject:
        return codec.recurring_list(await _ask(self.service.list_recurring(caller)))

    async def add_recurring(self, caller: Principal, request: web.Request) -> codec.JsonObject:
        req = codec.recurring_request(await self._body(request))
        await _ask(self.service.add_recurring(caller, req))
        return {"name": req.name}

    async def remove_recurring(self, caller: Principal, request: web.Request) -> codec.JsonObject:
        req = pb.RemoveRecurringRequest(name=request.match_info["name"])
        return {"removed": (await _ask(self.service.remove_recurring(caller, req))).removed}

    def metrics(self, exposition: Exposition) -> Endpoint:
        async def page(caller: Principal, request: web.Request) -> web.StreamResponse:
            if caller.pools is not None:  # the page covers every pool and process-wide counters
                raise PermissionDenied("/metrics covers every pool: it needs a credential without pools")
            return await _prometheus(exposition, request)

        return page

    # ----------------------------------------------------------------------------------- probes

    async def healthz(self, request: web.Request) -> web.StreamResponse:
        return _json({"status": "ok"})

    async def readyz(self, request: web.Request) -> web.StreamResponse:
        if not self.service.ready:
            raise Unavailable("not serving: shutting down or not the leader")
        return _json({"status": "ok"})

    async def openapi(self, request: web.Request) -> web.StreamResponse:
        return web.Response(text=OPENAPI_JSON, content_type=codec.JSON_TYPE)

    # ----------------------------------------------------------------------------------- routes

    def routes(self) -> list[tuple[str, str, Role, Endpoint]]:
        """Method, path, required role and endpoint of every authenticated route. The ``{ref}`` variants
        with a suffix come before the plain lookup, whose pattern would also match them."""
        strict = self._strict
        routes: list[tuple[str, str, Role, Endpoint]] = [
            ("POST", "/v1/tasks", Role.CLIENT, strict(self.submit, body=True)),
            ("POST", "/v1/tasks:batch", Role.CLIENT, strict(self.submit_batch, body=True)),
            ("GET", "/v1/tasks", Role.CLIENT, strict(self.list_tasks, query=True)),
            ("POST", "/v1/tasks/{ref}:cancel", Role.CLIENT, strict(self.cancel, query=True)),
            ("GET", "/v1/tasks/{ref}/result", Role.CLIENT, strict(self.result, query=True)),
            ("GET", "/v1/tasks/{ref}", Role.CLIENT, strict(self.get, query=True)),
            ("GET", "/v1/watch", Role.CLIENT, strict(self.watch, query=True)),
            ("GET", "/v1/snapshot", Role.METRICS, strict(self.snapshot)),
            ("GET", "/v1/workers", Role.METRICS, strict(self.workers)),
            ("GET", "/v1/recurring", Role.METRICS, strict(self.list_recurring)),
            ("POST", "/v1/recurring", Role.ADMIN, strict(self.add_recurring, body=True)),
            ("DELETE", "/v1/recurring/{name}", Role.ADMIN, strict(self.remove_recurring)),
        ]
        if self.exposition is not None:
            routes.append(("GET", "/metrics", Role.METRICS, strict(self.metrics(self.exposition))))
        return routes

    def add_routes(self, router: web.UrlDispatcher) -> None:
        for method, path, role, endpoint in self.routes():
            _add_route(router, method, path, self._authorized(role, endpoint))
        self.add_probe_routes(router)
        _add_route(router, "GET", "/v1/openapi.json", self._public(self.openapi))

    def add_probe_routes(self, router: web.UrlDispatcher) -> None:
        _add_route(router, "GET", "/healthz", self._public(self.healthz))
        _add_route(router, "GET", "/readyz", self._public(self.readyz))

    def add_open_metrics_route(self, router: web.UrlDispatcher, exposition: Exposition) -> None:
        """``/metrics`` without credentials (the metrics listener)."""

        async def open_metrics(request: web.Request) -> web.StreamResponse:
            return await _prometheus(exposition, request)

        _add_route(router, "GET", "/metrics", self._public(open_metrics))


class _EventReader:
    """Reads a Watch one event ahead in a task, so the SSE loop can wait with a timeout (for
    keepalives) and can always close the stream, which is what unsubscribes it."""

    def __init__(self, watch: Watch) -> None:
        self._watch = watch
        self._pending: asyncio.Future[pb.StatusEvent] | None = None

    async def open(self) -> tuple[str, ...]:
        """Open the stream, raising the request's own errors (unknown or forbidden pool) before any byte
        of the response; the shards that could not be reached."""
        await self._watch.open()
        self._pending = asyncio.ensure_future(anext(self._watch))
        return self._watch.unavailable_shards

    async def next(self, within_s: float) -> pb.StatusEvent | None:
        """The next event, or None when ``within_s`` passed first; the stream's end or error is raised."""
        assert self._pending is not None
        done, _ = await asyncio.wait({self._pending}, timeout=within_s)
        if not done:
            return None
        finished, self._pending = self._pending, asyncio.ensure_future(anext(self._watch))
        return finished.result()

    async def close(self) -> None:
        pending = self._pending
        if pending is not None and not pending.done():
            pending.cancel()
            await asyncio.wait({pending})
        elif pending is not None and not pending.cancelled():
            pending.exception()  # consumed; keeps asyncio from logging "exception never retrieved"
        await self._watch.aclose()


def build_http_app(
    service: RequestHandler,
    *,
    max_body_bytes: int,
    loopback_only_guard: bool,
    metrics: Exposition | None = None,
    sse_keepalive_s: float = SSE_KEEPALIVE_S,
    require_client_cert: bool = False,
    limits: RequestLimits | None = None,
) -> web.Application:
    """The HTTP/JSON application of a shard server or a router.

    ``loopback_only_guard`` (set when no credential is configured) refuses requests whose ``Host`` is not
    a loopback name, except the probes. ``metrics`` serves ``/metrics`` (text format 0.0.4, or OpenMetrics
    when asked for; the route is absent without it). ``require_client_cert`` (mTLS) refuses every route but the probes to a caller
    without a verified client certificate. ``limits`` (shared with the process's gRPC server) bounds
    concurrent requests and streams and each request's time, and counts limit hits.
    """
    gateway = _Gateway(
        service,
        max_body_bytes=max_body_bytes,
        metrics=metrics,
        sse_keepalive_s=sse_keepalive_s,
        limit_hits=limits.hits if limits is not None else None,
    )
    middlewares = [_middleware(loopback_only_guard, require_client_cert)]
    if limits is not None:
        middlewares.append(limits_middleware(limits))
    app = web.Application(middlewares=middlewares)
    gateway.add_routes(app.router)
    return app


def build_metrics_app(service: RequestHandler, metrics: Exposition) -> web.Application:
    """The ``server.metrics_addr`` listener: ``/metrics`` without credentials, for a Prometheus on an
    internal network, plus the probes. Nothing else is served there, so binding it internally exposes
    counters and nothing that changes state."""
    gateway = _Gateway(service, max_body_bytes=None, metrics=metrics, sse_keepalive_s=SSE_KEEPALIVE_S)
    app = web.Application(middlewares=[_middleware(False)])
    gateway.add_open_metrics_route(app.router, metrics)
    gateway.add_probe_routes(app.router)
    return app


__all__ = ["build_http_app", "build_metrics_app"]
