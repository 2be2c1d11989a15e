"""The runtime and the group commit (no sockets, a recording store): schedule changes ride in the same
group commit as the tasks they created, callers are answered only after it, autoscaler targets go to
``on_scale`` without costing a commit, and answers about a task (Get, Wait, List) wait for the commit of
the state they report."""

from __future__ import annotations

import asyncio

import pytest
from structlog.testing import capture_logs

from cronoq.auth import Role
from cronoq.engine import Engine
from cronoq.engine.model import (
    Abort,
    AutoscaleRule,
    Dispatch,
    PoolConfig,
    Recurring,
    RecurringSpec,
    Status,
    TaskSpec,
)
from cronoq.errors import Unavailable
from cronoq.v1 import cronoq_pb2 as pb
from shard.outputs import OutputCache
from shard.runtime import CommitFailures, Runtime
from shard.store import Batch, Fenced, Leadership, Recovered, StoredTask, StoreUnavailable
from tests.shardkit import service_over

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
    store: RecordingStore,
    engine: Engine,
    scaled: list[tuple[str, int]] | None = None,
    failures: list[str] | None = None,
) -> Runtime:
    """A runtime committing to ``store``; ``scaled`` and ``failures`` collect its scale actions and the
    store failures it reports."""
    runtime = Runtime(
        engine,
        OutputCache(10, 1 << 20),
        clock=lambda: NOW,
        store=store,
        on_scale=None if scaled is None else (lambda pool, n: scaled.append((pool, n))),
        on_store_failure=None if failures is None else failures.append,
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
        removal = store.batches[-1]
        assert removal.schedules == [("nightly", None)]
        # The occurrence created ahead is cancelled with the schedule, in the same transaction.
        assert [(t.id, t.status) for t in removal.tasks] == [(recurring.last_task_id, Status.CANCELLED)]
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
    pool = PoolConfig("default", min=1, max=50, autoscale=AutoscaleRule(drain_time=1.0))
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
    pool = PoolConfig("default", min=1, max=50, autoscale=AutoscaleRule(drain_time=1.0))
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


class Sink:
    def __init__(self) -> None:
        self.leases: list[Dispatch] = []

    def send_lease(self, action: Dispatch) -> None:
        self.leases.append(action)

    def send_abort(self, action: Abort) -> None:
        pass


async def yield_to_loop(turns: int = 20) -> None:
    """Let every runnable task run until it blocks (no time passes; nothing here waits on a clock)."""
    for _ in range(turns):
        await asyncio.sleep(0)


async def test_submit_and_cancel_answer_only_after_their_commit() -> None:
    pools = [PoolConfig("default")]
    store = RecordingStore()
    runtime = runtime_with(store, Engine(pools))
    service = service_over(runtime, pools)
    caller = service.authorize(None, Role.ADMIN)
    store.gate.clear()
    submit = asyncio.create_task(service.submit(caller, pb.SubmitRequest(task=pb.TaskSpec(pool="default"))))
    await yield_to_loop()
    assert not submit.done(), "accepted before the task was committed"
    store.gate.set()
    task_id = (await asyncio.wait_for(submit, 5)).id
    assert [t.id for t in store.batches[-1].tasks] == [task_id]

    store.gate.clear()
    cancel = asyncio.create_task(service.cancel(caller, pb.CancelRequest(task=pb.TaskRef(id=task_id))))
    await yield_to_loop()
    assert not cancel.done(), "cancelled before the cancellation was committed"
    store.gate.set()
    assert (await asyncio.wait_for(cancel, 5)).cancelled
    assert [(t.id, t.status) for t in store.batches[-1].tasks] == [(task_id, Status.CANCELLED)]
    runtime.cancel_timer()


async def test_get_wait_and_list_report_a_finish_only_after_its_commit() -> None:
    pools = [PoolConfig("default")]
    store = RecordingStore()
    runtime = runtime_with(store, Engine(pools))
    service = service_over(runtime, pools)
    caller = service.authorize(None, Role.ADMIN)
    sink = Sink()
    runtime.attach(1, sink, "default", 1, {})
    task_id = (await service.submit(caller, pb.SubmitRequest(task=pb.TaskSpec(pool="default")))).id
    await runtime.sync()  # the lease is delivered with the commit that made the task running
    [lease] = sink.leases

    store.gate.clear()  # the next commit, which records the success, is held
    assert runtime.engine.complete(1, lease.lease, NOW)
    runtime.flush()
    ref = pb.TaskRef(id=task_id)
    get = asyncio.create_task(service.get(caller, pb.GetRequest(task=ref)))
    wait = asyncio.create_task(service.wait(caller, pb.WaitRequest(task=ref, timeout_s=1.0)))
    listing = asyncio.create_task(service.list_tasks(caller, pb.ListTasksRequest()))
    answers = [get, wait, listing]
    await yield_to_loop()
    assert not any(a.done() for a in answers), "answered before the success was committed"
    known = runtime.engine.get(task_id)
    assert known is not None and known.status is Status.SUCCEEDED  # the engine already knows

    store.gate.set()
    info, result, page = await asyncio.wait_for(asyncio.gather(get, wait, listing), 5)
    assert info.status == result.status == page.tasks[0].status == pb.TASK_STATUS_SUCCEEDED
    assert any(t.id == task_id and t.status is Status.SUCCEEDED for b in store.batches for t in b.tasks)

    # Once committed, answers come at once.
    assert (await service.get(caller, pb.GetRequest(task=ref))).status == pb.TASK_STATUS_SUCCEEDED
    runtime.cancel_timer()


class FailingStore(RecordingStore):
    """Refuses its next commits with the errors in ``failures``, in order, then records as usual."""

    def __init__(self, *failures: Exception) -> None:
        super().__init__()
        self.failures = list(failures)
        self.attempts = 0

    async def commit(self, batch: Batch) -> None:
        self.attempts += 1
        if self.failures:
            raise self.failures.pop(0)
        await super().commit(batch)


async def test_a_transient_store_failure_is_retried_and_the_caller_answered_after_success() -> None:
    pools = [PoolConfig("default")]
    store = FailingStore(StoreUnavailable("connection lost"), StoreUnavailable("connection lost"))
    runtime = runtime_with(store, Engine(pools))
    service = service_over(runtime, pools)
    caller = service.authorize(None, Role.ADMIN)
    answer = await asyncio.wait_for(
        service.submit(caller, pb.SubmitRequest(task=pb.TaskSpec(pool="default"))), 5
    )
    assert store.attempts == 3 and [t.id for t in store.batches[0].tasks] == [answer.id]
    # Counted for cronoq_store_commit_failures_total, which the CronoqStoreCommitsFailing alert reads.
    assert runtime.commit_failures == CommitFailures(retried=2, fatal=0)
    runtime.cancel_timer()


async def test_a_fenced_commit_answers_unavailable_delivers_nothing_and_reports_the_failure() -> None:
    pools = [PoolConfig("default")]
    store = FailingStore(Fenced("a newer leader holds epoch 2"))
    failures: list[str] = []
    runtime = runtime_with(store, Engine(pools), failures=failures)
    service = service_over(runtime, pools)
    caller = service.authorize(None, Role.ADMIN)
    sink = Sink()
    runtime.attach(1, sink, "default", 1, {})
    with pytest.raises(Unavailable, match="stepped down"):
        await asyncio.wait_for(service.submit(caller, pb.SubmitRequest(task=pb.TaskSpec(pool="default"))), 5)
    assert failures and "epoch 2" in failures[0]
    assert runtime.commit_failures == CommitFailures(retried=0, fatal=1)
    assert sink.leases == [] and store.batches == []  # the lease held for that commit never left
    with pytest.raises(Unavailable, match="stepped down"):  # nothing later is acknowledged either
        await service.submit(caller, pb.SubmitRequest(task=pb.TaskSpec(pool="default")))
    with pytest.raises(Unavailable, match="stepped down"):  # nor reported from the unwritten state
        await service.list_tasks(caller, pb.ListTasksRequest())
    runtime.cancel_timer()


async def test_a_store_that_fails_with_a_bug_is_a_store_failure_not_a_silent_stop() -> None:
    """A commit raising anything but a StoreError (a bug in the store: it once met a finished task's
    released payload) ended the committer without a word: every caller waited for good, and the
    server still answered /readyz. It is a store failure like any fatal one, logged with its trace."""
    pools = [PoolConfig("default")]
    store = FailingStore(TypeError("object of type 'NoneType' has no len()"))
    failures: list[str] = []
    runtime = runtime_with(store, Engine(pools), failures=failures)
    caller = (service := service_over(runtime, pools)).authorize(None, Role.ADMIN)
    with capture_logs() as logs, pytest.raises(Unavailable, match="TypeError: object of type 'NoneType'"):
        await asyncio.wait_for(service.submit(caller, pb.SubmitRequest(task=pb.TaskSpec(pool="default"))), 5)
    assert failures == ["store failure: TypeError: object of type 'NoneType' has no len()"]
    assert [entry["event"] for entry in logs] == ["commit_failed_unexpectedly"]
    assert logs[0]["log_level"] == "error" and logs[0]["exc_info"] is True
    runtime.cancel_timer()


class QueuedSink:
    """A worker stream as the server has one: leases and aborts queue up, a writer task takes them."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Dispatch | Abort] = asyncio.Queue()
        self.written: list[Dispatch | Abort] = []
        self.writer = asyncio.ensure_future(self._write())

    def send_lease(self, action: Dispatch) -> None:
        self.queue.put_nowait(action)

    def send_abort(self, action: Abort) -> None:
        self.queue.put_nowait(action)

    async def _write(self) -> None:
        while True:
            self.written.append(await self.queue.get())


async def test_with_the_memory_store_the_writers_start_before_the_caller_is_answered() -> None:
    """Submit and Cancel answer after one pass of the loop when a lease or an abort went out, so that the
    worker stream's writer takes it first; an answer written first would delay the lease."""
    pools = [PoolConfig("default")]
    runtime = Runtime(Engine(pools), OutputCache(10, 1 << 20), clock=lambda: NOW)
    service = service_over(runtime, pools)
    caller = service.authorize(None, Role.ADMIN)
    sink = QueuedSink()
    try:
        runtime.attach(1, sink, "default", 1, {})
        answer = await service.submit(caller, pb.SubmitRequest(task=pb.TaskSpec(pool="default")))
        assert [action.task.id for action in sink.written if isinstance(action, Dispatch)] == [answer.id]

        queued = await service.submit(caller, pb.SubmitRequest(task=pb.TaskSpec(pool="default")))
        assert sink.queue.empty() and len(sink.written) == 1  # no free slot: nothing went out
        assert runtime.engine.get(queued.id) is not None

        cancelled = await service.cancel(caller, pb.CancelRequest(task=pb.TaskRef(id=answer.id)))
        assert cancelled.cancelled
        aborts = [action for action in sink.written if isinstance(action, Abort)]
        leases = [action for action in sink.written if isinstance(action, Dispatch)]
        assert len(aborts) == 1 and [lease.task.id for lease in leases] == [answer.id, queued.id]
    finally:
        sink.writer.cancel()
        runtime.cancel_timer()
