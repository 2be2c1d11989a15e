"""The router in front of a real cluster: two shards, each a leader and a standby on its own Postgres
schema, and a ``cronoq-router`` process. Producers use only the router; workers start at the router and
are redirected to their shard's leader. What needs no failover runs in front of two memory-store shards."""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import TypeVar

import aiohttp
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cronoq.client import Client, Lease, task
from cronoq.cluster.shards import SHARD_SHIFT, UNSHARDED
from cronoq.errors import ApiError, NotFound, Unavailable

from .helpers import durable_config, postgres_store, scrape_metrics, watch_while, worker
from .serverproc import ServerProcess, leader_and_standby
from .shardproc import ShardSpec, routed_cluster, routed_ha_cluster, running_router

pytestmark = pytest.mark.asyncio
T = TypeVar("T")

SHARDS = {"a": (1, "a1"), "b": (2, "b1")}  # name -> (number, its one pool)


SPECS = [ShardSpec(name, number, (pool,)) for name, (number, pool) in SHARDS.items()]


def cluster(
    tmp_path: Path, postgres_url: str, schema: str
) -> contextlib.AbstractContextManager[tuple[ServerProcess, dict[str, list[ServerProcess]]]]:
    """The router and, per shard of :data:`SPECS`, [leader, standby] (all started)."""
    return routed_ha_cluster(tmp_path, SPECS, postgres_url, schema)


async def echo(lease: Lease) -> str:
    return f"{lease.pool}:{lease.payload.decode()}"


async def test_producers_and_workers_use_only_the_router(
    tmp_path: Path, postgres_url: str, pg_schema: str
) -> None:
    with cluster(tmp_path, postgres_url, pg_schema) as (router, shards):
        async with (
            worker(router.target, echo, pool="a1") as wa,
            worker(router.target, echo, pool="b1") as wb,
            Client(router.target) as client,
        ):
            assert wa.connections == 1 and wb.connections == 1  # redirected once, then registered
            ids = {}
            for name, (number, pool) in SHARDS.items():
                done = await client.submit(b"x", pool=pool, key=f"k-{name}", wait=True, wait_timeout=10)
                assert done.id >> SHARD_SHIFT == number  # the owning shard issued it
                assert done.result is not None and done.result.text() == f"{pool}:x"
                ids[name] = done.id
                assert (await client.get(done.id)).pool == pool  # by id: routed by its shard bits
                assert (await client.get(f"k-{name}")).id == done.id  # by key: asked of the shards
            with pytest.raises(NotFound):
                await client.get("held-by-no-shard")  # every shard asked, and every one answers
            batch = await client.submit_batch([task(str(i).encode(), pool="b1") for i in range(5)])
            assert all(s.id >> SHARD_SHIFT == 2 for s in batch)
            results = await asyncio.gather(*(client.wait(s.id, timeout=10) for s in batch))
            assert sorted(r.text() for r in results) == [f"b1:{i}" for i in range(5)]

            seen = [t.id async for t in client.iter_tasks(page_size=2)]
            assert seen == sorted(seen) and len(seen) == 7 and set(ids.values()) <= set(seen)
            snapshot = await client.snapshot()
            assert {p.name for p in snapshot.pools} == {"a1", "b1"} and not snapshot.unavailable_shards
            assert {w.pool for w in await client.list_workers()} == {"a1", "b1"}

            m = await scrape_metrics(router)
            for name, (_, pool) in SHARDS.items():
                leader = f"http://127.0.0.1:{shards[name][0].grpc_port}"
                assert m("cronoq_router_shard_leader", shard=name, endpoint=leader) == 1
                assert m("cronoq_router_worker_redirects_total", shard=name, pool=pool) == 1
                assert m("cronoq_router_forwarded_total", shard=name, method="Submit", outcome="ok") == 1
                assert m("cronoq_router_fanout_unavailable_total", shard=name, method="ListTasks") == 0
            assert m("cronoq_router_forwarded_total", shard="b", method="SubmitBatch", outcome="ok") == 1
            # By key: every shard is asked; those without the key answer NOT_FOUND.
            for name in SHARDS:
                assert m("cronoq_router_forwarded_total", shard=name, method="Get", outcome="not_found") >= 1
            assert m("cronoq_router_fanout_partial_total", method="Snapshot") == 0

        async with (
            aiohttp.ClientSession(base_url=router.http) as http,
            http.post("/v1/tasks", json={"pool": "a1", "payload": {"n": 1}}) as resp,
        ):
            body = await resp.json()
            assert resp.status == 200 and int(body["id"]) >> SHARD_SHIFT == 1, body


