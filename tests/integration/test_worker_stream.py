"""The Workers.Work protocol spoken raw (no SDK): handshake, slots, drain and bad input."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf.message import Message

from cronoq.client import Client
from cronoq.v1 import cronoq_pb2 as pb
from cronoq.v1 import cronoq_pb2_grpc as pbg

from .serverproc import ServerProcess, running_server
from .shardproc import ShardSpec, routed_cluster

pytestmark = pytest.mark.asyncio


class RawWorker:
    """A hand-driven Work stream: ``send`` messages, ``recv`` the server's, see how it ends."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.outbox: asyncio.Queue[pb.WorkerMessage | None] = asyncio.Queue()
        self.inbox: asyncio.Queue[pb.ServerMessage | None] = asyncio.Queue()
        self.call = pbg.WorkersStub(channel).Work(self._requests())
        # Cancelling a pending read() cancels the whole call, so one task reads and recv() waits on a queue.
        self.reading = asyncio.Event()
        self.reading.set()
        self._reader = asyncio.create_task(self._read_all())

    async def _read_all(self) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError):
            while True:
                await self.reading.wait()  # cleared: the worker stops reading its stream
                msg = await self.call.read()
                if msg is grpc.aio.EOF:
                    break
                self.inbox.put_nowait(msg)
        self.inbox.put_nowait(None)

    async def _requests(self) -> AsyncIterator[pb.WorkerMessage]:
        while True:
            msg = await self.outbox.get()
            if msg is None:
                return
            yield msg

    def send(self, **kw: Any) -> None:  # the fields of a WorkerMessage
        self.outbox.put_nowait(pb.WorkerMessage(**kw))

    async def recv(self, timeout: float = 5) -> pb.ServerMessage:
        msg = await asyncio.wait_for(self.inbox.get(), timeout)
        assert msg is not None, "stream ended"
        return msg

    async def status(self, timeout: float = 5) -> grpc.StatusCode:
        return await asyncio.wait_for(self.call.code(), timeout)

    async def register(self, pool: str = "default", slots: int = 1, **labels: str) -> pb.Registered:
        self.send(
            register=pb.Register(pool=pool, slots=slots, worker_name="raw", protocol_version=3, labels=labels)
        )
        msg = await self.recv()
        assert msg.WhichOneof("msg") == "registered"
        return msg.registered


async def barrier(w: RawWorker, client: Client) -> None:
    """Wait until the server processed everything ``w`` sent so far: a stream's messages are handled in
    order, so once a heartbeat for an unknown lease shows up as stale, everything before it was seen."""
    before = (await client.snapshot()).totals.stale_completions
    w.send(heartbeat=pb.Heartbeat(lease=2**63))
    for _ in range(500):
        if (await client.snapshot()).totals.stale_completions > before:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the server never processed the barrier heartbeat")


async def snapshot(client: Client) -> tuple[int, int, int]:
    snap = await client.snapshot()
    return snap.live_tasks, snap.totals.dispatched, snap.workers_connected


async def test_register_then_lease_within_granted_slots(server: ServerProcess) -> None:
    async with grpc.aio.insecure_channel(server.target) as ch, Client(server.target) as client:
        w = RawWorker(ch)
        reg = await w.register(slots=100)  # pool max is 16: the grant is capped
        assert reg.slots == 16 and reg.protocol_version == 3 and reg.worker_id > 0
        assert reg.lease_ttl_s == pytest.approx(1.0)
        assert reg.max_message_bytes == 1048576
        w.send(set_slots=pb.SetSlots(slots=2))
        await asyncio.sleep(0)  # let the message go out before tasks arrive
        ids = [(await client.submit(f"t{i}".encode())).id for i in range(3)]
        leases = [(await w.recv()).lease for _ in range(2)]
        assert (
            sorted(lease.task_id for lease in leases) == sorted(ids[:2])
            or len({ls.task_id for ls in leases}) == 2
        )
        # A third lease must not arrive while two are held.
        with pytest.raises(TimeoutError):
            await w.recv(timeout=0.5)
        w.send(complete=pb.Complete(lease=leases[0].lease, output=b"ok"))
        third = (await w.recv()).lease
        assert third.task_id not in {ls.task_id for ls in leases}
        for lease in (leases[1], third):
            w.send(complete=pb.Complete(lease=lease.lease))
        for i in ids:
            assert (await client.wait(i, timeout=5)).status == "succeeded"
        w.outbox.put_nowait(None)


