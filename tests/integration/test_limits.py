"""Each ``[limits]`` entry hit once against a real server, over gRPC and over HTTP where both apply.

Every hit must be refused (or cut) with the right status and a message naming the limit, change nothing
(no task added), and be counted in ``cronoq_limit_hits_total{limit=...}`` on ``/metrics``. Where a test
needs a call to be in flight it polls the ``cronoq_requests_in_flight`` / ``cronoq_streams_open`` gauges
rather than sleeping.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from typing import Any

import aiohttp
import grpc
import pytest

from cronoq import Permanent
from cronoq.client import Client, Lease, task
from cronoq.v1 import cronoq_pb2 as pb
from cronoq.v1 import cronoq_pb2_grpc as pbg

from .helpers import eager_worker_refusals, worker
from .serverproc import ServerProcess, running_server
from .shardproc import (
    ShardSpec,
    cluster_tables,
    routed_cluster,
    router_process,
    running_cluster,
    server_or_router,
)

pytestmark = pytest.mark.asyncio

SMALL = """
[limits]
max_tasks_per_batch = 3
max_message_bytes = 8192
max_http_body_bytes = 16384
max_key_len = 8
max_kind_len = 8
max_tags = 2
max_tag_len = 8
max_deps = 2
max_resources = 1
max_wait_s = 0.3
request_timeout_s = 1
max_slots_per_worker = 2
max_list = 5

[[pools]]
name = "default"
max = 16

[[pools]]
name = "strict"
max_pending = 1
overflow = "reject"

[[pools]]
name = "parked"
max_pending = 1
"""

TOTAL = """
[limits]
max_pending_total = 2

[[pools]]
name = "default"

