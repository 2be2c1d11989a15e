"""Task keys are one namespace across the shards of a cluster (issue: a key squatted across shards).

Shard ``a`` owns pools ``a1`` and ``a2``, shard ``b`` owns ``b1``, with a router in front; every entry
point (the router, either shard, gRPC and HTTP) must give the same answers. A credential scoped to
``a1`` may never shadow, read, wait on or cancel a ``b1`` task by its key; a key two shards hold (left by
a submission made while the other shard could not be asked) is refused until the caller names the pool,
never settled by whichever shard answers first.
"""

from __future__ import annotations

import asyncio
import contextlib
import signal
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import psycopg
import pytest
from psycopg import sql

from cronoq.client import Client, task
from cronoq.errors import FailedPrecondition, InvalidArgument, NotFound, PermissionDenied, Unavailable
from cronoq.v1 import cronoq_pb2 as pb
from cronoq.v1 import cronoq_pb2_grpc as pbg

from .helpers import postgres_store, token
from .serverproc import ServerProcess
from .shardproc import ShardSpec, routed_cluster, running_cluster

pytestmark = pytest.mark.asyncio

SHARDS = (ShardSpec("a", 1, ("a1", "a2")), ShardSpec("b", 2, ("b1",)))
ADMIN = "admin-token-0123456789abcdef"
ONLY_A1 = "only-a1-token-0123456789abcdef"
ONLY_B1 = "only-b1-token-0123456789abcdef"
# A shard that cannot be asked (SIGSTOP) is given up on within 3/4 of request_timeout_s.
SHARED = "[limits]\nrequest_timeout_s = 2\n\n" + "".join(
    (token(ADMIN, "admin"), token(ONLY_A1, "client", ("a1",)), token(ONLY_B1, "client", ("b1",)))
)


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[tuple[ServerProcess, dict[str, ServerProcess]]]:
    with routed_cluster(tmp_path, SHARDS, SHARED) as running:
        yield running


def entry_points(cluster: tuple[ServerProcess, dict[str, ServerProcess]]) -> list[ServerProcess]:
    router, shards = cluster
    return [router, shards["a"], shards["b"]]


async def http(
    proc: ServerProcess, method: str, path: str, token: str, body: object = None
) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.request(
            method, f"{proc.http}{path}", json=body, headers={"Authorization": f"Bearer {token}"}
        ) as resp,
    ):
        return resp.status, await resp.json()


@pytest.fixture
async def clients(
    cluster: tuple[ServerProcess, dict[str, ServerProcess]],
) -> AsyncIterator[dict[tuple[str, str], Client]]:
    """A client per (entry point, token): entry points ``router``, ``a`` and ``b``."""
    names = ("router", "a", "b")
    opened: dict[tuple[str, str], Client] = {}
    try:
        for name, proc in zip(names, entry_points(cluster), strict=True):
            for token in (ADMIN, ONLY_A1, ONLY_B1):
                opened[(name, token)] = Client(proc.target, token=token)
        yield opened
    finally:
        for client in opened.values():
            await client.close()


