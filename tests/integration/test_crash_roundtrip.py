"""Every field of every accepted task survives a crash, whatever it holds: random batches of specs (any
Unicode in texts and tag maps, any bytes as payload, every priority, timeouts and deadlines across
their range) are submitted to a durable server, which is then killed with SIGKILL and started again.
What it tells about each task afterwards (``Get``) and what a worker then receives (the ``Lease``) must
be what it told and would have sent before, on SQLite and on Postgres."""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cronoq.client import Client
from cronoq.errors import InvalidArgument
from cronoq.v1 import cronoq_pb2 as pb
from cronoq.v1 import cronoq_pb2_grpc as pbg

from .helpers import postgres_store, sqlite_store
from .serverproc import assert_clean_log, new_server

POOL = '[limits]\nmax_tasks_per_batch = 1000\n\n[[pools]]\nname = "default"\nmax = 100000\n'
NOW_NS = time.time_ns()
# The engine keeps a deadline as float seconds: about 0.25 us apart near today's date.
DEADLINE_NS = 512

texts = st.text(st.characters(codec="utf-8", exclude_characters="\x00"), max_size=40)
specs = st.builds(
    pb.TaskSpec,
    pool=st.just("default"),
    payload=st.binary(max_size=200),
    content_type=texts,
    kind=texts,
    key=texts,  # made unique below
    tags=st.dictionaries(texts.filter(bool), texts, max_size=6),
    priority=st.integers(pb.PRIORITY_UNSPECIFIED, pb.PRIORITY_LOW),
    timeout_s=st.floats(min_value=0.001, max_value=1e6),
    deadline_unix_ns=st.integers(NOW_NS + 10**12, NOW_NS + 10 * 365 * 86_400 * 10**9),
    tenant=texts,
)


def lease_fields(lease: pb.Lease) -> tuple[Any, ...]:
    return (
        lease.payload,
        lease.content_type,
        lease.kind,
        lease.key,
        dict(lease.tags),
        lease.priority,
        lease.timeout_s,
    )


async def submit(target: str, batch: list[pb.TaskSpec]) -> list[int]:
    async with grpc.aio.insecure_channel(target) as channel:
        answer = await pbg.TasksStub(channel).SubmitBatch(pb.SubmitBatchRequest(tasks=batch), timeout=10)
    return [task.id for task in answer.tasks]


async def infos(target: str, ids: list[int]) -> dict[int, pb.TaskInfo]:
    async with grpc.aio.insecure_channel(target) as channel:
        stub = pbg.TasksStub(channel)
        return {i: await stub.Get(pb.GetRequest(task=pb.TaskRef(id=i)), timeout=10) for i in ids}


async def leases(target: str, count: int) -> dict[int, pb.Lease]:
    """Register one worker with ``count`` slots and take a lease of each task (none is answered)."""
    register = pb.Register(pool="default", slots=count, worker_name="roundtrip", protocol_version=3)

    async def requests() -> AsyncIterator[pb.WorkerMessage]:
        yield pb.WorkerMessage(register=register)
        await asyncio.Event().wait()  # keep the stream open while the leases come

    taken: dict[int, pb.Lease] = {}
    async with grpc.aio.insecure_channel(target) as channel:
        call = pbg.WorkersStub(channel).Work(requests())
        async for message in call:
            if message.WhichOneof("msg") == "lease":
                taken[message.lease.task_id] = message.lease
                if len(taken) == count:
                    break
        call.cancel()
    return taken


