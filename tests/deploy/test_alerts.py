"""The alert rules (``charts/cronoq/files/alerts.yaml``): valid for ``promtool``, every alert unit-tested
(``alerts_test.yaml``: silent one evaluation before it fires, then firing with its labels and
annotations), explained in docs/operations.md where its runbook_url points, kept apart per install,
and reading only what a real server or router exports. ``tests/integration/test_monitoring.py`` makes
each one fire on a real cluster scraped by a real Prometheus."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path
from typing import Any

import yaml

from .compose_image import REPO
from .promql import GROUPING, unknown_names

RULES = REPO / "charts" / "cronoq" / "files" / "alerts.yaml"
UNIT_TESTS = Path(__file__).with_name("alerts_test.yaml")
OPERATIONS = REPO / "docs" / "operations.md"
# What the issue asks to be alerted on, by the name of the alert that does.
ALERTS = {
    "CronoqShardWithoutLeader",  # no leader for a shard
    "CronoqShardUnreachable",  # a shard the router cannot reach
    "CronoqDeadLetters",  # dead letters rising
    "CronoqPoolWaitHigh",  # pool wait p99 over a threshold
    "CronoqWorkWithoutWorkers",  # pending work with no connected worker
    "CronoqStoreCommitsFailing",  # commits failing
    "CronoqStandbyMissing",  # a standby missing
}


def rules() -> list[dict[str, Any]]:
    (group,) = yaml.safe_load(RULES.read_text())["groups"]
    found: list[dict[str, Any]] = group["rules"]
    return found


def minutes(duration: str) -> float:
    """A promtool eval_time or a rule's ``for`` (``90s``, ``10m``, ``1h``) in minutes."""
    match = re.fullmatch(r"(\d+)([smh])", duration)
    assert match is not None, f"not a duration promtool or these rules use here: {duration}"
    return int(match[1]) * {"s": 1 / 60, "m": 1, "h": 60}[match[2]]


def test_there_is_an_alert_for_each_thing_to_watch() -> None:
    assert {rule["alert"] for rule in rules()} == ALERTS


def test_promtool_checks_the_rules(promtool: Path) -> None:
    done = subprocess.run(
        [str(promtool), "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(ALERTS)} rules found" in done.stdout


def test_promtool_unit_tests_pass(promtool: Path) -> None:
    done = subprocess.run(
        [str(promtool), "test", "rules", str(UNIT_TESTS)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout


def test_every_alert_is_unit_tested_silent_then_firing() -> None:
    """For each alert, a promtool test that expects it firing at some time and silent one evaluation
    before: the condition's last minute of ``for`` (or the minute before it turns true) is checked."""
    document = yaml.safe_load(UNIT_TESTS.read_text())
    assert document["rule_files"] == [str(Path("..") / ".." / RULES.relative_to(REPO))]
    step = minutes(document["evaluation_interval"])
    checked: dict[str, set[tuple[float, bool]]] = {}
    for test in document["tests"]:
        for case in test["alert_rule_test"]:
            checked.setdefault(case["alertname"], set()).add(
                (minutes(case["eval_time"]), bool(case["exp_alerts"]))
            )
    for alert in ALERTS:
        firing = [at for at, fires in checked.get(alert, set()) if fires]
        assert firing, f"no promtool test expects {alert} to fire"
        assert any((at - step, False) in checked[alert] for at in firing), (
            f"no promtool test expects {alert} silent one evaluation before it fires"
        )


def test_every_alert_says_what_happened_and_where_to_read_what_to_do() -> None:
    headings = set(re.findall(r"^### (\w+)$", OPERATIONS.read_text(), re.MULTILINE))
    for rule in rules():
        alert = rule["alert"]
        assert rule["labels"]["severity"] in {"critical", "warning"}, alert
        annotations = rule["annotations"]
        assert set(annotations) == {"summary", "description", "runbook_url"}, alert
        # GitHub's anchor of the heading "### CronoqShardWithoutLeader" is its lower-cased text.
        assert annotations["runbook_url"] == f"docs/operations.md#{alert.lower()}", alert
        assert alert in headings, f"docs/operations.md has no section ### {alert}"
        assert "for" not in rule or minutes(rule["for"]) >= 1, alert  # durations for production


def test_every_alert_keeps_installs_apart() -> None:
    """Each aggregation keeps ``namespace`` and ``job``: two installs with a shard or a pool of the same
    name, watched by one Prometheus, alert apart (the promtool tests have such a second install)."""
    for rule in rules():
        groupings = GROUPING.findall(rule["expr"])
        assert groupings, rule["alert"]
        for grouping in groupings:
            labels = {label.strip() for label in grouping.split(",")}
            assert {"namespace", "job"} <= labels, (rule["alert"], grouping)


def test_every_metric_and_label_exists(exported: dict[str, set[str]]) -> None:
    for rule in rules():
        assert not unknown_names(rule["expr"], exported), (
            rule["alert"],
            unknown_names(rule["expr"], exported),
        )