[[pools]]
name = "other"
"""

CONCURRENCY = """
[limits]
max_concurrent_requests = 1
max_concurrent_streams = 2
max_wait_s = 30
"""

# ----------------------------------------------------------------------------------------- helpers


def scrape(server: ServerProcess) -> dict[str, float]:
    """Every sample of ``/metrics`` by its full name (labels included)."""
    with urllib.request.urlopen(f"{server.http}/metrics", timeout=5) as r:
        text = r.read().decode()
    samples: dict[str, float] = {}
    for line in text.splitlines():
        if line and not line.startswith("#"):
            name, value = line.rsplit(" ", 1)
            samples[name] = float(value)
    return samples


class Watched:
    """The limit-hit counters and the submitted-task count of a server, before and after a block."""

    def __init__(self, server: ServerProcess) -> None:
        self.server = server
        self.before = scrape(server)

    def hits(self, limit: str) -> float:
        key = f'cronoq_limit_hits_total{{limit="{limit}"}}'
        return scrape(self.server)[key] - self.before[key]

    def submitted(self) -> float:
        return scrape(self.server)["cronoq_submitted_total"] - self.before["cronoq_submitted_total"]


async def poll(server: ServerProcess, gauge: str, value: float, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while (got := (await asyncio.to_thread(scrape, server)).get(gauge)) != value:
        assert time.monotonic() < deadline, f"{gauge} is {got}, not {value}"
        await asyncio.sleep(0.02)


@contextlib.asynccontextmanager
async def grpc_stubs(server: ServerProcess) -> AsyncIterator[tuple[Any, Any, Any]]:
    """Tasks, Workers and Admin stubs on one channel."""
    async with grpc.aio.insecure_channel(server.target) as channel:
        yield pbg.TasksStub(channel), pbg.WorkersStub(channel), pbg.AdminStub(channel)


async def grpc_refused(call: Any) -> grpc.aio.AioRpcError:
    with pytest.raises(grpc.aio.AioRpcError) as err:
        await call
    return err.value


async def http_json(
    session: aiohttp.ClientSession, method: str, path: str, **kw: Any
) -> tuple[int, dict[str, Any]]:
    async with session.request(method, path, **kw) as resp:
        return resp.status, await resp.json()


@pytest.fixture(scope="module")
def small(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with running_server(tmp_path_factory.mktemp("small"), SMALL) as server:
        yield server


@pytest.fixture
async def http(small: ServerProcess) -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession(base_url=small.http) as session:
        yield session


# ----------------------------------------------------------------------------- per-request sizes

# (limit, the offending gRPC TaskSpec fields, the same as HTTP JSON)
SPEC_LIMITS = [
    ("max_key_len", {"key": "k" * 9}, {"key": "k" * 9}),
    ("max_kind_len", {"kind": "k" * 9}, {"kind": "k" * 9}),
    ("max_tags", {"tags": {"a": "1", "b": "2", "c": "3"}}, {"tags": {"a": "1", "b": "2", "c": "3"}}),
    ("max_tag_len", {"tags": {"a": "v" * 9}}, {"tags": {"a": "v" * 9}}),
    (
        "max_deps",
        {"deps": [pb.Dep(target=pb.TaskRef(key=k)) for k in "abc"]},
        {"deps": [{"key": k} for k in "abc"]},
    ),
    ("max_resources", {"resources": {"a": 1, "b": 1}}, {"resources": {"a": 1, "b": 1}}),
]


@pytest.mark.parametrize(("limit", "wire", "json"), SPEC_LIMITS, ids=[s[0] for s in SPEC_LIMITS])
async def test_task_spec_limits(
    small: ServerProcess,
    http: aiohttp.ClientSession,
    limit: str,
    wire: dict[str, Any],
    json: dict[str, Any],
) -> None:
    watched = Watched(small)
    async with grpc_stubs(small) as (tasks, _, _):
        err = await grpc_refused(tasks.Submit(pb.SubmitRequest(task=pb.TaskSpec(**wire))))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and f"limits.{limit}" in err.details()
    status, body = await http_json(http, "POST", "/v1/tasks", json={"payload": 1, **json})
    assert (status, body["code"]) == (400, "invalid_argument") and f"limits.{limit}" in body["error"]
    assert body["error"].startswith("task.")  # and the field it refused
    assert watched.hits(limit) == 2 and watched.submitted() == 0


async def test_batch_size(small: ServerProcess, http: aiohttp.ClientSession) -> None:
    watched = Watched(small)
    async with grpc_stubs(small) as (tasks, _, _):
        err = await grpc_refused(tasks.SubmitBatch(pb.SubmitBatchRequest(tasks=[pb.TaskSpec()] * 4)))
    assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "4 tasks exceed limits.max_tasks_per_batch (3)" in err.details()
    status, body = await http_json(
        http, "POST", "/v1/tasks:batch", json={"tasks": [{"payload": i} for i in range(4)]}
    )
    assert status == 400 and "limits.max_tasks_per_batch" in body["error"]
    assert watched.hits("max_tasks_per_batch") == 2 and watched.submitted() == 0


async def test_message_size(small: ServerProcess, http: aiohttp.ClientSession) -> None:
    """gRPC: a request message above the limit is refused by name. HTTP bodies may be larger than gRPC
    messages, but a task whose lease could not be sent to a worker is refused at submission."""
    watched = Watched(small)
    async with grpc_stubs(small) as (tasks, _, _):
        err = await grpc_refused(tasks.Submit(pb.SubmitRequest(task=pb.TaskSpec(payload=b"x" * 10_000))))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "limits.max_message_bytes" in err.details() and "8192" in err.details()
    payload = base64.b64encode(b"x" * 9_000).decode()  # 12 kB of JSON: under the body limit
    status, body = await http_json(http, "POST", "/v1/tasks", json={"payload_base64": payload})
    assert status == 400 and body["error"].startswith("task.payload: 9000 bytes")
    assert "limits.max_message_bytes" in body["error"]
    assert watched.hits("max_message_bytes") == 2 and watched.submitted() == 0


async def test_worker_message_size(small: ServerProcess) -> None:
    """A worker message above the limit ends its stream with the limit's name."""
    watched = Watched(small)
    async with grpc_stubs(small) as (_, workers, _):
        call = workers.Work()
        await call.write(pb.WorkerMessage(register=pb.Register(pool="default", slots=1)))
        assert (await call.read()).HasField("registered")
        await call.write(pb.WorkerMessage(complete=pb.Complete(lease=1, output=b"x" * 10_000)))
        err = await grpc_refused(call.read())
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "limits.max_message_bytes" in err.details()
    assert watched.hits("max_message_bytes") == 1


async def test_http_body_size(small: ServerProcess, http: aiohttp.ClientSession) -> None:
    watched = Watched(small)
    status, body = await http_json(http, "POST", "/v1/tasks", json={"payload": "x" * 20_000})
    assert (status, body["code"]) == (413, "resource_exhausted")
    assert "limits.max_http_body_bytes (16384 bytes)" in body["error"]
    assert watched.hits("max_http_body_bytes") == 1 and watched.submitted() == 0