async def until(probe: Callable[[], Awaitable[T]], done: Callable[[T], bool]) -> T:
    """What ``probe()`` gives once ``done`` says so (state that lives in the servers), within 10 s."""
    async with asyncio.timeout(10):
        while not done(value := await probe()):  # noqa: ASYNC110 - the condition lives in the servers
            await asyncio.sleep(0.02)
    return value


async def until_routed(client: Client, key: str) -> float:
    """Seconds until a Get through the router succeeds again (a producer retrying, as producers do)."""
    began = time.monotonic()
    while True:
        try:
            await client.get(key)
            return time.monotonic() - began
        except Unavailable:
            assert time.monotonic() - began < 10, "the router did not find the new leader"
            await asyncio.sleep(0.02)


async def test_the_router_follows_a_failover_and_names_a_shard_that_is_down(
    tmp_path: Path, postgres_url: str, pg_schema: str
) -> None:
    with cluster(tmp_path, postgres_url, pg_schema) as (router, shards):
        async with Client(router.target) as client:
            before = await client.submit(b"x", pool="a1", key="before")
            first, second = shards["a"]
            # Round 1: the leader dies, the standby takes over. Round 2: the first one, restarted as a
            # standby, takes over again at the address the router once used and saw fail.
            for epoch, (dying, taking_over) in enumerate(((first, second), (second, first)), start=2):
                dying.kill()
                taking_over.wait_probe("/readyz", 200, timeout=30)
                recovered = await until_routed(client, "before")
                print(
                    f"round {epoch - 1}: router traffic recovered {recovered:.2f} s after the new leader was ready"
                )
                assert recovered < 2.0, (
                    "docs/operations.md: forwarded calls work again within 2 s of the new leader being ready"
                )
                after = await client.submit(b"y", pool="a1", key=f"after-{epoch}")
                assert after.id >> SHARD_SHIFT == 1 and (after.id >> 48) & 0xFF == epoch  # the new leader's
                dying.start(ready=False)

            for proc in shards["b"]:
                proc.kill()
            page = await client.list_tasks()
            assert page.unavailable_shards == ["b"] and len(page.tasks) == 3 and page.tasks[0].id == before.id
            snapshot = await client.snapshot()
            assert snapshot.unavailable_shards == ["b"] and [p.name for p in snapshot.pools] == ["a1"]
            events = client.watch()
            assert await events.unavailable_shards() == ["b"]
            await events.aclose()
            with pytest.raises(Unavailable):
                await client.submit(b"z", pool="b1")
            with pytest.raises(Unavailable, match=r"shard\(s\) 'b' could not be asked"):
                await client.get("on-no-shard")  # b may hold it: not NOT_FOUND while b is down

        m = await scrape_metrics(router)
        # Shard a's leader moved twice and is known; shard b has none (both members killed).
        assert m("cronoq_router_shard_leader", shard="a", endpoint=f"http://{first.target}") == 1
        assert m("cronoq_router_shard_leader", shard="b", endpoint="") == 0
        assert m("cronoq_router_leader_changes_total", shard="a") >= 2
        assert m("cronoq_router_leader_changes_total", shard="b") >= 1
        for method in ("ListTasks", "Snapshot", "Watch"):
            assert m("cronoq_router_fanout_partial_total", method=method) == 1
            assert m("cronoq_router_fanout_unavailable_total", shard="b", method=method) == 1
            assert m("cronoq_router_fanout_unavailable_total", shard="a", method=method) == 0
        assert m("cronoq_router_forwarded_total", shard="b", method="Submit", outcome="unavailable") == 1
        assert m("cronoq_router_forwarded_total", shard="a", method="Submit", outcome="ok") == 3
        assert m.total("cronoq_router_retries_total") >= 1  # calls that met the failover went again


