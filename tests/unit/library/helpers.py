"""Shared bits of the library-mode tests: bounded waits and retry policies without jitter."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from cronoq import RetryPolicy, TaskContext

T = TypeVar("T")

WAIT_S = 10.0  # generous: a wait this long means the behaviour under test is broken, not slow

# Retries at once (no backoff, no jitter) so retry paths finish in a few loop iterations.
QUICK_RETRY = RetryPolicy(max_attempts=3, initial_backoff=0.0, multiplier=1.0, max_backoff=0.0, jitter=False)


async def within(awaitable: Awaitable[T]) -> T:
    """Await with a generous bound, so a hang fails the test instead of the suite."""
    return await asyncio.wait_for(awaitable, WAIT_S)


async def echo(ctx: TaskContext, payload: object) -> object:
    return payload