async def test_worker_labels_and_slots(small: ServerProcess) -> None:
    """Registration: labels are bounded like tags (refused); slots above max_slots_per_worker are cut."""
    watched = Watched(small)
    async with grpc_stubs(small) as (_, workers, _):
        call = workers.Work()
        await call.write(
            pb.WorkerMessage(register=pb.Register(pool="default", slots=1, labels={"a": "v" * 9}))
        )
        err = await grpc_refused(call.read())
        assert err.code() == grpc.StatusCode.INVALID_ARGUMENT and "limits.max_tag_len" in err.details()

        call = workers.Work()
        await call.write(pb.WorkerMessage(register=pb.Register(pool="default", slots=10)))
        registered = (await call.read()).registered
        assert registered.slots == 2  # the pool allows 16; limits.max_slots_per_worker 2
        await call.write(pb.WorkerMessage(set_slots=pb.SetSlots(slots=5)))
        await call.done_writing()
        assert await call.read() == grpc.aio.EOF
    assert watched.hits("max_tag_len") == 1 and watched.hits("max_slots_per_worker") == 2


# ------------------------------------------------------------------------------- pending bounds


async def fill(tasks: Any, pool: str) -> None:
    """Fill a pool of max_pending 1 (no other test uses it): this one task must be accepted, so that
    the refusal that follows is the bound at exactly max_pending."""
    await tasks.Submit(pb.SubmitRequest(task=pb.TaskSpec(pool=pool)))


async def test_pool_bound_with_reject(small: ServerProcess, http: aiohttp.ClientSession) -> None:
    async with grpc_stubs(small) as (tasks, _, _):
        await fill(tasks, "strict")
        watched = Watched(small)
        err = await grpc_refused(tasks.Submit(pb.SubmitRequest(task=pb.TaskSpec(pool="strict"))))
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
    assert "pool 'strict'" in err.details() and "limits.max_pending_per_pool" in err.details()
    status, body = await http_json(http, "POST", "/v1/tasks", json={"pool": "strict", "payload": 1})
    assert (status, body["code"]) == (429, "resource_exhausted") and "max_pending_per_pool" in body["error"]
    assert watched.hits("max_pending_per_pool") == 2 and watched.submitted() == 0


async def test_pool_bound_with_wait_gives_up_within_the_request_timeout(
    small: ServerProcess, http: aiohttp.ClientSession
) -> None:
    """``overflow = wait``: parked until a little before request_timeout_s (1 s), then refused."""
    async with grpc_stubs(small) as (tasks, _, _):
        await fill(tasks, "parked")
        watched = Watched(small)
        started = time.monotonic()
        err = await grpc_refused(tasks.Submit(pb.SubmitRequest(task=pb.TaskSpec(pool="parked"))))
        took = time.monotonic() - started
    assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED and "stayed full" in err.details()
    assert "limits.max_pending_per_pool" in err.details() and "limits.request_timeout_s" in err.details()
    assert 0.8 <= took < 3
    status, body = await http_json(http, "POST", "/v1/tasks", json={"pool": "parked", "payload": 1})
    assert status == 429 and "stayed full" in body["error"]
    assert watched.hits("max_pending_per_pool") == 2 and watched.submitted() == 0
    assert watched.hits("request_timeout_s") == 0  # answered as "pool full", not as a timeout


async def test_pending_total(tmp_path: Any) -> None:
    with running_server(tmp_path, TOTAL) as server:
        async with (
            grpc_stubs(server) as (tasks, _, _),
            aiohttp.ClientSession(base_url=server.http) as session,
        ):
            await tasks.Submit(pb.SubmitRequest(task=pb.TaskSpec(pool="default")))
            await tasks.Submit(pb.SubmitRequest(task=pb.TaskSpec(pool="other")))
            watched = Watched(server)
            err = await grpc_refused(tasks.Submit(pb.SubmitRequest(task=pb.TaskSpec(pool="other"))))
            assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            assert "limits.max_pending_total" in err.details()
            status, body = await http_json(session, "POST", "/v1/tasks", json={"payload": 1})
            assert status == 429 and "limits.max_pending_total" in body["error"]
            assert watched.hits("max_pending_total") == 2 and watched.submitted() == 0


