"""bench/profile.py's reading of py-spy's collapsed stacks: shares by layer and by running frame."""

from __future__ import annotations

from pathlib import Path

from bench.profile import layer, summarize


def test_frames_are_sorted_into_layers_by_their_file() -> None:
    assert layer("Thread.run (threading.py:982)") == "grpc poller thread (C)"
    assert layer("Runner.run (asyncio/runners.py:118)") == "event loop in C (uvloop, grpc callbacks)"
    assert layer("current_task (asyncio/tasks.py:38)") == "event loop (Python)"
    assert layer("EngineCore._run (cronoq/engine/core.py:285)") == "engine"
    assert layer("WorkerStream._write_loop (shard/workers.py:152)") == "cronoq"
    assert layer("_MessageToString (google/protobuf/text_format.py:1)") == "protobuf"
    assert layer("main (somewhere.py:1)") == "other"


def test_summary_counts_the_running_frame_of_each_stack(tmp_path: Path) -> None:
    raw = tmp_path / "raw.txt"
    raw.write_text(
        "main (x.py:1);Thread.run (threading.py:982) 6\n"
        "main (x.py:1);Runner.run (asyncio/runners.py:118);f (shard/workers.py:152) 3\n"
        "main (x.py:1);Runner.run (asyncio/runners.py:118) 1\n"
    )
    text = summarize(raw)
    assert "  60.0%  grpc poller thread (C)" in text
    assert "  30.0%  cronoq" in text and "  10.0%  event loop in C (uvloop, grpc callbacks)" in text
    assert "  30.0%  f (shard/workers.py:152)" in text
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    assert summarize(empty) == "  no samples"
