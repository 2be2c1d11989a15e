"""Producer-side API against a real server: batches, keys, listing, waiting, watching, labels."""

from __future__ import annotations

import asyncio
import urllib.request
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path

import pytest

from cronoq.client import Client, ClientError, Lease, task

from .helpers import worker
from .serverproc import ServerProcess, running_server

pytestmark = pytest.mark.asyncio


async def until_watching(server: ServerProcess, n: int) -> None:
    """Poll /metrics until ``n`` Watch subscriptions exist on the server."""
    for _ in range(500):
        text = await asyncio.to_thread(
            lambda: urllib.request.urlopen(f"{server.http}/metrics", timeout=5).read()
        )
        if f"cronoq_watch_streams {n}".encode() in text:
            return
        await asyncio.sleep(0.01)
    raise AssertionError(f"the server never had {n} watch streams")


async def test_batch_is_atomic_and_keys_deduplicate(server: ServerProcess) -> None:
    async with Client(server.target) as client:
        with pytest.raises(ClientError) as err:
            await client.submit_batch([task(b"a", key="k1"), task(b"b", pool="nope"), task(b"c")])
        assert err.value.code == "not_found" and "tasks[1].pool" in err.value.message
        with pytest.raises(ClientError) as err:
            await client.submit_batch([task(b"a", key="same"), task(b"b", key="same")])
        assert err.value.code == "invalid_argument"
        assert (await client.snapshot()).totals.submitted == 0  # nothing of either batch was kept

        first = await client.submit_batch([task(b"a", key="k1"), task(b"b")])
        again = await client.submit_batch([task(b"other", key="k1")])
        assert [s.duplicate for s in first] == [False, False]
        assert again[0].id == first[0].id and again[0].duplicate
        assert (await client.get("k1")).id == first[0].id


async def test_list_tasks_pages_in_id_order_with_filters(server: ServerProcess) -> None:
    async with Client(server.target) as client:
        ids = [s.id for s in await client.submit_batch([task(str(i)) for i in range(7)])]
        other = (await client.submit(b"x", pool="other")).id
        await client.cancel(ids[2])
        page1 = await client.list_tasks(pools=["default"], limit=3)
        assert [t.id for t in page1.tasks] == ids[:3] and page1.next_after == ids[2]
        page2 = await client.list_tasks(pools=["default"], after=page1.next_after, limit=3)
        assert [t.id for t in page2.tasks] == ids[3:6]
        page3 = await client.list_tasks(pools=["default"], after=page2.next_after, limit=3)
        assert [t.id for t in page3.tasks] == ids[6:] and page3.next_after == 0
        cancelled = await client.list_tasks(statuses=["cancelled"])
        assert [t.id for t in cancelled.tasks] == [ids[2]]
        everything = await client.list_tasks()
        assert [t.id for t in everything.tasks] == [*ids, other]
        with pytest.raises(ClientError) as err:
            await client.list_tasks(pools=["nope"])
        assert err.value.code == "not_found"


async def test_wait_times_out_while_task_is_pending(server: ServerProcess) -> None:
    async with Client(server.target) as client:
        sub = await client.submit(b"nobody serves this")
        with pytest.raises(TimeoutError):
            await client.wait(sub.id, timeout=0.2)
        with pytest.raises(ClientError) as err:
            await client.wait(123456789)
        assert err.value.code == "not_found"


async def test_watch_terminal_and_all_transitions(server: ServerProcess) -> None:
    async def handler(lease: Lease) -> str:
        return "ok"

    async with Client(server.target) as client:
        terminal: list[tuple[int, str]] = []
        every: list[str] = []

        async def watch_terminal() -> None:
            async for ev in client.watch(["default"]):
                terminal.append((ev.id, ev.status))
                return

        async def watch_all() -> None:
            async for ev in client.watch(all_transitions=True, keys=["watched"]):
                every.append(ev.status)
                if ev.status == "succeeded":
                    return

        w1 = asyncio.create_task(watch_terminal())
        w2 = asyncio.create_task(watch_all())
        await until_watching(server, 2)
        async with worker(server.target, handler):
            sub = await client.submit(b"x", key="watched")
            await asyncio.wait_for(asyncio.gather(w1, w2), 10)
        assert terminal == [(sub.id, "succeeded")]
        assert every == ["blocked", "ready", "running", "succeeded"]


