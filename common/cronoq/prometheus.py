"""``/metrics`` of a server or a router, served by prometheus-client.

cronoq keeps its figures where the engine and the runtime need them (engine totals, outcome counts,
gate counters); nothing on the hot path feeds a metrics library. A scrape reads those numbers and
builds the families then (:func:`family`, through the collector an :class:`Exposition` holds), next to
prometheus-client's standard process, platform and GC collectors and ``cronoq_build_info``.
prometheus-client writes the exposition: text format 0.0.4 by default, OpenMetrics to a scraper whose
``Accept`` asks for it.

Each process (and each server or router a test runs in one process) has its own registry: the global
default one would make a second server's collectors clash with the first's.
"""

from __future__ import annotations

import asyncio
import gc
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Literal, TypeVar

from prometheus_client import CollectorRegistry, GCCollector, PlatformCollector, ProcessCollector
from prometheus_client.exposition import choose_encoder
from prometheus_client.metrics_core import InfoMetricFamily, Metric

from cronoq import __version__
from cronoq.engine import compiled

Sample = tuple[Mapping[str, str], float]
Kind = Literal["gauge", "counter", "summary"]
K = TypeVar("K", bound=tuple[str, ...])


def family(name: str, kind: Kind, help_text: str, samples: Iterable[Sample]) -> Metric:
    """One family of samples computed at scrape time.

    A counter is named with ``_total`` here, as Prometheus and the docs know it; prometheus-client names
    the family without it (it adds ``_total`` to ``# HELP``/``# TYPE`` in the text format, and OpenMetrics
    wants it on samples only). No ``_created`` sample: these counters count since the process started,
    or on from what a store's last commit kept, which no one creation time describes."""
    if kind == "counter" and not name.endswith("_total"):
        raise ValueError(f"counter {name} must be named ..._total")
    metric = Metric(name.removesuffix("_total") if kind == "counter" else name, help_text, kind)
    for labels, value in samples:
        metric.add_sample(name, dict(labels), float(value))
    return metric


def labelled(counts: Mapping[K, int], names: tuple[str, ...]) -> Iterable[Sample]:
    """Samples of a counter kept as a mapping from label-value tuples, in sorted label order."""
    for key in sorted(counts):
        yield dict(zip(names, key, strict=True)), float(counts[key])


def build_info(store: str) -> Metric:
    """``cronoq_build_info``: the version, whether the engine runs its mypyc-compiled build or its
    Python sources (about half the speed: worth a look on a slow shard), and the store."""
    return InfoMetricFamily(
        "cronoq_build",
        "The cronoq build this process runs: version, engine (compiled or python) and store.",
        value={
            "version": __version__,
            "engine": "compiled" if compiled() else "python",
            "store": store,
        },
    )


class _Scraped:
    """The process's cronoq families, built by ``families`` at each scrape, plus its build info."""

    __slots__ = ("_build", "_families")

    def __init__(self, families: Callable[[], Iterable[Metric]], build: Metric) -> None:
        self._families = families
        self._build = build

    def collect(self) -> Iterable[Metric]:
        yield from self._families()
        yield self._build


class Exposition:
    """A process's ``/metrics``: its own registry, with ``families`` (cronoq's figures, read at scrape
    time), the standard process, platform and GC collectors, and ``cronoq_build_info``. ``store`` is the
    store kind (``memory``, ``sqlite``, ``postgres``; ``none`` for a router, which keeps no state)."""

    __slots__ = ("registry",)

    def __init__(self, families: Callable[[], Iterable[Metric]], *, store: str) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        ProcessCollector(registry=self.registry)
        PlatformCollector(registry=self.registry)
        GCCollector(registry=self.registry)
        self.registry.register(_Scraped(families, build_info(store)))

    async def render(self, accept: str) -> tuple[bytes, str]:
        """The page and its content type for a request's ``Accept`` header: OpenMetrics to a scraper
        that asks for ``application/openmetrics-text``, text format 0.0.4 otherwise (prometheus-client's
        negotiation).

        The families are collected on the event loop, the only place the engine may be read; writing
        them out, most of a scrape's time with many pools (prometheus-client formats each sample in
        Python), happens in a thread, which hands the loop back at every GIL switch interval instead of
        holding it for the whole page."""
        encode, content_type = choose_encoder(accept)
        with _collection_paused():
            metrics = list(self.registry.collect())
            body = await asyncio.to_thread(encode, _Collected(metrics))
            metrics.clear()  # freed now, before the collector is back on
        return body, content_type


class _CollectionPause:
    """The garbage collector off while any page is built and written: a page with many pools is tens of
    thousands of samples and label dicts, alive until it is written. A collection that runs meanwhile
    promotes them to older generations, bringing forward the next full collection, which on a server
    holding 100,000 tasks takes the event loop for about 140 ms (every 20 or so scrapes with 200 pools,
    ``bench/scrape.py``). Paused, they are freed by reference counting and never counted. Scrapes
    overlap (a page is written in a thread while the loop serves the next request): the collector comes
    back on when the last of them ends, and only if it was on when the first began."""

    __slots__ = ("_resume", "depth")

    def __init__(self) -> None:
        self.depth = 0
        self._resume = False

    @contextmanager
    def __call__(self) -> Iterator[None]:
        if self.depth == 0:
            self._resume = gc.isenabled()
            gc.disable()
        self.depth += 1
        try:
            yield
        finally:
            self.depth -= 1
            if self.depth == 0 and self._resume:
                gc.enable()


_collection_paused = _CollectionPause()


class _Collected:
    """Families already collected, for an encoder to write out away from the event loop."""

    __slots__ = ("_metrics",)

    def __init__(self, metrics: list[Metric]) -> None:
        self._metrics = metrics

    def collect(self) -> Iterable[Metric]:
        return self._metrics


__all__ = ["Exposition", "Kind", "Sample", "build_info", "family", "labelled"]
