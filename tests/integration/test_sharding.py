"""Sharding (docs/operations.md) against real ``cronoq-server`` processes, one per shard, on loopback.

Shard ``a`` (number 1) owns pools ``a1`` and ``a2``, shard ``b`` (number 2) owns ``b1``. Any server
answers for every shard: task calls for the other shard are forwarded over gRPC with the caller's own
credential and a ``cronoq-forwarded`` marker; workers are redirected instead; list and admin views fan
out and name the shards that did not answer. Each test asks one server about the other shard's tasks
and then checks with the owning server that the work really happened there, not on the server asked.
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import re
import signal
import socket
import sys
import time
from collections.abc import AsyncIterator, Awaitable, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest

from cronoq.client import Client, Lease, task
from cronoq.errors import (
    FailedPrecondition,
    InvalidArgument,
    NotFound,
    PermissionDenied,
    Unauthenticated,
    Unavailable,
)
from cronoq.v1 import cronoq_pb2 as pb
from cronoq.v1 import cronoq_pb2_grpc as pbg
from tests.ports import free_ports

from .helpers import (
    Metrics,
    eager_worker_refusals,
    scrape_metrics,
    sqlite_store,
    token,
    watch_while,
    worker,
)
from .serverproc import ServerProcess, write_config
from .shardproc import ShardSpec, cluster_tables, new_cluster, routed_cluster, router_process, running_cluster

pytestmark = pytest.mark.asyncio

SHARDS = (ShardSpec("a", 1, ("a1", "a2")), ShardSpec("b", 2, ("b1",)))
SHARD_SHIFT = 56  # task ids carry the shard number in their top 8 bits
FORWARDED = (("cronoq-forwarded", "1"),)
# A refusal to forward must come before any connection attempt, which to an unroutable peer would
# hang until the call's deadline.
PROMPT_S = 3.0

ADMIN = "admin-token-0123456789abcdef"
ONLY_A1 = "only-a1-token-0123456789abcdef"
WIDER_ON_A = "wider-on-a-token-0123456789abcdef"  # a allows it b1; b does not
UNKNOWN_TO_B = "unknown-to-b-token-0123456789abcdef"


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[dict[str, ServerProcess]]:
    with running_cluster(tmp_path, SHARDS) as procs:
        yield procs


@pytest.fixture
async def channel_a(cluster: dict[str, ServerProcess]) -> AsyncIterator[Any]:
    """A raw gRPC channel to shard a, for what the SDK hides: metadata sent and trailers received."""
    async with grpc.aio.insecure_channel(cluster["a"].target) as channel:
        yield channel


def shard_number(task_id: int) -> int:
    return task_id >> SHARD_SHIFT


def endpoint(proc: ServerProcess) -> str:
    """The ``[[shards]]`` endpoint that shardproc writes for the shard ``proc`` serves."""
    return f"http://{proc.target}"


async def rpc_error(call: Awaitable[object], timeout: float = 10.0) -> Any:
    """The ``AioRpcError`` a raw call ends with (fails if it succeeds)."""
    with pytest.raises(grpc.aio.AioRpcError) as failed:
        await asyncio.wait_for(call, timeout)
    return failed.value


def trailers(err: Any) -> dict[str, str]:
    return {key: value for key, value in err.trailing_metadata() or () if isinstance(value, str)}


def assert_redirect(err: Any, shard: str, url: str) -> None:
    """FAILED_PRECONDITION naming the owning shard and its endpoint, as workers and routers expect."""
    assert err.code() == grpc.StatusCode.FAILED_PRECONDITION, (err.code(), err.details())
    meta = trailers(err)
    assert (meta.get("cronoq-shard"), meta.get("cronoq-shard-endpoint")) == (shard, url), meta


def non_loopback_address() -> str | None:
    """An address of this machine that is not loopback (a UDP connect sends nothing), if it has one."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("10.255.255.1", 9))
        except OSError:
            return None
        host = str(probe.getsockname()[0])
    return None if ipaddress.ip_address(host).is_loopback else host