async def test_a_scoped_credential_can_never_shadow_or_reach_another_pools_key(
    cluster: tuple[ServerProcess, dict[str, ServerProcess]], clients: dict[tuple[str, str], Client]
) -> None:
    """The hostile run's steps, at every entry point: the squatter's submission is refused, so the
    owner's cancel and wait reach the owner's own task; the squatter cannot see it by key."""
    victim = await clients[("router", ADMIN)].submit(b"victim", pool="b1", key="nightly-7")
    for entry in ("router", "a", "b"):
        squatter = clients[(entry, ONLY_A1)]
        with pytest.raises(PermissionDenied, match=r"task.key: key 'nightly-7' is held by a task outside"):
            await squatter.submit(b"squat", pool="a1", key="nightly-7")
        for lookup in (
            squatter.get("nightly-7"),
            squatter.cancel("nightly-7"),
            squatter.wait("nightly-7", 1),
        ):
            with pytest.raises(NotFound, match="no task 'nightly-7'"):
                await lookup
        # The owner's scope and an unscoped credential find the one task, by key, anywhere.
        assert (await clients[(entry, ONLY_B1)].get("nightly-7")).id == victim.id
        assert (await clients[(entry, ADMIN)].get("nightly-7")).id == victim.id
    for proc in entry_points(cluster):
        status, answer = await http(proc, "POST", "/v1/tasks", ONLY_A1, {"pool": "a1", "key": "nightly-7"})
        assert (status, answer["code"]) == (403, "permission_denied"), answer
        status, answer = await http(proc, "GET", "/v1/tasks/nightly-7", ONLY_A1)
        assert (status, answer["code"]) == (404, "not_found"), answer
    # Nothing of a1 holds the key: the admin sees one task of that key in the whole cluster.
    page = await clients[("router", ADMIN)].list_tasks()
    assert [(t.id, t.pool) for t in page.tasks if t.key == "nightly-7"] == [(victim.id, "b1")]

    # An unscoped submission of the key to another shard's pool is a duplicate of the task holding it,
    # with its result when it waits; the owner's cancel cancels the owner's task.
    again = await clients[("a", ADMIN)].submit(b"again", pool="a1", key="nightly-7")
    assert (again.id, again.duplicate) == (victim.id, True)
    assert await clients[("router", ADMIN)].cancel("nightly-7")
    waited = await clients[("router", ADMIN)].submit(
        b"", pool="a2", key="nightly-7", wait=True, wait_timeout=5
    )
    assert (waited.id, waited.duplicate) == (victim.id, True)
    assert waited.result is not None and waited.result.status == "cancelled"
    status, answer = await http(cluster[0], "POST", "/v1/tasks", ADMIN, {"pool": "a1", "key": "nightly-7"})
    assert (status, answer["id"], answer["duplicate"]) == (200, str(victim.id), True), answer


async def test_a_dependency_on_a_task_of_another_shard_is_refused_naming_that_shard(
    cluster: tuple[ServerProcess, dict[str, ServerProcess]], clients: dict[tuple[str, str], Client]
) -> None:
    """A task can depend only on tasks of its own shard: a dependency on a ``b1`` task from an ``a1`` task,
    by id or by key, is refused naming shard b at every entry point, over gRPC and HTTP, rather than
    answered "unknown dependency". A credential that may not see the ``b1`` task still finds it
    unknown, as a lookup would."""
    on_b = await clients[("router", ADMIN)].submit(b"x", pool="b1", key="on-b")
    own = "a task can depend only on tasks of its own shard, and pool 'a1' is served by shard 'a'"
    refusals: dict[int | str, str] = {
        on_b.id: f"task.deps[0].id: task {on_b.id} is on shard 'b'; {own}",
        "on-b": f"task.deps[0].key: key 'on-b' is held by task {on_b.id} on shard 'b'; {own}",
    }
    for name, proc in zip(("router", "a", "b"), entry_points(cluster), strict=True):
        for ref, message in refusals.items():
            with pytest.raises(InvalidArgument) as err:
                await clients[(name, ADMIN)].submit(b"y", pool="a1", after=ref)
            assert err.value.message == message, name
            target = {"id": str(ref)} if isinstance(ref, int) else {"key": ref}
            status, body = await http(proc, "POST", "/v1/tasks", ADMIN, {"pool": "a1", "deps": [target]})
            assert (status, body) == (400, {"error": message, "code": "invalid_argument"}), name
    with pytest.raises(InvalidArgument) as err:
        await clients[("a", ADMIN)].submit_batch(
            [task(b"1", pool="a1", key="first"), task(b"2", pool="a1", after=["first", "on-b"])]
        )
    assert err.value.message.startswith(f"tasks[1].deps[1].key: key 'on-b' is held by task {on_b.id} on")
    with pytest.raises(NotFound) as unknown:
        await clients[("router", ONLY_A1)].submit(b"z", pool="a1", after="on-b")
    assert unknown.value.message == "task.deps[0].key: unknown dependency 'on-b'"
    page = await clients[("router", ADMIN)].list_tasks()
    assert [t.id for t in page.tasks] == [on_b.id]  # nothing else was admitted


