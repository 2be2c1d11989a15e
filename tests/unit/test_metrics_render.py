"""The server's ``/metrics`` page, as prometheus-client writes it from the shard's families: figures no
integration test can move cheaply, and the format details a scraper relies on."""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterable, Iterator, Mapping

import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.parser import text_string_to_metric_families

from cronoq import __version__
from cronoq.engine import Engine, compiled
from cronoq.engine.model import PoolConfig, Priority, TaskSpec
from cronoq.engine.snapshot import EngineSnapshot
from cronoq.engine.stats import WaitTotals
from cronoq.prometheus import Exposition, _CollectionPause, family
from shard import metrics
from shard.runtime import CommitFailures, CommitStats
from tests.prometheus import openmetrics_families
from tests.unit.engine.helpers import drain, make_engine, spec

OPENMETRICS = "application/openmetrics-text; version=1.0.0"


async def page(families: Iterable[Metric], accept: str = "") -> str:
    """The page of one scrape whose collector yields ``families`` (built then, as a server's are)."""
    body, _ = await Exposition(lambda: families, store="memory").render(accept)
    return body.decode()


def leader_families(
    snap: EngineSnapshot, commits: CommitStats | None = None, waits: Mapping[str, WaitTotals] | None = None
) -> Iterator[Metric]:
    return metrics.families(
        snap, {}, shard="", watch_streams=0, waits=waits or {}, store="postgres", commits=commits
    )


async def leader_page(snap: EngineSnapshot, accept: str = "", commits: CommitStats | None = None) -> str:
    return await page(leader_families(snap, commits), accept)


async def test_skipped_recurring_starts_are_exposed_as_a_counter() -> None:
    snap = Engine([PoolConfig("default")]).snapshot(1_000.0)
    snap.totals.recurring_skipped = 7
    text = await leader_page(snap)
    assert "# TYPE cronoq_recurring_skipped_total counter" in text
    assert "\ncronoq_recurring_skipped_total 7.0\n" in text


async def test_ready_tasks_are_exposed_apart_from_those_waiting_for_their_start() -> None:
    """``cronoq_pool_ready`` counts what could run now; ``cronoq_pool_pending`` also counts a task
    whose start is tomorrow, which must not make the CronoqWorkWithoutWorkers alert fire."""
    engine = Engine([PoolConfig("default")])
    engine.submit([TaskSpec(pool="default"), TaskSpec(pool="default", start=1_000.0 + 86_400)], 1_000.0)
    text = await leader_page(engine.snapshot(1_000.0))
    assert "# TYPE cronoq_pool_ready gauge" in text
    assert '\ncronoq_pool_ready{pool="default"} 1.0\n' in text
    assert '\ncronoq_pool_pending{pool="default",priority="normal"} 2.0\n' in text


async def test_commit_failures_are_counted_by_kind() -> None:
    text = await page([metrics.commit_failures(CommitFailures(retried=3, fatal=1))])
    assert "# TYPE cronoq_store_commit_failures_total counter" in text
    assert '\ncronoq_store_commit_failures_total{kind="retried"} 3.0\n' in text
    assert '\ncronoq_store_commit_failures_total{kind="fatal"} 1.0\n' in text


async def test_openmetrics_page_parses_and_counters_have_no_created_sample() -> None:
    """Every family of a leader with a durable store, resources and a commit summary written as
    OpenMetrics passes prometheus-client's strict OpenMetrics parser: counters typed without ``_total``
    and sampled with it, the quantile-only commit summary accepted, ``# EOF`` last. No ``_created``
    sample in either format: cronoq's counters count from what the store kept, not from a moment."""
    engine = Engine([PoolConfig("default")])
    commits = CommitStats()
    commits.add(0.002, 3)
    text = await leader_page(engine.snapshot(1_000.0), OPENMETRICS, commits)
    assert text.endswith("\n# EOF\n")
    parsed = openmetrics_families(text)
    assert parsed["cronoq_tasks"].type == "counter"
    assert {s.name for s in parsed["cronoq_tasks"].samples} == {"cronoq_tasks_total"}
    assert parsed["cronoq_store_commit_seconds"].type == "summary"
    assert parsed["cronoq_build"].type == "info"
    assert "_created" not in text
    assert "_created" not in await leader_page(engine.snapshot(1_000.0), commits=commits)


async def test_build_info_names_version_engine_and_store() -> None:
    body, content_type = await Exposition(list, store="sqlite").render("")
    text = body.decode()
    assert content_type == "text/plain; version=0.0.4; charset=utf-8"
    engine = "compiled" if compiled() else "python"
    assert f'\ncronoq_build_info{{engine="{engine}",store="sqlite",version="{__version__}"}} 1.0\n' in text
    # The standard collectors: process (on Linux), platform and GC.
    for name in (
        "process_cpu_seconds_total",
        "process_resident_memory_bytes",
        "python_info",
        "python_gc_objects_collected_total",
    ):
        assert f"\n# TYPE {name} " in text, name


