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


def test_recurring_add_list_remove_and_task_options(server: ServerProcess) -> None:
    out = cronoq(
        server,
        "recurring",
        "add",
        "every-hour",
        "0 * * * *",
        "--tz",
        "Europe/Paris",
        "--overlap",
        "queue",
        "--pool",
        "other",
        "--kind",
        "report",
        "--key",
        "hourly",
        "--json",
        '{"r": 1}',
        "--tolerance",
        "5",
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"name": "every-hour"}
    [schedule] = json.loads(cronoq(server, "recurring", "list").stdout)
    assert (schedule["name"], schedule["pool"], schedule["kind"], schedule["overlap"]) == (
        "every-hour",
        "other",
        "report",
        "queue",
    )
    assert schedule["tz"] == "Europe/Paris" and schedule["next_at"] > 0 and schedule["last_task_id"] > 0
    occurrence = json.loads(cronoq(server, "get", str(schedule["last_task_id"])).stdout)
    assert occurrence["status"] == "scheduled" and occurrence["key"].startswith("hourly@")

    bad = cronoq(server, "recurring", "add", "x", "61 * * * *")
    assert bad.returncode == 1 and bad.stderr.startswith("cronoq: invalid_argument: cron: invalid cron")
    assert json.loads(cronoq(server, "recurring", "remove", "every-hour").stdout) == {"removed": True}
    assert json.loads(cronoq(server, "recurring", "remove", "every-hour").stdout) == {"removed": False}
    assert json.loads(cronoq(server, "recurring", "list").stdout) == []

    first = json.loads(cronoq(server, "submit", "--key", "first").stdout)
    later = cronoq(server, "submit", "--after", "first", "--start-in", "3600", "--on-miss", "skip")
    assert later.returncode == 0, later.stderr
    assert (
        json.loads(cronoq(server, "get", str(json.loads(later.stdout)["id"])).stdout)["status"] == "blocked"
    )
    unknown = cronoq(server, "submit", "--resource", "gpu=1")
    assert (
        unknown.returncode == 1
        and "cronoq: not_found: task.resources: unknown resource 'gpu'" in unknown.stderr
    )
    assert first["duplicate"] is False
