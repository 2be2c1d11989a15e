"""Worker connection life cycle: shutdown, reconnect backoff, fatal statuses, shard redirects, stop."""

from __future__ import annotations

import asyncio
import itertools
import socket
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack

import grpc
import pytest

from cronoq import errors
from cronoq.client import MAX_REDIRECTS, ClientError, Lease, Worker
from cronoq.client._connect import ChannelOptions, Endpoint, open_channel
from cronoq.client._worker import LEADER_HUNT_DELAY_S

from .scripted import TIMEOUT, Refusal, WorkersServer, redirect_to, running, serve

UNAVAILABLE = Refusal(grpc.StatusCode.UNAVAILABLE, "standby")


class Enough(Exception):
    """Raised from the patched backoff pause to end run() once a test has seen enough delays."""


def record_pauses(worker: Worker, monkeypatch: pytest.MonkeyPatch, limit: int = 1000) -> list[float]:
    """Replaces the reconnect pause: delays are recorded instead of slept; the ``limit``-th raises."""
    delays: list[float] = []

    async def pause(delay: float) -> None:
        delays.append(delay)
        if len(delays) >= limit:
            raise Enough

    monkeypatch.setattr(worker, "_pause", pause)
    return delays


async def _never(lease: Lease) -> None:
    await asyncio.Event().wait()


async def _echo(lease: Lease) -> bytes:
    return lease.payload


# ------------------------------------------------------------------------------------- reconnect


@pytest.mark.parametrize(("not_leader", "expected_pauses"), [(True, []), (False, [0.1])])
async def test_shutdown_is_recorded_and_reconnects(
    workers: WorkersServer, monkeypatch: pytest.MonkeyPatch, not_leader: bool, expected_pauses: list[float]
) -> None:
    worker = Worker(workers.target, "p", _never)
    pauses = record_pauses(worker, monkeypatch)
    async with running(worker):
        first = await workers.accept()
        await first.handshake()
        await first.send(shutdown={"reason": "leadership moved", "not_leader": not_leader})
        second = await workers.accept()
        await second.handshake()
        await worker.wait_registered(TIMEOUT)

    assert worker.last_shutdown == "leadership moved"
    assert worker.connections == 2
    assert pauses == expected_pauses