def test_a_counter_must_be_named_total() -> None:
    with pytest.raises(ValueError, match=r"counter cronoq_tasks must be named \.\.\._total"):
        family("cronoq_tasks", "counter", "Tasks.", [])


async def test_no_garbage_collection_runs_while_a_page_is_alive() -> None:
    """A large page's samples, collected while alive, would be promoted and bring the next full
    collection forward (a long stall of the event loop on a server holding many tasks): no collection
    runs while any family of the page is alive, and the collector is back on afterwards."""
    snap = Engine([PoolConfig(f"p{i}") for i in range(200)]).snapshot(1_000.0)
    alive: list[weakref.ref[Metric]] = []

    def families() -> Iterator[Metric]:
        for built in leader_families(snap):
            alive.append(weakref.ref(built))
            yield built

    exposition = Exposition(families, store="memory")
    found: list[int] = []  # families of the page alive at each collection

    def record(phase: str, info: dict[str, int]) -> None:
        if phase == "start":
            found.append(sum(ref() is not None for ref in alive))

    gc.collect()  # generation 0 starts empty: the page alone is enough to fill it
    gc.callbacks.append(record)
    try:
        text = (await exposition.render(""))[0].decode()
    finally:
        gc.callbacks.remove(record)
    assert text.count("\ncronoq_pool_pending{") > 700  # more new objects than generation 0 holds
    assert len(alive) > 20 and not any(found) and gc.isenabled()


def buckets(text: str, name: str, **labels: str) -> dict[str, float]:
    """The ``le`` buckets of the series of histogram ``name`` with ``labels``."""
    found = {}
    for parsed in text_string_to_metric_families(text):
        for sample in parsed.samples:
            le = sample.labels.pop("le", None)
            if sample.name == f"{name}_bucket" and sample.labels == labels and le is not None:
                found[le] = sample.value
    return found


async def test_dispatch_waits_are_a_histogram_per_pool_and_priority_since_start() -> None:
    """Every attempt's ready-to-dispatch wait is counted in the bucket of its priority class, with the
    sum, and stays counted after the quantile window has moved past it: what rates over any range are
    taken from. Classes that never dispatched have no series."""
    engine = make_engine()
    engine.submit([spec(priority=Priority.HIGH), spec(priority=Priority.HIGH), spec()], 0.0)
    engine.add_worker(1, "p", 1, {}, 0.003)  # the first HIGH waited 3 ms
    for now in (0.5, 300.0):  # each completion starts the next: HIGH after 0.5 s, NORMAL after 300 s
        (dispatch,) = drain(engine).dispatches
        assert engine.complete(1, dispatch.lease, now)
    text = await page(leader_families(engine.snapshot(400.0), waits=engine.dispatch_waits()))
    assert "# TYPE cronoq_pool_dispatch_wait_seconds histogram" in text
    high = buckets(text, "cronoq_pool_dispatch_wait_seconds", pool="p", priority="high")
    assert (high["0.002"], high["0.004"], high["0.256"], high["0.512"], high["+Inf"]) == (0, 1, 1, 2, 2)
    assert len(high) == 20  # powers of two from 1 ms to 2^18 ms, and +Inf
    normal = buckets(text, "cronoq_pool_dispatch_wait_seconds", pool="p", priority="normal")
    assert normal["262.144"] == 0 and normal["+Inf"] == 1  # 300 s: above every bound
    assert '\ncronoq_pool_dispatch_wait_seconds_sum{pool="p",priority="normal"} 300.0\n' in text
    assert '\ncronoq_pool_dispatch_wait_seconds_count{pool="p",priority="high"} 2.0\n' in text
    assert 'priority="critical"' not in text.split("cronoq_pool_dispatch_wait_seconds", 1)[1]


async def test_commit_latency_is_a_histogram_of_every_commit() -> None:
    commits = CommitStats()
    for seconds in (0.0004, 0.003, 0.003, 0.2):
        commits.add(seconds, 1)
    text = await leader_page(make_engine().snapshot(0.0), commits=commits)
    found = buckets(text, "cronoq_store_commit_duration_seconds", store="postgres")
    assert (found["0.0005"], found["0.0025"], found["0.005"], found["0.25"], found["+Inf"]) == (1, 1, 3, 4, 4)
    assert '\ncronoq_store_commit_duration_seconds_count{store="postgres"} 4.0\n' in text


def test_overlapping_scrapes_keep_the_collector_off_until_the_last_ends() -> None:
    """Pages are written in threads, so scrapes overlap: the first to end used to turn the collector back
    on under the second's page. It comes back when the last ends, and only if it was on before."""
    pause = _CollectionPause()
    assert gc.isenabled()
    first, second = pause(), pause()
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    assert not gc.isenabled()  # the second page is still alive
    second.__exit__(None, None, None)
    assert gc.isenabled()
    gc.disable()  # a process that runs with the collector off keeps it off
    try:
        with pause():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()
