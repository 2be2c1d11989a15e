"""The server's Prometheus exposition of figures that no integration test can move cheaply."""

from __future__ import annotations

from cronoq.engine import Engine
from cronoq.engine.model import PoolConfig, TaskSpec
from shard import metrics
from shard.runtime import CommitFailures


def test_skipped_recurring_starts_are_exposed_as_a_counter() -> None:
    snap = Engine([PoolConfig("default")]).snapshot(1_000.0)
    snap.totals.recurring_skipped = 7
    text = metrics.render(snap, {}, shard="", watch_streams=0)
    assert "# TYPE cronoq_recurring_skipped_total counter" in text
    assert "\ncronoq_recurring_skipped_total 7\n" in text


def test_ready_tasks_are_exposed_apart_from_those_waiting_for_their_start() -> None:
    """``cronoq_pool_ready`` counts what could run now; ``cronoq_pool_pending`` also counts a task
    whose start is tomorrow, which must not make the CronoqWorkWithoutWorkers alert fire."""
    engine = Engine([PoolConfig("default")])
    engine.submit([TaskSpec(pool="default"), TaskSpec(pool="default", start=1_000.0 + 86_400)], 1_000.0)
    text = metrics.render(engine.snapshot(1_000.0), {}, shard="", watch_streams=0)
    assert "# TYPE cronoq_pool_ready gauge" in text
    assert '\ncronoq_pool_ready{pool="default"} 1\n' in text
    assert 'cronoq_pool_pending{pool="default",priority="normal"} 2' in text


def test_commit_failures_are_counted_by_kind() -> None:
    text = metrics.render_commit_failures(CommitFailures(retried=3, fatal=1))
    assert "# TYPE cronoq_store_commit_failures_total counter" in text
    assert 'cronoq_store_commit_failures_total{kind="retried"} 3\n' in text
    assert 'cronoq_store_commit_failures_total{kind="fatal"} 1\n' in text