# ------------------------------------------------------------------------------------------- caps


async def test_wait_is_cut_to_max_wait(small: ServerProcess, http: aiohttp.ClientSession) -> None:
    """A longer wait than max_wait_s (0.3 s) is cut to it, answered DEADLINE_EXCEEDED naming it."""
    async with grpc_stubs(small) as (tasks, _, _):
        task_id = (await tasks.Submit(pb.SubmitRequest(task=pb.TaskSpec()))).id
        watched = Watched(small)
        started = time.monotonic()
        err = await grpc_refused(tasks.Wait(pb.WaitRequest(task=pb.TaskRef(id=task_id), timeout_s=60)))
        assert time.monotonic() - started < 5
        assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED and "limits.max_wait_s" in err.details()
        err = await grpc_refused(
            tasks.Submit(pb.SubmitRequest(task=pb.TaskSpec(), wait=True, wait_timeout_s=60))
        )
        assert err.code() == grpc.StatusCode.DEADLINE_EXCEEDED and "limits.max_wait_s" in err.details()
    status, body = await http_json(http, "GET", f"/v1/tasks/{task_id}/result", params={"timeout_s": "60"})
    assert (status, body["code"]) == (504, "deadline_exceeded") and "limits.max_wait_s" in body["error"]
    assert watched.hits("max_wait_s") == 3
    # A wait within the limit is not a hit.
    async with grpc_stubs(small) as (tasks, _, _):
        await grpc_refused(tasks.Wait(pb.WaitRequest(task=pb.TaskRef(id=task_id), timeout_s=0.1)))
    assert watched.hits("max_wait_s") == 3


async def test_list_page_is_cut_to_max_list(small: ServerProcess, http: aiohttp.ClientSession) -> None:
    async with grpc_stubs(small) as (tasks, _, _):
        await tasks.SubmitBatch(pb.SubmitBatchRequest(tasks=[pb.TaskSpec(kind="listed")] * 3))
        await tasks.SubmitBatch(pb.SubmitBatchRequest(tasks=[pb.TaskSpec(kind="listed")] * 3))
        watched = Watched(small)
        page = await tasks.ListTasks(pb.ListTasksRequest(limit=50))
        assert len(page.tasks) == 5 and page.next_after
        assert len((await tasks.ListTasks(pb.ListTasksRequest(limit=5))).tasks) == 5  # not a hit
    status, body = await http_json(http, "GET", "/v1/tasks", params={"limit": "50"})
    assert status == 200 and len(body["tasks"]) == 5 and body["next_after"]
    assert watched.hits("max_list") == 2


LONG_MESSAGES = "[limits]\nmax_message_bytes = 65536\n"
LONG_MESSAGE_SHARDS = [
    ShardSpec("a", 1, ("default",), pool_options="retry = { max_attempts = 1 }"),
    ShardSpec("b", 2, ("other",), pool_options="retry = { max_attempts = 1 }"),
]


@pytest.mark.parametrize("kind", ["server", "router"])
async def test_a_page_of_long_messages_is_cut_to_what_one_answer_carries(tmp_path: Any, kind: str) -> None:
    """A ListTasks page of ``max_list`` tasks whose failure messages are long can be far larger than
    ``max_message_bytes``, which grpc refuses to send: the caller got RESOURCE_EXHAUSTED for every
    such page and could never list past it. The page stops at what fits and the cursor goes on."""
    config = LONG_MESSAGES + "".join(
        f'\n[[pools]]\nname = "{p}"\n{spec.pool_options}\n'
        for spec in LONG_MESSAGE_SHARDS
        for p in spec.pools
    )

    async def handler(lease: Lease) -> None:
        raise Permanent("é" * 8000)  # 16,000 bytes of UTF-8: five make a page too large

    with server_or_router(kind, tmp_path, config, LONG_MESSAGE_SHARDS, LONG_MESSAGES) as target:
        async with (
            worker(target.target, handler, "default", slots=4),
            worker(target.target, handler, "other", slots=4),
            Client(target.target) as client,
        ):
            ids = []
            for pool in ("default", "other"):
                ids += [s.id for s in await client.submit_batch([task(b"x", pool=pool) for _ in range(6)])]
            for task_id in ids:
                assert (await client.wait(task_id, timeout=10)).status == "failed"
        listed: list[int] = []
        after = 0
        async with grpc_stubs(target) as (tasks, _, _):
            for _ in range(len(ids)):
                page = await tasks.ListTasks(pb.ListTasksRequest(after=after, limit=1000))
                assert 1 <= len(page.tasks) <= 4 and page.ByteSize() <= 65536
                listed += [t.id for t in page.tasks]
                after = page.next_after
                if not after:
                    break
        assert listed == sorted(ids)
        async with aiohttp.ClientSession(base_url=target.http) as session:
            status, body = await http_json(session, "GET", "/v1/tasks", params={"limit": "1000"})
        assert status == 200 and [int(t["id"]) for t in body["tasks"]] == sorted(ids)[: len(body["tasks"])]
        assert len(body["tasks"]) <= 4 and body["next_after"]


