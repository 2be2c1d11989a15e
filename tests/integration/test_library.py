"""Library mode's time-driven paths with real executors and the real clock.

Durations are short (tenths of a second) and every assertion about time is a lower bound measured
around the behaviour (a retry cannot start before its backoff ends), so a slow machine makes these tests
slower, not flaky. Waits are bounded by ``within``.
"""

from __future__ import annotations

import asyncio
import inspect
import subprocess
import sys
import textwrap
import threading
import time
from collections.abc import Awaitable
from typing import TypeVar

import pytest

from cronoq import (
    AutoscaleConfig,
    Pool,
    Retryable,
    RetryPolicy,
    Scheduler,
    SchedulerError,
    SubmitError,
    TaskContext,
    TaskFailed,
)
from cronoq.process import EVENT_LOOP_ENV, choose_event_loop

T = TypeVar("T")


async def within(awaitable: Awaitable[T]) -> T:
    """Await with a generous bound, so a hang fails the test instead of the suite."""
    return await asyncio.wait_for(awaitable, 10.0)


class Hang:
    """An executor that never finishes on its own; it records how each attempt was stopped."""

    def __init__(self) -> None:
        self.stopped: list[tuple[int, bool]] = []  # (attempt, ctx.is_cancelled() when cancelled)

    async def __call__(self, ctx: TaskContext, payload: object) -> object:
        if payload == "quick" and ctx.attempt > 1:
            return "second attempt"
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            self.stopped.append((ctx.attempt, ctx.is_cancelled()))
            raise
        return None


async def test_timeout_aborts_the_attempt_and_retries() -> None:
    hang = Hang()
    retry = RetryPolicy(max_attempts=2, initial_backoff=0, jitter=False)
    async with Scheduler([Pool("default", hang, autoscale=False, retry=retry)]) as scheduler:
        assert await within(await scheduler.submit("quick", timeout=0.05)) == "second attempt"
        with pytest.raises(TaskFailed) as failed:
            await within(await scheduler.submit("forever", timeout=0.05))
        snapshot = await scheduler.snapshot()
    assert (failed.value.status, failed.value.message) == ("dead_lettered", "attempt timed out")
    assert hang.stopped == [(1, True), (1, True), (2, True)]
    assert snapshot.totals["timeouts"] == 3


async def test_timeout_zero_times_out_at_once() -> None:
    async with Scheduler([Pool("default", Hang(), autoscale=False, retry=RetryPolicy.none())]) as scheduler:
        with pytest.raises(TaskFailed, match="attempt timed out"):
            await within(await scheduler.submit(None, timeout=0))


async def test_lease_expires_without_heartbeats() -> None:
    hang = Hang()
    pool = Pool("default", hang, autoscale=False, lease_ttl=0.2, retry=RetryPolicy.none())
    async with Scheduler([pool]) as scheduler:
        started = time.time()
        with pytest.raises(TaskFailed) as failed:
            await within(await scheduler.submit(None))
        assert time.time() - started >= 0.2
        snapshot = await scheduler.snapshot()
    assert (failed.value.status, failed.value.message) == ("dead_lettered", "lease expired")
    assert hang.stopped == [(1, True)] and snapshot.totals["lease_expiries"] == 1


async def test_heartbeats_keep_a_long_attempt_alive() -> None:
    async def beating(ctx: TaskContext, payload: object) -> object:
        for _ in range(20):  # 0.6 s in all: twice the TTL
            await asyncio.sleep(0.03)
            ctx.heartbeat()
        return "alive"

    def beating_in_a_thread(ctx: TaskContext, payload: object) -> object:
        for _ in range(20):
            time.sleep(0.03)
            ctx.heartbeat()
        return threading.current_thread() is not threading.main_thread()

    # More attempts in threads at once than a loop's default thread pool runs (at most 32): the TTL
    # counts from dispatch, so each must start then rather than wait for a thread.
    n = 40
    pools = [
        Pool("default", beating, autoscale=False, lease_ttl=0.3, retry=RetryPolicy.none()),
        Pool(
            "threads",
            beating_in_a_thread,
            min=n,
            max=n,
            autoscale=False,
            lease_ttl=0.3,
            retry=RetryPolicy.none(),
        ),
    ]
    async with Scheduler(pools) as scheduler:
        on_loop = await scheduler.submit(None)
        in_threads = [await scheduler.submit(None, pool="threads") for _ in range(n)]
        assert await within(on_loop) == "alive"
        assert [await within(handle) for handle in in_threads] == [True] * n
        assert (await scheduler.snapshot()).totals["lease_expiries"] == 0


async def test_retry_after_is_a_floor_for_the_backoff() -> None:
    starts: list[float] = []

    async def throttled(ctx: TaskContext, payload: object) -> object:
        starts.append(time.time())
        if ctx.attempt == 1:
            raise Retryable("429", retry_after=0.3)
        return ctx.attempt

    retry = RetryPolicy(max_attempts=2, initial_backoff=0.01, jitter=False)
    async with Scheduler([Pool("default", throttled, autoscale=False, retry=retry)]) as scheduler:
        assert await within(await scheduler.submit(None)) == 2
    assert starts[1] - starts[0] >= 0.3


async def test_a_fixed_start_waits_for_its_time() -> None:
    ran_at: list[float] = []

    async def record(ctx: TaskContext, payload: object) -> None:
        ran_at.append(time.time())

    async with Scheduler([Pool("default", record, autoscale=False)]) as scheduler:
        submitted_at = time.time()
        handle = await scheduler.submit(None, start_in=0.3)
        assert await scheduler.status(handle.id) == "scheduled"
        await within(handle)
    assert ran_at[0] - submitted_at >= 0.3


