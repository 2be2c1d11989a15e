"""Durability with the SQLite store, against real server processes: nothing accepted is lost to a crash,
running attempts are retried, results survive restarts, and a second process on the file stands by."""

from __future__ import annotations

import asyncio
import signal
import sqlite3
import time
import urllib.error
import urllib.request
from contextlib import closing
from pathlib import Path

import pytest

from cronoq.client import Client, Lease, task
from cronoq.errors import NotFound, Unavailable

from .helpers import durable_config, sqlite_store, worker
from .serverproc import ServerProcess, leader_and_standby, new_server

pytestmark = pytest.mark.asyncio

EPOCH_SHIFT = 48


def refusal_headers(url: str) -> dict[str, str]:
    """The headers of an HTTP error answer (fails if the request succeeds)."""
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(url, timeout=5)
    return dict(refused.value.headers)


def metrics_text(server: ServerProcess) -> str:
    with urllib.request.urlopen(f"{server.http}/metrics", timeout=5) as response:
        return str(response.read().decode())


def lease_expiry(db: Path) -> int:
    """When the lease in the file runs out unless renewed (Unix ns)."""
    with closing(sqlite3.connect(db)) as conn:
        return int(conn.execute("SELECT expires_unix_ns FROM cronoq_leader").fetchone()[0])


async def wait_all_done(client: Client, ids: list[int], timeout: float = 30.0) -> dict[int, str]:
    """Wait for every task (server-side waits, no polling) and return its final status."""
    results = await asyncio.wait_for(
        asyncio.gather(*(client.wait(i, timeout=timeout) for i in ids)), timeout + 5
    )
    return {r.id: r.status for r in results}


async def test_kill_9_with_300_queued_tasks_loses_none(tmp_path: Path) -> None:
    db = tmp_path / "cronoq.db"
    server = new_server(tmp_path / "a", durable_config(sqlite_store(db)))
    server.start()
    try:
        async with Client(server.target) as client:
            accepted: list[int] = []
            for b in range(3):
                batch = [task({"n": b * 100 + i}, key=f"k{b * 100 + i}") for i in range(100)]
                accepted += [s.id for s in await client.submit_batch(batch)]
        assert len(set(accepted)) == 300 and all(i >> EPOCH_SHIFT == 1 for i in accepted)
        expires = lease_expiry(db)
        server.kill()

        server.start()
        # The lease names the process that held it: a restart does not wait out a dead one's lease.
        assert time.time_ns() < expires
        async with Client(server.target) as client:
            listed = [t async for t in client.iter_tasks()]
            assert sorted(t.id for t in listed) == sorted(accepted)
            assert {t.status for t in listed} == {"ready"}
            again = await client.submit_batch([task({"n": 0}, key="k0"), task({"n": -1}, key="new")])
            assert again[0].duplicate and again[0].id == accepted[0]  # keys survived the crash
            assert again[1].id >> EPOCH_SHIFT == 2  # a new leader, a new epoch: ids never repeat

            seen: list[int] = []

            async def handler(lease: Lease) -> int:
                seen.append(lease.task_id)
                return int(lease.json()["n"])

            async with worker(server.target, handler, slots=32):
                statuses = await wait_all_done(client, [*accepted, again[1].id])
            assert set(statuses.values()) == {"succeeded"}
            assert sorted(seen) == sorted([*accepted, again[1].id])  # each ran exactly once
    finally:
        server.stop()


async def test_running_attempt_is_retried_after_a_crash_and_results_survive(tmp_path: Path) -> None:
    server = new_server(tmp_path / "a", durable_config(sqlite_store(tmp_path / "cronoq.db")))
    server.start()
    started = asyncio.Event()

    async def first_handler(lease: Lease) -> str:
        if lease.key == "slow":
            started.set()
            await asyncio.Event().wait()  # runs until the server dies
        return f"out-{lease.key}"

    try:
        async with (
            Client(server.target) as client,
            worker(server.target, first_handler, slots=2, reconnect=False),
        ):
            fast = await client.submit(b"f", key="fast", wait=True, wait_timeout=10)
            assert fast.result is not None and fast.result.text() == "out-fast"
            slow = await client.submit(b"s", key="slow")
            await asyncio.wait_for(started.wait(), 10)
            server.kill()
        server.start()
        async with Client(server.target) as client:
            info = await client.get(slow.id)
            assert (info.status, info.attempt) in {("ready", 1), ("retrying", 1)}
            assert info.message == "attempt lost in failover"
            done = await client.wait(fast.id, timeout=5)  # finished before the crash: output kept
            assert done.status == "succeeded" and done.text() == "out-fast"
            assert (await client.get("fast")).output_available

            async def second_handler(lease: Lease) -> str:
                return f"attempt {lease.attempt}"

            async with worker(server.target, second_handler):
                result = await client.wait(slow.id, timeout=10)
            assert (result.status, result.text()) == ("succeeded", "attempt 2")
    finally:
        server.stop()


