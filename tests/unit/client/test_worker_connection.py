"""Worker connection life cycle: shutdown, reconnect backoff, fatal statuses, shard redirects, stop."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import itertools
import logging
import socket
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from typing import Any

import grpc
import pytest

from cronoq import errors
from cronoq.api.limits import grpc_server_options
from cronoq.client import MAX_REDIRECTS, ClientError, Lease, Worker
from cronoq.client._connect import CHANNEL_DEFAULTS
from cronoq.client._worker import LEADER_HUNT_DELAY_S
from cronoq.config.model import Limits
from cronoq.transport import ChannelOptions, Endpoint, open_channel, take_first_message
from cronoq.v1 import cronoq_pb2 as pb

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


# ----------------------------------------------------------------------------------- extension


async def test_a_server_without_batches_is_served_over_workers_work(workers: WorkersServer) -> None:
    """The scripted server has no BatchedWorkers service, as the reference's: grpc answers UNIMPLEMENTED
    and the worker opens Workers.Work at once, neither failing nor waiting a backoff."""
    worker = Worker(workers.target, "p", _echo)
    async with running(worker):
        stream = await workers.accept()
        await stream.handshake()
        await worker.wait_registered(TIMEOUT)
        await stream.lease(1, b"x")
        assert (await stream.next("complete")).output == b"x"
    assert (worker.batched, worker.connections, workers.connects) == (False, 1, 1)


@pytest.mark.parametrize(("batches", "probes"), [(True, [1, 2]), (False, [0, 0])])
async def test_batches_are_asked_for_again_once_a_plain_stream_ended(
    batches: bool, probes: list[int]
) -> None:
    """A server that refused the extension may come back upgraded: the next stream asks again (one
    refused call per connection, not one per lease); ``batches=False`` never asks."""
    servicer = WorkersServer()
    async with serve(servicer, batch_probes=True):
        worker = Worker(servicer.target, "p", _never, batches=batches)
        seen = []
        async with running(worker):
            for _ in range(2):
                stream = await servicer.accept()
                await stream.handshake()
                await worker.wait_registered(TIMEOUT)
                seen.append(servicer.batch_probes)
                await stream.send(shutdown={"reason": "restart", "not_leader": True})
        assert seen == probes
        assert worker.batched is False


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


async def test_a_stream_the_server_ended_leaves_nothing_of_it_behind(
    workers: WorkersServer, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """grpc.aio reads the worker's messages in a task of its own. When the server ended the stream (an
    error status, a lost connection), that task waited for the worker's next message forever; once the
    call was collected, asyncio logged "Task was destroyed but it is pending!" and a failed close of the
    message generator as errors, in the worker's log, on every reconnect."""
    worker = Worker(workers.target, "p", _never)
    pauses = record_pauses(worker, monkeypatch)
    async with running(worker):
        first = await workers.accept()
        await first.handshake()
        first.end(UNAVAILABLE)
        await (await workers.accept()).handshake()
        await worker.wait_registered(TIMEOUT)
        gc.collect()  # the first call is garbage now: destroying a pending task is logged at once
    assert pauses == [0.1] and worker.connections == 2
    assert [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR] == []


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
    defaults = dict(CHANNEL_DEFAULTS) | {"grpc.keepalive_time_ms": 10_000}
    assert opened == [
        (workers.target, defaults | {"grpc.default_authority": "cronoq.internal"}),
        (shards[0].target, defaults),
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
            await take_first_message(context)  # as a cronoq server refuses a Work call
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


async def test_a_stop_before_run_starts_makes_run_return_without_serving(workers: WorkersServer) -> None:
    worker = Worker(workers.target, "p", _never)
    task = asyncio.create_task(worker.run())
    await worker.stop()  # not running, so it returns without yielding: run() has not started yet
    await asyncio.wait_for(task, TIMEOUT)
    assert workers.connects == 0 and not worker.running
    # The stop was for that run only: the next one serves.
    async with running(worker):
        await (await workers.accept()).handshake()
        await worker.wait_registered(TIMEOUT)


class ScriptedCall:
    """Stands in for grpc's Work call, so that a test decides when the worker's messages are taken and
    when the server's arrive (grpc hands both over as soon as it can)."""

    def __init__(self, requests: AsyncIterator[pb.WorkerMessage]) -> None:
        self.requests = requests
        self._inbox: asyncio.Queue[pb.ServerMessage | None] = asyncio.Queue()
        self._waiting = asyncio.Event()  # the worker asked for the next server message

    def __aiter__(self) -> ScriptedCall:
        return self

    async def __anext__(self) -> pb.ServerMessage:
        self._waiting.set()
        message = await self._inbox.get()
        self._waiting.clear()
        if message is None:
            raise StopAsyncIteration
        return message

    async def deliver(self, **message: Any) -> None:
        """Hands the worker a server message and returns once it has handled it."""
        self._waiting.clear()
        self._inbox.put_nowait(pb.ServerMessage(**message))
        await asyncio.wait_for(self._waiting.wait(), TIMEOUT)

    def end(self) -> None:
        self._inbox.put_nowait(None)

    def cancel(self) -> None:
        self.end()


async def test_a_lease_arriving_while_stopping_is_nacked_before_the_half_close(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The server may send a lease before it reads SetSlots(0); if it reaches an idle stopping worker
    before the half-close has gone out, its nack must go first: after the half-close nothing can be
    sent, and the server fails a lease that is never answered."""
    calls: asyncio.Queue[ScriptedCall] = asyncio.Queue()

    class Stub:
        def __init__(self, channel: object) -> None:
            pass

        def Work(self, requests: AsyncIterator[pb.WorkerMessage], metadata: object) -> ScriptedCall:
            call = ScriptedCall(requests)
            calls.put_nowait(call)
            return call

    monkeypatch.setattr("cronoq.client._worker.pb_grpc.WorkersStub", Stub)
    worker = Worker("127.0.0.1:1", "p", _never, batches=False)  # the same outbox feeds batches
    async with running(worker):
        call = await asyncio.wait_for(calls.get(), TIMEOUT)
        assert (await anext(call.requests)).WhichOneof("msg") == "register"
        await call.deliver(registered=pb.Registered(worker_id=1, slots=1, protocol_version=3))
        stopping = asyncio.create_task(worker.stop(grace=0))
        assert (await anext(call.requests)).WhichOneof("msg") == "set_slots"
        await call.deliver(lease=pb.Lease(lease=7, task_id=70, attempt=1))
        after = [message async for message in call.requests]  # up to the half-close
        call.end()  # as the server does on the half-close
        await asyncio.wait_for(stopping, TIMEOUT)
    assert [message.WhichOneof("msg") for message in after] == ["nack"]
    assert after[0].nack.lease == 7


# ------------------------------------------------------------------------------------- keepalive


async def test_the_channel_sends_keepalive_pings_unless_options_say_otherwise(
    workers: WorkersServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    opened: list[dict[str, object]] = []

    def spy(endpoint: Endpoint, credentials: object, options: ChannelOptions) -> object:
        opened.append(dict(options))
        return open_channel(endpoint, credentials, options)

    monkeypatch.setattr("cronoq.client._worker.open_channel", spy)
    for options in (None, [("grpc.keepalive_time_ms", 60_000)]):
        worker = Worker(workers.target, "p", _never, options=options)
        async with running(worker):
            await (await workers.accept()).handshake()
            await worker.wait_registered(TIMEOUT)

    defaults = {
        "grpc.max_receive_message_length": -1,
        "grpc.use_local_subchannel_pool": 1,  # a connection of its own
        "grpc.max_reconnect_backoff_ms": 5_000,  # back within 5 s of the server's return
        "grpc.keepalive_time_ms": 20_000,
        "grpc.keepalive_timeout_ms": 10_000,
        "grpc.http2.ping_timeout_ms": 10_000,
        "grpc.http2.max_pings_without_data": 0,
    }
    assert opened == [defaults, defaults | {"grpc.keepalive_time_ms": 60_000}]


def test_keepalive_pings_are_never_too_many_for_a_cronoq_server() -> None:
    """A cronoq server (or router) answers pings closer together than this with GOAWAY too_many_pings."""
    server = dict(grpc_server_options(Limits(), 1000))
    assert (
        dict(CHANNEL_DEFAULTS)["grpc.keepalive_time_ms"]
        >= server["grpc.http2.min_ping_interval_without_data_ms"]
    )


class Relay:
    """A TCP relay to ``target`` whose connections can go silent: :meth:`freeze` makes the current ones
    drop whatever either side sends, without closing anything, the way a stopped (SIGSTOP) or
    partitioned server looks to its client. Connections made later are relayed as usual."""

    def __init__(self, target: str) -> None:
        self.host, port = target.rsplit(":", 1)
        self.port = int(port)
        self.target = ""
        self._live: list[asyncio.StreamWriter] = []
        self._frozen: set[asyncio.StreamWriter] = set()
        self._writers: list[asyncio.StreamWriter] = []

    async def __aenter__(self) -> Relay:
        self._server = await asyncio.start_server(self._relay, "127.0.0.1", 0)
        self.target = f"127.0.0.1:{self._server.sockets[0].getsockname()[1]}"
        return self

    async def __aexit__(self, *exc: object) -> None:
        self._server.close()
        for writer in self._writers:
            writer.close()

    def freeze(self) -> None:
        self._frozen.update(self._live)
        self._live.clear()

    async def _relay(self, client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter) -> None:
        server_reader, server_writer = await asyncio.open_connection(self.host, self.port)
        self._writers += [client_writer, server_writer]
        self._live.append(client_writer)
        await asyncio.gather(
            self._pipe(client_reader, server_writer, client_writer),
            self._pipe(server_reader, client_writer, client_writer),
        )

    async def _pipe(
        self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, conn: asyncio.StreamWriter
    ) -> None:
        with contextlib.suppress(ConnectionError):
            while data := await src.read(65536):
                if conn not in self._frozen:
                    dst.write(data)
                    await dst.drain()
            if conn not in self._frozen:
                dst.close()


async def test_a_silent_server_is_noticed_by_keepalive_and_the_worker_reconnects() -> None:
    """The worker's keepalive settings, a hundred times faster, against a server gone silent."""
    fast = [(key, value // 100 if key.endswith("_ms") else value) for key, value in CHANNEL_DEFAULTS]
    # A test server that tolerates the fast pings: a GOAWAY for too many pings would also end the stream.
    lenient = [("grpc.http2.min_ping_interval_without_data_ms", 1), ("grpc.http2.max_ping_strikes", 0)]
    workers = WorkersServer()
    async with serve(workers, options=lenient), Relay(workers.target) as relay:
        worker = Worker(relay.target, "p", _never, options=fast)
        async with running(worker):
            await (await workers.accept()).handshake()
            await worker.wait_registered(TIMEOUT)
            relay.freeze()
            await (await workers.accept()).handshake()  # a new stream, on a new connection
            await worker.wait_registered(TIMEOUT)
    assert worker.connections == 2
