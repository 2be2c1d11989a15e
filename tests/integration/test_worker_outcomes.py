"""Every worker outcome against a real server process, through the Python SDK."""

from __future__ import annotations

import asyncio
import signal
from pathlib import Path

import pytest

import cronoq
from cronoq.client import CancelTask, Client, Lease, Reject

from .conftest import DEFAULT_CONFIG
from .helpers import SubprocessWorker, worker
from .serverproc import ServerProcess, running_server

pytestmark = pytest.mark.asyncio


async def test_complete_returns_output(server: ServerProcess) -> None:
    async def handler(lease: Lease) -> dict[str, object]:
        return {"doubled": lease.json()["n"] * 2, "attempt": lease.attempt}

    async with worker(server.target, handler), Client(server.target) as client:
        done = await client.submit({"n": 21}, wait=True, wait_timeout=10)
        assert done.result is not None
        assert done.result.status == "succeeded"
        assert done.result.json() == {"doubled": 42, "attempt": 1}
        info = await client.get(done.id)
        assert info.status == "succeeded" and info.attempt == 1 and info.output_available


async def test_retryable_then_success(server: ServerProcess) -> None:
    async def handler(lease: Lease) -> str:
        if lease.attempt < 3:
            raise cronoq.Retryable(f"flaky {lease.attempt}")
        return "third time"

    async with worker(server.target, handler), Client(server.target) as client:
        done = await client.submit(b"x", wait=True, wait_timeout=10)
        assert done.result is not None and done.result.status == "succeeded"
        assert done.result.text() == "third time"
        assert (await client.get(done.id)).attempt == 3
        snap = await client.snapshot()
        assert snap.totals.retries == 2


async def test_retries_exhausted_dead_letters(server: ServerProcess) -> None:
    async def handler(lease: Lease) -> None:
        raise ValueError(f"boom {lease.attempt}")

    async with worker(server.target, handler), Client(server.target) as client:
        done = await client.submit(b"x", wait=True, wait_timeout=10)
        assert done.result is not None and done.result.status == "dead_lettered"
        assert done.result.message == "ValueError: boom 3"
        assert (await client.snapshot()).totals.dead_lettered == 1


async def test_permanent_fails_without_retry(server: ServerProcess) -> None:
    async def handler(lease: Lease) -> None:
        raise cronoq.Permanent("bad input")

    async with worker(server.target, handler), Client(server.target) as client:
        done = await client.submit(b"x", wait=True, wait_timeout=10)
        assert done.result is not None and done.result.status == "failed"
        assert done.result.message == "bad input"
        assert (await client.get(done.id)).attempt == 1


async def test_cancel_task_from_handler(server: ServerProcess) -> None:
    async def handler(lease: Lease) -> None:
        raise CancelTask()

    async with worker(server.target, handler), Client(server.target) as client:
        done = await client.submit(b"x", wait=True, wait_timeout=10)
        assert done.result is not None and done.result.status == "cancelled"


async def test_reject_hands_over_to_another_worker(server: ServerProcess) -> None:
    rejected: list[int] = []

    async def picky(lease: Lease) -> str:
        rejected.append(lease.task_id)
        raise Reject("not for me")

    async def willing(lease: Lease) -> int:
        return lease.attempt

    async with (
        worker(server.target, picky, name="picky", slots=4),
        worker(server.target, willing, name="willing", slots=4),
        Client(server.target) as client,
    ):
        subs = [await client.submit(b"x") for _ in range(8)]
        results = [await client.wait(s.id, timeout=10) for s in subs]
    assert [r.status for r in results] == ["succeeded"] * 8
    # Leases were spread over both workers; every rejected one ran elsewhere within the same attempt.
    assert rejected
    assert [r.json() for r in results] == [1] * 8


async def test_cancel_running_task_reaches_handler(server: ServerProcess) -> None:
    started = asyncio.Event()
    observed: list[bool] = []

    async def handler(lease: Lease) -> None:
        started.set()
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            observed.append(lease.cancelled.is_set())
            raise

    async with worker(server.target, handler), Client(server.target) as client:
        sub = await client.submit(b"x")
        await asyncio.wait_for(started.wait(), 10)
        assert await client.cancel(sub.id) is True
        result = await client.wait(sub.id, timeout=10)
        assert result.status == "cancelled"
        for _ in range(200):
            if observed:
                break
            await asyncio.sleep(0.01)
        assert observed == [True]
        assert await client.cancel(sub.id) is False


async def test_frozen_worker_loses_lease_and_task_succeeds_elsewhere(server: ServerProcess) -> None:
    frozen = SubprocessWorker(server.target)
    try:
        async with Client(server.target) as client:
            sub = await client.submit(b"30")  # the subprocess would sleep 30 s
            task_id, attempt = await frozen.expect_start()
            assert (task_id, attempt) == (sub.id, 1)
            frozen.proc.send_signal(signal.SIGSTOP)

            async def fast(lease: Lease) -> str:
                return f"rescued on attempt {lease.attempt}"

            async with worker(server.target, fast):
                result = await client.wait(sub.id, timeout=15)
            assert result.status == "succeeded"
            assert result.text() == "rescued on attempt 2"
            snap = await client.snapshot()
            assert snap.totals.lease_expiries == 1
    finally:
        frozen.proc.send_signal(signal.SIGCONT)
        frozen.close()


