"""Worker against a scripted Workers service: handshake, slots, outcomes, heartbeats, aborts."""

from __future__ import annotations

import asyncio
import json
import threading
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import pytest

import cronoq
from cronoq.client import PROTOCOL_VERSION, CancelTask, Lease, Reject, Worker

from .scripted import TIMEOUT, WorkersServer, running


async def test_registers_first_and_exposes_the_grant(workers: WorkersServer) -> None:
    worker = Worker(workers.target, "gpu", _never, slots=4, token="s3cret", name="w1", labels={"gpu": "a100"})
    async with running(worker):
        stream = await workers.accept()
        register = await stream.handshake(slots=2, ttl=9.0, max_bytes=1 << 20)
        await worker.wait_registered(TIMEOUT)

        assert stream.kinds()[0] == "register"
        assert (register.pool, register.slots, register.worker_name) == ("gpu", 4, "w1")
        assert register.protocol_version == PROTOCOL_VERSION == 3
        assert dict(register.labels) == {"gpu": "a100"}
        assert workers.metadata[0]["authorization"] == "Bearer s3cret"
        assert worker.running
        assert (worker.worker_id, worker.lease_ttl, worker.granted_slots) == (42, 9.0, 2)
        assert (worker.server_protocol, worker.max_message_bytes, worker.connections) == (3, 1 << 20, 1)


async def test_wait_registered_times_out_and_reports_a_worker_that_ended(workers: WorkersServer) -> None:
    worker = Worker(workers.target, "default", _never, reconnect=False)
    async with running(worker) as task:
        stream = await workers.accept()
        with pytest.raises(TimeoutError):
            await worker.wait_registered(0.01)
        stream.end()
        with pytest.raises(RuntimeError, match="before it registered"):
            await worker.wait_registered(TIMEOUT)
        await task  # the stream ended cleanly and reconnect is off: run() returns


async def test_lease_fields_reach_the_handler(workers: WorkersServer) -> None:
    seen: list[Lease] = []

    async def handler(lease: Lease) -> None:
        seen.append(lease)

    async with running(Worker(workers.target, "p", handler)):
        stream = await workers.accept()
        await stream.handshake(ttl=30.0)
        await stream.lease(
            7,
            b'{"n": 1}',
            content_type="application/json",
            kind="resize",
            key="k1",
            tags={"a": "b"},
            timeout_s=2.5,
            deadline_unix_ns=1_700_000_000_500_000_000,
            pool="p",
            priority=2,
        )
        await stream.next("complete")

    lease = seen[0]
    assert (lease.id, lease.task_id, lease.attempt) == (7, 1007, 1)
    assert (lease.payload, lease.content_type, lease.json(), lease.text()) == (
        b'{"n": 1}',
        "application/json",
        {"n": 1},
        '{"n": 1}',
    )
    assert (lease.kind, lease.key, lease.tags, lease.pool, lease.priority) == (
        "resize",
        "k1",
        {"a": "b"},
        "p",
        "high",
    )
    assert (lease.timeout, lease.deadline, lease.lease_ttl) == (2.5, 1_700_000_000.5, 30.0)
    assert not lease.cancelled.is_set()


async def _never(lease: Lease) -> None:
    await asyncio.Event().wait()


class Boom(Exception):
    pass


def _raiser(exc: BaseException) -> Callable[[Lease], Any]:
    async def handler(lease: Lease) -> None:
        raise exc

    return handler


def _returner(value: object) -> Callable[[Lease], Any]:
    async def handler(lease: Lease) -> object:
        return value

    return handler


OUTCOMES: list[tuple[str, Callable[[Lease], Any], str, dict[str, Any]]] = [
    (
        "json",
        _returner({"a": [1, "é"]}),
        "complete",
        {"output": '{"a":[1,"é"]}'.encode(), "content_type": "application/json"},
    ),
    (
        "bytes",
        _returner(b"\x00\x01"),
        "complete",
        {"output": b"\x00\x01", "content_type": "application/octet-stream"},
    ),
    (
        "text",
        _returner("héllo"),
        "complete",
        {"output": "héllo".encode(), "content_type": "text/plain; charset=utf-8"},
    ),
    ("none", _returner(None), "complete", {"output": b"", "content_type": ""}),
    ("not json", _returner(object()), "fail", {"permanent": True}),
    ("nan", _returner(float("nan")), "fail", {"permanent": True}),
    ("too big", _returner(b"x" * 1025), "fail", {"permanent": True}),
    (
        "retryable",
        _raiser(cronoq.Retryable("busy", retry_after=3.0)),
        "fail",
        {"message": "busy", "permanent": False, "retry_after_s": 3.0},
    ),
    (
        "permanent",
        _raiser(cronoq.Permanent("bad input")),
        "fail",
        {"message": "bad input", "permanent": True},
    ),
    ("reject", _raiser(Reject("gpu busy")), "nack", {"reason": "gpu busy"}),
    ("cancel task", _raiser(CancelTask("no longer wanted")), "cancelled", {}),
    (
        "other exception",
        _raiser(Boom("disk full")),
        "fail",
        {"message": "Boom: disk full", "permanent": False},
    ),
    (
        "own CancelledError",
        _raiser(asyncio.CancelledError()),
        "fail",
        {"message": "CancelledError: raised by the handler", "permanent": False},
    ),
]


