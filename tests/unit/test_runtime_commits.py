"""The runtime's handling of the engine's ScheduleChanged and Scale actions (no sockets, a recording
store): schedule changes ride in the same group commit as the tasks they created, callers are answered
only after it, and autoscaler targets go to ``on_scale`` without costing a commit."""

from __future__ import annotations

import asyncio

from cronoq.engine import Engine
from cronoq.engine.model import (
    AutoscaleConfig,
    PoolConfig,
    Recurring,
    RecurringSpec,
    TaskSpec,
)
from shard.outputs import OutputCache
from shard.runtime import Runtime
from shard.store import Batch, Leadership, Recovered, StoredTask

NOW = 1_900_000_000.0


class RecordingStore:
    """A durable store that keeps every committed batch; ``gate`` holds commits until it is set."""

    def __init__(self) -> None:
        self.batches: list[Batch] = []
        self.gate = asyncio.Event()
        self.gate.set()

    @property
    def durable(self) -> bool:
        return True

    async def open(self) -> None:
        pass

    async def acquire(self) -> Leadership:
        return Leadership(1)

    async def recover(self, finished_since: float) -> Recovered:
        return Recovered([], 0)

    async def commit(self, batch: Batch) -> None:
        await self.gate.wait()
        self.batches.append(batch)

    async def fetch(self, ref: int | str) -> StoredTask | None:
        return None

    async def prune(self, finished_before: float) -> int:
        return 0

    async def release(self) -> None:
        pass

    async def close(self) -> None:
        pass


def runtime_with(
    store: RecordingStore, engine: Engine, scaled: list[tuple[str, int]] | None = None
) -> Runtime:
    runtime = Runtime(
        engine,
        OutputCache(10, 1 << 20),
        clock=lambda: NOW,
        store=store,
        on_scale=None if scaled is None else (lambda pool, n: scaled.append((pool, n))),
    )
    runtime.start_committer()
    return runtime


async def test_a_schedule_and_its_first_occurrence_commit_together_before_the_answer() -> None:
    store = RecordingStore()
    engine = Engine([PoolConfig("default")])
    runtime = runtime_with(store, engine)
    try:
        store.gate.clear()
        spec = RecurringSpec("nightly", "0 3 * * *", TaskSpec("default", key="n"))
        engine.add_recurring(spec, NOW)
        runtime.flush()
        answered = asyncio.ensure_future(runtime.sync())
        await asyncio.sleep(0)
        assert not answered.done()  # not before the commit
        store.gate.set()
        await asyncio.wait_for(answered, 5)
        [batch] = store.batches
        [(name, recurring)] = batch.schedules
        assert name == "nightly" and isinstance(recurring, Recurring)
        assert recurring.next_start is not None and recurring.last_task_id
        assert [t.id for t in batch.tasks] == [recurring.last_task_id]  # the occurrence, same transaction

        assert engine.remove_recurring("nightly", NOW)
        runtime.flush()
        await asyncio.wait_for(runtime.sync(), 5)
        assert store.batches[-1].schedules == [("nightly", None)]
    finally:
        await runtime.stop_committer()
        runtime.cancel_timer()


async def test_a_schedule_is_written_as_it_was_when_it_changed() -> None:
    """The engine keeps advancing its own schedule object; a held change must not follow it."""
    store = RecordingStore()
    engine = Engine([PoolConfig("default")])
    runtime = runtime_with(store, engine)
    try:
        store.gate.clear()
        spec = RecurringSpec("s", "* * * * *", TaskSpec("default"))
        live = engine.add_recurring(spec, NOW)
        runtime.flush()
        first = live.next_start
        live.next_start = (first or 0) + 3600  # what a later advance would do to the engine's object
        store.gate.set()
        await asyncio.wait_for(runtime.sync(), 5)
        [(_, written)] = store.batches[0].schedules
        assert written is not None and written.next_start == first
    finally:
        await runtime.stop_committer()
        runtime.cancel_timer()


async def test_scale_actions_go_to_on_scale_and_cost_no_commit() -> None:
    store = RecordingStore()
    pool = PoolConfig("default", min=1, max=50, autoscale=AutoscaleConfig(drain_time=1.0))
    engine = Engine([pool])
    scaled: list[tuple[str, int]] = []
    runtime = runtime_with(store, engine, scaled)
    try:
        engine.tick(NOW)  # the first evaluation: nothing queued, the target stays at min
        runtime.flush()
        await asyncio.wait_for(runtime.sync(), 5)
        assert scaled == [] and store.batches == []
        engine.submit([TaskSpec("default") for _ in range(20)], NOW)
        engine.tick(NOW + 1.0)
        runtime.flush()
        await asyncio.wait_for(runtime.sync(), 5)
        assert scaled and scaled[-1][0] == "default" and scaled[-1][1] > 1
        assert all(not batch.schedules for batch in store.batches)
    finally:
        await runtime.stop_committer()
        runtime.cancel_timer()


async def test_without_a_durable_store_scale_goes_out_at_once_and_schedules_are_dropped() -> None:
    pool = PoolConfig("default", min=1, max=50, autoscale=AutoscaleConfig(drain_time=1.0))
    engine = Engine([pool])
    scaled: list[tuple[str, int]] = []
    runtime = Runtime(
        engine, OutputCache(10, 1 << 20), clock=lambda: NOW, on_scale=lambda p, n: scaled.append((p, n))
    )
    try:
        engine.add_recurring(RecurringSpec("s", "* * * * *", TaskSpec("default")), NOW)
        engine.tick(NOW)
        engine.submit([TaskSpec("default") for _ in range(20)], NOW)
        engine.tick(NOW + 1.0)
        runtime.flush()
        assert scaled and scaled[-1][1] > 1
    finally:
        runtime.cancel_timer()
