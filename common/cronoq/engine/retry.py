"""Retry backoff: how long a task waits in RETRYING after a failed attempt.

Kept apart from the engine so the formula can be tested on its own and reused by library mode.
"""

from __future__ import annotations

import random

from .model import RetryRule


def backoff_delay(policy: RetryRule, attempt: int, retry_after: float | None, rng: random.Random) -> float:
    """The delay after failed attempt ``attempt`` (1-based).

    b = min(max_backoff, initial_backoff * multiplier**(attempt-1)); with jitter the delay is uniform in
    [0, b] ("full jitter", which spreads a thundering herd of retries best); a worker's ``retry_after``
    is a floor, because it usually comes from a rate limit that knows better than our formula.
    """
    try:
        base = policy.initial_backoff * policy.multiplier ** (attempt - 1)
    except OverflowError:  # a huge multiplier**k: the cap applies anyway
        base = policy.max_backoff
    delay = min(policy.max_backoff, base)
    if policy.jitter:
        delay = rng.uniform(0.0, delay)
    if retry_after is not None and retry_after > delay:
        delay = retry_after
    return delay
