"""Calls that reach a server as it swaps its gRPC listener (a standby taking over, a leader stepping
down) end ``Unavailable``, retryable, and say when they never ran, so that callers and routers send
them again, keyed or not: never ``Cancelled``. Real processes on one SQLite file.

gRPC core cancels the calls it holds but has not yet handed to the server when the old listener's
server stops, whatever its grace (grpc/grpc#41785); a standby answering producers as fast as they call
always holds some. The SDK reads that CANCELLED as what it is: a call that never ran."""

from __future__ import annotations

import asyncio
import contextlib
import json
import signal
import sqlite3
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cronoq.client import Client, ClientError
from cronoq.transport import NOT_RECEIVED_KEY

from .helpers import durable_config, sqlite_store
from .serverproc import ServerProcess, leader_and_standby, running_server

pytestmark = pytest.mark.asyncio

PRODUCERS = 20  # each one call at a time, as fast as the standby answers
POOL = "hammer"
HAMMER_POOL = f"""
[[pools]]
name = "{POOL}"
max = 1
"""
NEVER_RAN = (NOT_RECEIVED_KEY, "1")
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


@dataclass
class Producers:
    """Producers submitting to one target as fast as it answers, every other task keyless."""

    target: str
    succeeded: int = 0
    failures: list[tuple[bool, ClientError]] = field(default_factory=list)  # (keyed, error)
    succeeded_by: Counter[int] = field(default_factory=Counter)
    failed_by: Counter[int] = field(default_factory=Counter)
    stop: asyncio.Event = field(default_factory=asyncio.Event)

    async def produce(self, producer: int) -> None:
        async with Client(self.target) as client:
            n = 0
            while not self.stop.is_set():
                n += 1
                key = f"{self.target}-p{producer}-{n}" if n % 2 else None  # one round's keys: new
                try:
                    # Time enough for any answer: a call cut off by its own deadline proves nothing.
                    await client.submit(b"x", pool=POOL, key=key, call_timeout=30)
                except ClientError as err:
                    self.failures.append((key is not None, err))
                    self.failed_by[producer] += 1
                else:
                    self.succeeded += 1
                    self.succeeded_by[producer] += 1

    async def until(self, counts: Counter[int], what: str) -> None:
        """Until every producer has ``counts`` above 0 (each has had an answer of that kind)."""
        async with asyncio.timeout(20):
            while len(counts) < PRODUCERS:  # noqa: ASYNC110 - the producers run in this loop
                await asyncio.sleep(0.01)
        assert len(counts) == PRODUCERS, what


async def committed(target: str) -> int:
    async with Client(target) as client:
        return len([t async for t in client.iter_tasks(pools=[POOL], page_size=1000)])


async def hammer_takeover(leader: ServerProcess, standby: ServerProcess) -> Producers:
    """Producers hammer ``standby`` while ``leader`` shuts down and it takes over, until every producer
    had a task accepted by it."""
    producers = Producers(standby.target)
    running = [asyncio.create_task(producers.produce(i)) for i in range(PRODUCERS)]
    try:
        await producers.until(producers.failed_by, "every producer is refused by the standby")
        leader.signal(signal.SIGTERM)  # a clean shutdown: the standby takes over at once
        await asyncio.to_thread(standby.wait_probe, "/readyz", 200, 20)
        await producers.until(producers.succeeded_by, "every producer reaches the new leader")
    finally:
        producers.stop.set()
        await asyncio.gather(*running)
    assert leader.wait(20) == 0
    codes = Counter(type(err).__name__ for _, err in producers.failures)
    print(f"{producers.succeeded} submitted, refusals: {dict(codes)}")
    assert set(codes) == {"Unavailable"}
    assert all(err.retryable for _, err in producers.failures)
    # Keyless ones are safe to send again only when they never ran, which they must say.
    unmarked = [err for keyed, err in producers.failures if not keyed and NEVER_RAN not in err.metadata]
    assert not unmarked, unmarked[:3]
    return producers


async def test_calls_on_a_standby_as_it_takes_over_end_unavailable_and_unrun_ones_say_so(
    tmp_path: Path,
) -> None:
    body = durable_config(sqlite_store(tmp_path / "cronoq.db")) + HAMMER_POOL
    with leader_and_standby(tmp_path, body) as (first, second):
        succeeded = (await hammer_takeover(first, second)).succeeded
        first.start(ready=False)  # and back: the first server stands by, then takes over again
        succeeded += (await hammer_takeover(second, first)).succeeded
        # None of the refused calls ran: the pool holds exactly the tasks whose submit succeeded.
        assert await committed(first.target) == succeeded


def _swapped(server: ServerProcess, leading: bool) -> bool:
    """Whether the server logged that its gRPC listener is now the one for this role."""
    for line in server.logs().splitlines():
        with contextlib.suppress(ValueError):
            entry = json.loads(line)
            if entry.get("event") == "grpc_listener" and entry.get("leading") is leading:
                return True
    return False


async def _swap_logged(server: ServerProcess, leading: bool) -> None:
    async with asyncio.timeout(20):
        while not _swapped(server, leading):  # noqa: ASYNC110 - another process writes the log
            await asyncio.sleep(0.01)


def _take_lease(db: Path) -> None:
    """Another instance takes the lease (for a minute): the leader steps down at its next renewal."""
    with contextlib.closing(sqlite3.connect(db)) as conn, conn:
        conn.execute(
            "UPDATE cronoq_leader SET epoch = epoch + 1, holder = 'elsewhere', expires_unix_ns = ? WHERE id = 1",
            (time.time_ns() + 60 * 10**9,),
        )


async def test_a_deposed_leader_listens_again_at_once_while_its_calls_finish(tmp_path: Path) -> None:
    """A call still running on the leader's gRPC server when it steps down keeps its grace, and the
    standby's server answers on the port meanwhile: the port is not closed while the old calls finish."""
    db = tmp_path / "cronoq.db"
    with running_server(
        tmp_path / "a", durable_config(sqlite_store(db)), env={"CRONOQ_LOG": "debug"}
    ) as server:
        async with grpc.aio.insecure_channel(server.target) as channel:
            watch = health_pb2_grpc.HealthStub(channel).Watch(health_pb2.HealthCheckRequest(service=""))
            assert (await watch.read()).status == SERVING
            _take_lease(db)
            assert (await watch.read()).status == NOT_SERVING  # stepped down
            ended = asyncio.ensure_future(watch.read())
            await _swap_logged(server, leading=False)
            assert not ended.done(), "the old listener's call was cut before the new one listened"
            async with grpc.aio.insecure_channel(server.target) as fresh:
                check = health_pb2_grpc.HealthStub(fresh).Check
                answer = await check(health_pb2.HealthCheckRequest(service=""), timeout=5)
                assert answer.status == NOT_SERVING  # the standby's server, on the same port
            assert not ended.done(), "the old listener's call was cut before the new one answered"
            with pytest.raises(grpc.aio.AioRpcError) as cut:
                await ended  # at the end of its grace
            assert cut.value.code() == grpc.StatusCode.UNAVAILABLE
