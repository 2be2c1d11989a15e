"""Per-pool metrics over a sliding window, in bounded memory.

The window (``limits.metrics_window``, 60 s by default) is cut into ``SLOTS`` time buckets kept in a
ring; a bucket is cleared when the ring comes round to it again, so counting costs O(1) and memory does
not grow with traffic. Wait times and attempt run times each go into a log-bucket histogram per bucket:
percentiles are quantized to an eighth of an octave (about 6 % error), which is what a dashboard needs,
for a few hundred ints; the mean wait is exact (a running sum).

Utilization is the time spent running attempts within the window over the worker-seconds of the
window, as the reference defines it. The busy slots of the hot path are never integrated: an attempt is
credited when it ends, to the slices it ran in (one, for all but long attempts), and ``view`` adds the
in-window part of the attempts still running, which the engine passes in. Capacity changes rarely, so
the engine calls ``advance(now, capacity)`` just before it changes (and before a snapshot) to integrate
worker-seconds.
"""

from __future__ import annotations

import math
from bisect import bisect_left, bisect_right
from collections.abc import Iterable, Iterator
from typing import Final

from .model import Status

SLOTS: Final = 60  # buckets per window
# Globals: cheaper than an enum class attribute lookup on the path every attempt takes.
_SUCCEEDED: Final = Status.SUCCEEDED
_FAILED: Final = Status.FAILED

# Histogram: bin 0 holds durations under 1 ms; then 8 linear sub-bins per octave from 1 ms, 31 octaves
# (to about 24 days); the last bin also takes anything longer.
_UNIT: Final = 1e-3
_SUB: Final = 8
BINS: Final = 1 + 31 * _SUB
# Where each bin from 1 on begins, in units. The edges are exact binary fractions, so bisecting them
# finds the bin the octave arithmetic defines, in one C call: every finished attempt pays for one.
_EDGES: Final = [2.0**octave * (1.0 + sub / _SUB) for octave in range(31) for sub in range(_SUB)]


def duration_bin(seconds: float) -> int:
    """The histogram bin of a duration (a wait, or an attempt's run time)."""
    return bisect_right(_EDGES, seconds / _UNIT)


def _in_units(seconds: float) -> float:
    return seconds / _UNIT


def bin_all(counts: list[int], samples: list[float], also: list[int] | None = None) -> None:
    """Add to ``counts`` (and to ``also``, when given) the bin of each of ``samples`` (sorting them), as
    ``duration_bin`` gives it (``0`` below 1 ms): a sort in C and one bisection per bin edge inside the
    samples' range, instead of a bisection per sample on the path every attempt takes."""
    samples.sort()
    start = bisect_left(samples, _UNIT)  # bin 0: under 1 ms
    _add(counts, also, 0, start)
    n = len(samples)
    if start == n:
        return
    last = duration_bin(samples[-1])
    for index in range(duration_bin(samples[start]), last):
        # Bin ``index`` ends where the samples reach _EDGES[index], the first edge of the next bin.
        end = bisect_left(samples, _EDGES[index], start, n, key=_in_units)
        _add(counts, also, index, end - start)
        start = end
    _add(counts, also, last, n - start)


def _add(counts: list[int], also: list[int] | None, index: int, n: int) -> None:
    counts[index] += n
    if also is not None:
        also[index] += n


def edge_bin(seconds: float) -> int:
    """The first bin at or above ``seconds``, which must be a bin edge (1 ms times a power of two, say):
    the bins below it hold exactly the durations under ``seconds``."""
    return bisect_left(_EDGES, seconds / _UNIT) + 1


def bin_value(index: int) -> float:
    """The value a bin stands for: its midpoint (0 for the sub-millisecond bin)."""
    if index == 0:
        return 0.0
    octave, sub = divmod(index - 1, _SUB)
    return _UNIT * 2.0**octave * (1.0 + (sub + 0.5) / _SUB)


def quantile(counts: list[int], total: int, q: float) -> float:
    """The value below which a fraction ``q`` of the ``total`` samples in ``counts`` fall."""
    if total == 0:
        return 0.0
    rank = max(1, math.ceil(q * total))
    seen = 0
    for index, count in enumerate(counts):
        seen += count
        if seen >= rank:
            return bin_value(index)
    return bin_value(BINS - 1)


PRIORITIES: Final = 4  # the classes of model.Priority, whose values index the lists below


class WaitTotals:
    """One pool's dispatch waits since the engine started, per priority class (``counts[priority]`` in
    the window's bins, their sum and number): the histogram ``/metrics`` exports, which rates over any
    range can be taken from, where the window's quantiles only say what one process saw lately. Filled
    when a slice's waits are binned, so the path every attempt takes pays only for the class index."""

    __slots__ = ("counts", "dispatched", "sums")

    def __init__(self) -> None:
        self.counts = [[0] * BINS for _ in range(PRIORITIES)]
        self.sums = [0.0] * PRIORITIES
        self.dispatched = [0] * PRIORITIES