@pytest.mark.parametrize(
    ("handler", "kind", "fields"), [o[1:] for o in OUTCOMES], ids=[o[0] for o in OUTCOMES]
)
async def test_handler_outcome_becomes_the_right_message(
    workers: WorkersServer, handler: Callable[[Lease], Any], kind: str, fields: dict[str, Any]
) -> None:
    async with running(Worker(workers.target, "p", handler)):
        stream = await workers.accept()
        await stream.handshake(max_bytes=2048)  # outputs up to 2048 - 1024 bytes fit
        await stream.lease(5)
        message = await stream.next(kind)

    assert message.lease == 5
    for name, value in fields.items():
        assert getattr(message, name) == value, name
    if kind == "fail" and "retry_after_s" not in fields:
        assert not message.HasField("retry_after_s")
    assert stream.kinds().count(kind) == 1


async def test_output_size_limit_allows_exactly_max_minus_headroom(workers: WorkersServer) -> None:
    async with running(Worker(workers.target, "p", _returner(b"x" * 1024))):
        stream = await workers.accept()
        await stream.handshake(max_bytes=2048)
        await stream.lease(1)
        assert (await stream.next("complete")).output == b"x" * 1024


async def test_sync_handler_runs_in_the_default_executor(workers: WorkersServer) -> None:
    def handler(lease: Lease) -> dict[str, str]:
        return {"thread": threading.current_thread().name, "text": lease.text()}

    async with running(Worker(workers.target, "p", handler)):
        stream = await workers.accept()
        await stream.handshake()
        await stream.lease(1, b"hi")
        output = json.loads((await stream.next("complete")).output)

    assert output["text"] == "hi"
    assert output["thread"] != threading.main_thread().name


async def test_a_sync_callable_returning_a_coroutine_is_awaited(workers: WorkersServer) -> None:
    async with running(Worker(workers.target, "p", lambda lease: _returner("ok")(lease))):
        stream = await workers.accept()
        await stream.handshake()
        await stream.lease(1)
        assert (await stream.next("complete")).output == b"ok"


async def test_reject_on_a_protocol_1_server_is_a_retryable_failure(workers: WorkersServer) -> None:
    async with running(Worker(workers.target, "p", _raiser(Reject("busy")))):
        stream = await workers.accept()
        await stream.handshake(protocol=1)
        await stream.lease(1)
        fail = await stream.next("fail")
    assert (fail.message, fail.permanent) == ("busy", False)


async def test_never_runs_more_than_the_granted_slots(workers: WorkersServer) -> None:
    release = asyncio.Event()
    started: list[int] = []
    running_now = 0
    peak = 0

    async def handler(lease: Lease) -> None:
        nonlocal running_now, peak
        running_now += 1
        peak = max(peak, running_now)
        started.append(lease.id)
        await release.wait()
        running_now -= 1

    worker = Worker(workers.target, "p", handler, slots=3)
    async with running(worker):
        stream = await workers.accept()
        await stream.handshake(slots=2)
        for lease_id in (1, 2, 3):
            await stream.lease(lease_id)
        nack = await stream.next("nack")
        assert nack.lease == 3
        assert "2 slots" in nack.reason
        release.set()
        done = {(await stream.next("complete")).lease for _ in range(2)}
        # The slots are free again: a new lease runs.
        await stream.lease(4)
        assert (await stream.next("complete")).lease == 4

    assert worker.granted_slots == 2
    assert done == {1, 2}
    assert sorted(started) == [1, 2, 4]
    assert peak == 2


async def test_heartbeats_every_third_of_the_registered_ttl(workers: WorkersServer) -> None:
    release = asyncio.Event()

    async def handler(lease: Lease) -> None:
        await release.wait()

    loop = asyncio.get_running_loop()
    async with running(Worker(workers.target, "p", handler)):
        stream = await workers.accept()
        await stream.handshake(ttl=0.3)
        await stream.lease(9)
        leased_at = loop.time()
        beats = []
        for _ in range(3):
            assert (await stream.next("heartbeat")).lease == 9
            beats.append(loop.time())
        release.set()
        await stream.next("complete")

    # Heartbeat k is sent at least k x ttl/3 (0.1 s) after the lease arrived, and the lease arrived
    # after leased_at; delivery delays only make receipts later. (Gaps between receipts are no bound:
    # one delayed heartbeat arrives just before the next.) 0.01 s of timer slack.
    since_lease = [at - leased_at for at in beats]
    assert all(since >= 0.1 * k - 0.01 for k, since in enumerate(since_lease, start=1)), since_lease


