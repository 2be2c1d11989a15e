"""The server's Prometheus exposition of figures that no integration test can move cheaply."""

from __future__ import annotations

from cronoq.engine import Engine
from cronoq.engine.model import PoolConfig
from shard import metrics


def test_skipped_recurring_starts_are_exposed_as_a_counter() -> None:
    snap = Engine([PoolConfig("default")]).snapshot(1_000.0)
    snap.totals.recurring_skipped = 7
    text = metrics.render(snap, {}, shard="", watch_streams=0)
    assert "# TYPE cronoq_recurring_skipped_total counter" in text
    assert "\ncronoq_recurring_skipped_total 7\n" in text