async def test_set_slots_zero_drains(server: ServerProcess) -> None:
    async with grpc.aio.insecure_channel(server.target) as ch, Client(server.target) as client:
        w = RawWorker(ch)
        await w.register(slots=2)
        first = await client.submit(b"a")
        lease = (await w.recv()).lease
        assert lease.task_id == first.id
        w.send(set_slots=pb.SetSlots(slots=0))
        w.send(heartbeat=pb.Heartbeat(lease=lease.lease))
        await barrier(w, client)
        second = await client.submit(b"b")
        with pytest.raises(TimeoutError):
            await w.recv(timeout=0.5)
        # The running lease still completes after the drain started.
        w.send(complete=pb.Complete(lease=lease.lease))
        assert (await client.wait(first.id, timeout=5)).status == "succeeded"
        assert (await client.get(second.id)).status == "ready"
        w.outbox.put_nowait(None)


@pytest.mark.parametrize(
    ("first", "code", "words"),
    [
        ({"heartbeat": pb.Heartbeat(lease=1)}, grpc.StatusCode.FAILED_PRECONDITION, "first message"),
        ({"register": pb.Register(pool="", slots=1)}, grpc.StatusCode.INVALID_ARGUMENT, "register.pool"),
        ({"register": pb.Register(pool="nope", slots=1)}, grpc.StatusCode.NOT_FOUND, "unknown pool 'nope'"),
        (
            {"register": pb.Register(pool="default", slots=0)},
            grpc.StatusCode.INVALID_ARGUMENT,
            "register.slots",
        ),
        (
            {"register": pb.Register(pool="default", slots=1, worker_name="a\x00b")},
            grpc.StatusCode.INVALID_ARGUMENT,
            "register.worker_name",
        ),
        (
            {"register": pb.Register(pool="default", slots=1, labels={"gpu": "a\x00"})},
            grpc.StatusCode.INVALID_ARGUMENT,
            "register.labels",
        ),
    ],
)
async def test_bad_first_message_refused_without_state_change(
    server: ServerProcess, first: dict[str, object], code: grpc.StatusCode, words: str
) -> None:
    async with grpc.aio.insecure_channel(server.target) as ch, Client(server.target) as client:
        before = await snapshot(client)
        w = RawWorker(ch)
        w.send(**first)
        assert await w.status() == code
        assert words in (await w.call.details())
        assert await snapshot(client) == before


async def test_unknown_lease_reports_are_ignored_and_counted(server: ServerProcess) -> None:
    async with grpc.aio.insecure_channel(server.target) as ch, Client(server.target) as client:
        w = RawWorker(ch)
        await w.register()
        sub = await client.submit(b"x")
        lease = (await w.recv()).lease
        w.send(complete=pb.Complete(lease=lease.lease + 1000))
        w.send(fail=pb.Fail(lease=999999, message="nope", permanent=True))
        w.send(heartbeat=pb.Heartbeat(lease=424242))
        w.send(nack=pb.Nack(lease=31337))
        # The real lease is still held: finishing it works, and the task was untouched meanwhile.
        w.send(complete=pb.Complete(lease=lease.lease, output=b"real"))
        result = await client.wait(sub.id, timeout=5)
        assert result.status == "succeeded" and result.output == b"real"
        snap = await client.snapshot()
        assert snap.totals.stale_completions == 4  # (the heartbeat counts as a stale report too)
        assert snap.totals.succeeded == 1 and snap.totals.failed == 0
        w.outbox.put_nowait(None)


async def test_second_register_and_empty_message_are_protocol_errors(server: ServerProcess) -> None:
    async with grpc.aio.insecure_channel(server.target) as ch:
        w = RawWorker(ch)
        await w.register()
        w.send(register=pb.Register(pool="default", slots=1))
        assert await w.status() == grpc.StatusCode.FAILED_PRECONDITION
        w2 = RawWorker(ch)
        await w2.register()
        w2.send()
        assert await w2.status() == grpc.StatusCode.INVALID_ARGUMENT