async def test_an_answer_over_grpcs_default_size_is_forwarded_whole(tmp_path: Any) -> None:
    """With ``max_message_bytes`` above grpc's default of 4 MiB, an output that large reaches a caller
    of the router, and of a shard that forwards to another: the forwarding channel took grpc's default
    and refused the shard's answer (RESOURCE_EXHAUSTED "Received message larger than max")."""
    limits = "[limits]\nmax_message_bytes = 8388608\n"
    output = b"o" * 5_000_000

    async def handler(lease: Lease) -> bytes:
        return output

    with routed_cluster(tmp_path, LONG_MESSAGE_SHARDS, limits) as (router, shards):
        async with worker(router.target, handler, "other"):
            for via in (router, shards["a"]):  # pool "other" is shard b's
                async with Client(via.target) as client:
                    done = await client.submit(output, pool="other", wait=True, wait_timeout=20)
                    assert done.result is not None and done.result.output == output
                    assert (await client.wait(done.id, timeout=5)).output == output


# ----------------------------------------------------------------------------------- concurrency


@pytest.fixture(scope="module")
def busy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with running_server(tmp_path_factory.mktemp("busy"), CONCURRENCY) as server:
        yield server


async def test_concurrent_requests(busy: ServerProcess) -> None:
    """max_concurrent_requests = 1: a Wait in flight holds the only place; any other call, over either
    transport, is refused until it ends. Probes and /metrics stay open."""
    async with grpc_stubs(busy) as (tasks, _, _), aiohttp.ClientSession(base_url=busy.http) as session:
        task_id = (await tasks.Submit(pb.SubmitRequest(task=pb.TaskSpec()))).id
        await poll(busy, "cronoq_requests_in_flight", 0)
        watched = Watched(busy)
        waiting = tasks.Wait(pb.WaitRequest(task=pb.TaskRef(id=task_id)))
        await poll(busy, "cronoq_requests_in_flight", 1)

        err = await grpc_refused(tasks.Get(pb.GetRequest(task=pb.TaskRef(id=task_id))))
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "limits.max_concurrent_requests" in err.details()
        status, body = await http_json(session, "GET", f"/v1/tasks/{task_id}")
        assert (status, body["code"]) == (429, "resource_exhausted")
        assert "limits.max_concurrent_requests" in body["error"]
        assert busy.probe("/healthz") == 200 and busy.probe("/readyz") == 200

        waiting.cancel()
        await poll(busy, "cronoq_requests_in_flight", 0)
        assert (await tasks.Get(pb.GetRequest(task=pb.TaskRef(id=task_id)))).id == task_id
        assert watched.hits("max_concurrent_requests") == 2


async def take_every_stream(busy: ServerProcess, workers: Any) -> list[Any]:
    """Open the two Work streams ``busy`` allows (max_concurrent_streams = 2), both registered."""
    open_streams = []
    for _ in range(2):
        call = workers.Work()
        await call.write(pb.WorkerMessage(register=pb.Register(pool="default", slots=1)))
        assert (await call.read()).HasField("registered")
        open_streams.append(call)
    await poll(busy, "cronoq_streams_open", 2)
    return open_streams


