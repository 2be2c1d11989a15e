"""Latency histograms as Prometheus reads them: counts per bucket since the process started.

A user alerts on latencies across replicas and over any range (``histogram_quantile`` over
``rate(..._bucket[5m])`` summed by pool or shard), which per-process quantiles cannot give. Observing is
one bisection and two additions, so it may sit on a path every request takes; the counts are turned into
a family only when ``/metrics`` is scraped.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Iterable, Mapping, Sequence
from typing import Final, TypeVar

from prometheus_client.metrics_core import HistogramMetricFamily, Metric

# Upper bounds (seconds) of the buckets of a call's latency: a loopback call is about a millisecond, a
# commit of a busy store tens of them, a forwarded call that met a failover seconds.
CALL_BOUNDS: Final = (
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    0.5,
    1.0,
    2.5,
    5.0,
    10.0,
    30.0,
)


class Histogram:
    """Counts of observations per bucket (``counts[i]``: those in ``(bounds[i-1], bounds[i]]``, the last
    one above every bound) and their sum."""

    __slots__ = ("bounds", "counts", "total")

    def __init__(self, bounds: Sequence[float] = CALL_BOUNDS) -> None:
        self.bounds = tuple(bounds)
        self.counts = [0] * (len(self.bounds) + 1)
        self.total = 0.0

    def observe(self, seconds: float) -> None:
        self.counts[bisect_left(self.bounds, seconds)] += 1
        self.total += seconds

    def cumulative(self) -> list[tuple[str, float]]:
        """The ``le`` buckets Prometheus wants: cumulative counts, ending with ``+Inf``."""
        return cumulative(self.bounds, self.counts)


def cumulative(bounds: Sequence[float], counts: Sequence[int]) -> list[tuple[str, float]]:
    """``(le, count at or below le)`` for each bound and ``+Inf``, from per-bucket ``counts`` (one more
    than ``bounds``: the last holds what is above every bound)."""
    buckets = []
    seen = 0
    for bound, count in zip(bounds, counts, strict=False):
        seen += count
        buckets.append((repr(float(bound)), float(seen)))
    buckets.append(("+Inf", float(seen + counts[-1])))
    return buckets


K = TypeVar("K", bound=tuple[str, ...])


def observe(histograms: dict[K, Histogram], key: K, seconds: float) -> None:
    """Observe ``seconds`` in the histogram of ``key`` (label values), made on first use."""
    histogram = histograms.get(key)
    if histogram is None:
        histogram = histograms[key] = Histogram()
    histogram.observe(seconds)


Series = tuple[Mapping[str, str], list[tuple[str, float]], float]  # labels, cumulative buckets, sum


def histogram_family(name: str, help_text: str, labels: Sequence[str], series: Iterable[Series]) -> Metric:
    """A histogram family of ``series`` (each with the values of ``labels``, in that order)."""
    metric = HistogramMetricFamily(name, help_text, labels=list(labels))
    for values, buckets, total in series:
        metric.add_metric([values[label] for label in labels], buckets, total)
    return metric


def labelled_histograms(histograms: Mapping[K, Histogram], labels: Sequence[str]) -> Iterable[Series]:
    """The series of histograms kept by label values, in sorted label order."""
    for key in sorted(histograms):
        h = histograms[key]
        yield dict(zip(labels, key, strict=True)), h.cumulative(), h.total
