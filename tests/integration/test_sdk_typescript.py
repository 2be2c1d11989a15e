"""The TypeScript SDK's worker (``sdk/typescript``, ``runWorker``) against a real server process: every
outcome a handler can have, aborts reaching ``lease.signal``, heartbeats, lease expiry of a frozen
worker, a hand-over by ``Reject``, ``SetSlots(0)`` and the drain on stop, and the fallback to
``Workers.Work``. The worker runs in its own node process (:mod:`.tsworker`); the Python SDK's
``Client`` checks what the server recorded. One server and one worker serve most tests of the module."""

from __future__ import annotations

import asyncio
import signal
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from cronoq.client import Client, Lease
from tests.typescript import sdk_dist

from .conftest import DEFAULT_CONFIG
from .helpers import FAST_RETRY, Scalar, toml_table, worker
from .serverproc import ServerProcess, running_server
from .tsworker import TsWorker, registered

RETRY: dict[str, Scalar] = {"max_attempts": 3, **FAST_RETRY}
# The suite's usual server (pool "default": 16 slots, a 1 s lease TTL, 3 attempts 50 ms apart) and a pool
# for each test that needs a worker of its own.
CONFIG = DEFAULT_CONFIG + "".join(
    toml_table("[pools]", name=name, max=max_, lease_ttl_s=ttl, retry=RETRY)
    for name, max_, ttl in (("handover", 8, None), ("solo", 4, 1), ("drain", 4, None))
)


@pytest.fixture(scope="module")
def dist() -> Path:
    return sdk_dist()


