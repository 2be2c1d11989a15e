"""The chaos suite run on this checkout (``make chaos``, short): 90 s of seeded faults of every kind on
``make cluster``'s topology must leave nothing acknowledged lost, no stale outcome, nothing stuck and no
other violation; and the same suite run on a build broken on purpose (``python -m chaos.broken``:
submissions acknowledged before they are committed) must be caught. Both run as a user runs them, as
programs, and are judged by their reports."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from chaos.history import iter_file
from chaos.schedule import KINDS, SQLITE_KINDS
from tests.deploy.compose_image import REPO
from tests.postgres import server_programs

SHORT_SECONDS, SHORT_SEED = 90, 20261206  # tests/unit/chaos_suite/test_schedule.py: every kind comes


@pytest.fixture(autouse=True)
def _postgres() -> None:
    try:
        server_programs()
    except LookupError as err:
        pytest.skip(str(err))


def run(
    args: list[str], out: Path, timeout: float
) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, *args, "--out", str(out)], cwd=REPO, capture_output=True, text=True, timeout=timeout
    )
    print(done.stdout[-20000:], done.stderr[-5000:], sep="\n")
    assert (out / "report.json").exists(), "the run wrote no report"
    report: dict[str, Any] = json.loads((out / "report.json").read_text())
    return done, report


def leftovers(directory: Path) -> list[str]:
    """Processes whose working directory is under ``directory`` (each of the run's has its own there)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if os.readlink(entry / "cwd").startswith(str(directory)):
                    found.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode())
            except OSError:
                continue
    return found


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_a_short_chaos_run_keeps_every_invariant(tmp_path: Path) -> None:
    done, report = run(
        ["-m", "chaos", "--seconds", str(SHORT_SECONDS), "--seed", str(SHORT_SEED)], tmp_path, 400
    )
    assert report["violations"] == {}, report["violation_list"][:40]
    assert done.returncode == 0
    assert report["lost"] == report["stale"] == report["stuck"] == report["unverified"] == 0
    assert report["seed"] == SHORT_SEED and report["acknowledged"] > 500
    # Every kind of the schedule came, or was skipped for a target already under a fault; the SQLite
    # ones only where a tmpfs could be mounted (as root), which the report says.
    expected = set(KINDS) if report["sqlite"] == "on a tmpfs" else set(KINDS) - SQLITE_KINDS
    assert set(report["faults"]) - {"exit"} | set(report["faults_skipped"]) == expected
    assert sum(report["faults"].values()) >= 15
    kinds = {record["type"] for record in iter_file(tmp_path / "history.jsonl")}
    assert kinds >= {"meta", "fault", "heal", "role", "call", "lease", "report", "running", "final", "end"}
    # Nothing of the run is left: no process working in its directory, no tmpfs mounted there.
    assert leftovers(tmp_path) == []
    assert str(tmp_path) not in Path("/proc/mounts").read_text()


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_a_build_that_acknowledges_before_it_commits_is_caught(tmp_path: Path) -> None:
    done, report = run(["-m", "chaos.broken"], tmp_path, 280)
    assert done.returncode == 0, "chaos.broken says the checker missed the broken build"
    assert report["lost"] > 0 and report["verdict"] == "fail"
    assert report["source"] == "a build broken on purpose (chaos/patches/ack-before-commit.patch)"
    assert "the checker caught the broken build (lost)" in done.stdout