async def test_the_lease_ttl_overrides_the_registered_one(workers: WorkersServer) -> None:
    async with running(Worker(workers.target, "p", _never)):
        stream = await workers.accept()
        await stream.handshake(ttl=600.0)  # would mean a heartbeat every 200 s
        await stream.lease(3, lease_ttl_s=0.03)
        for _ in range(3):
            assert (await stream.next("heartbeat")).lease == 3


async def test_no_heartbeats_without_a_ttl(workers: WorkersServer) -> None:
    release = asyncio.Event()

    async def handler(lease: Lease) -> None:
        await release.wait()

    async with running(Worker(workers.target, "p", handler, slots=2)):
        stream = await workers.accept()
        await stream.handshake()
        await stream.lease(1)
        # A second lease with a tiny TTL heartbeats; by the time it has, the first would have too.
        await stream.lease(2, lease_ttl_s=0.03)
        for _ in range(3):
            assert (await stream.next("heartbeat")).lease == 2
        release.set()
        await stream.next("complete")
        assert all(m.heartbeat.lease == 2 for m in stream.log if m.WhichOneof("msg") == "heartbeat")


async def test_abort_cancels_the_handler_sets_cancelled_and_frees_the_slot(workers: WorkersServer) -> None:
    leases: dict[int, Lease] = {}
    cancelled = asyncio.Event()

    async def handler(lease: Lease) -> str:
        leases[lease.id] = lease
        if lease.id == 2:
            return "second"
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise
        return "unreachable"

    async with running(Worker(workers.target, "p", handler, slots=1)):
        stream = await workers.accept()
        await stream.handshake(ttl=0.03)
        await stream.lease(1)
        await stream.next("heartbeat")
        await stream.send(abort={"lease": 1, "reason": "attempt timed out"})
        async with asyncio.timeout(TIMEOUT):
            await cancelled.wait()
        assert leases[1].cancelled.is_set()
        await stream.lease(2)  # the only slot is free again
        assert (await stream.next("complete")).lease == 2
        beats_after_abort = [m for m in stream.log if m.WhichOneof("msg") == "heartbeat"]

    reports = [m for m in stream.log if m.WhichOneof("msg") not in ("register", "heartbeat", "set_slots")]
    assert [m.complete.lease for m in reports] == [2]  # nothing at all was sent for the aborted lease
    assert len([m for m in stream.log if m.WhichOneof("msg") == "heartbeat"]) == len(beats_after_abort)


async def test_abort_of_an_unknown_lease_is_ignored(workers: WorkersServer) -> None:
    async with running(Worker(workers.target, "p", _returner("ok"))):
        stream = await workers.accept()
        await stream.handshake()
        await stream.send(abort={"lease": 99, "reason": "lease expired"})
        await stream.lease(1)
        assert (await stream.next("complete")).lease == 1


# ------------------------------------------------------------------------ reports that go wrong


@pytest.mark.parametrize("retry_after", [-1, float("nan"), float("inf"), "5", True, [1], 10**400], ids=repr)
def test_retryable_refuses_a_retry_after_the_server_would_refuse(retry_after: object) -> None:
    with pytest.raises(ValueError, match="retry_after"):
        cronoq.Retryable("busy", retry_after=retry_after)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("retry_after", "seconds"), [(None, None), (0, 0.0), (2, 2.0), (0.5, 0.5), (timedelta(minutes=1), 60.0)]
)
def test_retryable_takes_seconds_or_a_timedelta(
    retry_after: float | timedelta | None, seconds: float
) -> None:
    assert cronoq.Retryable("busy", retry_after=retry_after).retry_after == seconds


class Exploding(dict[str, int]):
    """An output the JSON encoder fails on with neither TypeError nor ValueError."""

    def items(self) -> Any:
        raise RuntimeError("cannot list the items")


def _nested(depth: int) -> list[object]:
    value: list[object] = []
    for _ in range(depth):
        value = [value]
    return value


def _retry_after_replaced(value: object) -> Callable[[Lease], Any]:
    """A Retryable whose retry_after was replaced after the constructor checked it."""

    async def handler(lease: Lease) -> None:
        err = cronoq.Retryable("busy", retry_after=1)
        err.retry_after = value  # type: ignore[assignment]
        raise err

    return handler


def _retryable_with(retry_after: object) -> Callable[[Lease], Any]:
    async def handler(lease: Lease) -> None:
        raise cronoq.Retryable("busy", retry_after=retry_after)  # type: ignore[arg-type]

    return handler


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text for you")