async def test_after_not_leader_unavailable_is_retried_briskly_not_with_the_backoff(
    workers: WorkersServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    worker = Worker(workers.target, "p", _never, backoff=(5.0, 5.0))
    pauses = record_pauses(worker, monkeypatch)
    async with running(worker):
        first = await workers.accept()
        await first.handshake()
        workers.refusals = [UNAVAILABLE, UNAVAILABLE, None]  # the standby, twice, then the new leader
        await first.send(shutdown={"reason": "not the leader", "not_leader": True})
        await (await workers.accept()).handshake()
        await worker.wait_registered(TIMEOUT)
    assert pauses == [LEADER_HUNT_DELAY_S, LEADER_HUNT_DELAY_S]
    assert worker.connections == 2


async def test_a_lease_before_registered_ends_the_session(
    workers: WorkersServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    worker = Worker(workers.target, "p", _never)
    pauses = record_pauses(worker, monkeypatch)
    async with running(worker):
        await (await workers.accept()).lease(1)
        await (await workers.accept()).handshake()
        await worker.wait_registered(TIMEOUT)
    assert pauses == [0.1]
    assert worker.connections == 1


async def test_backoff_doubles_up_to_the_maximum(
    workers: WorkersServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    workers.refusals = [UNAVAILABLE] * 10
    worker = Worker(workers.target, "p", _never, backoff=(0.1, 0.5))
    pauses = record_pauses(worker, monkeypatch, limit=6)
    with pytest.raises(Enough):
        await worker.run()
    assert pauses == [0.1, 0.2, 0.4, 0.5, 0.5, 0.5]
    assert workers.connects == 6


@pytest.mark.parametrize(("session_s", "third_pause"), [(0.0, 0.02), (0.25, 0.01)])
async def test_backoff_resets_after_a_session_longer_than_ten_maximum_delays(
    workers: WorkersServer, monkeypatch: pytest.MonkeyPatch, session_s: float, third_pause: float
) -> None:
    workers.refusals = [UNAVAILABLE, UNAVAILABLE, None]
    worker = Worker(workers.target, "p", _never, backoff=(0.01, 0.02))  # 10 x 0.02 = 0.2 s
    pauses = record_pauses(worker, monkeypatch, limit=3)
    async with running(worker) as task:
        stream = await workers.accept()
        await stream.handshake()
        await asyncio.sleep(session_s)  # a lower bound on the session's length, not a race
        stream.end()
        with pytest.raises(Enough):
            await task
    assert pauses == [0.01, 0.02, third_pause]


async def test_an_unreachable_server_is_retried(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]  # closed again: connections are refused
    worker = Worker(f"127.0.0.1:{port}", "p", _never)
    pauses = record_pauses(worker, monkeypatch, limit=2)
    with pytest.raises(Enough):
        await worker.run()
    assert pauses == [0.1, 0.2]


FATAL = [
    (grpc.StatusCode.UNAUTHENTICATED, errors.Unauthenticated),
    (grpc.StatusCode.PERMISSION_DENIED, errors.PermissionDenied),
    (grpc.StatusCode.NOT_FOUND, errors.NotFound),
    (grpc.StatusCode.FAILED_PRECONDITION, errors.FailedPrecondition),
    (grpc.StatusCode.INVALID_ARGUMENT, errors.InvalidArgument),
    (grpc.StatusCode.UNIMPLEMENTED, errors.Unimplemented),
]


@pytest.mark.parametrize(("code", "error"), FATAL, ids=[code.name for code, _ in FATAL])
async def test_fatal_statuses_raise_from_run(
    workers: WorkersServer, code: grpc.StatusCode, error: type[ClientError]
) -> None:
    workers.refusals = [Refusal(code, "no such pool 'p'")]
    with pytest.raises(error, match="no such pool") as raised:
        await Worker(workers.target, "p", _never).run()
    assert raised.value.code == code.name.lower()
    assert workers.connects == 1


async def test_without_reconnect_a_retryable_status_is_raised(workers: WorkersServer) -> None:
    workers.refusals = [UNAVAILABLE]
    with pytest.raises(errors.Unavailable):
        await Worker(workers.target, "p", _never, reconnect=False).run()


def test_a_stopped_worker_runs_again_on_another_loop() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    worker = Worker(f"127.0.0.1:{port}", "p", _never)

    async def run_once() -> None:
        workers = WorkersServer()
        async with serve(workers, port=port), running(worker):
            await (await workers.accept()).handshake()
            await worker.wait_registered(TIMEOUT)

    for round_ in (1, 2):
        asyncio.run(run_once())
        assert not worker.running
        assert worker.connections == round_


# ------------------------------------------------------------------------------------- redirects


@pytest.fixture
async def shards() -> AsyncIterator[list[WorkersServer]]:
    """Five more scripted Workers services."""
    async with AsyncExitStack() as stack:
        servers = [WorkersServer() for _ in range(5)]
        for server in servers:
            await stack.enter_async_context(serve(server))
        yield servers


async def test_follows_a_redirect_and_drops_host_bound_options(
    workers: WorkersServer, shards: list[WorkersServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[tuple[str, dict[str, object]]] = []

    def spy(endpoint: Endpoint, credentials: object, options: ChannelOptions) -> object:
        opened.append((endpoint.address, dict(options)))
        return open_channel(endpoint, credentials, options)

    monkeypatch.setattr("cronoq.client._worker.open_channel", spy)
    workers.refusals = [redirect_to(shards[0].url + "/")]
    options = [("grpc.default_authority", "cronoq.internal"), ("grpc.keepalive_time_ms", 10_000)]
    worker = Worker(workers.target, "p", _echo, token="t" * 20, options=options)
    async with running(worker):
        stream = await shards[0].accept()
        await stream.handshake()
        await stream.lease(1, b"on shard b")
        assert (await stream.next("complete")).output == b"on shard b"

    assert shards[0].metadata[0]["authorization"] == "Bearer " + "t" * 20  # loopback http is fine
    assert opened == [
        (workers.target, dict(options)),
        (shards[0].target, {"grpc.keepalive_time_ms": 10_000}),
    ]


async def test_gives_up_after_max_redirects_in_a_row(shards: list[WorkersServer]) -> None:
    for server, following in itertools.pairwise(shards):
        server.refusals = [redirect_to(following.url)]
    with pytest.raises(errors.FailedPrecondition, match=f"{MAX_REDIRECTS} shard redirects"):
        await Worker(shards[0].target, "p", _never).run()
    assert [s.connects for s in shards] == [1, 1, 1, 1, 0]


async def test_an_unavailable_shard_sends_the_worker_back_to_the_configured_target(
    workers: WorkersServer, shards: list[WorkersServer], monkeypatch: pytest.MonkeyPatch
) -> None:
    # More round trips than MAX_REDIRECTS: a redirect followed by an outage is not "in a row".
    rounds = MAX_REDIRECTS + 1
    workers.refusals = [redirect_to(shards[0].url)] * rounds
    shards[0].refusals = [UNAVAILABLE] * rounds
    worker = Worker(workers.target, "p", _never)
    pauses = record_pauses(worker, monkeypatch)
    async with running(worker):
        await (await workers.accept()).handshake()
        await worker.wait_registered(TIMEOUT)
    assert (workers.connects, shards[0].connects) == (rounds + 1, rounds)
    assert pauses == [0.1, 0.2, 0.4, 0.8]


REFUSED = [
    ("http://user:pw@127.0.0.1:1", "user information"),
    ("http://10.1.2.3:7070", "token over plain http"),
    ("ftp://127.0.0.1:1", "not an http"),
    ("http://127.0.0.1:notaport", "not a valid URL"),
]


@pytest.mark.parametrize(("url", "why"), REFUSED)
async def test_unsafe_redirects_are_refused(workers: WorkersServer, url: str, why: str) -> None:
    workers.refusals = [redirect_to(url)]
    with pytest.raises(errors.FailedPrecondition, match=why):
        await Worker(workers.target, "p", _never, token="secret-token-0123456789").run()
    assert workers.connects == 1


async def test_redirect_in_initial_metadata_is_followed(shards: list[WorkersServer]) -> None:
    class InitialMetadataRedirect(WorkersServer):
        async def Work(self, request_iterator: object, context: grpc.aio.ServicerContext) -> None:
            self.connects += 1
            await context.send_initial_metadata((("cronoq-shard-endpoint", shards[1].url),))
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, "pool is served by shard b")

    redirecting = InitialMetadataRedirect()
    async with serve(redirecting), running(Worker(redirecting.target, "p", _never)):
        await (await shards[1].accept()).handshake()
    assert redirecting.connects == 1


# ------------------------------------------------------------------------------------------ stop


async def test_stop_lets_running_handlers_finish_within_grace(workers: WorkersServer) -> None:
    release = asyncio.Event()
    started: set[int] = set()
    both_started = asyncio.Event()

    async def handler(lease: Lease) -> str:
        started.add(lease.id)
        if len(started) == 2:
            both_started.set()
        await release.wait()
        return "finished"

    worker = Worker(workers.target, "p", handler, slots=2)
    async with running(worker) as task:
        stream = await workers.accept()
        await stream.handshake()
        await stream.lease(1)
        await stream.lease(2)
        async with asyncio.timeout(TIMEOUT):
            await both_started.wait()
        stopping = [asyncio.create_task(worker.stop(grace=TIMEOUT)) for _ in range(2)]
        assert (await stream.next("set_slots")).slots == 0
        await stream.lease(3)  # arrives while draining: handed back
        assert (await stream.next("nack")).lease == 3
        release.set()
        assert {(await stream.next("complete")).lease for _ in range(2)} == {1, 2}
        async with asyncio.timeout(TIMEOUT):
            await stream.half_closed.wait()
            await asyncio.gather(*stopping)
            await task
    assert stream.kinds().count("set_slots") == 1  # both stop() calls shared one drain
    assert not worker.running


async def test_stop_cancels_handlers_still_running_after_grace(workers: WorkersServer) -> None:
    started = asyncio.Event()
    cancelled = asyncio.Event()
    leases: list[Lease] = []

    async def handler(lease: Lease) -> None:
        leases.append(lease)
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            cancelled.set()

    worker = Worker(workers.target, "p", handler, grace=0.05)
    async with running(worker) as task:
        stream = await workers.accept()
        await stream.handshake()
        await stream.lease(1)
        async with asyncio.timeout(TIMEOUT):
            await started.wait()
        await asyncio.wait_for(worker.stop(), TIMEOUT)
        fail = await stream.next("fail")
        assert task.done()

    assert cancelled.is_set() and leases[0].cancelled.is_set()
    assert (fail.lease, fail.permanent) == (1, False)
    assert "stopped" in fail.message
    assert stream.kinds()[-2:] == ["set_slots", "fail"]
    assert stream.half_closed.is_set()


async def test_stop_while_waiting_to_reconnect_returns_at_once(workers: WorkersServer) -> None:
    workers.refusals = [UNAVAILABLE]
    worker = Worker(workers.target, "p", _never, backoff=(60.0, 60.0))
    async with running(worker) as task:
        await asyncio.wait_for(workers.connected.wait(), TIMEOUT)
        await asyncio.wait_for(worker.stop(), TIMEOUT)
        assert task.done()


async def test_stop_gives_up_on_a_server_that_does_not_close_the_stream(
    workers: WorkersServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr("cronoq.client._worker.CLOSE_WAIT", 0.05)
    workers.end_on_half_close = False
    worker = Worker(workers.target, "p", _never)
    async with running(worker) as task:
        stream = await workers.accept()
        await stream.handshake()
        await worker.wait_registered(TIMEOUT)
        await asyncio.wait_for(worker.stop(), TIMEOUT)
        assert task.done() and not task.cancelled()
        assert stream.half_closed.is_set()