async def test_concurrent_streams(busy: ServerProcess) -> None:
    """max_concurrent_streams = 2: two Work streams open, a third stream of any kind (Work, Watch, the
    HTTP event stream) is refused until one closes."""
    async with (
        grpc_stubs(busy) as (tasks, workers, admin),
        aiohttp.ClientSession(base_url=busy.http) as session,
    ):
        watched = Watched(busy)
        open_streams = await take_every_stream(busy, workers)

        third = workers.Work()
        with contextlib.suppress(grpc.aio.AioRpcError):  # refused as it opens, maybe before this write
            await third.write(pb.WorkerMessage(register=pb.Register(pool="default", slots=1)))
        assert await third.code() == grpc.StatusCode.RESOURCE_EXHAUSTED, await third.details()
        assert "limits.max_concurrent_streams" in await third.details()
        err = await grpc_refused(tasks.Watch(pb.WatchRequest()).read())
        assert err.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        status, body = await http_json(session, "GET", "/v1/watch")
        assert status == 429 and "limits.max_concurrent_streams" in body["error"]
        assert watched.hits("max_concurrent_streams") == 3
        assert len((await admin.ListWorkers(pb.Empty())).workers) == 2  # unary calls are not streams

        open_streams.pop().cancel()
        await poll(busy, "cronoq_streams_open", 1)
        async with session.get("/v1/watch") as stream:
            assert stream.status == 200
        for call in open_streams:
            call.cancel()
        await poll(busy, "cronoq_streams_open", 0)


async def test_a_worker_refused_for_streams_gets_the_reason_even_when_it_registers_at_once(
    busy: ServerProcess,
) -> None:
    """A worker writes its Register as soon as its stream opens. When the server refused the stream
    at once, the grpc.aio client sometimes reported its own INTERNAL "Internal error from Core" for the
    write in flight instead of the server's status; the server now takes the first message before
    refusing, so every worker learns why."""
    async with grpc_stubs(busy) as (_, workers, _):
        open_streams = await take_every_stream(busy, workers)
        answers = await eager_worker_refusals(workers, "default")
        assert {code for code, _ in answers} == {grpc.StatusCode.RESOURCE_EXHAUSTED}, answers
        assert all("limits.max_concurrent_streams" in details for _, details in answers)
        for call in open_streams:
            call.cancel()
        await poll(busy, "cronoq_streams_open", 0)


# ---------------------------------------------------------------------------------------- router


async def test_the_router_counts_what_it_enforces_and_the_shard_the_rest(tmp_path: Any) -> None:
    """Batch size and list pages are the router's to enforce (and count); a task spec is checked, and
    counted, by the shard the router forwards it to."""
    spec = ShardSpec("a", 1, ("default",))
    limits = "[limits]\nmax_tasks_per_batch = 2\nmax_list = 3\nmax_key_len = 8\n"
    with running_cluster(tmp_path, [spec], extra={"a": limits}) as procs:
        shard = procs["a"]
        router = router_process(
            tmp_path / "router", limits + cluster_tables([spec], {"a": f"http://{shard.target}"})
        )
        router.start()
        try:
            at_router, at_shard = Watched(router), Watched(shard)
            async with (
                grpc_stubs(router) as (tasks, _, _),
                aiohttp.ClientSession(base_url=router.http) as session,
            ):
                err = await grpc_refused(tasks.SubmitBatch(pb.SubmitBatchRequest(tasks=[pb.TaskSpec()] * 3)))
                assert err.code() == grpc.StatusCode.INVALID_ARGUMENT
                assert "limits.max_tasks_per_batch" in err.details()
                status, body = await http_json(session, "POST", "/v1/tasks:batch", json={"tasks": [{}] * 3})
                assert status == 400 and "limits.max_tasks_per_batch" in body["error"]

                err = await grpc_refused(tasks.Submit(pb.SubmitRequest(task=pb.TaskSpec(key="k" * 9))))
                assert (
                    err.code() == grpc.StatusCode.INVALID_ARGUMENT and "limits.max_key_len" in err.details()
                )

                await tasks.SubmitBatch(pb.SubmitBatchRequest(tasks=[pb.TaskSpec()] * 2))
                await tasks.SubmitBatch(pb.SubmitBatchRequest(tasks=[pb.TaskSpec()] * 2))
                assert len((await tasks.ListTasks(pb.ListTasksRequest(limit=50))).tasks) == 3
            assert at_router.hits("max_tasks_per_batch") == 2 and at_shard.hits("max_tasks_per_batch") == 0
            assert at_router.hits("max_key_len") == 0 and at_shard.hits("max_key_len") == 1
            assert at_router.hits("max_list") == 1 and at_shard.hits("max_list") == 0
            assert at_shard.submitted() == 4
        finally:
            router.stop()
