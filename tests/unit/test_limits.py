"""``[limits]`` enforcement that needs no server process: the hit counters, which validation errors name
and count which limit, the lease-size bound behind ``max_message_bytes``, and the request gates and
timeout of both transports (on an in-process aiohttp app and gRPC server)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from dataclasses import replace
from typing import Any

import grpc
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from cronoq.api.http_api import _middleware
from cronoq.api.limits import LimitsInterceptor, RequestLimits, grpc_receive_limit, limits_middleware
from cronoq.cluster.routing import check_batch
from cronoq.config.model import Limits
from cronoq.engine.model import RetryRule
from cronoq.errors import DeadlineExceeded, InvalidArgument, ResourceExhausted
from cronoq.limit_hits import COUNTED, NOT_COUNTED, LimitHits, exceeded
from cronoq.v1 import cronoq_pb2 as pb
from cronoq.v1 import cronoq_pb2_grpc as pbg
from shard.convert import SpecLimits, lease_size, spec_from_wire

LIMITS = SpecLimits(
    max_key_len=8,
    max_kind_len=8,
    max_tags=2,
    max_tag_len=8,
    max_deps=2,
    max_resources=1,
    max_message_bytes=4096,
)


def convert(msg: pb.TaskSpec, limits: SpecLimits = LIMITS) -> Any:
    return spec_from_wire(
        "task", msg, default_pool="default", pools={"default": RetryRule()}, limits=limits, now=0.0
    )


# ------------------------------------------------------------------------------------- counters


def test_every_limit_is_either_counted_or_said_not_to_be() -> None:
    names = {f for f in Limits.__dataclass_fields__}
    assert set(COUNTED) | NOT_COUNTED == names and not set(COUNTED) & NOT_COUNTED
    assert len(names) == 21


def test_counts_start_at_zero_and_render_as_one_counter_family() -> None:
    hits = LimitHits()
    hits.hit("max_list")
    hits.hit("max_list")
    [counter] = hits.families()
    assert (counter.name, counter.type) == ("cronoq_limit_hits", "counter")
    assert {s.name for s in counter.samples} == {"cronoq_limit_hits_total"}
    by_limit = {s.labels["limit"]: s.value for s in counter.samples}
    assert by_limit["max_list"] == 2 and by_limit["max_tasks_per_batch"] == 0
    assert "keepalive_timeout_s" not in by_limit and len(by_limit) == len(COUNTED)
    with pytest.raises(ValueError, match="not a counted limit"):
        hits.hit("keepalive_timeout_s")
    with pytest.raises(ValueError, match="not a counted limit"):
        exceeded("max_nothing", InvalidArgument("x"))


def test_counting_counts_marked_errors_only() -> None:
    hits = LimitHits()
    for error in (exceeded("max_deps", InvalidArgument("too many")), InvalidArgument("other")):
        with pytest.raises(InvalidArgument), hits.counting():
            raise error
    assert hits.counts()["max_deps"] == 1 and sum(hits.counts().values()) == 1


def test_refuse_counts_and_marks() -> None:
    hits = LimitHits()
    err = hits.refuse("max_wait_s", DeadlineExceeded("slow"))
    assert err.limit == "max_wait_s" and hits.counts()["max_wait_s"] == 1


# ------------------------------------------------------------------------------ spec validation


@pytest.mark.parametrize(
    ("msg", "limit", "field"),
    [
        (pb.TaskSpec(key="k" * 9), "max_key_len", "task.key"),
        (pb.TaskSpec(tenant="t" * 9), "max_key_len", "task.tenant"),
        (pb.TaskSpec(kind="k" * 9), "max_kind_len", "task.kind"),
        (pb.TaskSpec(tags={"a": "1", "b": "2", "c": "3"}), "max_tags", "task.tags"),
        (pb.TaskSpec(labels={"a": "1", "b": "2", "c": "3"}), "max_tags", "task.labels"),
        (pb.TaskSpec(tags={"k" * 9: "v"}), "max_tag_len", "task.tags key"),
        (pb.TaskSpec(tags={"k": "v" * 9}), "max_tag_len", "task.tags['k']"),
        (pb.TaskSpec(deps=[pb.Dep(target=pb.TaskRef(id=i)) for i in (1, 2, 3)]), "max_deps", "task.deps"),
        (pb.TaskSpec(deps=[pb.Dep(target=pb.TaskRef(key="k" * 9))]), "max_key_len", "task.deps[0].key"),
        (pb.TaskSpec(resources={"a": 1, "b": 1}), "max_resources", "task.resources"),
        (pb.TaskSpec(payload=b"x" * 4000), "max_message_bytes", "task.payload"),
    ],
)
def test_spec_refusals_name_their_field_and_limit(msg: pb.TaskSpec, limit: str, field: str) -> None:
    with pytest.raises(InvalidArgument) as err:
        convert(msg)
    assert err.value.limit == limit
    assert err.value.message.startswith(field) and f"limits.{limit}" in err.value.message


def test_bounds_that_are_not_limits_are_not_marked() -> None:
    with pytest.raises(InvalidArgument) as err:
        convert(pb.TaskSpec(content_type="x" * 129))
    assert err.value.limit is None


def test_batch_size_is_marked() -> None:
    with pytest.raises(InvalidArgument) as err:
        check_batch(pb.SubmitBatchRequest(tasks=[pb.TaskSpec()] * 4), 3)
    assert err.value.limit == "max_tasks_per_batch"
    assert err.value.message == "tasks: 4 tasks exceed limits.max_tasks_per_batch (3)"


@pytest.mark.parametrize(
    "msg",
    [
        pb.TaskSpec(),
        pb.TaskSpec(payload=b"p" * 1000, key="k" * 8, kind="kind", content_type="application/json"),
        pb.TaskSpec(payload=b"\xff" * 300, key="ключ", kind="вид", tags={"ä": "ö" * 8, "b": "c"}),
        pb.TaskSpec(
            pool="default", timeout_s=1e9, deadline_in_s=1e9, priority=pb.PRIORITY_CRITICAL, tags={"x": "y"}
        ),
    ],
)
def test_lease_size_bounds_the_lease_the_server_sends(msg: pb.TaskSpec) -> None:
    spec = convert(msg, replace(LIMITS, max_key_len=32))
    lease = pb.Lease(
        lease=2**64 - 1,
        task_id=2**64 - 1,
        attempt=2**32 - 1,
        payload=spec.payload,
        content_type=spec.content_type,
        kind=spec.kind,
        key=spec.key,
        tags=spec.tags,
        pool=spec.pool,
        priority=pb.PRIORITY_LOW,
        timeout_s=1e9,
        deadline_unix_ns=2**63 - 1,
        lease_ttl_s=1e9,
    )
    assert pb.ServerMessage(lease=lease).ByteSize() <= lease_size(spec)


def test_a_payload_that_fits_is_accepted() -> None:
    assert convert(pb.TaskSpec(payload=b"x" * 3000)).payload == b"x" * 3000


# ------------------------------------------------------------------------------- request gates


def request_limits(**kw: Any) -> RequestLimits:
    return RequestLimits(replace(Limits(), **kw), LimitHits())


def test_gates_refuse_one_more_and_free_their_place() -> None:
    limits = request_limits(max_concurrent_requests=1, max_concurrent_streams=1)
    with limits.request(), limits.stream():
        with pytest.raises(
            ResourceExhausted, match=r"^resource_exhausted: limits\.max_concurrent_requests: .* 1 requests"
        ):
            limits.acquire_request()
        with pytest.raises(ResourceExhausted, match=r"limits\.max_concurrent_streams: "):
            limits.acquire_stream()
    assert (limits.requests, limits.streams) == (0, 0)
    with limits.request():
        pass
    counts = limits.hits.counts()
    assert (counts["max_concurrent_requests"], counts["max_concurrent_streams"]) == (1, 1)
    families = {m.name: m for m in limits.families()}
    assert {name: m.samples[0].value for name, m in families.items() if m.type == "gauge"} == {
        "cronoq_requests_in_flight": 0,
        "cronoq_streams_open": 0,
    }
    assert families["cronoq_request_duration_seconds"].samples == []  # nothing went through the gates


def test_admitted_calls_are_timed_by_transport_and_method() -> None:
    limits = request_limits()
    for transport, method, seconds in (
        ("grpc", "Submit", 0.0007),
        ("grpc", "Submit", 0.2),
        ("http", "GET /v1/tasks/{id}", 3.0),
    ):
        limits.observe(transport, method, seconds)
    (histogram,) = [m for m in limits.families() if m.type == "histogram"]
    samples = {(s.name, s.labels.get("le"), s.labels["method"]): s.value for s in histogram.samples}
    assert samples[("cronoq_request_duration_seconds_bucket", "0.001", "Submit")] == 1
    assert samples[("cronoq_request_duration_seconds_bucket", "0.25", "Submit")] == 2
    assert samples[("cronoq_request_duration_seconds_count", None, "Submit")] == 2
    assert samples[("cronoq_request_duration_seconds_bucket", "2.5", "GET /v1/tasks/{id}")] == 0
    assert samples[("cronoq_request_duration_seconds_sum", None, "GET /v1/tasks/{id}")] == 3.0


async def test_deadline_cancels_the_call_and_counts() -> None:
    limits = request_limits(request_timeout_s=0.05, max_wait_s=100.0)
    never = asyncio.Event()
    with pytest.raises(
        DeadlineExceeded, match=r"^deadline_exceeded: limits\.request_timeout_s: .* within 0\.05 s$"
    ) as err:
        async with limits.deadline(waits=False):
            await never.wait()
    assert err.value.limit == "request_timeout_s" and limits.hits.counts()["request_timeout_s"] == 1
    assert limits.timeout_s(waits=True) == pytest.approx(100.05)


async def test_deadline_lets_other_timeouts_through() -> None:
    limits = request_limits(request_timeout_s=10.0)
    with pytest.raises(TimeoutError):
        async with limits.deadline(waits=False):
            await asyncio.wait_for(asyncio.Event().wait(), 0.01)
    assert limits.hits.counts()["request_timeout_s"] == 0


def test_grpc_receive_limit_leaves_room_to_refuse_by_name() -> None:
    assert grpc_receive_limit(4096) == 8192 and grpc_receive_limit(2**31 - 1) == 2**31 - 1


# ---------------------------------------------------------------------------------------- HTTP


@contextlib.asynccontextmanager
async def http_app(
    limits: RequestLimits, release: asyncio.Event, entered: asyncio.Event
) -> AsyncIterator[TestClient[Any, Any]]:
    """Routes that hold until ``release`` (setting ``entered`` once inside, past the gates), and quick
    ones."""

    async def held(request: web.Request) -> web.Response:
        entered.set()
        await release.wait()
        return web.json_response({})

    async def quick(request: web.Request) -> web.Response:
        return web.json_response({})

    app = web.Application(middlewares=[_middleware(False), limits_middleware(limits)])
    for path in ("/v1/tasks/{ref}/result", "/v1/watch", "/v1/snapshot"):
        app.router.add_get(path, held)
    app.router.add_get("/healthz", quick)
    app.router.add_get("/v1/workers", quick)
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        yield client


async def test_http_request_timeout_and_concurrency() -> None:
    limits = request_limits(max_concurrent_requests=1, request_timeout_s=0.05, max_wait_s=5.0)
    release, entered = asyncio.Event(), asyncio.Event()
    async with http_app(limits, release, entered) as client:
        resp = await client.get("/v1/snapshot")  # no wait allowance: 0.05 s
        assert resp.status == 504 and (await resp.json())["code"] == "deadline_exceeded"
        assert "limits.request_timeout_s" in (await resp.json())["error"]

        entered.clear()
        waiting = asyncio.ensure_future(client.get("/v1/tasks/1/result"))  # 5.05 s allowed
        await entered.wait()
        resp = await client.get("/v1/workers")
        assert resp.status == 429 and "limits.max_concurrent_requests" in (await resp.json())["error"]
        assert (await client.get("/healthz")).status == 200  # probes are not limited
        release.set()
        assert (await waiting).status == 200
    counts = limits.hits.counts()
    assert (counts["request_timeout_s"], counts["max_concurrent_requests"]) == (1, 1)


async def test_http_event_stream_takes_a_stream_place() -> None:
    limits = request_limits(max_concurrent_streams=1, request_timeout_s=0.05)
    release, entered = asyncio.Event(), asyncio.Event()
    async with http_app(limits, release, entered) as client:
        watching = asyncio.ensure_future(client.get("/v1/watch"))
        await entered.wait()
        resp = await client.get("/v1/watch")
        assert resp.status == 429 and "limits.max_concurrent_streams" in (await resp.json())["error"]
        release.set()
        assert (await watching).status == 200  # no request timeout on streams
    assert limits.hits.counts()["max_concurrent_streams"] == 1


# ---------------------------------------------------------------------------------------- gRPC


class _Tasks(pbg.TasksServicer):
    def __init__(self) -> None:
        self.release = asyncio.Event()

    async def Get(self, request: pb.GetRequest, context: Any) -> pb.TaskInfo:
        await self.release.wait()
        return pb.TaskInfo(id=request.task.id)

    async def Watch(self, request: pb.WatchRequest, context: Any) -> AsyncIterator[pb.StatusEvent]:
        yield pb.StatusEvent(id=1)
        await self.release.wait()


@contextlib.asynccontextmanager
async def grpc_server(limits: RequestLimits) -> AsyncIterator[tuple[Any, _Tasks]]:
    server = grpc.aio.server(
        options=[("grpc.max_receive_message_length", grpc_receive_limit(limits.max_message_bytes))],
        interceptors=[LimitsInterceptor(limits)],
    )
    # The generated base class answers the methods not written here UNIMPLEMENTED; its stub calls them abstract.
    tasks = _Tasks()  # type: ignore[abstract]
    pbg.add_TasksServicer_to_server(tasks, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        async with grpc.aio.insecure_channel(f"127.0.0.1:{port}") as channel:
            yield pbg.TasksStub(channel), tasks
    finally:
        tasks.release.set()
        await server.stop(None)


async def test_grpc_message_size_timeout_and_streams() -> None:
    limits = request_limits(max_message_bytes=4096, request_timeout_s=0.05, max_concurrent_streams=1)
    async with grpc_server(limits) as (stub, tasks):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Get(pb.GetRequest(task=pb.TaskRef(key="k" * 5000)))
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert err.value.details().startswith("limits.max_message_bytes: a message of 50")

        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Get(pb.GetRequest(task=pb.TaskRef(id=1)))
        assert err.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert "limits.request_timeout_s" in err.value.details()

        first = stub.Watch(pb.WatchRequest())
        assert (await first.read()).id == 1  # holds the only stream place, past the request timeout
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Watch(pb.WatchRequest()).read()
        assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "limits.max_concurrent_streams" in err.value.details()
        tasks.release.set()
        assert await first.read() == grpc.aio.EOF
    counts = limits.hits.counts()
    assert (counts["max_message_bytes"], counts["request_timeout_s"], counts["max_concurrent_streams"]) == (
        1,
        1,
        1,
    )
    assert (limits.requests, limits.streams) == (0, 0)


async def test_grpc_errors_raised_by_a_limit_keep_their_status() -> None:
    """ApiErrors the interceptor itself raises become the call's status (not UNKNOWN)."""
    limits = request_limits(max_concurrent_requests=1)
    limits.acquire_request()  # the only place is taken
    async with grpc_server(limits) as (stub, _):
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Get(pb.GetRequest(task=pb.TaskRef(id=1)))
    assert err.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "limits.max_concurrent_requests" in err.value.details()
