"""The chart's monitoring templates, rendered by the real ``helm``: the ``PrometheusRule`` (the rules of
``files/alerts.yaml``, the one file Compose and ``make cluster`` load too) and the Grafana dashboard
ConfigMaps (the chart's copy of ``dashboards/*.json``) for the sidecar, both off by default."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]  # ships no type information
import pytest
import yaml

from dashboards import generate

from .chart_render import CHART, CONFIG_FILE, REQUIRED, Doc, Rendered, ci_values, merge, refusal, render
from .conftest import KUBERNETES_VERSION, REPO

RULES_FILE = CHART / "files" / "alerts.yaml"
SHARDED = ci_values("sharded-tls-values.yaml")  # two shards, two replicas each
ON = {"prometheusRule": {"enabled": True}, "dashboards": {"enabled": True}}


def alerts_file() -> list[dict[str, Any]]:
    groups: list[dict[str, Any]] = yaml.safe_load(RULES_FILE.read_text())["groups"]
    return groups


def rule_of(rendered: Rendered) -> Doc:
    (rule,) = rendered.of_kind("PrometheusRule")
    return rule


def alert_names(rendered: Rendered) -> list[str]:
    return [rule["alert"] for group in rule_of(rendered)["spec"]["groups"] for rule in group["rules"]]


def installed_config_maps(rendered: Rendered) -> list[Doc]:
    """The ConfigMaps an install keeps (not the ``helm test`` hook's, created only while it runs)."""
    return [
        doc
        for doc in rendered.of_kind("ConfigMap")
        if "helm.sh/hook" not in doc["metadata"].get("annotations", {})
    ]


def test_off_by_default(helm: Path) -> None:
    rendered = render(helm, REQUIRED)
    assert not rendered.of_kind("PrometheusRule")
    assert [doc["metadata"]["name"] for doc in installed_config_maps(rendered)] == ["rel-cronoq-config"]


@pytest.mark.parametrize("values", [REQUIRED, SHARDED], ids=["default", "sharded"])
def test_the_prometheus_rule_holds_the_alerts_file(helm: Path, values: dict[str, Any]) -> None:
    """Rule for rule the file's (the annotations' own {{ $labels }} templates included: Helm must not
    expand them), with the labels a Prometheus's ruleSelector matches."""
    extra = {"prometheusRule": {"enabled": True, "labels": {"release": "prometheus"}}}
    rule = rule_of(render(helm, merge(values, extra)))
    assert rule["apiVersion"] == "monitoring.coreos.com/v1"
    assert rule["metadata"]["name"] == "rel-cronoq"
    assert rule["metadata"]["labels"]["release"] == "prometheus"
    assert rule["metadata"]["labels"]["app.kubernetes.io/instance"] == "rel"
    assert rule["spec"]["groups"] == alerts_file()
    assert "{{ $labels.shard }}" in rule["spec"]["groups"][0]["rules"][0]["annotations"]["summary"]


def test_promtool_accepts_the_rendered_rules(helm: Path, promtool: Path, tmp_path: Path) -> None:
    """What Helm wrote (re-indented, keys sorted, long strings folded) is still the same valid rules."""
    rendered = tmp_path / "rendered.yaml"
    rendered.write_text(yaml.safe_dump(rule_of(render(helm, merge(SHARDED, ON)))["spec"]))
    done = subprocess.run(
        [str(promtool), "check", "rules", str(rendered)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stdout + done.stderr
    count = sum(len(group["rules"]) for group in alerts_file())
    assert f"SUCCESS: {count} rules found" in done.stdout


def test_runbook_links_become_full_urls_with_a_base(helm: Path) -> None:
    base = "https://git.example.com/cronoq/-/blob/main"
    values = merge(SHARDED, {"prometheusRule": {"enabled": True, "runbookBaseUrl": base + "/"}})
    for group in rule_of(render(helm, values))["spec"]["groups"]:
        for rule in group["rules"]:
            assert rule["annotations"]["runbook_url"] == f"{base}/docs/operations.md#{rule['alert'].lower()}"


def test_disabled_alerts_are_left_out(helm: Path) -> None:
    values = merge(SHARDED, {"prometheusRule": {"enabled": True, "disabled": ["CronoqPoolWaitHigh"]}})
    every = [rule["alert"] for group in alerts_file() for rule in group["rules"]]
    assert alert_names(render(helm, values)) == [name for name in every if name != "CronoqPoolWaitHigh"]


@pytest.mark.parametrize(
    ("values", "kept"),
    [
        pytest.param(REQUIRED, True, id="two-replicas"),
        pytest.param(merge(REQUIRED, {"store": {"kind": "sqlite"}, "replicas": 1}), False, id="sqlite"),
        pytest.param(
            merge(SHARDED, {"shards": [{**s, "replicas": 1} for s in SHARDED["shards"]]}),
            False,
            id="shards-of-one",
        ),
        pytest.param(
            merge(
                SHARDED,
                {"replicas": 1, "shards": [{**SHARDED["shards"][0], "replicas": 2}, SHARDED["shards"][1]]},
            ),
            True,
            id="one-shard-with-a-standby",
        ),
    ],
)
def test_the_standby_alert_is_left_out_where_no_server_has_a_standby(
    helm: Path, values: dict[str, Any], kept: bool
) -> None:
    names = alert_names(render(helm, merge(values, ON)))
    assert ("CronoqStandbyMissing" in names) == kept
    assert "CronoqShardWithoutLeader" in names


def test_dashboards_are_configmaps_for_the_grafana_sidecar(helm: Path) -> None:
    values = merge(REQUIRED, {"dashboards": {"enabled": True, "annotations": {"grafana_folder": "cronoq"}}})
    maps = {doc["metadata"]["name"]: doc for doc in installed_config_maps(render(helm, values))}
    dashboards = {name: doc for name, doc in maps.items() if CONFIG_FILE not in doc["data"]}
    assert set(dashboards) == {"rel-cronoq-dashboard-overview", "rel-cronoq-dashboard-shard"}
    for doc in dashboards.values():
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
        assert doc["metadata"]["labels"]["grafana_dashboard"] == "1"
        assert doc["metadata"]["annotations"] == {"grafana_folder": "cronoq"}
        ((name, text),) = doc["data"].items()
        # Byte for byte what Compose's Grafana loads (the generator keeps the two copies equal).
        assert text == (REPO / "dashboards" / name).read_text() == generate.render(name)
    assert set(generate.DASHBOARDS) == {name for doc in dashboards.values() for name in doc["data"]}


def test_helm_lint_strict_passes_with_both(helm: Path, tmp_path: Path) -> None:
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(merge(ci_values("sharded-tls-values.yaml"), ON)))
    done = subprocess.run(
        [str(helm), "lint", "--strict", str(CHART), "-f", str(values)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr


@pytest.mark.parametrize(
    ("values", "message"),
    [
        pytest.param(
            {"prometheusRule": {"enabled": True, "disabled": ["CronoqNoSuchAlert"]}},
            'prometheusRule.disabled: "CronoqNoSuchAlert" is not one of the alerts: CronoqShardWithoutLeader,',
            id="unknown-alert",
        ),
        pytest.param(
            {"prometheusRule": {"disabled": "CronoqDeadLetters"}}, "prometheusRule.disabled", id="not-a-list"
        ),
        pytest.param(
            {"prometheusRule": {"runbookBaseUrl": "git.example.com"}},
            "prometheusRule.runbookBaseUrl",
            id="url",
        ),
        pytest.param({"prometheusRule": {"label": {}}}, "label", id="unknown-key"),
        pytest.param(
            {"dashboards": {"labels": {"grafana_dashboard": 1}}}, "dashboards.labels", id="label-value"
        ),
    ],
)
def test_refused(helm: Path, values: dict[str, Any], message: str) -> None:
    assert message in refusal(helm, merge(REQUIRED, values))
