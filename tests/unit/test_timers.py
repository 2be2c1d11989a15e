"""``call_no_earlier``: an engine timer never fires before its deadline, on either loop."""

from __future__ import annotations

import asyncio
import time
from functools import partial

import pytest

from cronoq.process import EVENT_LOOP_ENV, choose_event_loop
from cronoq.timers import call_no_earlier


def _stamp(fired: asyncio.Future[float]) -> None:
    fired.set_result(time.monotonic())


DELAYS = (0.0, 0.0001, 0.0004, 0.0006, 0.0014, 0.0026, 0.0101)


async def _shortest_waits(repeats: int) -> dict[float, float]:
    """For each delay, the shortest time that passed between arming a timer and its callback."""
    loop = asyncio.get_running_loop()
    shortest: dict[float, float] = {}
    for delay in DELAYS:
        for _ in range(repeats):
            fired: asyncio.Future[float] = loop.create_future()
            armed = time.monotonic()
            call_no_earlier(loop, delay, partial(_stamp, fired))
            waited = await fired - armed
            shortest[delay] = min(shortest.get(delay, waited), waited)
    return shortest


@pytest.mark.parametrize("kind", ["uvloop", "asyncio"])
def test_a_timer_never_fires_before_its_delay(kind: str) -> None:
    """``call_no_earlier`` never fires early (uvloop's own ``call_later`` does: the next test keeps
    checking that, so that this one goes on testing something real if uvloop changes)."""
    loop = choose_event_loop({EVENT_LOOP_ENV: kind})
    shortest = loop.run(_shortest_waits(20))
    for delay, waited in shortest.items():
        assert waited >= delay, f"{kind}: a {delay * 1e3:.1f} ms timer fired after {waited * 1e3:.3f} ms"


def test_uvloop_call_later_itself_fires_early() -> None:
    """The reason for call_no_earlier: a plain 0.4 ms uvloop timer (rounded to 0 ms) fires before 0.4 ms."""

    async def shortest() -> float:
        loop = asyncio.get_running_loop()
        waits = []
        for _ in range(20):
            fired: asyncio.Future[float] = loop.create_future()
            armed = time.monotonic()
            loop.call_later(0.0004, _stamp, fired)
            waits.append(await fired - armed)
        return min(waits)

    assert choose_event_loop({EVENT_LOOP_ENV: "uvloop"}).run(shortest()) < 0.0004
