"""Library mode end to end with real executors on the test's event loop.

No test here depends on timing: executors that must stay running wait on an ``asyncio.Event`` the test
sets, and every wait is bounded by ``within`` so a broken behaviour fails instead of hanging. The
time-driven paths (timeouts, lease TTLs, backoff, fixed starts, cron, autoscaling) are in
``tests/integration/test_library.py``.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Awaitable, Callable

import pytest

from cronoq import (
    Dep,
    EventsLagged,
    EventStream,
    Permanent,
    Pool,
    Priority,
    Resource,
    Retryable,
    RetryPolicy,
    Scheduler,
    SchedulerError,
    StatusEvent,
    SubmitError,
    Task,
    TaskContext,
    TaskFailed,
)

from .helpers import QUICK_RETRY, WAIT_S, echo, within

Executor = Callable[[TaskContext, object], Awaitable[object]]


def fixed(
    executor: Executor,
    capacity: int = 4,
    *,
    retry: RetryPolicy = QUICK_RETRY,
    max_pending: int | None = None,
    overflow: str = "wait",
) -> Pool:
    """The pool "default" with a fixed capacity (no autoscaler) that retries at once by default."""
    return Pool(
        "default",
        executor,
        min=max(capacity, 1),
        max=max(capacity, 1),
        initial=capacity,
        autoscale=False,
        retry=retry,
        max_pending=max_pending,
        overflow=overflow,
    )


class Gate:
    """An executor that reports when it starts and then waits until the test releases it."""

    def __init__(self) -> None:
        self.started = asyncio.Event()
        self.release = asyncio.Event()
        self.contexts: list[TaskContext] = []
        self.cancelled: list[tuple[int, bool]] = []  # (task id, ctx.is_cancelled() when cancelled)

    async def __call__(self, ctx: TaskContext, payload: object) -> object:
        self.contexts.append(ctx)
        self.started.set()
        try:
            await self.release.wait()
        except asyncio.CancelledError:
            self.cancelled.append((ctx.id, ctx.is_cancelled()))
            raise
        return payload


# ------------------------------------------------------------------------------------------ outcomes


async def test_submit_returns_a_handle_that_resolves_to_the_result() -> None:
    async def double(ctx: TaskContext, payload: object) -> object:
        assert isinstance(payload, int)
        return payload * 2

    async with Scheduler([fixed(double)]) as scheduler:
        handle = await scheduler.submit(21)
        assert await within(handle) == 42
        assert await within(handle) == 42  # awaitable any number of times
        assert await handle.result() == 42
        assert handle.done() and not handle.duplicate and handle.id == 1
        assert repr(handle) == "TaskHandle(id=1, duplicate=False, done=True)"
        assert await scheduler.status(handle.id) == "succeeded"


async def test_enqueue_returns_ids_in_order_and_runs_everything() -> None:
    seen: list[object] = []

    async def record(ctx: TaskContext, payload: object) -> None:
        seen.append(payload)

    async with Scheduler([fixed(record, capacity=1)]) as scheduler:
        stream = scheduler.events()
        ids = [await scheduler.enqueue(i) for i in range(5)]
        assert ids == [1, 2, 3, 4, 5]
        assert await scheduler.status(5) in ("ready", "running")  # visible at once, before any yield
        finished = [(await within(anext(stream))).id for _ in ids]
    assert sorted(finished) == ids and seen == [0, 1, 2, 3, 4]


async def test_enqueued_tasks_keep_their_ids_across_batches_and_other_calls() -> None:
    async with Scheduler([fixed(echo, capacity=0)]) as scheduler:
        ids = [await scheduler.enqueue(i) for i in range(2500)]  # more than one engine batch, no yield
        keyed = await scheduler.enqueue("keyed", key="k")
        after = await scheduler.enqueue("after")
        assert ids == list(range(1, 2501)) and (keyed, after) == (2501, 2502)
        assert await scheduler.status(2502) == "ready" and await scheduler.status(2503) is None
        assert (await scheduler.snapshot()).pending == 2502
        stream = scheduler.events()
        await scheduler.set_capacity("default", 4)
        finished = {(await within(anext(stream))).id for _ in range(2502)}
    assert finished == set(range(1, 2503))


async def test_executors_may_submit_more_work() -> None:
    scheduler: Scheduler

    async def fan_out(ctx: TaskContext, payload: object) -> object:
        assert isinstance(payload, int)
        if payload == 0:
            return "leaf"
        children = [await scheduler.submit(payload - 1) for _ in range(2)]
        return [await child for child in children]

    async with Scheduler([fixed(fan_out, capacity=8)]) as scheduler:
        assert await within(await scheduler.submit(2)) == [["leaf", "leaf"], ["leaf", "leaf"]]


async def test_permanent_fails_without_retry() -> None:
    attempts: list[int] = []

    async def refuse(ctx: TaskContext, payload: object) -> None:
        attempts.append(ctx.attempt)
        raise Permanent("bad input")

    async with Scheduler([fixed(refuse)]) as scheduler:
        handle = await scheduler.submit(None)
        with pytest.raises(TaskFailed) as failed:
            await within(handle)
    assert (failed.value.status, failed.value.message, failed.value.task_id) == ("failed", "bad input", 1)
    assert attempts == [1]


async def test_other_exceptions_retry_then_dead_letter_with_the_last_message() -> None:
    attempts: list[int] = []

    async def explode(ctx: TaskContext, payload: object) -> None:
        attempts.append(ctx.attempt)
        raise ValueError(f"boom {ctx.attempt}")

    async with Scheduler([fixed(explode)]) as scheduler:
        handle = await scheduler.submit(None)
        with pytest.raises(TaskFailed) as failed:
            await within(handle)
        snapshot = await scheduler.snapshot()
    assert (failed.value.status, failed.value.message) == ("dead_lettered", "ValueError: boom 3")
    assert attempts == [1, 2, 3]
    assert snapshot.totals["retries"] == 2 and snapshot.totals["dead_lettered"] == 1


async def test_retryable_then_success_with_the_task_retry_policy() -> None:
    async def flaky(ctx: TaskContext, payload: object) -> object:
        if ctx.attempt < 3:
            raise Retryable(f"flaky {ctx.attempt}", retry_after=0)
        return ctx.attempt

    retry = RetryPolicy(max_attempts=5, initial_backoff=0, jitter=False)
    async with Scheduler([fixed(flaky, retry=RetryPolicy.none())]) as scheduler:
        assert await within(await scheduler.submit(None, retry=retry)) == 3
        with pytest.raises(TaskFailed, match="flaky 1"):  # the pool's policy: one attempt
            await within(await scheduler.submit(None))


async def test_an_executors_own_cancelled_error_is_retryable() -> None:
    async def cancel_itself(ctx: TaskContext, payload: object) -> object:
        if ctx.attempt == 1:
            raise asyncio.CancelledError
        return "second"

    async with Scheduler([fixed(cancel_itself)]) as scheduler:
        stream = scheduler.events()
        assert await within(await scheduler.submit(None)) == "second"
    async with Scheduler([fixed(cancel_itself, retry=RetryPolicy.none())]) as scheduler:
        with pytest.raises(TaskFailed) as failed:
            await within(await scheduler.submit(None))
    assert failed.value.message == "CancelledError: raised by the executor, not by cronoq"
    assert stream.closed


async def test_a_raising_executor_does_not_harm_the_scheduler() -> None:
    async def unstable(ctx: TaskContext, payload: object) -> object:
        if payload == "bad":
            raise RuntimeError("kaput")
        if payload == "worse":
            raise Permanent("broken")
        return payload

    async with Scheduler([fixed(unstable, retry=RetryPolicy.none())]) as scheduler:
        bad = [await scheduler.submit(p) for p in ["bad", "worse"] * 10]
        good = await scheduler.submit("fine")
        assert await within(good) == "fine"
        for handle in bad:
            with pytest.raises(TaskFailed):
                await within(handle)


async def test_sync_executors_run_in_threads_and_may_return_awaitables() -> None:
    loop_thread = threading.get_ident()

    async def later(value: object) -> object:
        return ("awaited", value)

    def blocking(ctx: TaskContext, payload: object) -> object:
        if payload == "raise":
            raise KeyError("missing")
        if payload == "coroutine":
            return later(threading.get_ident() != loop_thread)
        return threading.get_ident() != loop_thread

    pool = Pool("default", blocking, min=2, max=2, autoscale=False, retry=RetryPolicy.none())
    async with Scheduler([pool]) as scheduler:
        assert await within(await scheduler.submit("thread")) is True
        assert await within(await scheduler.submit("coroutine")) == ("awaited", True)
        with pytest.raises(TaskFailed, match="KeyError: 'missing'"):
            await within(await scheduler.submit("raise"))


async def test_every_dispatched_thread_attempt_starts_at_once() -> None:
    # More calls at once than a loop's default thread pool runs (at most 32): the engine counts each
    # attempt as running from dispatch (its timeout and lease TTL too), so none may wait for a thread.
    n = 40
    barrier = threading.Barrier(n)

    def meet(ctx: TaskContext, payload: object) -> str:
        barrier.wait(WAIT_S)  # passes only once all n attempts run at the same time
        return threading.current_thread().name

    pool = Pool("meet", meet, min=n, max=n, autoscale=False, retry=RetryPolicy.none())
    async with Scheduler([pool]) as scheduler:
        handles = [await scheduler.submit(None) for _ in range(n)]
        names = [await within(handle) for handle in handles]
    assert all(name.startswith("cronoq-meet") for name in names)  # the pool's own threads

    def pool_threads_left() -> bool:
        return any(thread.name.startswith("cronoq-meet") for thread in threading.enumerate())

    await within(_until(pool_threads_left, False))  # they end with the scheduler


class Unprintable(Exception):
    def __str__(self) -> str:
        raise RuntimeError("no text")


class UnprintablePermanent(Permanent):
    def __str__(self) -> str:
        raise RuntimeError("no text")


def stop_iteration(ctx: TaskContext, payload: object) -> object:
    raise StopIteration("empty")  # asyncio cannot carry it out of the thread into a future


async def unprintable(ctx: TaskContext, payload: object) -> object:
    raise Unprintable


async def unprintable_permanent(ctx: TaskContext, payload: object) -> object:
    raise UnprintablePermanent("never read")


@pytest.mark.parametrize(
    ("executor", "status", "message"),
    [
        (stop_iteration, "dead_lettered", "StopIteration: empty"),
        (unprintable, "dead_lettered", "Unprintable"),
        (unprintable_permanent, "failed", "UnprintablePermanent"),
    ],
)
async def test_exceptions_that_are_hard_to_report_still_end_the_attempt(
    executor: Callable[[TaskContext, object], object], status: str, message: str
) -> None:
    pool = Pool("default", executor, autoscale=False, retry=RetryPolicy.none())
    async with Scheduler([pool]) as scheduler:
        with pytest.raises(TaskFailed) as failed:
            await within(await scheduler.submit(None))
    assert (failed.value.status, failed.value.message) == (status, message)


# -------------------------------------------------------------------------------------- cancellation


async def test_cancelling_a_running_async_executor() -> None:
    gate = Gate()
    async with Scheduler([fixed(gate)]) as scheduler:
        handle = await scheduler.submit("x", key="job")
        await within(gate.started.wait())
        assert await scheduler.cancel("job") is True
        with pytest.raises(TaskFailed) as failed:
            await within(handle)
        assert (failed.value.status, failed.value.message) == ("cancelled", "cancelled")
        await within(_until(lambda: bool(gate.cancelled)))
        assert gate.cancelled == [(handle.id, True)]  # CancelledError at its await, is_cancelled() true
        assert gate.contexts[0].is_cancelled()
        assert await scheduler.cancel("job") is False  # no longer live
        assert await scheduler.cancel(999) is False  # unknown


async def test_handle_cancel_is_fire_and_forget_and_cancelled_returns() -> None:
    noticed = asyncio.Event()
    started = asyncio.Event()

    async def watch(ctx: TaskContext, payload: object) -> None:
        async def helper() -> None:
            assert await ctx.cancelled() is True
            noticed.set()

        helper_task = asyncio.create_task(helper())
        started.set()
        try:
            await asyncio.Event().wait()
        finally:
            await within(helper_task)

    async with Scheduler([fixed(watch)]) as scheduler:
        stream = scheduler.events(on_lag="raise")
        handle = await scheduler.submit(None)
        # Running is the engine's word: the executor's asyncio task may not have begun yet (on Python
        # 3.13 it has not), and one cancelled before it begins never runs at all.
        await within(started.wait())
        handle.cancel()
        with pytest.raises(TaskFailed, match="ended as cancelled"):
            await within(handle)
        await within(noticed.wait())
        assert (await within(anext(stream))).status == "cancelled"


async def test_cancelled_returns_false_once_the_attempt_ends_otherwise() -> None:
    helpers: list[asyncio.Task[bool]] = []
    contexts: list[TaskContext] = []

    async def spawn(ctx: TaskContext, payload: object) -> object:
        contexts.append(ctx)
        helpers.append(asyncio.create_task(ctx.cancelled()))  # a helper that must end with the attempt
        await asyncio.sleep(0)  # the helper is now waiting
        return payload

    async with Scheduler([fixed(spawn)]) as scheduler:
        assert await within(await scheduler.submit("done")) == "done"
        assert await within(helpers[0]) is False
        assert await within(contexts[0].cancelled()) is False  # at once, now that the attempt is over
        assert not contexts[0].is_cancelled()


async def test_cancelled_can_be_awaited_on_an_executors_own_loop() -> None:
    loop = asyncio.get_running_loop()
    waiting = asyncio.Event()
    seen: asyncio.Future[bool] = loop.create_future()

    def watch_in_thread(ctx: TaskContext, payload: object) -> None:
        async def watch() -> bool:
            cancelled = asyncio.ensure_future(ctx.cancelled())
            await asyncio.sleep(0)  # cancelled() is now waiting on this thread's loop
            loop.call_soon_threadsafe(waiting.set)
            # Bounded only so the thread ends: past the test's own deadline, so a missed wake-up fails.
            return await asyncio.wait_for(cancelled, 2 * WAIT_S)

        loop.call_soon_threadsafe(seen.set_result, asyncio.run(watch()))

    pool = Pool("default", watch_in_thread, autoscale=False, retry=RetryPolicy.none())
    async with Scheduler([pool]) as scheduler:
        handle = await scheduler.submit(None)
        await within(waiting.wait())
        assert await scheduler.cancel(handle.id)
        assert await within(seen) is True


async def test_cancel_a_queued_task() -> None:
    gate = Gate()
    async with Scheduler([fixed(gate, capacity=1)]) as scheduler:
        await scheduler.submit("first")
        queued = await scheduler.submit("second")
        await within(gate.started.wait())
        assert await scheduler.status(queued.id) == "ready"
        assert await scheduler.cancel(queued.id)
        gate.release.set()
        with pytest.raises(TaskFailed, match="cancelled"):
            await within(queued)
    assert [ctx.id for ctx in gate.contexts] == [1]


async def test_a_thread_that_outlives_its_cancelled_attempt_is_a_stale_completion() -> None:
    loop = asyncio.get_running_loop()
    started = asyncio.Event()
    finish = threading.Event()

    def blocking(ctx: TaskContext, payload: object) -> object:
        loop.call_soon_threadsafe(started.set)
        finish.wait(WAIT_S)
        return "too late"

    pool = Pool("default", blocking, autoscale=False, retry=RetryPolicy.none())
    async with Scheduler([pool]) as scheduler:
        handle = await scheduler.submit(None)
        await within(started.wait())
        assert await scheduler.cancel(handle.id)
        with pytest.raises(TaskFailed, match="ended as cancelled"):
            await within(handle)
        assert await _stale_completions(scheduler) == 0
        finish.set()  # its report now reaches the engine, which fences it by its lease and counts it
        await within(_until(lambda: _stale_completions(scheduler), 1))


async def _stale_completions(scheduler: Scheduler) -> int:
    return (await scheduler.snapshot()).totals["stale_completions"]


# -------------------------------------------------------------------------------- context and keys


async def test_context_describes_the_attempt() -> None:
    contexts: list[TaskContext] = []

    async def keep(ctx: TaskContext, payload: object) -> None:
        contexts.append(ctx)

    async with Scheduler([fixed(keep)]) as scheduler:
        parent = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
        await within(
            await scheduler.submit(
                None,
                kind="resize",
                key="k1",
                tags={"traceparent": parent, "n": 1},
                deadline_at=2e9,
                timeout=30,
            )
        )
        await within(await scheduler.submit(None))
    first, second = contexts
    assert (first.id, first.attempt, first.pool, first.kind, first.key) == (1, 1, "default", "resize", "k1")
    assert first.tags == {"traceparent": parent, "n": "1"} and first.tag("n") == "1"
    assert first.traceparent() == parent and second.traceparent() is None
    assert (first.deadline, first.timeout, first.group) == (2e9, 30.0, {})
    assert (second.kind, second.key, second.deadline, second.timeout) == ("default", None, None, None)
    assert first.lease != second.lease
    assert repr(first) == "TaskContext(id=1, attempt=1, pool='default', key='k1')"


async def test_a_key_names_one_task_live_or_finished() -> None:
    gate = Gate()
    async with Scheduler([fixed(gate)]) as scheduler:
        first = await scheduler.submit({"v": 1}, key="once")
        again = await scheduler.submit({"v": 2}, key="once", priority="critical")
        assert again.duplicate and again.id == first.id
        gate.release.set()
        assert await within(first) == {"v": 1}
        assert await within(again) == {"v": 1}
        late = await scheduler.submit({"v": 3}, key="once")
        assert late.duplicate and late.done() and await late == {"v": 1}  # the retained result
        assert await scheduler.enqueue(None, key="once") == first.id
        assert await scheduler.status("once") == "succeeded"
    assert len(gate.contexts) == 1


async def test_a_duplicate_of_a_failed_task_fails_the_same_way() -> None:
    async def refuse(ctx: TaskContext, payload: object) -> None:
        raise Permanent("no")

    async with Scheduler([fixed(refuse)]) as scheduler:
        with pytest.raises(TaskFailed, match="ended as failed: no"):
            await within(await scheduler.submit(None, key="k"))
        duplicate = await scheduler.submit(None, key="k")
        with pytest.raises(TaskFailed, match="ended as failed: no"):
            await duplicate


async def test_a_heartbeat_after_the_attempt_ended_changes_nothing() -> None:
    contexts: list[TaskContext] = []

    async def keep(ctx: TaskContext, payload: object) -> object:
        contexts.append(ctx)
        return payload

    async with Scheduler([fixed(keep)]) as scheduler:
        await within(await scheduler.submit(None))
        contexts[0].heartbeat()
        await within(asyncio.to_thread(contexts[0].heartbeat))  # its hop to the loop comes first
        assert await _stale_completions(scheduler) == 0  # a heartbeat is no completion, stale or not


async def test_status_and_handle_lookups() -> None:
    gate = Gate()
    async with Scheduler([fixed(gate)]) as scheduler:
        assert await scheduler.status(42) is None and await scheduler.handle("nope") is None
        submitted = await scheduler.submit("x", key="k")
        looked_up = await scheduler.handle("k")
        assert looked_up is not None and looked_up.id == submitted.id and not looked_up.done()
        gate.release.set()
        assert await within(looked_up) == "x"
        finished = await scheduler.handle(submitted.id)
        assert finished is not None and finished.done()
        with pytest.raises(TaskFailed, match="ended as succeeded: task already finished"):
            await finished
        with pytest.raises(TypeError, match="task id"):
            await scheduler.status(True)


# ----------------------------------------------------------------------------------------- batches


async def test_submit_batch_is_atomic() -> None:
    async with Scheduler([fixed(echo)]) as scheduler:
        with pytest.raises(SubmitError) as refused:
            await scheduler.submit_batch([Task(1, key="a"), Task(2, after="a"), Task(3, pool="nowhere")])
        assert (refused.value.code, refused.value.index) == ("unknown_pool", 2)
        assert await scheduler.status("a") is None
        with pytest.raises(SubmitError) as twice:
            await scheduler.submit_batch([Task(1, key="a"), Task(2, key="a")])
        assert twice.value.code == "duplicate_key_in_batch"
        assert (await scheduler.snapshot()).totals["submitted"] == 0
        handles = await scheduler.submit_batch([Task("child", after="parent"), Task("parent", key="parent")])
        assert [await within(h) for h in handles] == ["child", "parent"]  # input order
        assert handles[0].id == 1 and handles[1].id == 2
        assert await scheduler.submit_batch([]) == []


async def test_dependencies_wait_and_skip() -> None:
    order: list[object] = []

    async def record(ctx: TaskContext, payload: object) -> object:
        order.append(payload)
        if payload == "bad":
            raise Permanent("bad")
        return payload

    async with Scheduler([fixed(record, capacity=4)]) as scheduler:
        ok = await scheduler.submit("ok", key="ok")
        bad = await scheduler.submit("bad", key="bad")
        after_ok = await scheduler.submit("after_ok", after="ok")
        on_failure = await scheduler.submit("on_failure", deps=[Dep("bad", on="failure")])
        skipped = await scheduler.submit("skipped", after=["ok", "bad"])
        assert await within(after_ok) == "after_ok" and await within(on_failure) == "on_failure"
        with pytest.raises(TaskFailed) as failed:
            await within(skipped)
        assert failed.value.status == "skipped"
        with pytest.raises(SubmitError) as unknown:
            await scheduler.submit(None, after="missing")
        assert unknown.value.code == "unknown_dependency"
        await within(ok)
        with pytest.raises(TaskFailed):
            await within(bad)
    assert order.index("after_ok") > order.index("ok") and "skipped" not in order


# ------------------------------------------------------------------------------------------- events


async def test_events_carry_terminal_statuses_unless_transitions_are_asked_for() -> None:
    async with Scheduler([fixed(echo)]) as scheduler:
        stream = scheduler.events()
        handle = await scheduler.submit(None, key="k")
        await within(handle)
        event = await within(anext(stream))
    assert (event.id, event.pool, event.key, event.status, event.attempt) == (
        1,
        "default",
        "k",
        "succeeded",
        1,
    )
    assert event.message == "" and event.at > 0
    assert repr(event) == 'StatusEvent(id=1, pool="default", key=\'k\', status="succeeded", attempt=1)'

    async with Scheduler([fixed(echo)], emit_transitions=True) as scheduler:
        stream = scheduler.events()
        await within(await scheduler.submit(None))
        statuses = [(e.status, e.attempt) for e in [await within(anext(stream)) for _ in range(4)]]
        assert statuses == [("blocked", 0), ("ready", 0), ("running", 1), ("succeeded", 1)]
    assert [e async for e in stream] == []  # ended with the scheduler


async def test_a_slow_stream_drops_its_oldest_events() -> None:
    async with Scheduler([fixed(echo)], event_capacity=2) as scheduler:
        skipping = scheduler.events()
        raising = scheduler.events(on_lag="raise")
        handles = [await scheduler.submit(i) for i in range(5)]
        for handle in handles:
            await within(handle)
        assert skipping.lagged == 3 and raising.lagged == 3
        assert [(await within(anext(skipping))).id for _ in range(2)] == [4, 5]
        with pytest.raises(EventsLagged) as lagged:
            await within(anext(raising))
        assert lagged.value.skipped == 3
        assert [(await within(anext(raising))).id for _ in range(2)] == [4, 5]
        with pytest.raises(ValueError, match="on_lag must be 'skip' or 'raise'"):
            scheduler.events(on_lag="block")


async def test_closing_a_stream_ends_it() -> None:
    async with Scheduler([fixed(echo)]) as scheduler:
        async with scheduler.events() as stream:
            waiting = asyncio.ensure_future(anext(stream))
            await asyncio.sleep(0)
        assert stream.closed
        with pytest.raises(StopAsyncIteration):
            await within(waiting)
        await within(await scheduler.submit(None))  # a closed stream receives nothing
        assert [e async for e in stream] == []


# ---------------------------------------------------------------------------------------- capacity


async def test_priorities_decide_the_order() -> None:
    order: list[object] = []

    async def record(ctx: TaskContext, payload: object) -> None:
        order.append(payload)

    async with Scheduler([fixed(record, capacity=0)]) as scheduler:
        for priority in ("low", Priority.NORMAL, 1, Priority.CRITICAL):
            await scheduler.enqueue(priority, priority=priority)
        last = await scheduler.submit("last", priority="low")
        await scheduler.set_capacity("default", 1)
        await within(last)
    assert order == [Priority.CRITICAL, 1, Priority.NORMAL, "low", "last"]


async def test_labelled_tasks_run_only_on_matching_capacity() -> None:
    groups: list[dict[str, str]] = []

    async def record(ctx: TaskContext, payload: object) -> None:
        groups.append(ctx.group)

    async with Scheduler([fixed(record, capacity=0)]) as scheduler:
        gpu = await scheduler.submit("gpu", labels={"gpu": "a100"})
        await scheduler.set_capacity("default", 1)
        plain = await scheduler.submit("plain")
        await within(plain)
        assert not gpu.done()
        await scheduler.set_group_capacity("default", {"gpu": "a100", "zone": "x"}, 1)
        await within(gpu)
        snapshot = await scheduler.snapshot()
        with pytest.raises(ValueError, match="unknown pool 'nope'"):
            await scheduler.set_capacity("nope", 1)
        with pytest.raises(ValueError, match="capacity must be >= 0"):
            await scheduler.set_capacity("default", -1)
    assert groups == [{}, {"gpu": "a100", "zone": "x"}]
    assert snapshot.pools[0].capacity == 2


async def test_a_semaphore_bounds_concurrency_across_pools() -> None:
    running = 0
    peak = 0
    release = asyncio.Event()

    async def hold(ctx: TaskContext, payload: object) -> None:
        nonlocal running, peak
        running += 1
        peak = max(peak, running)
        await release.wait()
        running -= 1

    pools = [fixed(hold, capacity=4), Pool("other", hold, min=4, max=4, autoscale=False)]
    async with Scheduler(pools, resources=[Resource.semaphore("db", 2)]) as scheduler:
        handles = [
            await scheduler.submit(i, resources={"db": 1}, pool=("default", "other")[i % 2]) for i in range(6)
        ]
        free = await scheduler.submit("free")  # needs no permit: not held up
        await within(_until(lambda: scheduler.status(free.id), "running"))
        await within(_until(lambda: running, 3))  # two permit holders and the free one
        release.set()
        for handle in handles:
            await within(handle)
        with pytest.raises(SubmitError) as unknown:
            await scheduler.submit(None, resources={"gpu": 1})
        assert unknown.value.code == "unknown_resource"
        with pytest.raises(SubmitError) as too_many:
            await scheduler.submit(None, resources={"db": 3})
        assert too_many.value.code == "resource_exceeds_capacity"
    assert peak == 3


async def test_overflow_reject_and_wait() -> None:
    gate = Gate()
    async with Scheduler([fixed(gate, capacity=1, max_pending=1, overflow="reject")]) as scheduler:
        await scheduler.submit("running")
        await within(gate.started.wait())
        await scheduler.submit("pending")
        with pytest.raises(SubmitError) as refused:
            await scheduler.submit("one too many")
        assert refused.value.code == "overloaded"
        gate.release.set()

    gate = Gate()
    async with Scheduler([fixed(gate, capacity=1, max_pending=1)]) as scheduler:
        await scheduler.submit("running")
        await within(gate.started.wait())
        await scheduler.submit("pending")
        parked = asyncio.ensure_future(scheduler.enqueue("parked"))
        await asyncio.sleep(0)
        assert not parked.done()
        gate.release.set()  # "running" ends, "pending" starts: room for the parked one
        assert await within(parked) == 3


async def test_submit_refuses_bad_options_and_unknown_pools() -> None:
    async with Scheduler([fixed(echo)]) as scheduler:
        with pytest.raises(ValueError, match=r"priority must be 0\.\.=3"):
            await scheduler.submit(None, priority=9)
        with pytest.raises(ValueError, match="use either deadline_in or deadline_at"):
            await scheduler.enqueue(None, deadline_in=1, deadline_at=2)
        with pytest.raises(SubmitError) as unknown:
            await scheduler.enqueue(None, pool="x")
        assert (unknown.value.code, unknown.value.message) == ("unknown_pool", "unknown pool 'x'")
        with pytest.raises(TypeError, match="unexpected keyword argument"):
            await scheduler.submit(None, colour="red")  # type: ignore[call-arg]
        with pytest.raises(TypeError, match="Task objects"):
            await scheduler.submit_batch([None])  # type: ignore[list-item]
        assert (await scheduler.snapshot()).totals["submitted"] == 0


async def test_snapshot() -> None:
    async with Scheduler([fixed(echo, capacity=3), Pool("b", echo, autoscale=False)]) as scheduler:
        await within(await scheduler.submit(None))
        snapshot = await scheduler.snapshot()
    default = snapshot.pool("default")
    assert default is not None and snapshot.pool("zzz") is None
    assert [p.name for p in snapshot.pools] == ["default", "b"]
    assert (default.capacity, default.busy, default.desired, default.pending, default.window) == (
        3,
        0,
        3,
        0,
        60.0,
    )
    assert default.pending_by_class == [0, 0, 0, 0] and default.succeeded == 1
    assert (snapshot.live_tasks, snapshot.running, snapshot.pending) == (0, 0, 0)
    assert snapshot.totals["submitted"] == 1 and snapshot.totals["succeeded"] == 1
    assert repr(snapshot) == "Snapshot(live_tasks=0, running=0, pending=0)"
    assert repr(default).startswith(
        'PoolSnapshot(name="default", capacity=3, busy=0, pending=0, utilization='
    )


# ---------------------------------------------------------------------------------------- lifecycle


async def test_calls_outside_the_running_lifetime_are_refused() -> None:
    scheduler = Scheduler([fixed(echo)])
    with pytest.raises(RuntimeError, match=r"scheduler not started; call `await scheduler.start\(\)` first"):
        await scheduler.submit(None)
    with pytest.raises(RuntimeError, match="scheduler not started"):
        scheduler.events()
    await scheduler.start()
    assert scheduler.started
    with pytest.raises(RuntimeError, match="scheduler already started"):
        await scheduler.start()
    await scheduler.shutdown()
    assert not scheduler.started
    await scheduler.shutdown()  # idempotent
    for call in (scheduler.enqueue(None), scheduler.status(1), scheduler.cancel(1), scheduler.snapshot()):
        with pytest.raises(RuntimeError, match="scheduler not started"):
            await call
    with pytest.raises(RuntimeError, match="shut down"):
        await scheduler.start()


async def test_shutdown_waits_for_running_attempts_within_the_grace() -> None:
    gate = Gate()
    scheduler = Scheduler([fixed(gate)])
    await scheduler.start()
    handle = await scheduler.submit("x")
    await within(gate.started.wait())
    stopping = asyncio.ensure_future(scheduler.shutdown(grace=60))
    await asyncio.sleep(0)
    with pytest.raises(RuntimeError, match="scheduler not started"):
        await scheduler.submit("refused while stopping")
    assert scheduler.started and not stopping.done()
    gate.release.set()
    await within(stopping)
    assert await handle == "x" and not scheduler.started and gate.cancelled == []


async def test_a_cancelled_shutdown_still_stops_everything() -> None:
    # An outer timeout, a failing TaskGroup sibling or a second Ctrl-C in ``async with`` all cancel it.
    gate = Gate()
    scheduler = Scheduler([fixed(gate, capacity=1)])
    await scheduler.start()
    stream = scheduler.events()
    running = await scheduler.submit("running")
    queued = await scheduler.submit("queued")
    await within(gate.started.wait())
    first = asyncio.ensure_future(scheduler.shutdown(grace=60))
    await asyncio.sleep(0)  # it now waits out its grace for "running"
    second = asyncio.ensure_future(scheduler.shutdown())
    first.cancel()
    with pytest.raises(asyncio.CancelledError):
        await first
    assert not scheduler.started
    await within(second)  # a caller that was waiting for the first one is released
    await within(scheduler.shutdown())  # and a later one has nothing left to wait for
    for handle in (running, queued):
        with pytest.raises(TaskFailed, match="ended as shutdown: scheduler shut down"):
            await within(handle)
    assert await within(_collect(stream)) == []
    await within(_until(lambda: bool(gate.cancelled)))
    assert gate.cancelled == [(running.id, True)]


async def _collect(stream: EventStream) -> list[StatusEvent]:
    return [event async for event in stream]


async def test_shutdown_aborts_what_outlives_the_grace() -> None:
    gate = Gate()
    async with Scheduler([fixed(gate, capacity=1)], shutdown_grace=0) as scheduler:
        stream = scheduler.events()
        running = await scheduler.submit("running")
        queued = await scheduler.submit("queued")
        await within(gate.started.wait())
    for handle in (running, queued):
        with pytest.raises(TaskFailed) as failed:
            await within(handle)
        assert (failed.value.status, failed.value.message) == ("shutdown", "scheduler shut down")
    assert gate.cancelled == [(running.id, True)]
    assert [e async for e in stream] == []


def test_a_scheduler_whose_loop_closed_raises_scheduler_error() -> None:
    scheduler = Scheduler([fixed(echo)])
    asyncio.run(scheduler.start())
    with pytest.raises(SchedulerError, match="event loop this scheduler was started on is closed"):
        asyncio.run(scheduler.status(1))

    async def open_stream() -> EventStream:
        return scheduler.events()  # a stream on a dead loop would never yield nor end

    with pytest.raises(SchedulerError, match="event loop this scheduler was started on is closed"):
        asyncio.run(open_stream())


async def _until(check: Callable[[], object], expected: object = True) -> None:
    """Yield to the loop until ``check()`` (awaited if it returns an awaitable) gives ``expected``."""
    while True:
        value = check()
        if isinstance(value, Awaitable):
            value = await value
        if value == expected:
            return
        await asyncio.sleep(0)


# ------------------------------------------------------------------------------------------ capacity


async def test_an_autoscaled_pool_starting_below_min_has_min_capacity_once_started() -> None:
    async with Scheduler([Pool("default", echo, min=1, max=1, initial=0)]) as scheduler:
        pool = (await scheduler.snapshot()).pool("default")
        assert pool is not None and (pool.capacity, pool.desired) == (1, 1)
        assert await within(await scheduler.submit("ran")) == "ran"
