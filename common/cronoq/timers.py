"""Timers that never fire early, on either event loop cronoq runs on (see :mod:`cronoq.process`).

The engine is woken for its next deadline (a lease expiring, a retry coming due, a fixed start). Woken
early, it finds nothing due and asks to be woken again for the remaining fraction of a millisecond, and
again, until the clock passes the deadline: a short busy loop. asyncio's timers fire late, never early;
uvloop's do fire early: libuv counts timers in whole milliseconds (uvloop rounds the delay to the
nearest one, and libuv compares against a millisecond-truncated clock), up to a millisecond before the
delay asked for.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Callable

from cronoq.process import is_uvloop

# uvloop: the rounding (up to half a millisecond early) and the truncated clock (up to a whole one).
_MS = 0.001


def call_no_earlier(
    loop: asyncio.AbstractEventLoop, delay: float, callback: Callable[[], object]
) -> asyncio.TimerHandle:
    """``loop.call_later(delay, callback)``, but not before ``delay`` seconds have passed: on uvloop the
    delay is rounded up to a whole millisecond, plus one (a timer then fires 1-2 ms late, about as late
    as asyncio's do)."""
    delay = max(0.0, delay)
    if is_uvloop(loop):
        delay = math.ceil(delay / _MS) * _MS + _MS
    return loop.call_later(delay, callback)
