"""Resources that gate dispatch: semaphores and token buckets shared by all pools of one engine.

A task names the units it needs (``TaskSpec.resources``); it is dispatched only when every one of them is
available at that moment, and then takes them all at once, so two tasks needing the same pair can never
each hold half of it. Semaphore permits come back when the attempt ends; bucket tokens never come back,
they refill with time.

Token buckets are kept in exact rational arithmetic. With floats, ``refill_at`` could name a time at
which ``take`` still finds the bucket a rounding error short (Unix timestamps carry only about 0.2 µs
of precision), and a bucket refilled to ``burst`` could yield one dispatch fewer than ``burst``. Buckets are
rate limits, so they see at most a few thousand dispatches per second and the exact arithmetic costs
nothing noticeable; semaphores are plain ints.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from fractions import Fraction

from .model import ResourceConfig, Semaphore
from .snapshot import ResourceStats


class _Semaphore:
    """At most ``permits`` units held at once."""

    __slots__ = ("held", "permits")

    def __init__(self, permits: int) -> None:
        self.permits = permits
        self.held = 0


class _Bucket:
    """A token bucket as the time it is (or was) empty, i.e. a generic cell rate algorithm.

    It holds min(burst, (now - empty_at) * rate) tokens; ``empty_at`` None means it has been full for ever
    (it starts full). Taking ``a`` tokens moves ``empty_at`` forward by a / rate.
    """

    __slots__ = ("_empty_at", "_fill_time", "burst", "rate")

    def __init__(self, rate: float, burst: float) -> None:
        self.rate = Fraction(rate)
        self.burst = Fraction(burst)
        self._fill_time = self.burst / self.rate  # from empty to full
        self._empty_at: Fraction | None = None

    def ready_at(self, amount: int) -> Fraction | None:
        """The exact time from which ``amount`` tokens are there (None: since for ever)."""
        if self._empty_at is None:
            return None
        return self._empty_at + amount / self.rate

    def take(self, amount: int, now: Fraction) -> None:
        """Consume ``amount`` tokens; the caller has checked that they are there."""
        full_since = now - self._fill_time  # tokens saved up before this are lost to the cap
        start = full_since if self._empty_at is None else max(self._empty_at, full_since)
        self._empty_at = start + amount / self.rate

    def tokens(self, now: Fraction) -> Fraction:
        if self._empty_at is None:
            return self.burst
        return min(self.burst, (now - self._empty_at) * self.rate)


def _float_at_or_after(exact: Fraction) -> float:
    """The smallest float not before ``exact``, so that a timer armed for it never fires a hair early."""
    rounded = float(exact)
    if Fraction(rounded) < exact:
        rounded = math.nextafter(rounded, math.inf)
    return rounded


class Resources:
    """The resources of one engine (one shard), shared by all its pools.

    ``check`` validates a submission; ``take``/``release`` bracket an attempt; a refused ``take`` names
    the resource to wait for, and ``refill_at`` when to look again at a task waiting for a bucket.
    Amounts passed to these must have passed ``check``.
    """

    __slots__ = ("_by_name",)

    def __init__(self, configs: Sequence[ResourceConfig]) -> None:
        self._by_name: dict[str, _Semaphore | _Bucket] = {}
        for config in configs:
            if config.name in self._by_name:
                raise ValueError(f"duplicate resource name {config.name!r}")
            if isinstance(config, Semaphore):
                if config.permits < 1:
                    raise ValueError(f"resource {config.name!r}: permits must be >= 1")
                self._by_name[config.name] = _Semaphore(config.permits)
            else:
                if not (math.isfinite(config.rate) and config.rate > 0):
                    raise ValueError(f"resource {config.name!r}: rate must be a finite number > 0")
                if not (math.isfinite(config.burst) and config.burst >= 1):
                    raise ValueError(f"resource {config.name!r}: burst must be a finite number >= 1")
                self._by_name[config.name] = _Bucket(config.rate, config.burst)

    def check(self, amounts: Mapping[str, int]) -> tuple[str, str] | None:
        """The (code, message) of the first problem with a task's resource request, or None if it can run.

        Entries are checked in order, each for its amount, then its name, then its capacity; a request
        above capacity is refused at submit because it could never be granted.
        """
        for name, amount in amounts.items():
            if amount <= 0:
                return ("invalid", "invalid task: resource amount must be > 0")
            resource = self._by_name.get(name)
            if resource is None:
                return ("unknown_resource", f"unknown resource {name!r}")
            capacity = resource.permits if isinstance(resource, _Semaphore) else resource.burst
            if amount > capacity:
                return (
                    "resource_exceeds_capacity",
                    f"requested amount exceeds capacity of resource {name!r}",
                )
        return None

    def unavailable(self, amounts: Mapping[str, int]) -> str | None:
        """Why a request that passed ``check`` under an earlier configuration (a previous leader's) can
        never be granted under this one, or None if it can: ``take`` assumes every name exists."""
        problem = self.check(amounts)
        if problem is None:
            return None
        code, message = problem
        return f"{message}: it is no longer configured" if code == "unknown_resource" else message

    def take(self, amounts: Mapping[str, int], now: float) -> str | None:
        """Take every requested unit if all are available at ``now`` and return None; otherwise take
        nothing (partial holds could deadlock two tasks each holding half of what the other needs) and
        return the resource to wait for.

        That is a short semaphore if there is one, since only a release can help and a release wakes
        its waiters; otherwise the short bucket that refills last, so that one timer at its refill time
        finds every bucket of the request ready (unless others took tokens meanwhile)."""
        if not amounts:
            return None
        by_name = self._by_name
        exact_now: Fraction | None = None
        wait: str | None = None
        wait_ready = Fraction(0)
        for name, amount in amounts.items():
            resource = by_name[name]
            if isinstance(resource, _Semaphore):
                if resource.held + amount > resource.permits:
                    return name
            else:
                ready = resource.ready_at(amount)
                if ready is None:
                    continue
                if exact_now is None:
                    exact_now = Fraction(now)
                if exact_now < ready and (wait is None or ready > wait_ready):
                    wait, wait_ready = name, ready
        if wait is not None:
            return wait
        for name, amount in amounts.items():
            resource = by_name[name]
            if isinstance(resource, _Semaphore):
                resource.held += amount
            else:
                resource.take(amount, Fraction(now) if exact_now is None else exact_now)
        return None

    def refills(self, name: str) -> bool:
        """Whether ``name`` is a token bucket, which time refills (a semaphore only gets permits back
        from a release)."""
        return isinstance(self._by_name[name], _Bucket)

    def refill_at(self, name: str, amount: int, now: float) -> float:
        """The earliest time, not before ``now``, at which bucket ``name`` holds ``amount`` tokens if
        nobody takes any meanwhile: the time to look again at a task waiting for it."""
        bucket = self._by_name[name]
        assert isinstance(bucket, _Bucket), "only buckets refill"
        ready = bucket.ready_at(amount)
        if ready is None or ready <= Fraction(now):
            return now
        return _float_at_or_after(ready)

    def room(self, name: str, now: float) -> Fraction:
        """How many units of ``name`` a dispatch could take at ``now``: free permits, or tokens."""
        resource = self._by_name[name]
        if isinstance(resource, _Semaphore):
            return Fraction(resource.permits - resource.held)
        return resource.tokens(Fraction(now))

    def stats(self, now: float, waiting: Mapping[str, int]) -> list[ResourceStats]:
        """Every resource in configuration order, with what is available at ``now`` and the number of
        tasks ``waiting`` for it (which the engine keeps)."""
        exact_now = Fraction(now)
        stats = []
        for name, r in self._by_name.items():
            if isinstance(r, _Semaphore):
                kind, capacity, available = "semaphore", Fraction(r.permits), Fraction(r.permits - r.held)
            else:
                kind, capacity, available = "token_bucket", r.burst, r.tokens(exact_now)
            stats.append(ResourceStats(name, kind, float(capacity), float(available), waiting.get(name, 0)))
        return stats

    def release(self, amounts: Mapping[str, int]) -> None:
        """An attempt that took ``amounts`` ended: its semaphore permits come back (tokens are spent)."""
        for name, amount in amounts.items():
            resource = self._by_name[name]
            if isinstance(resource, _Semaphore):
                resource.held -= amount