async def test_a_batch_answers_a_key_held_on_another_shard_as_its_duplicate(
    clients: dict[tuple[str, str], Client],
) -> None:
    held = await clients[("router", ADMIN)].submit(b"", pool="b1", key="batch-held")
    for entry in ("router", "a"):
        batch = await clients[(entry, ADMIN)].submit_batch(
            [task(b"", pool="a1", key=f"batch-new-{entry}"), task(b"", pool="a1", key="batch-held")]
        )
        assert [b.duplicate for b in batch] == [False, True]
        assert batch[1].id == held.id and batch[0].id >> 56 == 1
    with pytest.raises(PermissionDenied, match=r"tasks\[1\].key: key 'batch-held'"):
        await clients[("router", ONLY_A1)].submit_batch(
            [task(b"", pool="a1", key="batch-refused"), task(b"", pool="a1", key="batch-held")]
        )
    with pytest.raises(NotFound):  # nothing of the refused batch was kept
        await clients[("router", ADMIN)].get("batch-refused")


async def test_a_key_two_shards_hold_is_refused_until_the_pool_is_named(
    cluster: tuple[ServerProcess, dict[str, ServerProcess]], clients: dict[tuple[str, str], Client]
) -> None:
    """A shard that cannot be asked lets an unscoped submission of a key it holds through (and blocks a
    scoped one); the key then names two tasks, and every lookup by key alone is refused naming both."""
    _, shards = cluster
    on_b = await clients[("router", ADMIN)].submit(b"", pool="b1", key="twice")
    shards["b"].signal(signal.SIGSTOP)
    try:
        with pytest.raises(Unavailable, match="shard 'b' could not be asked") as refused:
            await clients[("a", ONLY_A1)].submit(b"", pool="a1", key="scoped-while-b-is-away")
        assert refused.value.retryable
        on_a = await clients[("a", ADMIN)].submit(b"", pool="a1", key="twice")
        assert not on_a.duplicate and on_a.id >> 56 == 1
    finally:
        shards["b"].signal(signal.SIGCONT)

    for entry in ("router", "a", "b"):
        admin = clients[(entry, ADMIN)]
        for lookup in (admin.get("twice"), admin.cancel("twice"), admin.wait("twice", 1)):
            with pytest.raises(FailedPrecondition) as ambiguous:
                await lookup
            message = ambiguous.value.message
            assert f"{on_a.id} in pool 'a1' (shard 'a')" in message, message
            assert f"{on_b.id} in pool 'b1' (shard 'b')" in message, message
            assert "cronoq-pool" in message
        assert (await admin.get("twice", pool="a1")).id == on_a.id
        assert (await admin.get("twice", pool="b1")).id == on_b.id
        # A scoped credential sees one of them: no ambiguity for it.
        assert (await clients[(entry, ONLY_B1)].get("twice")).id == on_b.id
        assert (await clients[(entry, ONLY_A1)].get("twice")).id == on_a.id
    for proc in entry_points(cluster):
        status, answer = await http(proc, "POST", "/v1/tasks/twice:cancel", ADMIN)
        assert (status, answer["code"]) == (409, "failed_precondition"), answer
        status, answer = await http(proc, "GET", "/v1/tasks/twice?pool=b1", ADMIN)
        assert (status, answer["id"]) == (200, str(on_b.id)), answer
    assert await clients[("router", ADMIN)].cancel("twice", pool="a1")
    assert (await clients[("router", ADMIN)].get("twice", pool="b1")).status == "ready"
    # The raw metadata works too, for clients other than ours.
    async with grpc.aio.insecure_channel(cluster[0].target) as channel:
        info = await pbg.TasksStub(channel).Get(
            pb.GetRequest(task=pb.TaskRef(key="twice")),
            metadata=(("authorization", f"Bearer {ADMIN}"), ("cronoq-pool", "a1")),
        )
    assert (info.id, info.status) == (on_a.id, pb.TASK_STATUS_CANCELLED)


