"""The chaos report from a hand-made history: faults by kind with their recovery and the store commits
that failed during store faults, skipped faults, processes that exited, the figures and the seed."""

from __future__ import annotations

from pathlib import Path

import pytest

from chaos.checker import check
from chaos.history import write_all
from chaos.report import main, render, summary

from .story import SHARD_A, Story


def test_the_report_sums_up_faults_recovery_and_tasks() -> None:
    story = Story()
    story.simple(1, SHARD_A + 1)
    story.fault(10, 1, "cut-link", "link:a", shards=("a",), pools=("pa",))
    story.add("heal", 14, fault=1, commit_failures=3)
    story.simple(12, SHARD_A + 2)  # began 2.05 s after the cut
    story.fault(20, 2, "kill-worker", "w1", heal=21)
    story.simple(20.5, SHARD_A + 3)
    story.add(
        "fault", 30, id=3, kind="kill-router", target="router", skipped="router is already under a fault"
    )
    story.add("exit", 40, process="a2", code=1)
    story.add("restart", 41, process="a2")
    records = story.sorted()
    verdict = check(records)
    data = summary(records, verdict)
    assert data["recovery"]["cut-link"]["commit_failures"] == 3
    assert (
        data["recovery"]["cut-link"]["p50_s"] == data["recovery"]["cut-link"]["p99_s"] == pytest.approx(2.05)
    )
    assert "commit_failures" not in data["recovery"]["kill-worker"]  # not a store fault
    assert data["faults_skipped"] == {"kill-router": 1} and data["exits"] == {"a2": 1}
    assert (data["acknowledged"], data["lost"], data["verdict"]) == (3, 0, "pass")
    text = render(records, verdict)
    assert "  cut-link               1        2.05 s   2.05 s           0  3\n" in text
    assert "faults injected: 2 (and 1 skipped: target busy or missing)" in text
    assert "processes that exited on their own (restarted): a2 1x" in text
    assert "lost: 0\n" in text and text.endswith("seed 7 (CHAOS_SEED=7 replays this schedule)\n")


def test_a_history_can_be_checked_again_from_its_file(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    story = Story()
    story.simple(1, SHARD_A + 1)
    path = tmp_path / "history.jsonl"
    write_all(path, story.sorted())
    assert main([str(path)]) == 0 and "no violations" in capsys.readouterr().out
    story.add("exit", 5, process="a1", code=-11)
    write_all(path, story.sorted())
    assert main([str(path)]) == 1 and "crash: a1 ended by SIGSEGV" in capsys.readouterr().out
