"""``cronoq top``'s frame, drawn from a constructed snapshot (no server, no terminal)."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

from cronoq.cli import render_top
from cronoq.client import PoolSnapshot, Snapshot, Totals

IDLE = PoolSnapshot(
    name="", capacity=0, busy=0, held=0, desired=0,
    pending_by_class={"critical": 0, "high": 0, "normal": 0, "low": 0},
    reservations=0, dispatched=0, succeeded=0, failed=0, priority_adherence=1.0,
    fixed_start_hit_rate=1.0, utilization=0.0, schedule_efficiency=1.0,
    wait_p50=0.0, wait_p90=0.0, wait_p99=0.0, cost=0.0, workers_connected=0, groups=[],
)  # fmt: skip


def pool(name: str, **values: Any) -> PoolSnapshot:
    """A pool at rest, with ``values`` changed."""
    return replace(IDLE, name=name, **values)


def snapshot(pools: list[PoolSnapshot], unavailable: list[str] | None = None) -> Snapshot:
    totals = Totals(
        submitted=120, dispatched=100, succeeded=97, failed=1, dead_lettered=2, cancelled=3, skipped=0,
        missed=0, shed=0, retries=4, timeouts=0, lease_expiries=0, stale_completions=0,
    )  # fmt: skip
    return Snapshot(
        pools=pools,
        live_tasks=20,
        running=sum(p.busy for p in pools),
        pending=sum(p.pending for p in pools),
        totals=totals,
        workers_connected=sum(p.workers_connected for p in pools),
        unavailable_shards=unavailable or [],
    )


def test_a_row_per_pool_with_aligned_columns_and_totals() -> None:
    gpu = pool(
        "gpu",
        capacity=8,
        busy=6,
        held=1,
        desired=10,
        pending_by_class={"critical": 1, "high": 2, "normal": 12, "low": 0},
        succeeded=97,
        failed=1,
        utilization=0.75,
        wait_p50=0.12,
        wait_p99=2.44,
        workers_connected=2,
    )
    batch = pool("batch-long-name", wait_p50=90.0, wait_p99=150.0)
    lines = render_top(snapshot([gpu, batch])).splitlines()
    header, first, second = lines[0], lines[1], lines[2]
    assert header.split() == [
        "POOL", "CAP", "BUSY", "HELD", "DESIRED", "PENDING", "CRIT/HIGH/NORM/LOW",
        "WAIT", "P50", "WAIT", "P99", "UTIL", "OK", "FAILED", "WORKERS",
    ]  # fmt: skip
    assert first.split() == [
        "gpu",
        "8",
        "6",
        "1",
        "10",
        "15",
        "1/2/12/0",
        "120ms",
        "2.4s",
        "75%",
        "97",
        "1",
        "2",
    ]
    assert second.split() == [
        "batch-long-name",
        "0",
        "0",
        "0",
        "0",
        "0",
        "0/0/0/0",
        "1.5m",
        "2.5m",
        "0%",
        "0",
        "0",
        "0",
    ]
    # Numbers are right-aligned under their headings, names left-aligned.
    assert len({len(header), len(first), len(second)}) == 1
    assert first.index("8") + 1 == header.index("CAP") + len("CAP")
    assert lines[3] == ""
    assert lines[4] == "total: 2 pool(s), capacity 8, running 6, pending 15, workers 2, live tasks 20"
    assert lines[5] == (
        "totals: submitted 120, succeeded 97, failed 1, dead-lettered 2, cancelled 3, retries 4"
    )
    assert len(lines) == 6  # every shard answered: no unavailable line


def test_unreachable_shards_are_named_and_an_empty_view_says_so() -> None:
    lines = render_top(snapshot([], unavailable=["b", "c"])).splitlines()
    assert lines[1] == "(no pools visible to this credential)"
    assert lines[-1] == "unavailable shards: b, c (their pools are not shown)"
