"""The ``cronoq`` command-line client against a real server."""

from __future__ import annotations

import json
import subprocess
import sys

from .serverproc import ServerProcess


def cronoq(server: ServerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cronoq.cli", "--target", server.target, *args],
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_submit_get_cancel_list_snapshot(server: ServerProcess) -> None:
    out = cronoq(server, "submit", "--json", '{"a": 1}', "--key", "cli-1", "--priority", "high")
    assert out.returncode == 0, out.stderr
    submitted = json.loads(out.stdout)
    assert submitted["duplicate"] is False
    again = json.loads(cronoq(server, "submit", "--data", "x", "--key", "cli-1").stdout)
    assert again == {**submitted, "duplicate": True}

    info = json.loads(cronoq(server, "get", "cli-1").stdout)
    assert info["id"] == submitted["id"] and info["status"] == "ready" and info["priority"] == "high"

    assert json.loads(cronoq(server, "cancel", str(submitted["id"])).stdout) == {"cancelled": True}
    assert json.loads(cronoq(server, "get", "cli-1").stdout)["status"] == "cancelled"

    page = json.loads(cronoq(server, "list", "--status", "cancelled").stdout)
    assert [t["id"] for t in page["tasks"]] == [submitted["id"]]

    snap = json.loads(cronoq(server, "snapshot").stdout)
    assert snap["totals"]["submitted"] == 1 and snap["totals"]["cancelled"] == 1


def test_errors_are_reported_with_their_code(server: ServerProcess) -> None:
    out = cronoq(server, "get", "no-such-key")
    assert out.returncode == 1
    assert out.stderr.startswith("cronoq: not_found:")
    out = cronoq(server, "submit", "--pool", "nope")
    assert out.returncode == 1
    assert "unknown pool 'nope'" in out.stderr