@contextlib.asynccontextmanager
async def peer_trap() -> AsyncIterator[tuple[str, list[str]]]:
    """A plain-http "other host" endpoint and the connections it receives.

    When this machine has a non-loopback address, the endpoint is a listener of ours on it, so a
    connection attempt is seen rather than inferred from timing; otherwise it is an unroutable
    address, and only promptness shows that nothing was attempted."""
    connections: list[str] = []
    host = non_loopback_address()
    if host is None:
        yield "http://10.255.255.1:7070", connections
        return

    async def accepted(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        connections.append(str(writer.get_extra_info("peername")))
        writer.close()

    server = await asyncio.start_server(accepted, host, 0)
    try:
        yield f"http://{host}:{server.sockets[0].getsockname()[1]}", connections
    finally:
        server.close()
        await server.wait_closed()


async def echo(lease: Lease) -> str:
    """Says which pool ran the task, so a result proves where the worker served."""
    return f"{lease.pool}:{lease.text()}"


async def json_echo(lease: Lease) -> dict[str, Any]:
    """As :func:`echo`, with a JSON output (content type application/json)."""
    return {"pool": lease.pool, "payload": lease.json()}


async def register_raw(channel: Any, pool: str) -> Any:
    """Opens a Work stream registering for ``pool`` and returns how it ended (it must fail)."""

    async def messages() -> AsyncIterator[pb.WorkerMessage]:
        yield pb.WorkerMessage(
            register=pb.Register(pool=pool, slots=1, worker_name="raw", protocol_version=3)
        )
        await asyncio.Event().wait()  # keep the stream open: the server must be the one to end it

    call = pbg.WorkersStub(channel).Work(messages())

    async def drain() -> None:
        async for message in call:
            raise AssertionError(f"registration for {pool!r} was answered: {message}")

    return await rpc_error(drain())


# ------------------------------------------------------------------------------------------ routing


async def test_task_calls_for_the_other_shard_are_forwarded_to_it(cluster: dict[str, ServerProcess]) -> None:
    """Submit, SubmitBatch, Get, Cancel and Wait, by id and by key, all work through the server that
    does not own the pool, and the owning shard is the one that holds the task (its id carries the
    owner's number and the owner answers for it directly)."""
    a, b = cluster["a"], cluster["b"]
    async with Client(a.target) as via_a, Client(b.target) as via_b:
        local = await via_a.submit(b"x", pool="a1", key="on-a")
        remote = await via_a.submit(b"y", pool="b1", key="on-b")
        other = await via_b.submit(b"z", pool="a2", key="on-a-via-b")
        assert [shard_number(s.id) for s in (local, remote, other)] == [1, 2, 1]

        owned = await via_b.get(remote.id)  # b holds what a accepted for b1
        assert (owned.pool, owned.key, owned.status) == ("b1", "on-b", "ready")
        assert (await via_a.get(other.id)).pool == "a2"
        assert (await via_a.get(remote.id)).id == remote.id  # by id: routed by the top 8 bits
        assert (await via_a.get("on-b")).id == remote.id  # by key: every shard is asked
        assert (await via_b.get("on-a")).id == local.id
        again = await via_a.submit(b"y", pool="b1", key="on-b")  # b's key index, reached via a
        assert (again.id, again.duplicate) == (remote.id, True)
        with pytest.raises(NotFound):
            await via_a.get("on-no-shard")
        with pytest.raises(NotFound):
            await via_a.get((7 << SHARD_SHIFT) | 1)  # no shard has number 7

        batch = await via_a.submit_batch(
            [task(b"1", pool="b1", key="batch-1"), task(b"2", pool="b1", key="batch-2")]
        )
        assert [shard_number(s.id) for s in batch] == [2, 2]
        assert [(await via_b.get(s.id)).key for s in batch] == ["batch-1", "batch-2"]

        assert await via_a.cancel(batch[1].id)  # by id, owned by b
        assert await via_b.cancel("on-a")  # by key, owned by a
        assert (await via_b.get(batch[1].id)).status == "cancelled"
        assert (await via_a.get(local.id)).status == "cancelled"

        async with worker(b.target, echo, pool="b1"):  # serves b's pool at b itself
            done = await via_a.submit(b"hi", pool="b1", wait=True, wait_timeout=10)
            assert done.result is not None and done.result.text() == "b1:hi"
            assert (await via_a.wait(remote.id, timeout=10)).text() == "b1:y"
            assert (await via_a.wait("batch-1", timeout=10)).text() == "b1:1"


async def test_a_call_forwarded_through_a_server_that_shuts_down_is_still_answered(
    cluster: dict[str, ServerProcess],
) -> None:
    """A server that shuts down lets the calls it forwarded finish while its listeners drain: it closes
    its channels to the other shards last (closing them first cut such a call short and held the
    listener's drain for all of its 5 s)."""
    a, b = cluster["a"], cluster["b"]
    async with Client(b.target) as via_b, Client(a.target) as via_a:
        remote = await via_b.submit(b"y", pool="b1")
        waiting = asyncio.ensure_future(via_a.wait(remote.id, timeout=30))
        async with asyncio.timeout(10):  # the Wait is on its way, and waits at b
            while b.metric("cronoq_requests_in_flight") != 1:  # noqa: ASYNC110 - another process
                await asyncio.sleep(0.02)
        a.signal(signal.SIGTERM)
        await asyncio.to_thread(a.wait_probe, "/readyz", 503)  # a stopped admitting, and drains
        async with worker(b.target, echo, pool="b1"):
            assert (await asyncio.wait_for(waiting, 10)).text() == "b1:y"
    assert a.wait(20) == 0


async def test_a_server_counts_the_calls_it_forwards(cluster: dict[str, ServerProcess]) -> None:
    """``cronoq_shard_forwarded_total`` on the forwarding server: by target shard, method and outcome."""
    a, b = cluster["a"], cluster["b"]

    def forwarded(m: Metrics, method: str, outcome: str) -> float:
        return m.get("cronoq_shard_forwarded_total", shard="b", method=method, outcome=outcome)

    before, owner_before = await scrape_metrics(a), await scrape_metrics(b)
    async with Client(a.target) as via_a:
        remote = await via_a.submit(b"y", pool="b1")
        await via_a.get(remote.id)
        with pytest.raises(NotFound):
            await via_a.get((2 << SHARD_SHIFT) | 0xFFFFFF)  # b's number, an id b never issued
    after = await scrape_metrics(a)
    assert forwarded(after, "Submit", "ok") - forwarded(before, "Submit", "ok") == 1
    assert forwarded(after, "Get", "ok") - forwarded(before, "Get", "ok") == 1
    assert forwarded(after, "Get", "not_found") - forwarded(before, "Get", "not_found") == 1
    # The owner ran the forwarded Submit itself: its own engine counted one more submission.
    submitted = "cronoq_submitted_total"
    assert (await scrape_metrics(b)).get(submitted) - owner_before.get(submitted) == 1


async def test_a_batch_spanning_shards_is_refused_naming_the_field(
    cluster: dict[str, ServerProcess],
) -> None:
    """A batch is atomic, and one shard cannot commit for another, so a batch whose tasks belong to
    two shards is refused as a whole, naming the task that does not fit; pools of one shard mix."""
    a, b = cluster["a"], cluster["b"]
    async with Client(a.target) as via_a, Client(b.target) as via_b:
        for client, batch in (
            (via_a, [task(b"0", pool="a1", key="span-0"), task(b"1", pool="b1", key="span-1")]),
            (via_b, [task(b"0", pool="b1", key="span-0"), task(b"1", pool="a2", key="span-1")]),
        ):
            with pytest.raises(InvalidArgument) as refused:
                await client.submit_batch(batch)
            assert "tasks[1].pool" in refused.value.message, refused.value.message
        with pytest.raises(InvalidArgument) as refused:
            await via_a.submit_batch([task(b"0", pool="b1", key="span-0"), task(b"1", pool="a1")])
        assert re.search(r"tasks\[[01]\]\.pool", refused.value.message), refused.value.message
        for client in (via_a, via_b):
            for key in ("span-0", "span-1"):
                with pytest.raises(NotFound):
                    await client.get(key)  # nothing of a refused batch was kept anywhere

        mixed = await via_b.submit_batch([task(b"0", pool="a1"), task(b"1", pool="a2")])
        assert [shard_number(s.id) for s in mixed] == [1, 1]


async def test_a_forwarded_call_is_refused_with_the_owner_instead_of_forwarded_again(
    cluster: dict[str, ServerProcess], channel_a: Any
) -> None:
    """A call carrying the forwarded marker is answered where it arrived or refused with the owning
    shard's name and endpoint, never forwarded a second time: with a stale or inconsistent shard map
    two servers would otherwise bounce a call between them forever."""
    b = cluster["b"]
    async with Client(b.target) as via_b:
        on_b = await via_b.submit(b"x", pool="b1", key="owned-by-b")
    tasks = pbg.TasksStub(channel_a)
    ref = pb.TaskRef(id=on_b.id)
    for call in (
        tasks.Submit(pb.SubmitRequest(task=task(b"x", pool="b1")), metadata=FORWARDED),
        tasks.SubmitBatch(pb.SubmitBatchRequest(tasks=[task(b"x", pool="b1")]), metadata=FORWARDED),
        tasks.Get(pb.GetRequest(task=ref), metadata=FORWARDED),
        tasks.Cancel(pb.CancelRequest(task=ref), metadata=FORWARDED),
        tasks.Wait(pb.WaitRequest(task=ref, timeout_s=1), metadata=FORWARDED),
    ):
        assert_redirect(await rpc_error(call), "b", endpoint(b))

    # What belongs here is served: the marker only stops further forwarding.
    accepted = await tasks.Submit(pb.SubmitRequest(task=task(b"x", pool="a1")), metadata=FORWARDED)
    assert shard_number(accepted.id) == 1
    async with Client(b.target) as via_b:
        assert (await via_b.get(on_b.id)).status == "ready"  # the refused Cancel did not reach b


@pytest.mark.parametrize("authenticated", [False, True], ids=["no-auth", "token"])
async def test_forwarding_over_plain_http_to_another_host_is_refused_promptly(
    tmp_path: Path, authenticated: bool
) -> None:
    """Plain http to another host would carry the caller's token (and payloads) in the clear to a
    peer that cannot prove who it is, so unless ``server.insecure_peer_http`` allows it the call
    fails at once with the owner's endpoint (the caller can go there itself) instead of connecting.
    docs/operations.md (Sharding) makes no exception for a cluster without authentication, hence both variants."""
    extra = {"a": token(ADMIN, "admin")} if authenticated else None
    metadata = (("authorization", f"Bearer {ADMIN}"),) if authenticated else ()
    async with peer_trap() as (remote, connections):
        with running_cluster(
            tmp_path, SHARDS, extra=extra, endpoints={"a": {"b": remote}}, start=["a"]
        ) as procs:
            await refused_without_connecting(procs["a"], remote, metadata, authenticated)
        assert connections == [], "the server connected to the peer it must not forward to"


async def refused_without_connecting(
    a: ServerProcess, remote: str, metadata: tuple[tuple[str, str], ...], authenticated: bool
) -> None:
    """Shard a, which sees shard b at ``remote``, refuses gRPC and HTTP calls for b promptly."""
    async with grpc.aio.insecure_channel(a.target) as channel:
        tasks = pbg.TasksStub(channel)
        for call in (
            tasks.Submit(pb.SubmitRequest(task=task(b"x", pool="b1")), metadata=metadata, timeout=10),
            tasks.Get(
                pb.GetRequest(task=pb.TaskRef(id=(2 << SHARD_SHIFT) | 1)), metadata=metadata, timeout=10
            ),
        ):
            began = time.monotonic()
            err = await rpc_error(call)
            assert time.monotonic() - began < PROMPT_S, "the server tried to reach the peer"
            assert_redirect(err, "b", remote)
    async with Client(a.target, token=ADMIN if authenticated else None) as via_a:
        with pytest.raises(FailedPrecondition):
            await via_a.submit(b"x", pool="b1", call_timeout=10)
        assert shard_number((await via_a.submit(b"x", pool="a1")).id) == 1
    async with (
        aiohttp.ClientSession(base_url=a.http, headers=dict(metadata)) as http,
        http.post("/v1/tasks", json={"pool": "b1", "payload": 1}) as resp,
    ):
        assert resp.status == 409, await resp.text()
        assert (await resp.json())["code"] == "failed_precondition"
        assert (resp.headers["cronoq-shard"], resp.headers["cronoq-shard-endpoint"]) == ("b", remote)


async def test_the_http_gateway_forwards_like_grpc(cluster: dict[str, ServerProcess]) -> None:
    """The HTTP/JSON routes run the same request logic as gRPC, forwarding included."""
    a, b = cluster["a"], cluster["b"]
    async with (
        aiohttp.ClientSession(base_url=a.http) as http_a,
        aiohttp.ClientSession(base_url=b.http) as http_b,
    ):
        async with http_a.post("/v1/tasks", json={"pool": "b1", "payload": 1, "key": "http-b"}) as resp:
            assert resp.status == 200, await resp.text()
            task_id = (await resp.json())["id"]
        assert shard_number(int(task_id)) == 2
        for path in (f"/v1/tasks/{task_id}", "/v1/tasks/http-b"):
            async with http_a.get(path) as resp:
                info = await resp.json()
            assert (resp.status, info["id"], info["pool"]) == (200, task_id, "b1"), info
        async with http_a.post(f"/v1/tasks/{task_id}:cancel") as resp:
            assert (resp.status, await resp.json()) == (200, {"cancelled": True})
        async with http_b.get(f"/v1/tasks/{task_id}") as resp:
            assert (await resp.json())["status"] == "cancelled"

        spanning = {"tasks": [{"pool": "a1", "payload": 1}, {"pool": "b1", "payload": 2}]}
        async with http_a.post("/v1/tasks:batch", json=spanning) as resp:
            body = await resp.json()
            assert (resp.status, body["code"]) == (400, "invalid_argument"), body
            assert "tasks[1].pool" in body["error"], body

        async with worker(b.target, json_echo, pool="b1"):
            async with http_a.post("/v1/tasks", json={"pool": "b1", "payload": 2, "wait": True}) as resp:
                submitted = await resp.json()
            assert (resp.status, submitted["result"]["status"]) == (200, "succeeded"), submitted
            async with http_a.post("/v1/tasks", json={"pool": "b1", "payload": 3}) as resp:
                later = (await resp.json())["id"]
            async with http_a.get(f"/v1/tasks/{later}/result", params={"timeout_s": "10"}) as resp:
                result = await resp.json()
            assert (resp.status, result["id"], result["status"]) == (200, later, "succeeded"), result


async def test_http_results_of_forwarded_tasks_keep_their_json_output(
    cluster: dict[str, ServerProcess],
) -> None:
    """A result is rendered by the server asked, from what the owner stored: a JSON output (content
    type application/json) must come back as ``output``, exactly as the owner's own gateway renders
    it, not as opaque ``output_base64`` because the asking server never saw the output."""
    a, b = cluster["a"], cluster["b"]
    async with (
        aiohttp.ClientSession(base_url=a.http) as http_a,
        aiohttp.ClientSession(base_url=b.http) as http_b,
        worker(b.target, json_echo, pool="b1"),
    ):
        async with http_a.post("/v1/tasks", json={"pool": "b1", "payload": 2, "wait": True}) as resp:
            submitted = await resp.json()
        async with http_b.get(f"/v1/tasks/{submitted['id']}/result") as resp:
            at_owner = await resp.json()
        assert at_owner["output"] == {"pool": "b1", "payload": 2}, at_owner
        assert submitted["result"] == at_owner, (submitted, at_owner)
        async with http_a.get(f"/v1/tasks/{submitted['id']}/result") as resp:
            assert (await resp.json()) == at_owner


# ------------------------------------------------------------------------------------------ workers


async def test_a_worker_is_redirected_to_the_shard_owning_its_pool(
    cluster: dict[str, ServerProcess], channel_a: Any
) -> None:
    """Work streams are never forwarded (a lease lives on one stream): registering for another
    shard's pool fails with the owner's endpoint, and the SDK worker follows it and serves there."""
    a, b = cluster["a"], cluster["b"]
    assert_redirect(await register_raw(channel_a, "b1"), "b", endpoint(b))
    async with (
        worker(a.target, echo, pool="b1") as on_b,
        worker(b.target, echo, pool="a2") as on_a,
        Client(a.target) as via_a,
        Client(b.target) as via_b,
    ):
        assert (on_b.connections, on_a.connections) == (1, 1)  # redirects are not registrations
        done = await via_a.submit(b"b-work", pool="b1", wait=True, wait_timeout=10)
        assert done.result is not None and done.result.text() == "b1:b-work"
        done = await via_b.submit(b"a-work", pool="a2", wait=True, wait_timeout=10)
        assert done.result is not None and done.result.text() == "a2:a-work"
        # Only b issues b1 leases (and only a a2 leases), so these results prove where each worker
        # registered; the listing fans out, so either server shows both.
        assert sorted(w.pool for w in await via_a.list_workers()) == ["a2", "b1"]


# ------------------------------------------------------------------------------------------ fan-out


async def list_all(client: Client, **kw: Any) -> tuple[list[int], list[list[int]]]:
    """Every task id, paging with ``limit=2``; also the pages, to check each one's size and cursor."""
    ids: list[int] = []
    pages: list[list[int]] = []
    after = 0
    for _ in range(20):
        page = await client.list_tasks(after=after, limit=2, **kw)
        assert page.unavailable_shards == []
        pages.append([t.id for t in page.tasks])
        ids += pages[-1]
        if not page.next_after:
            return ids, pages
        assert page.tasks and page.next_after == page.tasks[-1].id, page
        after = page.next_after
    raise AssertionError(f"no last page after 20 pages: {pages}")


async def test_lists_and_admin_views_fan_out_to_every_shard(cluster: dict[str, ServerProcess]) -> None:
    """ListTasks without pools merges all shards in id order, and its cursor pages across the shard
    boundary without loss or repeats; Snapshot and ListWorkers cover every shard's pools and workers,
    from whichever server is asked."""
    a, b = cluster["a"], cluster["b"]
    async with Client(a.target) as via_a, Client(b.target) as via_b:
        submitted = [
            await via_a.submit(b"", pool="a1"),
            await via_b.submit(b"", pool="b1"),
            await via_b.submit(b"", pool="a2"),
            await via_a.submit(b"", pool="b1"),
            await via_a.submit(b"", pool="a1"),
            await via_b.submit(b"", pool="b1"),
        ]
        expected = sorted(s.id for s in submitted)
        on_b = sorted(s.id for s in submitted if shard_number(s.id) == 2)
        for client in (via_a, via_b):
            ids, pages = await list_all(client)
            assert ids == expected, pages  # ascending, each once: a's ids (1 << 56 ...) before b's
            assert all(len(page) <= 2 for page in pages), pages
            assert [t.id async for t in client.iter_tasks()] == expected
            assert (await list_all(client, pools=["b1"]))[0] == on_b

        async with (
            aiohttp.ClientSession(base_url=a.http) as http,
            http.get("/v1/tasks", params={"limit": "100"}) as resp,
        ):
            page = await resp.json()
        assert [int(t["id"]) for t in page["tasks"]] == expected, page
        assert (page["next_after"], page["unavailable_shards"]) == ("0", []), page

        async with worker(a.target, echo, pool="a1"), worker(b.target, echo, pool="b1"):
            for client in (via_a, via_b):
                snapshot = await client.snapshot()
                assert sorted(p.name for p in snapshot.pools) == ["a1", "a2", "b1"]
                assert snapshot.unavailable_shards == []
                assert sorted(w.pool for w in await client.list_workers()) == ["a1", "b1"]


async def test_a_down_shard_is_named_and_the_rest_still_answers(cluster: dict[str, ServerProcess]) -> None:
    """Views that fan out degrade to what is reachable and say which shard is missing, instead of
    failing outright; calls that need the missing shard fail UNAVAILABLE (retryable)."""
    a, b = cluster["a"], cluster["b"]
    async with Client(a.target) as via_a:
        on_a = [(await via_a.submit(b"", pool=pool, key=f"a-{pool}")).id for pool in ("a1", "a2")]
        on_b = (await via_a.submit(b"", pool="b1", key="b-b1")).id
        async with worker(a.target, echo, pool="a2", reconnect=False):
            b.kill()

            page = await asyncio.wait_for(via_a.list_tasks(), 10)
            assert ([t.id for t in page.tasks], page.unavailable_shards) == (on_a, ["b"])
            snapshot = await asyncio.wait_for(via_a.snapshot(), 10)
            assert {"a1", "a2"} <= {p.name for p in snapshot.pools}
            assert snapshot.unavailable_shards == ["b"]
            async with grpc.aio.insecure_channel(a.target) as channel:
                listed = await pbg.AdminStub(channel).ListWorkers(pb.Empty(), timeout=10)
            assert ([w.pool for w in listed.workers], list(listed.unavailable_shards)) == (["a2"], ["b"])

            with pytest.raises(Unavailable):
                await via_a.submit(b"", pool="b1", call_timeout=10)
            with pytest.raises(Unavailable):
                await asyncio.wait_for(via_a.get(on_b), 10)
            with pytest.raises(Unavailable):
                await asyncio.wait_for(via_a.cancel(on_b), 10)
            assert (await asyncio.wait_for(via_a.get("a-a1"), 10)).id == on_a[0]  # found on a
            for key in ("b-b1", "on-no-shard"):  # b may hold it: not NOT_FOUND while b cannot be asked
                with pytest.raises(Unavailable, match=r"shard\(s\) 'b' could not be asked"):
                    await asyncio.wait_for(via_a.get(key), 10)
            done = await via_a.submit(b"still", pool="a2", wait=True, wait_timeout=10)
            assert done.result is not None and done.result.text() == "a2:still"


async def test_a_hung_shard_is_named_before_the_callers_deadline(tmp_path: Path) -> None:
    """A shard that takes connections but never answers (SIGSTOP) is named in ``unavailable_shards``
    well before the caller's own deadline (both are limits.request_timeout_s), through a router and
    through another shard. A lookup by key alone asks every shard (a key two shards hold is refused,
    never settled by the first to answer), so it gives the hung shard up within that share of the
    timeout and answers with the holder found; one naming the task's pool does not ask it at all."""
    limits = "[limits]\nrequest_timeout_s = 3\n"
    with running_cluster(tmp_path, SHARDS, extra={"a": limits, "b": limits}) as procs:
        tables = cluster_tables(SHARDS, {name: endpoint(proc) for name, proc in procs.items()})
        router = router_process(tmp_path / "router", f"{tables}\n{limits}")
        router.start()
        try:
            async with Client(router.target) as via_router, Client(procs["a"].target) as via_a:
                held = await via_router.submit(b"", pool="a1", key="on-a")
                procs["b"].signal(signal.SIGSTOP)
                try:
                    for client in (via_router, via_a):
                        page = await client.list_tasks()
                        assert ([t.id for t in page.tasks], page.unavailable_shards) == ([held.id], ["b"])
                        assert (await client.snapshot()).unavailable_shards == ["b"]
                    began = time.monotonic()
                    assert (await via_router.get("on-a", pool="a1")).id == held.id
                    assert time.monotonic() - began < 1.5, "the lookup waited for the hung shard"
                    assert (await via_router.get("on-a")).id == held.id
                finally:
                    procs["b"].signal(signal.SIGCONT)
        finally:
            router.stop()


async def test_a_watch_with_a_shard_down_names_it_and_serves_the_rest(
    cluster: dict[str, ServerProcess], tmp_path: Path
) -> None:
    """Watch fans out like the listings: through a sharded server and through a router, a shard that is
    down is named (gRPC initial metadata, HTTP header ``Cronoq-Unavailable-Shards``) and the reachable
    shards' events still come, rather than the whole watch failing."""
    a, b = cluster["a"], cluster["b"]
    router = router_process(
        tmp_path / "router", cluster_tables(SHARDS, {name: endpoint(proc) for name, proc in cluster.items()})
    )
    router.start()
    try:
        b.kill()
        for via in (a, router):
            async with grpc.aio.insecure_channel(via.target) as channel, Client(via.target) as client:
                call = pbg.TasksStub(channel).Watch(pb.WatchRequest(all_transitions=True), timeout=30)
                opened = dict(await asyncio.wait_for(call.initial_metadata(), 10))
                assert opened.get("cronoq-unavailable-shards") == "b", (via.target, opened)
                task_id = (await client.submit(b"", pool="a1")).id
                event = await asyncio.wait_for(call.read(), 10)
                assert (event.id, event.pool) == (task_id, "a1")
                call.cancel()

                async with (
                    aiohttp.ClientSession(base_url=via.http) as http,
                    http.get("/v1/watch", params={"all": "true"}) as resp,
                ):
                    assert (resp.status, resp.headers["Cronoq-Unavailable-Shards"]) == (200, "b")
                    task_id = (await client.submit(b"", pool="a1")).id
                    line = b""
                    while not line.startswith(b"data:"):
                        line = await asyncio.wait_for(resp.content.readline(), 10)
                    assert f'"id":"{task_id}"'.encode() in line, line

        # The command-line client says which shards it is not watching before it streams events.
        cli = await asyncio.create_subprocess_exec(
            sys.executable,
            "-m",
            "cronoq.cli",
            "--target",
            a.target,
            "watch",
            "--all",
            stdout=asyncio.subprocess.DEVNULL,
            stderr=asyncio.subprocess.PIPE,
        )
        try:
            assert cli.stderr is not None
            warning = await asyncio.wait_for(cli.stderr.readline(), 30)
            assert warning == b"cronoq: not watching shards b: they could not be reached\n"
        finally:
            cli.kill()
            await cli.wait()
    except BaseException:
        print(f"----- log of the router -----\n{router.logs()}")
        raise
    finally:
        router.stop()


async def test_sqlite_shards_each_lead_in_their_own_file_and_never_share_one(tmp_path: Path) -> None:
    """``{shard}`` in a SQLite path gives each shard its file, as in a Postgres schema: both shards lead.
    On one file the second shard's server used to stand by behind the first forever; now every server
    refuses to start, naming both shards."""
    own_files = {spec.name: sqlite_store(tmp_path / "{shard}.db") for spec in SHARDS}
    with running_cluster(tmp_path / "own", SHARDS, extra=own_files) as procs:  # each started as a leader
        files = sorted(p.name for p in tmp_path.glob("*.db"))  # noqa: ASYNC240 - a directory listing
        assert files == ["a.db", "b.db"]
        assert all(proc.probe("/readyz") == 200 for proc in procs.values())
    one_file = {spec.name: sqlite_store(tmp_path / "state.db") for spec in SHARDS}
    for name, proc in new_cluster(tmp_path / "shared", SHARDS, extra=one_file).items():
        try:
            with pytest.raises(RuntimeError, match="exited with 1"):
                proc.start(ready=False)
        finally:
            proc.stop()
        assert (
            f"store.path: shards 'a' and 'b' would share the SQLite file '{tmp_path / 'state.db'}'"
        ) in proc.logs(), name
    assert not (tmp_path / "state.db").exists()


async def test_a_forwarded_call_reaches_the_other_shards_leader_past_its_standby(tmp_path: Path) -> None:
    """A shard's endpoint may be a Service in front of its leader and standbys, which can hand a call to
    a standby: a server finds the other shard's leader among its ``members``, as the router does, and
    forwards there, and sends workers there."""
    ports = iter(free_ports(6))
    a, b_leader, b_standby = ((next(ports), next(ports)) for _ in range(3))
    leader_url, standby_url, a_url = (f"http://127.0.0.1:{grpc}" for grpc, _ in (b_leader, b_standby, a))
    # Everyone reaches shard b at its standby, as a balancer in front of both may.
    tables = cluster_tables(SHARDS, {"a": a_url, "b": standby_url}, {"b": [standby_url, leader_url]})
    b_body = f'[server]\nshard = "b"\n\n{sqlite_store(tmp_path / "{shard}.db")}{tables}'
    procs: dict[str, ServerProcess] = {}
    for name, body, (grpc_port, http_port) in (
        ("b-leader", b_body, b_leader),
        ("b-standby", b_body, b_standby),
        ("a", f'[server]\nshard = "a"\n\n{tables}', a),
    ):
        folder = tmp_path / name
        folder.mkdir()
        config = write_config(folder, body, grpc_port, http_port)
        procs[name] = ServerProcess(config, folder / "server.log", grpc_port=grpc_port, http_port=http_port)
    try:
        procs["b-leader"].start()
        procs["b-standby"].start(ready=False)
        procs["a"].start()
        assert procs["b-standby"].probe("/readyz") == 503  # the endpoint really is a standby
        async with Client(procs["a"].target) as via_a:
            submitted = await via_a.submit(b"", pool="b1", key="past-the-standby", call_timeout=10)
            assert shard_number(submitted.id) == 2
            assert (await via_a.get(submitted.id)).key == "past-the-standby"
        # Workers are sent to the leader found, not to the endpoint that reaches a standby; so is a call
        # that was forwarded here already (refused, not forwarded again).
        async with grpc.aio.insecure_channel(procs["a"].target) as channel:
            assert_redirect(await register_raw(channel, "b1"), "b", leader_url)
            again = pb.SubmitRequest(task=task(b"x", pool="b1"))
            assert_redirect(
                await rpc_error(pbg.TasksStub(channel).Submit(again, metadata=FORWARDED)), "b", leader_url
            )
        async with Client(procs["b-leader"].target) as on_b:
            assert (await on_b.get("past-the-standby")).id == submitted.id
    except BaseException:
        for name, proc in procs.items():
            print(f"----- log of {name} ({proc.target}) -----\n{proc.logs()}")
        raise
    finally:
        for proc in procs.values():
            proc.stop()


# ------------------------------------------------------------------------------------------ auth


async def test_the_owning_shard_authenticates_a_forwarded_call_again(tmp_path: Path) -> None:
    """Forwarding presents the caller's own token to the owner, which decides by its own
    configuration: a server cannot widen what a token may do on another shard, and the forwarded
    marker grants nothing by itself."""
    shared = token(ADMIN, "admin") + token(ONLY_A1, "client", ("a1",))
    extra = {
        "a": shared + token(WIDER_ON_A, "client", ("a1", "b1")) + token(UNKNOWN_TO_B, "client"),
        "b": shared + token(WIDER_ON_A, "client", ("a1",)),
    }
    # b learns its shard from CRONOQ_SHARD (the file names none), as one shared file would be run.
    with running_cluster(tmp_path, SHARDS, extra=extra, via_env=["b"]) as procs:
        a, b = procs["a"], procs["b"]
        async with Client(a.target, token=ADMIN) as admin:
            on_b = await admin.submit(b"", pool="b1", key="for-b")
            assert shard_number(on_b.id) == 2
            assert (await admin.get("for-b")).id == on_b.id

        async with Client(a.target, token=ONLY_A1) as narrow:
            with pytest.raises(PermissionDenied):  # refused by a already
                await narrow.submit(b"", pool="b1")
            assert shard_number((await narrow.submit(b"", pool="a1")).id) == 1
        async with Client(a.target, token=WIDER_ON_A) as wider:
            with pytest.raises(PermissionDenied):  # a lets it through; b refuses
                await wider.submit(b"", pool="b1")
            with pytest.raises(NotFound):  # as on one server: a pool not allowed hides its tasks
                await wider.get(on_b.id)
            with pytest.raises(PermissionDenied, match=r"pools: .*'b1'"):  # b's refusal, not "b is down"
                await wider.list_tasks(pools=["b1"])
            assert shard_number((await wider.submit(b"", pool="a1")).id) == 1
        async with Client(a.target, token=UNKNOWN_TO_B) as stranger:
            with pytest.raises(Unauthenticated):  # b has never heard of it
                await stranger.submit(b"", pool="b1")
            assert shard_number((await stranger.submit(b"", pool="a1")).id) == 1

        async with grpc.aio.insecure_channel(b.target) as channel:
            err = await rpc_error(
                pbg.TasksStub(channel).Submit(pb.SubmitRequest(task=task(b"", pool="b1")), metadata=FORWARDED)
            )
            assert err.code() == grpc.StatusCode.UNAUTHENTICATED, err.details()

        # Through a router that knows the wider token too: the router checks no pool scope itself, and
        # the owning shard's refusal reaches the caller.
        router = router_process(
            tmp_path / "router",
            cluster_tables(SHARDS, {name: endpoint(proc) for name, proc in procs.items()}) + extra["a"],
        )
        router.start()
        try:
            async with Client(router.target, token=WIDER_ON_A) as wider:
                with pytest.raises(PermissionDenied, match="b1"):
                    await wider.submit(b"", pool="b1")
                assert shard_number((await wider.submit(b"", pool="a1")).id) == 1
            # Workers with a token nobody knows, writing their Register at once: the router and a shard
            # both take it before refusing, so that every one of them is told why.
            unknown = (("authorization", "Bearer nobody-knows-this-0123456789abcdef"),)
            for server in (router, a):
                async with grpc.aio.insecure_channel(server.target) as channel:
                    answers = await eager_worker_refusals(pbg.WorkersStub(channel), "a1", unknown)
                assert {code for code, _ in answers} == {grpc.StatusCode.UNAUTHENTICATED}, answers
        finally:
            router.stop()

        # A worker's redirect to a loopback http endpoint may carry its token.
        async with (
            worker(a.target, echo, pool="b1", token=ADMIN),
            Client(a.target, token=ADMIN) as admin,
        ):
            done = await admin.submit(b"authed", pool="b1", wait=True, wait_timeout=10)
            assert done.result is not None and done.result.text() == "b1:authed"

        for proc in (a, b):
            logs = proc.logs()
            assert all(secret not in logs for secret in (ADMIN, ONLY_A1, WIDER_ON_A, UNKNOWN_TO_B))


async def test_a_watch_on_one_shard_sees_every_shard(cluster: dict[str, ServerProcess]) -> None:
    """A shard server answers Watch for the whole cluster: its own events and, through a forwarded
    subscription, the other shards'."""
    a, b = cluster["a"], cluster["b"]
    async with Client(a.target) as client:
        queued = {(await client.submit(b"w", pool=pool)).id for pool in ("a1", "b1")}

        @contextlib.asynccontextmanager
        async def workers() -> AsyncIterator[None]:
            async with worker(a.target, echo, pool="a1"), worker(a.target, echo, pool="b1"):
                yield

        seen = await watch_while(client, [a, b], len(queued), workers)
    assert sorted(seen) == sorted((task_id, "succeeded") for task_id in queued)


async def test_forwarded_calls_beyond_a_shards_streams_per_connection_go_over_more_connections(
    tmp_path: Path,
) -> None:
    """Every process allows 4 calls per connection (server.grpc_max_streams_per_connection). Ten
    watches through a router, and five through shard a of b's pool (each Client has a connection of its
    own), hold a stream to the shards for as long as they last; the router and shard a open more
    connections, so lookups and submissions still get through instead of waiting behind the watches."""
    shared = "[server]\ngrpc_max_streams_per_connection = 4\n"
    with routed_cluster(tmp_path, SHARDS, shared) as (router, procs):
        watchers = [Client(router.target) for _ in range(10)] + [Client(procs["a"].target) for _ in range(5)]
        streams = [client.watch(all_transitions=True) for client in watchers[:10]]
        streams += [client.watch(pools=["b1"]) for client in watchers[10:]]
        try:
            for stream in streams:
                assert await asyncio.wait_for(stream.unavailable_shards(), 10) == []
            async with Client(router.target) as via_router, Client(procs["a"].target) as via_a:
                async with asyncio.timeout(10):
                    on_b = await via_router.submit(b"", pool="b1", key="past-the-watches")
                    assert (await via_router.get("past-the-watches")).id == on_b.id
                    assert (await via_a.get(on_b.id)).id == on_b.id
                    assert (await via_a.submit(b"", pool="b1", key="past-the-watches")).duplicate
        finally:
            for stream in streams:
                await stream.aclose()
            for client in watchers:
                await client.close()