async def test_oversize_message_is_refused(server: ServerProcess) -> None:
    async with (
        grpc.aio.insecure_channel(server.target, options=[("grpc.max_send_message_length", 8 << 20)]) as ch,
        Client(server.target) as client,
    ):
        w = RawWorker(ch)
        await w.register()
        sub = await client.submit(b"x")
        lease = (await w.recv()).lease
        w.send(complete=pb.Complete(lease=lease.lease, output=b"z" * (2 << 20)))
        assert await w.status() == grpc.StatusCode.RESOURCE_EXHAUSTED
        # The stream died, so the attempt is retried rather than completed with a giant output.
        info = await client.get(sub.id)
        assert info.status in ("retrying", "ready")


async def test_worker_that_stops_reading_is_disconnected(server: ServerProcess) -> None:
    async with grpc.aio.insecure_channel(server.target) as ch, Client(server.target) as client:
        w = RawWorker(ch)
        await w.register(slots=1)
        big = b"p" * (512 << 10)
        ids = [(await client.submit(big)).id for _ in range(60)]
        w.reading.clear()
        await w.recv()  # the first lease (already read); nothing is read after it
        # Each cancel of the running task queues an abort and leases the next 512 KiB task to this worker,
        # until HTTP/2 flow control stops the writes and the bounded outbound queue overflows.
        for task_id in ids:
            await client.cancel(task_id)
            if (await client.snapshot()).workers_connected == 0:
                break
        assert (await client.snapshot()).workers_connected == 0
        assert (await client.get(ids[0])).status == "cancelled"
        # The call ends too, freeing its stream slot (limits.max_concurrent_streams) while the stuck
        # worker still reads nothing; a message it sends meanwhile changes nothing.
        w.send(set_slots=pb.SetSlots(slots=2))
        deadline = asyncio.get_running_loop().time() + 20  # the server gives the stuck write 5 s
        while server.metric("cronoq_streams_open") != 0:
            assert asyncio.get_running_loop().time() < deadline, (
                "the stuck worker's call kept its stream slot"
            )
            await asyncio.sleep(0.05)
        w.reading.set()  # once it reads again, it learns why
        assert await w.status(timeout=10) == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "KeyError" not in server.logs()


async def test_shutdown_starts_no_new_attempt_during_its_grace(tmp_path: Path) -> None:
    """SIGTERM gives running attempts the grace to finish; a slot one of them frees starts nothing
    (that attempt would be cut off at the end of the grace), and the server ends once none runs."""
    with running_server(tmp_path, "[server]\nshutdown_grace_s = 60\n") as server:
        async with grpc.aio.insecure_channel(server.target) as ch, Client(server.target) as client:
            w = RawWorker(ch)
            await w.register(slots=1)
            for _ in range(3):
                await client.submit(b"")
            first = (await w.recv()).lease
            server.signal(signal.SIGTERM)
            await asyncio.to_thread(server.wait_probe, "/readyz", 503)  # shutting down
            w.send(complete=pb.Complete(lease=first.lease))
            after = await w.recv(timeout=10)
            assert after.WhichOneof("msg") == "shutdown", after
        assert await asyncio.to_thread(server.wait, 30) == 0


OPENINGS: list[dict[str, Message]] = [
    {"heartbeat": pb.Heartbeat(lease=1)},
    {"register": pb.Register(pool="", slots=1)},
    {"register": pb.Register(pool="a1\x00", slots=1)},
    {"register": pb.Register(pool="p" * 65, slots=1)},
    {"register": pb.Register(pool="nope", slots=1)},
]


async def test_the_router_refuses_a_bad_opening_as_a_shard_does(tmp_path: Path) -> None:
    """A worker learns the same from the router (which only redirects workers) as from a shard: the
    same status and message for each bad first message, and a quiet end for a stream closed unopened."""
    with routed_cluster(tmp_path, [ShardSpec("a", 1, ("a1",))], "") as (router, shards):
        shard = shards["a"]
        for first in OPENINGS:
            answers = []
            for proc in (shard, router):
                async with grpc.aio.insecure_channel(proc.target) as ch:
                    w = RawWorker(ch)
                    w.send(**first)
                    answers.append((await w.status(), await w.call.details()))
            assert answers[0] == answers[1], first
            assert answers[0][0] != grpc.StatusCode.OK, first
        for proc in (shard, router):
            async with grpc.aio.insecure_channel(proc.target) as ch:
                w = RawWorker(ch)
                w.outbox.put_nowait(None)  # half-close before any message
                assert await w.status() == grpc.StatusCode.OK
