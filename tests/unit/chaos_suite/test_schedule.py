"""The chaos schedule: one seed gives one schedule, every kind comes within a short run, and the
kinds a run cannot inject (the SQLite ones without a tmpfs) are left out."""

from __future__ import annotations

import itertools

import pytest

from chaos.broken import DEMONSTRATIONS, MEAN_GAP_S
from chaos.schedule import KINDS, SQLITE_KINDS, Topology, plan

# As the harness makes it from make cluster's topology: the workers in name order.
TOPOLOGY = Topology(
    ("cpu", "gpu"), ("worker-default-1", "worker-default-2", "worker-disk", "worker-llm"), sqlite=True
)
SHORT_RUN = (90.0, 20261206)  # the seconds and seed of tests/integration/test_chaos.py's run


def test_a_seed_replays_its_schedule_and_another_seed_does_not() -> None:
    first = plan(42, 600, TOPOLOGY)
    assert first == plan(42, 600, TOPOLOGY)
    assert first != plan(43, 600, TOPOLOGY)
    assert [f.number for f in first] == list(range(1, len(first) + 1))


def test_faults_come_between_the_warmup_and_the_tail_with_their_durations() -> None:
    faults = plan(7, 600, TOPOLOGY)
    assert 100 < len(faults) < 200  # a mean gap of 4 s (each from 0.5 to 12 s)
    assert all(5 < f.at <= 590 for f in faults)
    assert all(a.at < b.at for a, b in itertools.pairwise(faults))
    for fault in faults:
        aim, (shortest, longest) = KINDS[fault.kind]
        assert shortest <= fault.duration <= longest
        assert fault.target in {"shard": TOPOLOGY.shards, "worker": TOPOLOGY.workers}.get(aim, (aim,))


def test_the_short_run_meets_every_kind() -> None:
    seconds, seed = SHORT_RUN
    assert {f.kind for f in plan(seed, seconds, TOPOLOGY)} == set(KINDS)


def test_kinds_can_be_chosen_and_sqlite_kinds_need_the_sqlite_server() -> None:
    chosen = plan(1, 300, TOPOLOGY, frozenset({"kill-leader", "slow-link"}))
    assert {f.kind for f in chosen} == {"kill-leader", "slow-link"}
    without = plan(1, 600, Topology(TOPOLOGY.shards, TOPOLOGY.workers, sqlite=False))
    assert not {f.kind for f in without} & SQLITE_KINDS
    with pytest.raises(ValueError, match="unknown kind nap-leader"):
        plan(1, 60, TOPOLOGY, frozenset({"nap-leader"}))


def test_the_broken_build_demonstration_kills_leaders_while_their_links_are_slow() -> None:
    """chaos.broken's ack-before-commit demonstration needs leaders killed while their commits are slow
    (a leader that commits in milliseconds has little unwritten to lose); its seed's schedule has that."""
    demo = DEMONSTRATIONS["ack-before-commit"]
    faults = plan(demo.seed, demo.seconds, TOPOLOGY, demo.faults, mean_gap=MEAN_GAP_S)
    slow = [f for f in faults if f.kind == "slow-link" and f.detail["delay_ms"] >= 200]
    kills = [
        kill
        for kill in faults
        if kill.kind == "kill-leader"
        and any(s.target == kill.target and s.at + 1.5 <= kill.at <= s.at + s.duration - 0.5 for s in slow)
    ]
    assert len(kills) >= 5, [f.describe() for f in faults]