TRICKY: list[tuple[str, Callable[[Lease], Any], str, dict[str, Any]]] = [
    (
        "Permanent(exception)",
        _raiser(cronoq.Permanent(Boom("bad input"))),
        "fail",
        {"message": "bad input", "permanent": True},
    ),
    (
        "Retryable(exception)",
        _raiser(cronoq.Retryable(Boom("busy"), retry_after=2)),
        "fail",
        {"message": "busy", "permanent": False, "retry_after_s": 2.0},
    ),
    ("Reject(exception)", _raiser(Reject(KeyError("gpu"))), "nack", {"reason": "'gpu'"}),
    (
        "retry_after timedelta",
        _retryable_with(timedelta(seconds=5)),
        "fail",
        {"message": "busy", "retry_after_s": 5.0},
    ),
    (
        "retry_after str",
        _retryable_with("5"),
        "fail",
        {
            "permanent": False,
            "message": "ValueError: retry_after must be a finite number of seconds >= 0 "
            "or a timedelta (got '5')",
        },
    ),
    (
        "retry_after NaN set later",
        _retry_after_replaced(float("nan")),
        "fail",
        {
            "permanent": False,
            "message": "busy (retry_after not sent: retry_after must be a finite number of "
            "seconds >= 0 or a timedelta (got nan))",
        },
    ),
    (
        "retry_after negative set later",
        _retry_after_replaced(-3),
        "fail",
        {"permanent": False},
    ),
    (
        "deeply nested output",
        _returner(_nested(100_000)),
        "fail",
        {"permanent": True},
    ),
    (
        "output breaking the encoder",
        _returner(Exploding(a=1)),
        "fail",
        {
            "permanent": False,
            "message": "the worker could not report how the handler ended: RuntimeError: "
            "cannot list the items",
        },
    ),
    (
        "undecodable file name",  # os.fsdecode(b"/data/\xff.csv"), in a message of the handler's own
        _raiser(Boom("cannot parse /data/\udcff.csv")),
        "fail",
        {"message": "Boom: cannot parse /data/\\udcff.csv", "permanent": False},
    ),
    (
        "unprintable exception",
        _raiser(Unprintable()),
        "fail",
        {"message": "Unprintable", "permanent": False},
    ),
]


@pytest.mark.parametrize(("handler", "kind", "fields"), [t[1:] for t in TRICKY], ids=[t[0] for t in TRICKY])
async def test_every_ending_answers_the_lease_and_stops_its_heartbeats(
    workers: WorkersServer, handler: Callable[[Lease], Any], kind: str, fields: dict[str, Any]
) -> None:
    """However the report goes wrong, the lease is answered (so the server frees the slot) and the worker
    stops heartbeating it; the stream survives, which a retry_after the server refuses would end."""
    release = asyncio.Event()

    async def dispatch(lease: Lease) -> object:
        if lease.id == 2:
            await release.wait()
            return "second"
        return await handler(lease)

    async with running(Worker(workers.target, "p", dispatch, slots=2)):
        stream = await workers.accept()
        await stream.handshake()
        await stream.lease(1, lease_ttl_s=0.03)
        message = await stream.next(kind)
        # Lease 2 beats on the same interval as lease 1 did, from later on: once it has beaten three times,
        # lease 1 would have beaten again had its heartbeat outlived its report.
        await stream.lease(2, lease_ttl_s=0.03)
        for _ in range(3):
            assert (await stream.next("heartbeat")).lease == 2
        reported_at = stream.log.index(next(m for m in stream.log if m.WhichOneof("msg") == kind))
        later = [m.heartbeat.lease for m in stream.log[reported_at:] if m.WhichOneof("msg") == "heartbeat"]
        release.set()
        assert (await stream.next("complete")).lease == 2

    assert message.lease == 1
    for name, value in fields.items():
        assert getattr(message, name) == value, name
    if kind == "fail" and "retry_after_s" not in fields:
        assert not message.HasField("retry_after_s")
    assert 1 not in later
    assert len(workers.metadata) == 1  # one stream all along


async def test_a_lease_over_grpcs_default_receive_limit_reaches_the_handler(workers: WorkersServer) -> None:
    """A server may send leases up to its max_message_bytes, which can be above grpc's 4 MiB default."""
    payload = b"p" * (5 * 1024 * 1024)

    async def handler(lease: Lease) -> int:
        return len(lease.payload)

    async with running(Worker(workers.target, "p", handler)):
        stream = await workers.accept()
        await stream.handshake(max_bytes=16 * 1024 * 1024)
        await stream.lease(1, payload)
        assert (await stream.next("complete")).output == str(len(payload)).encode()
    assert len(workers.metadata) == 1
