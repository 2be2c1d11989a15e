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

A READY task whose resources are taken is parked (``ResourceParking``): out of its pool's queue, so it
blocks nobody, until a release or a refill of the resource it waits for may let it go.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Mapping, Sequence
from fractions import Fraction
from heapq import heapify, heappop, heappush
from typing import TYPE_CHECKING, Final

from .model import ResourceConfig, Semaphore, Task
from .pool import PoolState
from .snapshot import ResourceStats
from .timers import TimerKind

if TYPE_CHECKING:
    from .core import EngineCore

# The slack of the float bounds below: a float operation is off by at most 1.1e-16 of its magnitude,
# so a few of them on values up to M are off by far less than _RELATIVE * M (+ _ABSOLUTE near 0).
_RELATIVE: Final = 1e-12
_ABSOLUTE: Final = 1e-9
# Entries of a resource's parked heap tolerated before dead ones are worth dropping.
_PARKED_SLACK: Final = 256


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


class ResourceParking:
    """The READY tasks of one engine waiting for resources, and the rules that park and wake them.

    The engine parks a task whose ``Resources.take`` named a short resource, tells this when an attempt
    released units (``released``) and when a parked task ends (``unpark``), and forwards RESOURCE_WAKE
    timers. A woken task goes back to its queue at its original place and its pool is marked for
    dispatch once the input is whole; units a woken task left unused are passed on by ``settle``, which
    the engine's dispatch runs at the end of an input. ``parked`` and ``rewoken`` are public because the
    engine tests them on its hot path, where nothing parked must cost no call. ``woken`` counts the
    tasks wake-ups put back in a queue, which the tests read to prove that a release or a refill wakes
    what it can serve, not the whole backlog behind a resource.
    """

    __slots__ = ("_engine", "_on", "_pools", "_refill_wake", "_resources", "parked", "rewoken", "woken")

    def __init__(self, engine: EngineCore, pools: Mapping[str, PoolState], resources: Resources) -> None:
        self._engine = engine
        self._pools = pools
        self._resources = resources
        self.parked: dict[int, tuple[Task, float]] = {}  # READY tasks waiting for resources, ready_at
        # Per resource and amount, the parked tasks waiting for it as (priority, seq, id), best first;
        # entries of tasks no longer parked are dropped when they surface.
        # (A heap per amount asked, so a wake never walks past requests bigger than the room left.)
        self._on: dict[str, dict[int, list[tuple[int, int, int]]]] = {}
        # The one RESOURCE_WAKE timer that counts: the earliest refill a task parked on a bucket waits
        # for (None: none armed). One timer serves every waiter of every bucket; a backlog behind a rate
        # limit would otherwise hold a timer per task and wake them all at each refill.
        self._refill_wake: float | None = None
        # Resources whose last wake-up woke someone: a woken task that finds no worker takes nothing, so
        # the room it was woken for goes to the next waiters (maybe of another pool) once the input's
        # dispatch is done.
        self.rewoken: set[str] = set()
        self.woken = 0

    def park(self, task: Task, short: str, ready_at: float, now: float) -> None:
        """A READY task whose resources are taken leaves the queue (so it blocks nobody) until a release
        or a token refill of ``short``, the resource it waits for, may let it go; it keeps its sequence
        number for when it comes back."""
        amounts = task.spec.resources
        self.parked[task.id] = (task, ready_at)
        by_amount = self._on.setdefault(short, {})
        waiting = by_amount.get(amounts[short])
        if waiting is None:
            waiting = by_amount[amounts[short]] = []
        elif len(waiting) > _PARKED_SLACK and len(waiting) > 2 * len(self.parked):
            # Mostly entries of tasks that finished while parked (cancelled, shed): drop them.
            waiting[:] = [entry for entry in waiting if entry[2] in self.parked]
            heapify(waiting)
        heappush(waiting, (task.spec.priority, task.seq, task.id))
        if self._resources.refills(short):
            self._arm_refill(self._resources.refill_at(short, amounts[short], now))

    def unpark(self, task: Task) -> bool:
        """``task`` ended while READY: True if it was parked (so not in its queue). Its heap entry is
        dropped when it surfaces."""
        return self.parked.pop(task.id, None) is not None

    def released(self, amounts: Mapping[str, int], now: float) -> None:
        """An attempt gave back ``amounts``: wake what the permits of each semaphore can serve (tokens
        stay spent; a refill wakes their waiters)."""
        resources = self._resources
        for name in amounts:
            if name in self._on and not resources.refills(name):
                self._wake(name, now)

    def settle(self, now: float) -> None:
        """After an input's dispatch: units that woken tasks left unused (they found no free worker,
        or another resource short) go to the next waiters, until a wake-up wakes nobody. Each round
        takes at least one task out of the waiting heaps, so this ends."""
        while self.rewoken:
            names, self.rewoken = self.rewoken, set()
            for name in names:
                self._wake(name, now)
            self._engine._dispatch_dirty(None, now)

    def due(self, due: float) -> float | None:
        """When a RESOURCE_WAKE timer fires: None unless it is the one that counts."""
        return due if due == self._refill_wake else None

    def refilled(self, now: float) -> None:
        """The RESOURCE_WAKE timer fired: buckets refilled. The engine's tick dispatches, then calls
        ``rearm_refills``."""
        self._refill_wake = None
        for name in list(self._on):
            if self._resources.refills(name):
                self._wake(name, now)

    def rearm_refills(self, now: float) -> None:
        """At the end of a tick (after a refill wake-up, its dispatch and settling): arm the wake-up for
        the next refill any parked task waits for. Settling has woken every waiter the tokens there
        could serve, so that refill is in the future: a timer armed in the past would spin."""
        resources = self._resources
        due: float | None = None
        for name, by_amount in self._on.items():
            if resources.refills(name):
                at = resources.refill_at(name, min(by_amount), now)
                if due is None or at < due:
                    due = at
        if due is not None and due > now:
            self._arm_refill(due)

    def per_pool(self) -> Counter[str]:
        """How many parked tasks each pool has (they are out of its queue's ``ready`` count)."""
        return Counter(task.spec.pool for task, _ in self.parked.values())

    def waiting(self) -> dict[str, int]:
        """How many parked tasks wait for each resource."""
        parked = self.parked
        return {
            name: sum(1 for heap in by_amount.values() for entry in heap if entry[2] in parked)
            for name, by_amount in self._on.items()
        }

    def _arm_refill(self, due: float) -> None:
        """Make sure a RESOURCE_WAKE fires by ``due`` (an earlier one serves: it arms the next)."""
        if self._refill_wake is None or due < self._refill_wake:
            self._refill_wake = due
            self._engine._arm(due, TimerKind.RESOURCE_WAKE, 0)

    def _wake(self, name: str, now: float) -> None:
        """Put the parked tasks waiting for resource ``name`` back in their queues at their original
        places, best first among those asking no more than the free units left, until none fits (a big
        request lets smaller ones behind it go). Each step looks at one head per distinct amount, so a
        release costs O(woken · amounts · log n), never a pass over the backlog: one behind a one-permit
        semaphore would otherwise be re-queued and parked again, whole, at every release. A woken task
        that still cannot run parks again. Their pools are marked dirty, dispatched once the input is
        whole: this runs while an attempt is being released, between two consistent states."""
        by_amount = self._on.get(name)
        if not by_amount:
            return
        room = self._resources.room(name, now)
        parked = self.parked
        engine = self._engine
        while room > 0:
            best: list[tuple[int, int, int]] | None = None
            best_amount = 0
            for amount, waiting in by_amount.items():
                while waiting and waiting[0][2] not in parked:
                    heappop(waiting)  # finished while parked
                if waiting and amount <= room and (best is None or waiting[0] < best[0]):
                    best, best_amount = waiting, amount
            if best is None:
                break
            room -= best_amount
            task, ready_at = parked.pop(heappop(best)[2])
            pool = self._pools[task.spec.pool]
            pool.queue.push(task, ready_at, requeue=True)
            engine._mark_dirty(pool)
            self.rewoken.add(name)
            self.woken += 1
        for amount in [a for a, waiting in by_amount.items() if not waiting]:
            del by_amount[amount]
        if not by_amount:
            del self._on[name]