class Bucket:
    """Counters for one slice of the window; ``index`` is the slice number (time // width).

    Waits and run times are kept as they come (waits by priority class) and binned into ``waits`` and
    ``runs`` by ``settle`` (when the slice stops being the newest, and before a view): binning each as
    it came was a twentieth of the engine's time per task. Settling also adds the waits to the pool's
    ``WaitTotals``."""

    __slots__ = (
        "_new_runs",
        "_new_waits",
        "_totals",
        "capacity_area",
        "dispatched",
        "ended",
        "failed",
        "fixed_hits",
        "fixed_total",
        "index",
        "inversions",
        "retried",
        "run_ok",
        "run_total",
        "runs",
        "succeeded",
        "wait_total",
        "waits",
    )

    def __init__(self, totals: WaitTotals) -> None:
        self.waits = [0] * BINS
        self.runs = [0] * BINS
        self._totals = totals
        self._new_waits: list[list[float]] = [[] for _ in range(PRIORITIES)]
        self._new_runs: list[float] = []
        self.clear(-1)

    def clear(self, index: int) -> None:
        self.settle()  # no wait leaves without reaching the totals (the slice being reused is settled)
        self.index = index
        self.dispatched = 0
        self.inversions = 0
        self.wait_total = 0.0
        self.succeeded = 0
        self.failed = 0
        self.retried = 0
        self.ended = 0
        self.run_total = 0.0
        self.run_ok = 0.0
        self.capacity_area = 0.0
        self.fixed_hits = 0
        self.fixed_total = 0
        self.waits[:] = _EMPTY
        self.runs[:] = _EMPTY
        self._new_runs.clear()

    def settle(self) -> None:
        """Bin the waits and run times counted since the last call."""
        totals = self._totals
        for priority, waits in enumerate(self._new_waits):
            if waits:
                bin_all(self.waits, waits, totals.counts[priority])
                totals.sums[priority] += sum(waits)
                totals.dispatched[priority] += len(waits)
                waits.clear()
        if self._new_runs:
            bin_all(self.runs, self._new_runs)
            self._new_runs.clear()

    def dispatch(self, wait: float, inverted: bool, priority: int) -> None:
        """An attempt of class ``priority`` started after waiting ``wait`` seconds READY; ``inverted`` if
        it passed over an eligible task of a higher class."""
        self.dispatched += 1
        if inverted:
            self.inversions += 1
        self.wait_total += wait
        self._new_waits[priority].append(wait)

    def fixed_start(self, hit: bool) -> None:
        """A fixed-start task started within its tolerance (a hit), or started late or missed."""
        self.fixed_total += 1
        if hit:
            self.fixed_hits += 1

    def attempt(self, run: float, outcome: Status) -> None:
        """An attempt ended after ``run`` seconds as SUCCEEDED, FAILED (retryable or not) or CANCELLED;
        its run time is credited here in full (``WindowStats.attempt`` moves what ran before this slice)."""
        self.ended += 1
        self._new_runs.append(run)
        self.run_total += run
        if outcome is _SUCCEEDED:
            self.succeeded += 1
            self.run_ok += run
        elif outcome is _FAILED:
            self.failed += 1

    def retry(self) -> None:
        """A task that failed retryably got another attempt (it is RETRYING, not dead-lettered)."""
        self.retried += 1


_EMPTY: Final = [0] * BINS


class WindowView:
    """The window's numbers as the snapshot reports them."""

    __slots__ = (
        "dispatched",
        "failed",
        "fixed_start_hit_rate",
        "priority_adherence",
        "retried",
        "run_p50",
        "run_p99",
        "schedule_efficiency",
        "succeeded",
        "utilization",
        "wait_mean",
        "wait_p50",
        "wait_p90",
        "wait_p99",
    )

    def __init__(self, buckets: list[Bucket], running: float = 0.0) -> None:
        """``running``: the seconds attempts still running have run within the window."""
        dispatched = inversions = succeeded = failed = retried = ended = fixed_hits = fixed_total = 0
        wait_total = run_total = run_ok = capacity_area = 0.0
        waits = [0] * BINS
        runs = [0] * BINS
        for b in buckets:
            dispatched += b.dispatched
            inversions += b.inversions
            wait_total += b.wait_total
            succeeded += b.succeeded
            failed += b.failed
            retried += b.retried
            ended += b.ended
            run_total += b.run_total
            run_ok += b.run_ok
            capacity_area += b.capacity_area
            fixed_hits += b.fixed_hits
            fixed_total += b.fixed_total
            if b.dispatched:
                waits = [x + y for x, y in zip(waits, b.waits, strict=True)]
            if b.ended:
                runs = [x + y for x, y in zip(runs, b.runs, strict=True)]
        self.dispatched = dispatched
        self.succeeded = succeeded
        self.failed = failed
        self.retried = retried
        self.priority_adherence = 1.0 - inversions / dispatched if dispatched else 1.0
        self.fixed_start_hit_rate = fixed_hits / fixed_total if fixed_total else 1.0
        # (Capped against float rounding, and an attempt outliving its worker's capacity by an instant.)
        self.utilization = min(1.0, (run_total + running) / capacity_area) if capacity_area > 0 else 0.0
        self.schedule_efficiency = min(self.utilization, run_ok / capacity_area) if capacity_area > 0 else 0.0
        self.wait_mean = wait_total / dispatched if dispatched else 0.0
        self.wait_p50 = quantile(waits, dispatched, 0.50)
        self.wait_p90 = quantile(waits, dispatched, 0.90)
        self.wait_p99 = quantile(waits, dispatched, 0.99)
        self.run_p50 = quantile(runs, ended, 0.50)
        self.run_p99 = quantile(runs, ended, 0.99)