async def test_a_scoped_watch_by_key_never_sees_another_pools_task(
    clients: dict[tuple[str, str], Client],
) -> None:
    """Watch filters by key on every shard; a credential scoped to a1 gets only a1's events, even for a
    key it names that a b1 task holds (an unscoped watch is the witness that those events happened)."""
    scoped = clients[("router", ONLY_A1)].watch(keys=["w-shared", "w-marker"], all_transitions=True)
    witness = clients[("router", ADMIN)].watch(keys=["w-shared"], all_transitions=True)
    try:
        await scoped.unavailable_shards()
        await witness.unavailable_shards()
        shared = await clients[("router", ADMIN)].submit(b"", pool="b1", key="w-shared")
        assert await clients[("router", ADMIN)].cancel(shared.id)
        async with asyncio.timeout(10):
            async for event in witness:
                if event.status == "cancelled":
                    break
        marker = await clients[("router", ONLY_A1)].submit(b"", pool="a1", key="w-marker")
        assert await clients[("router", ONLY_A1)].cancel("w-marker")
        seen = []
        async with asyncio.timeout(10):
            async for event in scoped:
                seen.append((event.id, event.pool))
                if event.status == "cancelled":
                    break
        assert {pool for _, pool in seen} == {"a1"} and {i for i, _ in seen} == {marker.id}, seen
    finally:
        await scoped.aclose()
        await witness.aclose()


async def test_a_key_held_by_a_task_not_yet_committed_on_its_shard_is_not_answered_as_its_duplicate(
    tmp_path: Path, postgres_url: str, pg_schema: str
) -> None:
    """Found by the chaos suite (seed 20261206): shard b's leader held a keyed task it could not commit
    (its link to Postgres was cut), and shard a, asked for the same key, answered the caller with that
    task's id as a duplicate; b's leader then lost its leadership, the task was never written, and the
    id the caller was given named nothing. A duplicate answer is an acknowledgement: the task it names
    must be committed first. Here b's commits are held up by a lock on its table, b's leader is killed
    before it can commit, and whatever a answered must still exist once b is back."""
    shards = (ShardSpec("a", 1, ("a1",)), ShardSpec("b", 2, ("b1",)))
    shared = "[limits]\nrequest_timeout_s = 2\n\n" + postgres_store(f"{pg_schema}_{{shard}}")
    with running_cluster(
        tmp_path, shards, extra={"a": shared, "b": shared}, env={"DATABASE_URL": postgres_url}
    ) as procs:
        async with Client(procs["a"].target) as to_a, Client(procs["b"].target) as to_b:
            with psycopg.connect(postgres_url) as blocker:
                blocker.execute(
                    sql.SQL("LOCK TABLE {}.cronoq_tasks IN ACCESS EXCLUSIVE MODE").format(
                        sql.Identifier(f"{pg_schema}_b")
                    )
                )
                held = asyncio.create_task(to_b.submit(b"", pool="b1", key="uncommitted", call_timeout=30))
                deadline = time.monotonic() + 20
                while procs["b"].metric("cronoq_live_tasks") != 1:  # b's engine holds it; b cannot commit
                    assert time.monotonic() < deadline and not held.done()
                    await asyncio.sleep(0.05)
                answer = await to_a.submit(b"", pool="a1", key="uncommitted", call_timeout=15)
                procs["b"].kill()
                blocker.rollback()
            with contextlib.suppress(Unavailable):
                await held  # its leader died before answering
            procs["b"].start()
            found = await to_a.get(answer.id)  # through a: b's ids are forwarded to b
            assert (found.id, found.key) == (answer.id, "uncommitted")