async def test_a_committed_keyless_submit_is_not_sent_again_when_its_leader_shuts_down(
    tmp_path: Path, postgres_url: str, pg_schema: str
) -> None:
    """A clean shutdown ends the wait of a Submit(wait) it had committed with "server is shutting
    down"; the router must not take that for a refusal and send the keyless Submit to the new leader."""
    with cluster(tmp_path, postgres_url, pg_schema) as (router, shards):
        leader, standby = shards["a"]
        async with Client(router.target) as client:
            waiting = asyncio.ensure_future(client.submit(b"once", pool="a1", wait=True, wait_timeout=5))
            # Committed, and waiting: nothing serves the pool.
            await until(lambda: client.list_tasks(pools=["a1"]), lambda page: bool(page.tasks))
            leader.signal(signal.SIGTERM)
            outcome = (await asyncio.gather(waiting, return_exceptions=True))[0]
            standby.wait_probe("/readyz", 200, timeout=30)
            # Once the router reaches the new leader:
            page = await until(
                lambda: client.list_tasks(pools=["a1"]), lambda page: not page.unavailable_shards
            )
            assert len(page.tasks) == 1, f"the Submit ran twice ({outcome!r})"
            assert isinstance(outcome, Unavailable) and "shutting down" in outcome.message, outcome


async def test_a_watch_through_the_router_sees_every_shard(
    tmp_path: Path, postgres_url: str, pg_schema: str
) -> None:
    with cluster(tmp_path, postgres_url, pg_schema) as (router, shards):
        async with Client(router.target) as client:
            queued = {(await client.submit(b"w", pool=pool)).id for _, pool in SHARDS.values()}
            leaders = [procs[0] for procs in shards.values()]

            @contextlib.asynccontextmanager
            async def workers() -> AsyncIterator[None]:
                async with worker(router.target, echo, pool="a1"), worker(router.target, echo, pool="b1"):
                    yield

            seen = await watch_while(client, leaders, len(queued), workers)
        assert sorted(seen) == sorted((task_id, "succeeded") for task_id in queued)


LOCK_TTL_S = 10.0  # a paused Postgres leader's lock session ends this long after its last word


async def answer_in_time(call: Awaitable[T], paused_at: float) -> tuple[float, T | ApiError]:
    """Seconds from the pause to ``call``'s answer (or its error), bounded by the lock TTL plus a second."""
    try:
        async with asyncio.timeout(paused_at + LOCK_TTL_S + 1.0 - time.monotonic()):
            outcome: T | ApiError = await call
    except TimeoutError:
        raise AssertionError(f"no answer within {LOCK_TTL_S + 1.0:g} s of the pause") from None
    except ApiError as err:
        outcome = err
    return time.monotonic() - paused_at, outcome


async def test_a_paused_leader_is_given_up_naming_its_shard_within_the_lock_ttl(
    tmp_path: Path, postgres_url: str, pg_schema: str
) -> None:
    """A SIGSTOPped leader keeps its connections open and answers nothing. The router must not wait out
    the request timeout on it (30 s, then a bare "Deadline Exceeded"): its leader search finds the
    leader silent, and the router answers from the new leader or UNAVAILABLE naming the shard. A watch
    open there ends the same way rather than go quiet."""
    with cluster(tmp_path, postgres_url, pg_schema) as (router, shards):
        leader = shards["a"][0]
        async with Client(router.target) as client, aiohttp.ClientSession(base_url=router.http) as http:
            await client.submit(b"x", pool="a1", key="before")  # the router found the leader
            events = client.watch()
            assert await events.unavailable_shards() == []

            async def over_http() -> tuple[int, str]:
                async with http.post("/v1/tasks", json={"pool": "a1", "key": "http"}) as resp:
                    return resp.status, await resp.text()

            leader.signal(signal.SIGSTOP)
            paused_at = time.monotonic()
            try:
                answers = await asyncio.gather(
                    answer_in_time(client.submit(b"k", pool="a1", key="keyed"), paused_at),
                    answer_in_time(client.submit(b"n", pool="a1"), paused_at),
                    answer_in_time(client.get("before"), paused_at),
                    answer_in_time(anext(events), paused_at),
                )
                took, answer = await answer_in_time(over_http(), paused_at)
            finally:
                leader.signal(signal.SIGCONT)
            for seconds, outcome in answers:
                print(f"answered {seconds:.2f} s after the pause: {outcome!r}")
                if isinstance(outcome, ApiError):
                    assert isinstance(outcome, Unavailable) and "shard 'a'" in outcome.message, outcome
                else:  # answered by the new leader
                    assert getattr(outcome, "id", 0) >> 48 & 0xFF == 2, outcome
            assert not isinstance(answer, ApiError)
            status, body = answer
            print(f"HTTP answered {took:.2f} s after the pause: {status} {body}")
            assert status == 200 or (status == 503 and "shard 'a'" in body), (status, body)
            assert isinstance(answers[-1][1], Unavailable)  # the watch ended; no event was sent
            await events.aclose()
            # Shard b was never in doubt; shard a's leader, woken before its lock session ended, leads
            # on, and the router sends there again once it answers.
            assert (await client.submit(b"b", pool="b1")).id >> SHARD_SHIFT == 2
            await until_routed(client, "before")


