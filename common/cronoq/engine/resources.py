"""Resources that gate dispatch: semaphores and token buckets shared by all pools of one engine.

A task names the units it needs (``TaskSpec.resources``); it is dispatched only when every one of them is
available at that moment, and then takes them all at once, so two tasks needing the same pair can never
each hold half of it. Semaphore permits come back when the attempt ends; bucket tokens never come back,
they refill with time.

Token buckets are kept in exact rational arithmetic. With floats, ``refill_at`` could name a time at
which ``take`` still finds the bucket a rounding error short (Unix timestamps carry only about 0.2 µs
of precision), and a bucket refilled to ``burst`` could yield one dispatch fewer than ``burst``. A
bucket that is certainly full, which floats can tell with a margin far above their rounding, is taken
from without any rational arithmetic (a bucket that rarely limits, taken from by every dispatch, would
otherwise cost more than the rest of the engine); semaphores are plain ints.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from fractions import Fraction
from typing import Final

from .model import ResourceConfig, Semaphore
from .snapshot import ResourceStats

# The slack of the float bounds below: a float operation is off by at most 1.1e-16 of its magnitude,
# so a few of them on values up to M are off by far less than _RELATIVE * M (+ _ABSOLUTE near 0).
_RELATIVE: Final = 1e-12
_ABSOLUTE: Final = 1e-9


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

    A take from a full bucket sets ``empty_at`` to now - fill_time + a / rate, which depends on nothing
    else: it is kept as (now, a) in ``_lazy_now``/``_lazy_amount`` and worked out only when an exact
    answer is needed. ``_empty_by`` is a float never before the exact ``empty_at`` (-inf: full for ever),
    so ``full_at`` can tell a certainly full bucket in floats.
    """

    __slots__ = (
        "_empty_at",
        "_empty_by",
        "_fill_by",
        "_fill_time",
        "_lazy_amount",
        "_lazy_now",
        "_rate_f",
        "burst",
        "rate",
    )

    def __init__(self, rate: float, burst: float) -> None:
        self.rate = Fraction(rate)
        self.burst = Fraction(burst)
        self._fill_time = self.burst / self.rate  # from empty to full
        self._empty_at: Fraction | None = None
        self._rate_f = rate
        self._fill_by = _float_at_or_after(self._fill_time)
        self._empty_by = -math.inf
        self._lazy_now = 0.0
        self._lazy_amount = 0  # 0: no take waits to be worked out

    def full_at(self, now: float) -> bool:
        """Whether the bucket certainly holds ``burst`` tokens at ``now`` (False when unsure)."""
        slack = _ABSOLUTE + _RELATIVE * (abs(now) + self._fill_by)
        return now - self._empty_by >= self._fill_by + slack

    def _exact_empty_at(self) -> Fraction | None:
        if self._lazy_amount:
            self._empty_at = Fraction(self._lazy_now) - self._fill_time + self._lazy_amount / self.rate
            self._lazy_amount = 0
        return self._empty_at

    def ready_at(self, amount: int) -> Fraction | None:
        """The exact time from which ``amount`` tokens are there (None: since for ever)."""
        empty_at = self._exact_empty_at()
        if empty_at is None:
            return None
        return empty_at + amount / self.rate

    def take(self, amount: int, now: float, exact_now: Fraction | None) -> None:
        """Consume ``amount`` tokens; the caller has checked that they are there."""
        if self.full_at(now):
            self._lazy_now = now
            self._lazy_amount = amount
            refill = amount / self._rate_f
            slack = _ABSOLUTE + _RELATIVE * (abs(now) + self._fill_by + refill)
            self._empty_by = now - self._fill_by + refill + slack
            return
        empty_at = self._exact_empty_at()
        exact = Fraction(now) if exact_now is None else exact_now
        full_since = exact - self._fill_time  # tokens saved up before this are lost to the cap
        start = full_since if empty_at is None else max(empty_at, full_since)
        self._empty_at = start + amount / self.rate
        self._empty_by = _float_at_or_after(self._empty_at)

    def tokens(self, now: Fraction) -> Fraction:
        empty_at = self._exact_empty_at()
        if empty_at is None:
            return self.burst
        return min(self.burst, (now - empty_at) * self.rate)


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
        wait_ready: Fraction | None = None  # (not Fraction(0): that is a Python call on every take)
        for name, amount in amounts.items():
            resource = by_name[name]
            if isinstance(resource, _Semaphore):
                if resource.held + amount > resource.permits:
                    return name
            else:
                if resource.full_at(now):
                    continue  # burst tokens, and check() saw that amount <= burst
                ready = resource.ready_at(amount)
                if ready is None:
                    continue
                if exact_now is None:
                    exact_now = Fraction(now)
                if exact_now < ready and (wait_ready is None or ready > wait_ready):
                    wait, wait_ready = name, ready
        if wait is not None:
            return wait
        for name, amount in amounts.items():
            resource = by_name[name]
            if isinstance(resource, _Semaphore):
                resource.held += amount
            else:
                resource.take(amount, now, exact_now)
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