def durable_store(kind: str, tmp_path: Path, request: pytest.FixtureRequest) -> tuple[str, dict[str, str]]:
    """The ``[store]`` table of a ``kind`` store (sqlite in ``tmp_path``, postgres in a fresh schema) and
    the environment the server needs for it."""
    if kind == "sqlite":
        return sqlite_store(tmp_path / "cronoq.db"), {}
    url = request.getfixturevalue("postgres_url")
    return postgres_store(request.getfixturevalue("pg_schema")), {"DATABASE_URL": url}


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_every_field_of_every_accepted_task_survives_a_crash(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    store, env = durable_store(kind, tmp_path, request)
    server = new_server(tmp_path / "server", f"{POOL}\n{store}", env)
    server.start()
    submitted: dict[int, pb.TaskSpec] = {}
    unique = itertools.count()
    try:

        @settings(
            max_examples=80,
            deadline=None,
            derandomize=True,
            database=None,
            suppress_health_check=list(HealthCheck),
        )
        @given(batch=st.lists(specs, min_size=1, max_size=8))
        def accept(batch: list[pb.TaskSpec]) -> None:
            for spec in batch:
                spec.key = f"{spec.key}#{next(unique)}"  # unique: no duplicates to sort out
            ids = asyncio.run(submit(server.target, batch))
            for spec, task_id in zip(batch, ids, strict=True):
                submitted[task_id] = spec

        accept()
        ids = sorted(submitted)
        before = asyncio.run(infos(server.target, ids))
        server.kill()
        server.start()
        after = asyncio.run(infos(server.target, ids))
        taken = asyncio.run(asyncio.wait_for(leases(server.target, len(ids)), 60))
    finally:
        server.stop()

    assert after == before
    assert sorted(taken) == ids
    for task_id, spec in submitted.items():
        expected = pb.Lease(
            payload=spec.payload,
            content_type=spec.content_type,
            kind=spec.kind or "default",
            key=spec.key,
            tags=spec.tags,
            priority=spec.priority or pb.PRIORITY_NORMAL,
            timeout_s=spec.timeout_s,
            deadline_unix_ns=spec.deadline_unix_ns,
        )
        assert lease_fields(taken[task_id]) == lease_fields(expected), task_id
        assert abs(taken[task_id].deadline_unix_ns - spec.deadline_unix_ns) <= DEADLINE_NS, task_id
    assert_clean_log(server)
    assert "undecodable" not in server.logs()


@pytest.mark.parametrize("kind", ["sqlite", "postgres"])
def test_the_longest_keys_a_server_accepts_are_kept_and_a_longer_one_stalls_nothing(
    kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    """``max_key_len`` at its highest: a key of 2,048 bytes, and a schedule's name and template key that
    long (its occurrences' keys add "@<UTC start>"), are committed by every store and read back after
    a restart.
    A key over 2,048 bytes of UTF-8 is refused: Postgres refuses an index entry over about 2,700 bytes,
    and such a commit used to fail on every retry, stalling every commit behind it."""
    store, env = durable_store(kind, tmp_path, request)
    config = '[limits]\nmax_key_len = 2048\n\n[[pools]]\nname = "default"\n' + store
    # Varied letters, as Postgres compresses a repetitive index entry below its limit.
    longest = "".join(chr(ord("a") + (i * 7919) % 26) for i in range(2048))
    server = new_server(tmp_path / "server", config, env)
    server.start()

    async def before_the_restart() -> tuple[int, int]:
        async with Client(server.target) as client:
            with pytest.raises(InvalidArgument, match=r"^invalid_argument: task\.key: 2,050 bytes in UTF-8"):
                await client.submit(b"x", key="é" * 1025)
            submitted = await client.submit(b"x", key=longest)
            await client.add_recurring(longest, "* * * * * *", b"tick", key=longest)
            deadline = time.monotonic() + 10
            while not (occurrences := [t async for t in client.iter_tasks() if t.key != longest]):
                assert time.monotonic() < deadline, "no occurrence within 10 s"
                await asyncio.sleep(0.1)
            after = await client.submit(b"y")  # commits go on
            assert (await client.get(after.id)).status == "ready"
            return submitted.id, occurrences[0].id

    try:
        task_id, occurrence_id = asyncio.run(before_the_restart())
        server.stop()  # a clean restart: a kill would wait out SQLite's leader lease (the test above kills)
        server.start()

        async def after_the_restart() -> None:
            async with Client(server.target) as client:
                assert (await client.get(longest)).id == task_id
                occurrence = await client.get(occurrence_id)
                assert occurrence.key is not None and occurrence.key.startswith(f"{longest}@")
                assert [r.name for r in await client.list_recurring()] == [longest]

        asyncio.run(after_the_restart())
    finally:
        server.stop()
    assert_clean_log(server)