async def test_the_routers_health_service_answers_for_every_service_it_serves(tmp_path: Path) -> None:
    """A gRPC health checker asks about the service it uses: the router serves Tasks, Workers (to
    redirect them) and Admin, and says SERVING for each, as a leading server does."""
    with routed_cluster(tmp_path, SPECS, "") as (router, _):
        async with grpc.aio.insecure_channel(router.target) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            for service in ("", "cronoq.v1.Tasks", "cronoq.v1.Workers", "cronoq.v1.Admin"):
                answer = await health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
                assert answer.status == health_pb2.HealthCheckResponse.SERVING, service
            with pytest.raises(grpc.aio.AioRpcError) as unknown:
                await health.Check(health_pb2.HealthCheckRequest(service="cronoq.v1.Nothing"), timeout=5)
            assert unknown.value.code() == grpc.StatusCode.NOT_FOUND


async def test_workers_listed_through_the_router_have_ids_that_name_their_shard(tmp_path: Path) -> None:
    """Each shard numbers its workers: listed together, two shards' first workers shared id 1 and
    nothing told their shards apart. A worker id carries its shard's number in the top 8 bits, as a
    task id does."""
    with routed_cluster(tmp_path, SPECS, "") as (router, _):
        async with (
            worker(router.target, echo, pool="a1") as wa,
            worker(router.target, echo, pool="b1") as wb,
            Client(router.target) as client,
        ):
            listed = {w.pool: w.id for w in await client.list_workers()}
            assert listed == {"a1": wa.worker_id, "b1": wb.worker_id}
            assert {pool: wid >> SHARD_SHIFT for pool, wid in listed.items()} == {"a1": 1, "b1": 2}
            async with aiohttp.ClientSession(base_url=router.http) as http, http.get("/v1/workers") as resp:
                assert {w["pool"]: int(w["id"]) for w in (await resp.json())["workers"]} == listed


async def test_a_router_in_front_of_a_cluster_without_shards_reaches_only_its_leader(
    tmp_path: Path, postgres_url: str, pg_schema: str
) -> None:
    """An install without shards behind a balancer reached its standby too (UNAVAILABLE, a retry).
    A router given the cluster's servers as ``[router] members`` finds the leader among them, sends
    every call and every worker there, and follows a failover, as it does for a shard."""
    body = durable_config(postgres_store(pg_schema))
    env = {"DATABASE_URL": postgres_url}
    with leader_and_standby(tmp_path, body, env) as (first, second):
        members = [f"http://{first.target}", f"http://{second.target}"]
        with running_router(tmp_path, body, members=members) as router:
            async with worker(router.target, echo) as w, Client(router.target) as client:
                assert w.connections == 1  # sent to the leader at once, not to the standby
                done = await client.submit(b"x", key="before", wait=True, wait_timeout=10)
                assert done.result is not None and done.result.text() == "default:x"
                assert (await client.get(done.id)).key == "before"  # an unsharded id: the epoch on top
                assert [t.id async for t in client.iter_tasks()] == [done.id]
                assert not (await client.snapshot()).unavailable_shards
                assert [x.pool for x in await client.list_workers()] == ["default"]

                first.kill()
                second.wait_probe("/readyz", 200, timeout=30)
                recovered = await until_routed(client, "before")
                print(f"router traffic recovered {recovered:.2f} s after the new leader was ready")
                after = await client.submit(b"y", wait=True, wait_timeout=20)  # the worker followed
                assert after.result is not None and after.result.text() == "default:y"
                assert (after.id >> 48) == 2 and (done.id >> 48) == 1  # the standby's term, then the leader's
                assert (await client.get(done.id)).key == "before"

            async with (
                aiohttp.ClientSession(base_url=router.http) as http,
                http.post("/v1/tasks", json={"payload": {"n": 1}}) as resp,
            ):
                assert resp.status == 200, await resp.text()
            m = await scrape_metrics(router)
            assert m("cronoq_router_shard_leader", shard=UNSHARDED, endpoint=members[1]) == 1
            assert m("cronoq_router_worker_redirects_total", shard=UNSHARDED, pool="default") == 2
            assert m("cronoq_router_leader_changes_total", shard=UNSHARDED) >= 2
