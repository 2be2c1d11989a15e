"""The autoscaler: a pool's desired worker count from queue pressure (engine-behaviour §6).

Once per ``interval`` the engine hands it what it saw: arrivals since the last evaluation, the mean
service time, the backlog per class, the current capacity and the workers fixed starts will need. The
desired count is what the arrival rate needs at the target utilization, plus what drains the backlog in
``drain_time`` (or faster where a class has an SLO), plus the reservations:

    lambda  = EWMA of arrivals / dt (alpha ``ewma_alpha``), started with the first sample
    slots(x) = 0 if x < 0.01 else ceil(x)
    base    = slots(lambda * S / target_utilization) + slots(total_backlog * S / drain_time)
    slo_c   = slots(backlog_c * S / slo[c])   for each class c with an SLO
    raw     = clamp(max(base, max slo_c) + reserved, min, max)

The target then moves towards ``raw`` asymmetrically, because starting workers late costs latency while
stopping them early costs a restart: up at once, at most max(capacity * max_step_up_ratio,
max_step_up_abs) per evaluation; down only to the highest ``raw`` of the last ``stabilization_window``
seconds, by at most ``max_step_down``, and no sooner than ``cooldown`` after the previous step down.

``Autoscaling`` is the engine's side: an autoscaler per autoscaled pool, and what it counts for them
between evaluations.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Mapping, Sequence

from .fixed import FixedStarts
from .model import AutoscaleRule, PoolConfig, Scale
from .pool import PoolState

_NEGLIGIBLE = 0.01  # below this many workers' worth of demand, slots() asks for none


def slots(workers: float) -> int:
    """Whole workers for a fractional demand; a negligible demand (rounding noise, a trickle) needs none."""
    return 0 if workers < _NEGLIGIBLE else math.ceil(workers)


class Autoscaler:
    """One pool's autoscaler; sans-IO, the engine calls ``evaluate`` once ``due_at`` has come.

    ``due_at`` is minus infinity before the first evaluation (due at once, whatever the clock's origin),
    then the previous evaluation's time plus ``interval``. ``config`` is read by the engine for
    ``reservation_horizon``.
    """

    __slots__ = (
        "_default_duration",
        "_history",
        "_last_at",
        "_last_down_at",
        "_max",
        "_min",
        "_rate",
        "_target",
        "_unsampled",
        "config",
        "due_at",
    )

    def __init__(
        self,
        config: AutoscaleRule,
        min_workers: int,
        max_workers: int,
        default_duration: float,
        initial: int | None = None,
    ) -> None:
        if min_workers > max_workers:
            raise ValueError(f"min_workers ({min_workers}) must not exceed max_workers ({max_workers})")
        self.config = config
        self.due_at = -math.inf
        self._min = min_workers
        self._max = max_workers
        self._default_duration = default_duration
        # The target the first evaluation moves from: the capacity the pool really starts with when
        # known, so that one starting below min gets min at once (the target is only emitted on change).
        self._target = min_workers if initial is None else initial
        self._rate: float | None = None  # lambda, arrivals per second; None until the first sample
        self._last_at: float | None = None  # time of the previous evaluation
        self._unsampled = 0  # arrivals seen in evaluations that had no elapsed time to divide them by
        self._history: deque[tuple[float, int]] = deque()  # (time, raw) within the stabilization window
        self._last_down_at: float | None = None

    @property
    def desired(self) -> int:
        """The current target: the last one returned by ``evaluate``, or ``initial`` (default
        ``min_workers``) before that."""
        return self._target

    def evaluate(
        self,
        now: float,
        *,
        arrivals: int,
        service_time: float | None,
        backlog: Sequence[int],
        capacity: int,
        reserved: int,
    ) -> int | None:
        """One evaluation at ``now``; the new target if it changed, else None.

        ``arrivals``: tasks that became eligible since the previous evaluation. ``service_time``: the mean
        observed run time (None: nothing observed yet, use the pool's default duration). ``backlog``: ready,
        due and retrying tasks per class, indexed by ``Priority``. ``capacity``: the pool's workers now.
        ``reserved``: peak concurrent fixed-start reservations ahead within the reservation horizon.
        """
        self.due_at = now + self.config.interval
        self._sample(now, arrivals)
        raw = self._raw(service_time, backlog, reserved)
        window = self.config.stabilization_window
        while self._history and now - self._history[0][0] >= window:
            self._history.popleft()
        self._history.append((now, raw))

        current = self._target
        target = current
        if raw > current:
            step = max(math.floor(capacity * self.config.max_step_up_ratio), self.config.max_step_up_abs)
            target = min(raw, current + step)
        else:
            peak = max(r for _, r in self._history)
            cooled = self._last_down_at is None or now - self._last_down_at >= self.config.cooldown
            if peak < current and cooled:
                target = max(peak, current - self.config.max_step_down)
                self._last_down_at = now
        if target == current:
            return None
        self._target = target
        return target

    def _sample(self, now: float, arrivals: int) -> None:
        """Fold the arrival rate since the previous evaluation into the EWMA.

        The first evaluation (and any at the same instant as the previous one) has no elapsed time to
        measure a rate over, so its arrivals are carried into the next sample instead of inventing a dt;
        the EWMA then starts with that first real sample, which is what makes a burst right after start
        count in full (30 arrivals in the first second: lambda = 30, not 0.3 x 30).
        """
        previous, self._last_at = self._last_at, now
        dt = 0.0 if previous is None else now - previous
        if dt <= 0:
            self._unsampled += arrivals
            return
        sample = (arrivals + self._unsampled) / dt
        self._unsampled = 0
        alpha = self.config.ewma_alpha
        self._rate = sample if self._rate is None else alpha * sample + (1 - alpha) * self._rate

    def _raw(self, service_time: float | None, backlog: Sequence[int], reserved: int) -> int:
        """The desired count before step limits, clamped to [min, max]."""
        config = self.config
        s = self._default_duration if service_time is None else service_time
        rate = self._rate or 0.0
        needed = slots(rate * s / config.target_utilization) + slots(sum(backlog) * s / config.drain_time)
        for cls, seconds in config.slo.items():
            needed = max(needed, slots(backlog[cls] * s / seconds))
        return min(max(needed + reserved, self._min), self._max)


class Autoscaling:
    """The autoscaling feature of one engine: an ``Autoscaler`` per pool that has one, fed from the
    engine's state at each evaluation and from what this counts between them.

    The engine counts into ``arrivals`` each task of an autoscaled engine that becomes eligible (READY
    at submission, or when its edges are met or its fixed start comes), tells ``ran`` how long each
    attempt of an autoscaled pool ran, calls ``evaluate`` from its tick and asks ``next_due`` when to
    tick. ``scalers`` and ``arrivals`` are public because the engine tests and counts them on its hot
    path, where a pool without autoscaling must cost nothing.
    """

    __slots__ = ("_fixed", "_pools", "_runs", "_waiting", "arrivals", "scalers")

    def __init__(
        self,
        pools: Mapping[str, PoolState],
        waiting: Mapping[str, list[int]],
        fixed: FixedStarts,
        configs: Sequence[PoolConfig],
    ) -> None:
        self._pools = pools
        self._waiting = waiting  # the engine's BLOCKED + SCHEDULED per pool and class: not backlog
        self._fixed = fixed
        self.scalers = {
            c.name: Autoscaler(c.autoscale, c.min, c.max, c.default_duration, c.initial)
            for c in configs
            if c.autoscale is not None
        }
        self.arrivals = {c.name: 0 for c in configs}  # tasks that became eligible since the last evaluation
        self._runs = {c.name: [0.0, 0] for c in configs}  # attempt run seconds and count, for service time

    def ran(self, pool: str, seconds: float) -> None:
        """An attempt of autoscaled ``pool`` ended after ``seconds``: it counts in the service time."""
        runs = self._runs[pool]
        runs[0] += seconds
        runs[1] += 1

    def evaluate(self, now: float) -> list[Scale]:
        """Evaluate every autoscaled pool whose interval is up; the targets that changed."""
        changed: list[Scale] = []
        for name, scaler in self.scalers.items():
            if now < scaler.due_at:
                continue
            pool = self._pools[name]
            run_total, runs = self._runs[name]
            waiting = self._waiting[name]
            backlog = [pending - waiting[c] for c, pending in enumerate(pool.pending)]
            reserved = self._fixed.reserved_ahead(name, now, scaler.config.reservation_horizon)
            target = scaler.evaluate(
                now,
                arrivals=self.arrivals[name],
                service_time=run_total / runs if runs else None,
                backlog=backlog,
                capacity=pool.workers.capacity,
                reserved=reserved,
            )
            self.arrivals[name] = 0
            if target is not None:
                changed.append(Scale(name, target))
        return changed

    def next_due(self) -> float | None:
        """The earliest evaluation due; None without autoscaled pools. Before its first evaluation an
        autoscaler is due at once (-inf): 0.0 says so to any caller."""
        return min((max(scaler.due_at, 0.0) for scaler in self.scalers.values()), default=None)

    def desired(self, pool: str, capacity: int) -> int:
        """The target of ``pool``'s autoscaler, or its ``capacity`` when it has none."""
        scaler = self.scalers.get(pool)
        return capacity if scaler is None else scaler.desired
