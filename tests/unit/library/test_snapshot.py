"""The library snapshot's pool numbers against a clock the test moves: the scheduler reads time only
through ``cronoq.library.scheduler._time``, so executors that advance it give exact run times."""

from __future__ import annotations

import asyncio

import pytest

from cronoq import Pool, Retryable, Scheduler, TaskContext
from cronoq.library import scheduler as scheduler_module

from .helpers import QUICK_RETRY, within


class Clock:
    """Seconds the test sets; the scheduler reads them as Unix time."""

    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


async def test_ready_retried_run_times_and_worker_seconds(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock(1_000.0)
    monkeypatch.setattr(scheduler_module, "_time", clock)
    release = asyncio.Event()

    async def work(ctx: TaskContext, payload: object) -> object:
        if payload == "hold":
            await release.wait()
            return payload
        clock.now += 2.0 if payload == "slow" else 1.0  # the attempt's run time
        if payload == "flaky" and ctx.attempt == 1:
            raise Retryable("again")
        return payload

    pool = Pool("default", work, min=2, max=2, initial=2, autoscale=False, retry=QUICK_RETRY)
    async with Scheduler([pool]) as scheduler:
        assert await within(await scheduler.submit("slow")) == "slow"  # runs 2 s
        assert await within(await scheduler.submit("flaky")) == "flaky"  # 1 s, retried, 1 s again
        held = [await scheduler.submit("hold") for _ in range(3)]  # two run, one is ready
        snapshot = (await scheduler.snapshot()).pool("default")
        release.set()
        for handle in held:
            await within(handle)
    assert snapshot is not None
    assert (snapshot.busy, snapshot.ready, snapshot.pending) == (2, 1, 1)
    assert (snapshot.dispatched, snapshot.failed, snapshot.retried) == (5, 1, 1)
    assert snapshot.run_p50 == pytest.approx(1.0, rel=1 / 16)  # runs of 1, 1 and 2 s
    assert snapshot.run_p99 == pytest.approx(2.0, rel=1 / 16)
    assert snapshot.wait_mean == 0.0  # every attempt found a free slot at once, the held one waits on
    assert snapshot.worker_seconds == pytest.approx(2 * 4.0)  # 2 slots from 1,000 to 1,004
    assert snapshot.cost == 0.0  # no autoscaler, no price