async def test_killed_worker_leases_are_retried(server: ServerProcess) -> None:
    doomed = SubprocessWorker(server.target, slots=2)
    try:
        async with Client(server.target) as client:
            a = await client.submit(b"30")
            b = await client.submit(b"30")
            started = {(await doomed.expect_start())[0], (await doomed.expect_start())[0]}
            assert started == {a.id, b.id}
            doomed.proc.kill()
            doomed.proc.wait(10)

            async def fast(lease: Lease) -> int:
                return lease.attempt

            async with worker(server.target, fast, slots=2):
                ra = await client.wait(a.id, timeout=15)
                rb = await client.wait(b.id, timeout=15)
            assert (ra.status, rb.status) == ("succeeded", "succeeded")
            assert ra.json() == 2 and rb.json() == 2
    finally:
        doomed.close()


async def test_heartbeats_keep_a_long_attempt_past_the_lease_ttl(server: ServerProcess) -> None:
    async def slow(lease: Lease) -> int:
        assert lease.lease_ttl == pytest.approx(1.0)
        await asyncio.sleep(2.5)  # the work itself: 2.5 x the pool's 1 s lease TTL
        return lease.attempt

    async with worker(server.target, slow), Client(server.target) as client:
        done = await client.submit(b"x", wait=True, wait_timeout=15)
        assert done.result is not None and done.result.status == "succeeded"
        assert done.result.json() == 1
        assert (await client.snapshot()).totals.lease_expiries == 0


async def test_attempt_timeout_aborts_and_retries(server: ServerProcess) -> None:
    cancelled: list[int] = []

    async def stuck(lease: Lease) -> None:
        try:
            await asyncio.sleep(30)
        except asyncio.CancelledError:
            cancelled.append(lease.attempt)
            raise

    async with worker(server.target, stuck), Client(server.target) as client:
        done = await client.submit(b"x", timeout=0.2, wait=True, wait_timeout=15)
        assert done.result is not None and done.result.status == "dead_lettered"
        assert done.result.message == "attempt timed out"
        snap = await client.snapshot()
        assert snap.totals.timeouts == 3 and snap.totals.retries == 2
    assert sorted(cancelled) == [1, 2, 3]


async def test_an_invalid_retry_after_does_not_end_the_workers_stream(server: ServerProcess) -> None:
    """The server ends a stream that sends retry_after_s NaN (INVALID_ARGUMENT, fatal for the worker),
    so the SDK leaves out a retry_after that was made invalid after the Retryable checked it."""

    async def handler(lease: Lease) -> str:
        if lease.attempt == 1:
            err = cronoq.Retryable("try again")
            err.retry_after = float("nan")
            raise err
        return "second"

    async with worker(server.target, handler) as w, Client(server.target) as client:
        done = await client.submit(b"x", wait=True, wait_timeout=10)
        assert done.result is not None and done.result.text() == "second"
        info = await client.get(done.id)
        assert info.attempt == 2
        assert w.running and w.connections == 1


@pytest.mark.parametrize("raised", ["permanent", "exception", "reject"])
async def test_a_report_with_a_huge_text_does_not_end_the_workers_stream(
    server: ServerProcess, raised: str
) -> None:
    """A failure's message (or a nack's reason) longer than the server's message limit ended the
    worker's stream: every lease on it was retried, and a Permanent failure was retried until it was
    dead-lettered as "worker disconnected". The SDK cuts the text to what a server keeps."""
    huge = "x" * 5_000_000  # over the server's limits.max_message_bytes (1 MiB here)
    other_started = asyncio.Event()

    async def handler(lease: Lease) -> str:
        if lease.payload == b"other":
            other_started.set()
            await asyncio.sleep(0.3)  # running on the same stream while the huge report goes out
            return "other"
        await other_started.wait()
        if raised == "permanent":
            raise cronoq.Permanent(huge)
        if raised == "reject":
            if lease.attempt == 1 and not rejected:
                rejected.append(lease.task_id)
                raise Reject(huge)
            return "second lease"
        raise ValueError(huge)

    rejected: list[int] = []
    async with worker(server.target, handler, slots=2) as w, Client(server.target) as client:
        other = await client.submit(b"other")
        done = await client.submit(b"huge", wait=True, wait_timeout=20)
        assert done.result is not None
        other_done = await client.wait(other.id, timeout=10)
        assert other_done.status == "succeeded" and other_done.text() == "other"
        info = await client.get(done.id)
        assert w.connections == 1  # the stream was never ended
    if raised == "reject":  # no other worker: the attempt failed as retryable, the next one ran
        assert rejected == [done.id] and done.result.text() == "second lease" and info.attempt == 2
        return
    expected = ("failed", 1) if raised == "permanent" else ("dead_lettered", 3)
    assert (done.result.status, info.attempt) == expected
    text = huge if raised == "permanent" else f"ValueError: {huge}"
    suffix = f"... (cut: {len(text):,} characters)"
    assert done.result.message == text[: 8192 - len(suffix)] + suffix


async def test_a_report_is_cut_to_fit_a_small_message_limit(tmp_path: Path) -> None:
    """Under 8,192 characters but over a small ``max_message_bytes`` in UTF-8 (2 bytes a character
    here): cut to fit, not sent whole to end the stream."""
    config = DEFAULT_CONFIG.replace("max_message_bytes = 1048576", "max_message_bytes = 4096")

    async def handler(lease: Lease) -> None:
        raise cronoq.Permanent("é" * 8000)

    with running_server(tmp_path, config) as server:
        async with worker(server.target, handler) as w, Client(server.target) as client:
            done = await client.submit(b"x", wait=True, wait_timeout=10)
            assert w.connections == 1
    assert done.result is not None and done.result.status == "failed"
    message = done.result.message
    assert message.startswith("é" * 1000) and message.endswith("... (cut: 8,000 characters)")
    assert len(message.encode()) <= 4096 - 1024  # the SDK keeps 1 KiB for the rest of the message
