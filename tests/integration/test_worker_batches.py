"""The ``BatchedWorkers.Work`` extension (docs/worker-protocol.md), spoken raw and through the SDK: a
frame carries what each side has queued, means what its messages mean one by one, stays within
``max_message_bytes``, and a worker of the SDK falls back to ``Workers.Work`` by itself where the server
does not offer the extension (a server with ``[server] worker_batches = false``, like the reference's)."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cronoq.client import Client, Lease
from cronoq.v1 import cronoq_pb2 as pb
from cronoq.v1 import cronoq_pb2_grpc as pbg

from .conftest import DEFAULT_CONFIG
from .helpers import worker
from .serverproc import ServerProcess, running_server
from .shardproc import ShardSpec, routed_cluster

pytestmark = pytest.mark.asyncio

REGISTER = pb.WorkerMessage(
    register=pb.Register(pool="default", slots=8, worker_name="raw", protocol_version=3)
)


class BatchedWorker:
    """A hand-driven BatchedWorkers.Work stream: ``send`` one frame, ``frame`` the next one received."""

    def __init__(self, channel: grpc.aio.Channel) -> None:
        self.outbox: asyncio.Queue[pb.WorkerBatch | None] = asyncio.Queue()
        self.inbox: asyncio.Queue[pb.ServerBatch | None] = asyncio.Queue()
        self.call = pbg.BatchedWorkersStub(channel).Work(self._frames())
        # Cancelling a pending read() cancels the whole call, so one task reads and frame() waits on a queue.
        self._reader = asyncio.create_task(self._read_all())

    async def _frames(self) -> AsyncIterator[pb.WorkerBatch]:
        while (batch := await self.outbox.get()) is not None:
            yield batch

    async def _read_all(self) -> None:
        with contextlib.suppress(grpc.aio.AioRpcError):
            while (batch := await self.call.read()) is not grpc.aio.EOF:
                self.inbox.put_nowait(batch)
        self.inbox.put_nowait(None)

    def send(self, *messages: pb.WorkerMessage) -> None:
        self.outbox.put_nowait(pb.WorkerBatch(messages=messages))

    def close(self) -> None:
        self.outbox.put_nowait(None)

    async def frame(self, timeout: float = 5) -> list[pb.ServerMessage]:
        batch = await asyncio.wait_for(self.inbox.get(), timeout)
        assert batch is not None, "stream ended"
        assert batch.messages, "the server sent an empty batch"
        return list(batch.messages)

    async def leases(self, n: int) -> list[pb.Lease]:
        """The next ``n`` leases, however the server framed them."""
        leases: list[pb.Lease] = []
        while len(leases) < n:
            frame = await self.frame()
            assert {m.WhichOneof("msg") for m in frame} == {"lease"}, frame
            leases += [m.lease for m in frame]
        assert len(leases) == n
        return leases

    async def status(self) -> tuple[grpc.StatusCode, str]:
        await asyncio.wait_for(self._reader, 5)
        return await self.call.code(), await self.call.details()


async def barrier(w: BatchedWorker, client: Client) -> None:
    """Wait until the server applied everything ``w`` sent so far (its frames are read in order): a
    heartbeat for a lease nobody holds counts as stale once it was."""
    before = (await client.snapshot()).totals.stale_completions
    w.send(pb.WorkerMessage(heartbeat=pb.Heartbeat(lease=2**63)))
    for _ in range(500):
        if (await client.snapshot()).totals.stale_completions > before:
            return
        await asyncio.sleep(0.01)
    raise AssertionError("the server never applied the barrier heartbeat")


def complete(lease: pb.Lease, output: bytes = b"") -> pb.WorkerMessage:
    return pb.WorkerMessage(complete=pb.Complete(lease=lease.lease, output=output))


async def test_a_frame_carries_everything_queued_and_means_its_messages_in_order(
    server: ServerProcess,
) -> None:
    """Tasks waiting when the worker registers leave in the registration's own frame (the server queues
    them before its writer first runs); a frame of outcomes settles every task it reports."""
    async with grpc.aio.insecure_channel(server.target) as channel, Client(server.target) as client:
        ids = [(await client.submit(f"t{i}".encode())).id for i in range(5)]
        w = BatchedWorker(channel)
        w.send(REGISTER)
        first = await w.frame()
        assert [m.WhichOneof("msg") for m in first] == ["registered"] + ["lease"] * 5
        assert first[0].registered.slots == 8 and first[0].registered.protocol_version == 3
        leases = [m.lease for m in first[1:]]
        assert sorted(lease.task_id for lease in leases) == sorted(ids)
        # Outcomes of every kind in one frame, applied in order: a heartbeat, then the reports.
        w.send(
            pb.WorkerMessage(heartbeat=pb.Heartbeat(lease=leases[0].lease)),
            complete(leases[0], b"done"),
            pb.WorkerMessage(fail=pb.Fail(lease=leases[1].lease, message="no", permanent=True)),
            pb.WorkerMessage(cancelled=pb.Cancelled(lease=leases[2].lease)),
            complete(leases[3]),
            # A report after another for the same lease is stale, as it would be sent alone.
            pb.WorkerMessage(fail=pb.Fail(lease=leases[3].lease, message="late", permanent=True)),
            complete(leases[4]),
        )
        statuses = [(await client.wait(lease.task_id, timeout=5)).status for lease in leases]
        assert statuses == ["succeeded", "failed", "cancelled", "succeeded", "succeeded"]
        assert (await client.wait(leases[0].task_id, timeout=5)).text() == "done"
        assert (await client.snapshot()).totals.stale_completions == 1
        w.close()
        assert (await w.status())[0] == grpc.StatusCode.OK


async def test_a_registration_frame_may_carry_more_messages(server: ServerProcess) -> None:
    """``[register, set_slots 0]``: registered, then drained, so a task submitted next waits."""
    async with grpc.aio.insecure_channel(server.target) as channel, Client(server.target) as client:
        w = BatchedWorker(channel)
        w.send(REGISTER, pb.WorkerMessage(set_slots=pb.SetSlots(slots=0)))
        assert [m.WhichOneof("msg") for m in await w.frame()] == ["registered"]
        await barrier(w, client)  # the set_slots was applied
        task_id = (await client.submit(b"x")).id
        with pytest.raises(TimeoutError):
            await w.frame(timeout=0.5)  # the lease waits: no slot
        w.send(pb.WorkerMessage(set_slots=pb.SetSlots(slots=1)))
        (lease,) = await w.leases(1)
        assert lease.task_id == task_id
        w.send(complete(lease))
        assert (await client.wait(task_id, timeout=5)).status == "succeeded"
        w.close()
        await w.status()


@pytest.mark.parametrize(
    ("frames", "code", "details"),
    [
        ([[]], grpc.StatusCode.INVALID_ARGUMENT, "messages: a batch carries at least one worker message"),
        (
            [[pb.WorkerMessage(set_slots=pb.SetSlots(slots=1))]],
            grpc.StatusCode.FAILED_PRECONDITION,
            "the first message on a Work stream must be register",
        ),
        ([[REGISTER], []], grpc.StatusCode.INVALID_ARGUMENT, "messages: a batch carries"),
        ([[REGISTER, REGISTER]], grpc.StatusCode.FAILED_PRECONDITION, "register may be sent only once"),
        ([[REGISTER], [pb.WorkerMessage()]], grpc.StatusCode.INVALID_ARGUMENT, "worker message has no field"),
    ],
    ids=["empty-first", "no-register", "empty-later", "register-twice", "empty-message"],
)
async def test_bad_frames_are_refused_naming_what_is_wrong(
    server: ServerProcess, frames: list[list[pb.WorkerMessage]], code: grpc.StatusCode, details: str
) -> None:
    async with grpc.aio.insecure_channel(server.target) as channel, Client(server.target) as client:
        w = BatchedWorker(channel)
        for frame in frames:
            w.send(*frame)
        w.close()
        assert (await w.status())[0] == code
        assert details in await w.call.details()
        snap = await client.snapshot()
        assert (snap.workers_connected, snap.live_tasks) == (0, 0)


async def test_a_refused_message_ends_the_stream_and_those_before_it_stand(server: ServerProcess) -> None:
    """The same as sending them one by one: the completion before the bad report counts, the lease
    after it is retried when the stream ends (as every lease of an ended stream is)."""
    async with grpc.aio.insecure_channel(server.target) as channel, Client(server.target) as client:
        ids = [(await client.submit(f"t{i}".encode())).id for i in range(2)]
        w = BatchedWorker(channel)
        w.send(REGISTER)
        leases = [m.lease for m in (await w.frame())[1:]]
        by_task = {lease.task_id: lease for lease in leases}
        bad = pb.WorkerMessage(fail=pb.Fail(lease=by_task[ids[1]].lease, retry_after_s=float("nan")))
        w.send(complete(by_task[ids[0]], b"kept"), bad)
        code, details = await w.status()
        assert code == grpc.StatusCode.INVALID_ARGUMENT and "fail.retry_after_s" in details
        assert (await client.wait(ids[0], timeout=5)).status == "succeeded"
        retried = await client.get(ids[1])
        assert retried.status in {"ready", "retrying"} and retried.attempt == 1


BIG_CONFIG = DEFAULT_CONFIG.replace("max_message_bytes = 1048576", "max_message_bytes = 65536")


@pytest.fixture
def small_messages(tmp_path: Path) -> Any:
    with running_server(tmp_path, BIG_CONFIG) as proc:
        yield proc


async def test_frames_stay_within_max_message_bytes_both_ways(small_messages: ServerProcess) -> None:
    """Leases of 20 KiB to a worker, under a 64 KiB limit: the server splits what it has queued into
    frames that fit (a frame of all ten would be refused by its own gRPC send limit and end the stream).
    The SDK worker's outputs of 25 KiB, finishing together, are split the same way (one frame of them
    would be refused by the server, ending the stream and retrying every lease)."""
    target = small_messages.target
    payload = b"p" * 20_000
    async with grpc.aio.insecure_channel(target) as channel, Client(target) as client:
        ids = [(await client.submit(payload)).id for _ in range(10)]
        w = BatchedWorker(channel)
        w.send(pb.WorkerMessage(register=pb.Register(pool="default", slots=10, protocol_version=3)))
        frames = [await w.frame()]
        while sum(len(f) for f in frames) < 11:
            frames.append(await w.frame())
        assert sum(len(f) for f in frames) == 11 and len(frames) >= 4
        for frame in frames:
            assert pb.ServerBatch(messages=frame).ByteSize() <= 65536
        leases = [m.lease for f in frames for m in f if m.WhichOneof("msg") == "lease"]
        assert sorted(lease.task_id for lease in leases) == sorted(ids)
        w.send(*(complete(lease) for lease in leases))
        for task_id in ids:
            assert (await client.wait(task_id, timeout=5)).status == "succeeded"
        w.close()
        await w.status()

        release = asyncio.Event()
        started = 0

        async def big_output(lease: Lease) -> bytes:
            nonlocal started
            started += 1
            await release.wait()
            return b"o" * 25_000

        async with worker(target, big_output, slots=6) as sdk:
            assert sdk.batched
            ids = [(await client.submit(b"x")).id for _ in range(6)]
            for _ in range(500):
                if started == 6:
                    break
                await asyncio.sleep(0.01)
            assert started == 6
            release.set()  # six outputs of 25 KiB are queued at once
            results = [await client.wait(task_id, timeout=10) for task_id in ids]
            assert [(r.status, len(r.output or b"")) for r in results] == [("succeeded", 25_000)] * 6
            assert {(await client.get(task_id)).attempt for task_id in ids} == {1}
            assert sdk.connections == 1  # never refused, never reconnected


async def echo(lease: Lease) -> str:
    return lease.text()


async def test_the_sdk_uses_batches_and_falls_back_where_the_server_has_none(tmp_path: Path) -> None:
    with (
        running_server(tmp_path / "with", DEFAULT_CONFIG) as with_batches,
        running_server(
            tmp_path / "without", DEFAULT_CONFIG.replace("[server]\n", "[server]\nworker_batches = false\n")
        ) as without,
    ):
        for proc, served in ((with_batches, True), (without, False)):
            async with grpc.aio.insecure_channel(proc.target) as channel:
                check = health_pb2_grpc.HealthStub(channel).Check
                asked = health_pb2.HealthCheckRequest(service="cronoq.v1.BatchedWorkers")
                if served:
                    assert (await check(asked)).status == health_pb2.HealthCheckResponse.SERVING
                else:
                    with pytest.raises(grpc.aio.AioRpcError) as refused:
                        await check(asked)
                    assert refused.value.code() == grpc.StatusCode.NOT_FOUND
            for batches in (True, False):
                async with (
                    worker(proc.target, echo, batches=batches) as w,
                    Client(proc.target) as client,
                ):
                    assert w.batched is (served and batches)
                    done = await client.submit(b"hi", wait=True, wait_timeout=10)
                    assert done.result is not None and done.result.text() == "hi"
                    assert w.connections == 1


async def test_a_worker_sent_on_by_the_router_keeps_its_batches(tmp_path: Path) -> None:
    """The router refuses a BatchedWorkers.Work stream with the owning shard's endpoint as it does a
    Workers.Work one, and the worker opens a batched stream there."""
    shards = (ShardSpec("a", 1, ("a1",)), ShardSpec("b", 2, ("b1",)))
    with routed_cluster(tmp_path, shards, "") as (router, _):
        async with (
            worker(router.target, echo, pool="a1") as on_a,
            worker(router.target, echo, pool="b1") as on_b,
            Client(router.target) as client,
        ):
            assert (on_a.batched, on_b.batched) == (True, True)
            for pool in ("a1", "b1"):
                done = await client.submit(pool.encode(), pool=pool, wait=True, wait_timeout=10)
                assert done.result is not None and done.result.text() == pool