class WindowStats:
    """One pool's windowed counters plus its worker-seconds since start (reported, and priced as cost)."""

    __slots__ = ("_current", "_ring", "_until", "_width", "capacity", "last", "wait_totals", "worker_seconds")

    def __init__(self, window: float) -> None:
        self._width = window / SLOTS
        self.wait_totals = WaitTotals()
        self._ring = [Bucket(self.wait_totals) for _ in range(SLOTS)]
        self._current = self._ring[0]
        self._until = 0.0  # where the current bucket's slice ends: before it, no division is needed
        self.capacity = 0  # slots since ``last``
        self.last = 0.0  # time up to which capacity has been integrated
        self.worker_seconds = 0.0

    def bucket(self, now: float) -> Bucket:
        """The bucket for time ``now``. Time never runs backwards here: a ``now`` older than the newest
        bucket counts in the newest one, so a late caller cannot wipe newer counts."""
        if now < self._until:
            return self._current
        index = int(now // self._width)
        b = self._current
        if index > b.index:
            b.settle()  # the newest slice is the only one that counts waits and run times
            b = self._current = self._slot(index)
            self._until = (index + 1) * self._width
        return b

    def attempt(self, started: float, now: float, outcome: Status) -> None:
        """An attempt that began at ``started`` ended at ``now`` as ``outcome``: counted in the slice of
        ``now``, its run time spread over the slices it ran in, as far back as the window reaches."""
        b = self._current if now < self._until else self.bucket(now)
        b.attempt(now - started, outcome)
        since = b.index * self._width  # where that slice begins
        if started < since:
            self._backdate(b, started, since, outcome is _SUCCEEDED)

    def _backdate(self, b: Bucket, started: float, since: float, succeeded: bool) -> None:
        """Move the run time before ``since`` (the start of ``b``'s slice) from ``b`` to the slices it
        was run in; the part before the window is dropped."""
        early = since - started
        b.run_total -= early
        if succeeded:
            b.run_ok -= early
        for slot, seconds in self._spread(started, since, b.index):
            slot.run_total += seconds
            if succeeded:
                slot.run_ok += seconds

    def _spread(self, start: float, end: float, newest: int) -> Iterator[tuple[Bucket, float]]:
        """The part of [``start``, ``end``) in each slice of the window whose newest slice is ``newest``.
        Older slices have left the window; the one just before its oldest shares a ring bucket with
        ``newest``'s, so it must not be written either."""
        width = self._width
        start = max(start, (newest - SLOTS + 1) * width)
        while start < end:
            index = int(start // width)
            stop = min(end, (index + 1) * width)
            if stop <= start:  # float rounding at a slice edge: the rest is in the next slice
                stop = end
            yield self._slot(index), stop - start
            start = stop

    def _slot(self, index: int) -> Bucket:
        b = self._ring[index % SLOTS]
        if b.index < index:
            b.clear(index)
        return b

    def advance(self, now: float, capacity: int) -> None:
        """Integrate the capacity so far up to ``now``; from ``now`` on it is ``capacity``."""
        start = self.last
        held = self.capacity
        self.capacity = capacity
        if now <= start:
            return
        self.last = now
        if not held:
            return
        self.worker_seconds += held * (now - start)
        for slot, seconds in self._spread(start, now, int(now // self._width)):
            slot.capacity_area += held * seconds

    def settled_waits(self) -> WaitTotals:
        """The pool's waits since start, including those of the newest slice."""
        self._current.settle()
        return self.wait_totals

    def view(self, now: float, running: Iterable[float] = ()) -> WindowView:
        """The window's numbers as of ``now``; ``running`` holds when each attempt still running began."""
        self.advance(now, self.capacity)
        width = self._width
        current = int(now // width)
        window_start = (current - SLOTS + 1) * width
        busy = sum(now - max(started, window_start) for started in running)
        self._current.settle()
        return WindowView([b for b in self._ring if current - SLOTS < b.index <= current], busy)