async def test_a_second_server_on_the_file_stands_by_and_takes_over_on_sigterm(tmp_path: Path) -> None:
    with leader_and_standby(tmp_path, durable_config(sqlite_store(tmp_path / "cronoq.db"))) as (
        leader,
        standby,
    ):
        assert (standby.probe("/healthz"), standby.probe("/readyz")) == (200, 503)
        async with Client(leader.target) as client:
            submitted = await client.submit(b"x", key="before")
        async with Client(standby.target) as client:
            with pytest.raises(Unavailable):
                await client.submit(b"y")
        assert standby.probe("/v1/tasks/before") == 503
        # The refusal closes the connection, so the client's next request goes through the load
        # balancer again.
        assert refusal_headers(f"{standby.http}/v1/tasks/before")["Connection"] == "close"
        assert 'cronoq_leader{shard=""} 0' in metrics_text(standby)
        leader_metrics = metrics_text(leader)
        assert 'cronoq_leader{shard=""} 1' in leader_metrics
        assert "cronoq_store_commits_total" in leader_metrics
        assert 'cronoq_store_commit_seconds{quantile="0.99"}' in leader_metrics

        leader.signal(signal.SIGTERM)
        assert leader.wait(20) == 0
        standby.wait_probe("/readyz", 200, timeout=5)  # a clean shutdown frees the lease at once
        async with Client(standby.target) as client:
            info = await client.get("before")
            assert info.id == submitted.id and info.status == "ready"


async def test_a_standby_takes_over_from_a_killed_leader_before_its_lease_runs_out(tmp_path: Path) -> None:
    """The standby sees that the process the lease names is gone: it leads while that lease (10 s,
    renewed every 2 s) still had seconds to run."""
    db = tmp_path / "cronoq.db"
    with leader_and_standby(tmp_path, durable_config(sqlite_store(db))) as (leader, standby):
        async with Client(leader.target) as client:
            submitted = await client.submit(b"x", key="k")
        expires = lease_expiry(db)
        leader.kill()
        standby.wait_probe("/readyz", 200, timeout=20)
        assert time.time_ns() < expires
        async with Client(standby.target) as client:
            assert (await client.get("k")).id == submitted.id
            assert (await client.submit(b"y")).id >> EPOCH_SHIFT == 2


async def echo(lease: Lease) -> bytes:
    return lease.payload


async def test_snapshot_totals_count_on_across_a_failover(tmp_path: Path) -> None:
    """Each commit keeps the engine's totals with its tasks, and a new leader counts on from the last
    ones: the totals a snapshot shows never go back when a standby takes over. (A new leader counted
    from zero: work submitted before the failover and finished after it then showed more tasks
    succeeded than submitted.)"""
    with leader_and_standby(tmp_path, durable_config(sqlite_store(tmp_path / "cronoq.db"))) as (
        leader,
        standby,
    ):
        async with Client(leader.target) as client:
            async with worker(leader.target, echo):
                await wait_all_done(client, [(await client.submit(b"ran")).id for _ in range(5)])
            queued = [(await client.submit(b"queued")).id for _ in range(3)]  # no worker now
            before = (await client.snapshot()).totals
        assert (before.submitted, before.dispatched, before.succeeded) == (8, 5, 5)
        leader.kill()  # what counts is what was committed: nothing is written at a shutdown
        standby.wait_probe("/readyz", 200, timeout=20)
        async with Client(standby.target) as client:
            assert (await client.snapshot()).totals == before
            async with worker(standby.target, echo):
                await wait_all_done(client, queued)
            after = (await client.snapshot()).totals
        assert (after.submitted, after.dispatched, after.succeeded) == (8, 8, 8)


async def test_finished_tasks_are_pruned_after_keep_finished_s(tmp_path: Path) -> None:
    body = durable_config(sqlite_store(tmp_path / "cronoq.db", keep_finished_s=1))
    server = new_server(tmp_path / "a", body)
    server.start()
    try:
        async with Client(server.target) as client:
            async with worker(server.target, lambda lease: asyncio.sleep(0, "done")):
                done = await client.submit(b"x", key="old", wait=True, wait_timeout=10)
            assert done.result is not None and done.result.status == "succeeded"
            live = await client.submit(b"y", key="live")  # no worker now: stays queued, never pruned
        server.stop()
        await asyncio.sleep(1.1)  # let the finished task age past keep_finished_s (the bound, not a race)
        server.start()  # the new leader prunes at once, and does not load what is past retention
        async with Client(server.target) as client:
            deadline = time.monotonic() + 10
            while True:
                try:
                    await client.get(done.id)
                except NotFound:
                    break
                assert time.monotonic() < deadline, "the finished task was not pruned"
                await asyncio.sleep(0.05)
            assert not (await client.submit(b"z", key="old")).duplicate  # its key is free again
            assert (await client.get(live.id)).status == "ready"
    finally:
        server.stop()


async def test_a_store_that_breaks_under_the_servers_ends_both_with_a_failure_status(tmp_path: Path) -> None:
    """Leadership that fails for good (here the lease table is gone) must end the process with a non-zero
    status naming the failure, not leave it up, unready for ever, with ``/healthz`` still 200."""
    db = tmp_path / "cronoq.db"
    with leader_and_standby(tmp_path, durable_config(sqlite_store(db))) as (leader, standby):
        with sqlite3.connect(db) as conn:
            conn.execute("DROP TABLE cronoq_leader")
        for server in (leader, standby):  # the leader's renewal and the standby's poll both hit it
            assert server.wait(timeout=30) == 1, server.logs()
            assert "leadership_failed" in server.logs() and "cronoq-server: stopped: leadership failed" in (
                server.logs()
            )