async def test_labels_route_tasks_to_matching_workers(server: ServerProcess) -> None:
    ran_on: dict[int, str] = {}

    def handler_for(name: str) -> Callable[[Lease], Awaitable[None]]:
        async def handler(lease: Lease) -> None:
            ran_on[lease.task_id] = name

        return handler

    async with (
        worker(server.target, handler_for("plain"), name="plain"),
        worker(server.target, handler_for("gpu"), name="gpu", labels={"gpu": "a100", "zone": "x"}),
        Client(server.target) as client,
    ):
        gpu_tasks = [(await client.submit(b"g", labels={"gpu": "a100"})).id for _ in range(4)]
        none = (await client.submit(b"n", labels={"gpu": "h100"})).id
        for t in gpu_tasks:
            assert (await client.wait(t, timeout=10)).status == "succeeded"
        assert {ran_on[t] for t in gpu_tasks} == {"gpu"}
        assert (await client.get(none)).status == "ready"  # no worker has gpu=h100
        workers = await client.list_workers()
        assert sorted(w.name for w in workers) == ["gpu", "plain"]
        snap = await client.snapshot()
        groups = {tuple(sorted(g.labels.items())): g.capacity for g in snap.pool("default").groups}
        assert groups[(("gpu", "a100"), ("zone", "x"))] == 1


async def test_sdk_worker_respects_granted_slots(server: ServerProcess) -> None:
    running = 0
    peak = 0
    gate = asyncio.Event()

    async def handler(lease: Lease) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await gate.wait()
        running -= 1

    async with worker(server.target, handler, pool="other", slots=50) as w, Client(server.target) as client:
        assert w.granted_slots == 4  # pool "other" has max = 4
        subs = [await client.submit(b"x", pool="other") for _ in range(10)]
        for _ in range(200):
            if running == 4:
                break
            await asyncio.sleep(0.01)
        assert (await client.snapshot()).pool("other").busy == 4
        gate.set()
        for s in subs:
            assert (await client.wait(s.id, timeout=10)).status == "succeeded"
    assert peak == 4


# max_message_bytes above grpc's 4 MiB default, and a pool whose retry backoff would outlast any wait.
LARGE_AND_SLOW_RETRY = """
[limits]
max_message_bytes = 16777216

[[pools]]
name = "default"
max = 4
retry = { max_attempts = 2, initial_backoff_s = 60, multiplier = 1.0, max_backoff_s = 60, jitter = false }
"""


@pytest.fixture
def large_server(tmp_path: Path) -> Iterator[ServerProcess]:
    with running_server(tmp_path, LARGE_AND_SLOW_RETRY) as proc:
        yield proc


async def test_messages_over_grpcs_default_limit_reach_sdk_workers_and_clients(
    large_server: ServerProcess,
) -> None:
    payload = bytes(range(256)) * (5 * 4096)  # 5 MiB

    async def handler(lease: Lease) -> bytes:
        return lease.payload[::-1]

    async with worker(large_server.target, handler) as w, Client(large_server.target) as client:
        sub = await client.submit(payload)
        result = await client.wait(sub.id, timeout=20)
        assert result.status == "succeeded" and result.output == payload[::-1]
        assert w.connections == 1  # the lease did not tear the stream down


async def test_a_retry_policy_without_initial_backoff_waits_the_pools_backoff(
    large_server: ServerProcess,
) -> None:
    """What docs/sdk-python.md says of missing retry fields: they are sent as 0, which the server reads as
    the pool's value, so the retry waits the pool's 60 s initial backoff rather than coming at once."""
    attempts: list[int] = []

    async def handler(lease: Lease) -> str:
        attempts.append(lease.attempt)
        raise RuntimeError("fails")

    async with worker(large_server.target, handler), Client(large_server.target) as client:
        # Without jitter: the SDK's default (full jitter) would draw the delay from [0, 60 s], and 2 % of
        # draws come within the 1.5 s below (a full-suite run drew one).
        sub = await client.submit(b"x", retry={"multiplier": 2.0, "jitter": False})
        deadline = asyncio.get_running_loop().time() + 10
        while (info := await client.get(sub.id)).status != "retrying":
            assert asyncio.get_running_loop().time() < deadline, info
            await asyncio.sleep(0.02)
        # An immediate retry would run (and fail) within milliseconds; 60 s of backoff keeps it waiting.
        with pytest.raises(TimeoutError):
            await client.wait(sub.id, timeout=1.5)
        assert attempts == [1] and (await client.get(sub.id)).status == "retrying"