@pytest.fixture(scope="module")
def server(dist: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[ServerProcess]:
    with running_server(tmp_path_factory.mktemp("server"), CONFIG) as proc:
        yield proc


@pytest.fixture(scope="module")
def ts_worker(dist: Path, server: ServerProcess) -> Iterator[TsWorker]:
    """The module's worker on pool ``default``, 4 slots."""
    with registered(dist, target=server.target, pool="default", slots=4, name="ts") as proc:
        yield proc


def payload(step: str, **fields: Any) -> dict[str, Any]:
    return {"do": step, **fields}


# ------------------------------------------------------------------------------------------ outcomes


async def test_registration_asks_for_batches_and_gets_the_slots(
    ts_worker: TsWorker, server: ServerProcess
) -> None:
    first = ts_worker.seen("registered")[0]
    assert (first["grantedSlots"], first["batched"], first["serverProtocol"]) == (4, True, 3)
    assert first["leaseTtl"] == 1 and first["maxMessageBytes"] == 1048576
    async with Client(server.target) as client:
        (seen,) = [w for w in await client.list_workers() if w.name == "ts"]
        assert (seen.pool, seen.slots) == ("default", 4)


async def test_a_returned_value_completes_the_task_and_the_lease_says_what_the_task_is(
    ts_worker: TsWorker, server: ServerProcess
) -> None:
    async with Client(server.target) as client:
        done = await client.submit(
            payload("echo", n=1),
            key="echo-1",
            kind="resize",
            priority="high",
            timeout=5,
            deadline_in=60,
            tags={"team": "render"},
            wait=True,
            wait_timeout=10,
        )
    assert done.result is not None and done.result.status == "succeeded"
    echoed = done.result.json()
    assert echoed["taskId"] == str(done.id) and echoed["attempt"] == 1
    assert {k: echoed[k] for k in ("pool", "kind", "key", "priority", "timeout", "leaseTtl")} == {
        "pool": "default",
        "kind": "resize",
        "key": "echo-1",
        "priority": "high",
        "timeout": 5,
        "leaseTtl": 1,
    }
    assert echoed["tags"]["team"] == "render" and echoed["contentType"] == "application/json"
    assert echoed["payload"] == {"do": "echo", "n": 1} and echoed["deadline"] > 0


async def test_bytes_and_text_outputs_keep_their_content(ts_worker: TsWorker, server: ServerProcess) -> None:
    async with Client(server.target) as client:
        raw = await client.submit(payload("bytes"), wait=True, wait_timeout=10)
        text = await client.submit(payload("complete", value="héllo"), wait=True, wait_timeout=10)
        nothing = await client.submit(payload("complete"), wait=True, wait_timeout=10)
    assert raw.result is not None and raw.result.output == b"\x00\x01\x02\xff"
    assert text.result is not None and text.result.text() == "héllo"
    assert nothing.result is not None and nothing.result.ok and nothing.result.output == b""


@pytest.mark.parametrize(
    ("step", "status", "message", "attempts"),
    [
        (payload("permanent", message="bad input"), "failed", "bad input", 1),
        (payload("throw", message="boom"), "dead_lettered", "TypeError: boom", 3),
        (payload("throw-string", message="oops"), "dead_lettered", "string thrown: oops", 3),
        (payload("retryable", message="later"), "dead_lettered", "later", 3),
        (payload("cancel"), "cancelled", None, 1),
        (
            payload("not-json"),
            "failed",
            "the handler's output is not JSON-encodable: TypeError: NaN is not valid JSON",
            1,
        ),
    ],
    ids=["permanent", "any-error", "a-thrown-string", "retryable", "cancel-task", "output-not-json"],
)
async def test_how_the_handler_ends_decides_the_outcome(
    ts_worker: TsWorker,
    server: ServerProcess,
    step: dict[str, Any],
    status: str,
    message: str | None,
    attempts: int,
) -> None:
    async with Client(server.target) as client:
        done = await client.submit(step, wait=True, wait_timeout=10)
        assert done.result is not None and done.result.status == status
        if message is not None:
            assert done.result.message == message
        assert (await client.get(done.id)).attempt == attempts


async def test_retryable_then_success(ts_worker: TsWorker, server: ServerProcess) -> None:
    async with Client(server.target) as client:
        done = await client.submit(payload("flaky", until=3), wait=True, wait_timeout=10)
    assert done.result is not None and done.result.text() == "attempt 3"


async def test_retry_after_holds_the_next_attempt_back(ts_worker: TsWorker, server: ServerProcess) -> None:
    """The pool retries after 50 ms; ``retryAfter: 0.6`` makes the server wait at least that long."""
    async with Client(server.target) as client:
        sub = await client.submit(payload("retryable", retryAfter=0.6))
        first = await ts_worker.wait_for("finished", taskId=str(sub.id), attempt=1)
        second = await ts_worker.wait_for("started", taskId=str(sub.id), attempt=2)
        await client.cancel(sub.id)
    assert second["at"] - first["at"] >= 0.6


# -------------------------------------------------------------------------------------------- aborts


async def test_an_attempt_timeout_aborts_the_handlers_signal(
    ts_worker: TsWorker, server: ServerProcess
) -> None:
    async with Client(server.target) as client:
        done = await client.submit(payload("sleep", seconds=30), timeout=0.2, wait=True, wait_timeout=15)
    assert done.result is not None and done.result.status == "dead_lettered"
    assert done.result.message == "attempt timed out"
    for attempt in (1, 2, 3):
        aborted = ts_worker.expect("aborted", taskId=str(done.id), attempt=attempt)
        assert aborted["reason"] == "aborted by the server: attempt timed out"


async def test_cancelling_a_running_task_aborts_the_handlers_signal(
    ts_worker: TsWorker, server: ServerProcess
) -> None:
    async with Client(server.target) as client:
        sub = await client.submit(payload("sleep", seconds=30))
        await ts_worker.wait_for("started", taskId=str(sub.id))
        assert await client.cancel(sub.id) is True
        aborted = await ts_worker.wait_for("aborted", taskId=str(sub.id))
        assert aborted["reason"].startswith("aborted by the server: ")
        assert (await client.wait(sub.id, timeout=10)).status == "cancelled"


async def test_heartbeats_keep_a_long_attempt_past_the_lease_ttl(
    ts_worker: TsWorker, server: ServerProcess
) -> None:
    async with Client(server.target) as client:
        expiries = (await client.snapshot()).totals.lease_expiries
        done = await client.submit(payload("sleep", seconds=2.5), wait=True, wait_timeout=15)  # TTL: 1 s
        assert done.result is not None and done.result.text() == "slept 2.5"
        assert (await client.get(done.id)).attempt == 1
        assert (await client.snapshot()).totals.lease_expiries == expiries


async def test_a_frozen_worker_loses_its_lease_to_another(dist: Path, server: ServerProcess) -> None:
    with registered(dist, target=server.target, pool="solo") as frozen:
        async with Client(server.target) as client:
            expiries = (await client.snapshot()).totals.lease_expiries
            sub = await client.submit(payload("sleep", seconds=30), pool="solo")
            await frozen.wait_for("started", taskId=str(sub.id), attempt=1)
            frozen.proc.send_signal(signal.SIGSTOP)

            async def rescue(lease: Lease) -> str:
                return f"rescued on attempt {lease.attempt}"

            async with worker(server.target, rescue, pool="solo"):
                result = await client.wait(sub.id, timeout=15)
            assert result.status == "succeeded" and result.text() == "rescued on attempt 2"
            assert (await client.snapshot()).totals.lease_expiries == expiries + 1


# ------------------------------------------------------------------------------------ hand-over, drain


async def test_reject_hands_the_lease_to_another_worker(dist: Path, server: ServerProcess) -> None:
    async def willing(lease: Lease) -> int:
        return lease.attempt

    with registered(dist, target=server.target, pool="handover", slots=4, rejectAll=True) as picky:
        async with worker(server.target, willing, pool="handover", slots=4), Client(server.target) as client:
            subs = [await client.submit(payload("complete"), pool="handover") for _ in range(8)]
            results = [await client.wait(s.id, timeout=10) for s in subs]
    assert [r.status for r in results] == ["succeeded"] * 8
    assert picky.seen("started"), "the leases all went to the willing worker: nothing was rejected"
    assert [r.json() for r in results] == [1] * 8  # each ran elsewhere within the same attempt


async def test_stop_sends_set_slots_0_and_lets_running_handlers_finish(
    dist: Path, server: ServerProcess
) -> None:
    """On SIGTERM the worker's signal aborts: it sends SetSlots(0) at once (the pool's capacity drops to
    0 while its handlers still run, so the server leases it nothing more), lets the running handlers
    finish and report, and stops; the queued tasks wait for another worker."""
    with registered(dist, target=server.target, pool="drain", slots=2, drainTimeout=20) as draining:
        async with Client(server.target) as client:
            running = [await client.submit(payload("sleep", seconds=4), pool="drain") for _ in range(2)]
            for sub in running:
                await draining.wait_for("started", taskId=str(sub.id))
            queued = [await client.submit(payload("complete", value="later"), pool="drain") for _ in range(2)]
            draining.proc.send_signal(signal.SIGTERM)
            for _ in range(300):  # the handlers run for 4 s: the drop must come well before
                if (await client.snapshot()).pool("drain").capacity == 0:
                    break
                await asyncio.sleep(0.01)
            assert (await client.snapshot()).pool("drain").capacity == 0
            assert not draining.seen("finished"), "SetSlots(0) went out only after the handlers finished"
            assert await asyncio.to_thread(draining.proc.wait, 15) == 0
            draining.expect("stopped")
            for sub in running:
                assert (await client.wait(sub.id, timeout=5)).text() == "slept 4"
            assert [(await client.get(s.id)).status for s in queued] == ["ready", "ready"]
            assert not [e for e in draining.seen("started") if e["taskId"] in {str(s.id) for s in queued}]

            async def rest(lease: Lease) -> str:
                return lease.text()

            async with worker(server.target, rest, pool="drain"):
                assert [(await client.wait(s.id, timeout=10)).status for s in queued] == ["succeeded"] * 2


async def test_handlers_still_running_after_the_drain_timeout_are_aborted(
    dist: Path, server: ServerProcess
) -> None:
    with registered(dist, target=server.target, pool="drain", drainTimeout=0.3) as draining:
        async with Client(server.target) as client:
            sub = await client.submit(payload("sleep", seconds=30), pool="drain")
            await draining.wait_for("started", taskId=str(sub.id))
            assert draining.stop() == 0
            aborted = draining.expect("aborted", taskId=str(sub.id))
            reason = "the worker stopped; the handler did not finish within 0.3 s"
            assert aborted["reason"] == reason
            info = await client.get(sub.id)
            assert (info.attempt, info.message) == (1, reason)  # failed as retryable, waiting for a worker
            assert await client.cancel(sub.id)


# --------------------------------------------------------------------------------------- the streams


async def test_without_the_extension_the_worker_serves_over_workers_work(dist: Path, tmp_path: Path) -> None:
    with (
        running_server(tmp_path, CONFIG.replace("[server]\n", "[server]\nworker_batches = false\n")) as plain,
        registered(dist, target=plain.target, pool="default", slots=2) as ts,
    ):
        assert ts.seen("registered")[0]["batched"] is False
        async with Client(plain.target) as client:
            done = await client.submit(payload("complete", value={"ok": True}), wait=True, wait_timeout=10)
        assert done.result is not None and done.result.json() == {"ok": True}