async def test_recurring_occurrences_run_until_removed() -> None:
    async def tick(ctx: TaskContext, payload: object) -> object:
        return payload

    async with Scheduler([Pool("default", tick, autoscale=False)]) as scheduler:
        stream = scheduler.events()
        await scheduler.add_recurring("every-second", "* * * * * *", "tick", key="tick")
        event = await within(anext(stream))
        assert event.status == "succeeded"
        assert event.key is not None and event.key.startswith("tick@") and event.key.endswith("Z")
        assert await scheduler.remove_recurring("every-second") is True
        assert await scheduler.remove_recurring("every-second") is False


async def test_recurring_refusals_are_scheduler_errors() -> None:
    async with Scheduler([Pool("default", Hang(), autoscale=False)]) as scheduler:
        with pytest.raises(SchedulerError, match=r"configuration error: .*61"):
            await scheduler.add_recurring("bad", "61 * * * *", None)
        with pytest.raises(SchedulerError, match=r"configuration error: .*Mars/X"):
            await scheduler.add_recurring("bad", "* * * * *", None, tz="Mars/X")
        with pytest.raises(ValueError, match="overlap must be one of skip, allow, queue, queue_on_success"):
            await scheduler.add_recurring("bad", "* * * * *", None, overlap="sometimes")
        with pytest.raises(SubmitError, match="unknown pool 'x'"):
            await scheduler.add_recurring("bad", "* * * * *", None, pool="x")
        with pytest.raises(TypeError, match="unexpected keyword argument"):
            await scheduler.add_recurring("bad", "* * * * *", None, start_in=1)  # type: ignore[call-arg]


async def test_autoscaling_follows_the_backlog() -> None:
    release = asyncio.Event()
    all_busy = asyncio.Event()
    running = 0

    async def wait(ctx: TaskContext, payload: object) -> None:
        nonlocal running
        running += 1
        if running == 8:
            all_busy.set()
        await release.wait()

    config = AutoscaleConfig(interval=0.05, drain_time=1.0)
    async with Scheduler([Pool("default", wait, min=1, max=8, autoscale=config)]) as scheduler:
        for _ in range(40):
            await scheduler.enqueue(None)
        await within(all_busy.wait())  # from 1 to max: 40 queued tasks want 40 workers
        pool = (await scheduler.snapshot()).pools[0]
        assert (pool.capacity, pool.busy, pool.desired) == (8, 8, 8)
        release.set()


async def test_shutdown_cannot_interrupt_a_thread_but_stops_waiting_for_it() -> None:
    loop = asyncio.get_running_loop()
    started = asyncio.Event()
    finish = threading.Event()

    def blocking(ctx: TaskContext, payload: object) -> None:
        loop.call_soon_threadsafe(started.set)
        finish.wait(10)

    async with Scheduler([Pool("default", blocking, autoscale=False)], shutdown_grace=0.1) as scheduler:
        handle = await scheduler.submit(None)
        await within(started.wait())
    with pytest.raises(TaskFailed, match="ended as shutdown: scheduler shut down"):
        await within(handle)
    finish.set()


def test_library_mode_in_a_fresh_process() -> None:
    script = textwrap.dedent(
        """
        import asyncio, sys
        import cronoq

        async def square(ctx, n):
            return n * n

        async def main():
            async with cronoq.Scheduler([cronoq.Pool("default", square)]) as scheduler:
                handles = [await scheduler.submit(n) for n in range(5)]
                print([await handle for handle in handles])

        asyncio.run(main())
        assert "grpc" not in sys.modules
        """
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[0, 1, 4, 9, 16]"


async def _wakes_before_deadline() -> list[tuple[float, float]]:
    """Retries with backoffs of fractions of a millisecond, so that the scheduler arms its engine timer
    for deadlines that do not fall on whole milliseconds: every timer callback that ran before the
    deadline it was armed for, as (now, deadline)."""
    early: list[tuple[float, float]] = []

    async def flaky(ctx: TaskContext, payload: object) -> object:
        if ctx.attempt < 8:
            raise Retryable("again")
        return ctx.attempt

    retry = RetryPolicy(max_attempts=8, initial_backoff=0.0003, multiplier=1.7, jitter=False)
    async with Scheduler([Pool("default", flaky, autoscale=False, retry=retry)]) as scheduler:
        on_timer = scheduler._on_timer

        def checked() -> None:
            deadline, now = scheduler._timer_at, time.time()
            if deadline is not None and now < deadline:
                early.append((now, deadline))
            on_timer()

        scheduler._on_timer = checked  # type: ignore[method-assign]
        handles = [await scheduler.submit(n) for n in range(10)]
        assert [await within(handle) for handle in handles] == [8] * 10
    return early


def test_on_uvloop_the_engine_timer_never_fires_before_its_deadline() -> None:
    """Library mode arms its engine timer through ``call_no_earlier``: a plain ``call_later`` fires up to
    a millisecond early on uvloop, and the scheduler would then spin until the deadline passed."""
    assert choose_event_loop({EVENT_LOOP_ENV: "uvloop"}).run(_wakes_before_deadline()) == []


_TIMED = [
    name
    for name, test in list(globals().items())
    if name.startswith("test_") and inspect.iscoroutinefunction(test)
]


@pytest.mark.parametrize("name", _TIMED)
def test_on_uvloop(name: str) -> None:
    """Each test above again on uvloop (pytest-asyncio runs them on asyncio's loop): library mode runs on
    its caller's loop, and uvloop's timers, unlike asyncio's, can fire early (see cronoq.timers)."""
    choose_event_loop({EVENT_LOOP_ENV: "uvloop"}).run(globals()[name]())
