"""Render ``charts/cronoq`` with the real ``helm`` binary and read what came out.

The chart cannot render without the two Secrets it names (tokens, database URL) and a way for the
routers to reach the servers (TLS, or plain http trusted with ``insecurePeerHttp``), so every scenario
starts from :data:`REQUIRED` and overlays what it changes with :func:`merge`.
"""

from __future__ import annotations

import json
import shutil
import subprocess
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from cronoq.config import syntax_of
from cronoq.config.problems import Problems
from cronoq.config.syntax import parse_document

from .conftest import REPO

CHART = REPO / "charts" / "cronoq"
TOKENS_SECRET = "cronoq-tokens"
DB_SECRET = "cronoq-db"
NAMESPACE = "jobs"
# The ConfigMap key of the servers' and routers' configuration, and the file the pods are given.
CONFIG_FILE = "cronoq.yaml"
REQUIRED: dict[str, Any] = {
    "auth": {"existingSecret": TOKENS_SECRET},
    "store": {"postgres": {"urlSecret": {"name": DB_SECRET}}},
    "insecurePeerHttp": True,
}
# The role → environment variable the pods receive each token in (and the config's token_env).
TOKEN_ENVS = {
    "client": "CRONOQ_CLIENT_TOKEN",
    "worker": "CRONOQ_WORKER_TOKEN",
    "metrics": "CRONOQ_METRICS_TOKEN",
    "admin": "CRONOQ_ADMIN_TOKEN",
}
DATABASE_URL_ENV = "CRONOQ_DATABASE_URL"

Doc = dict[str, Any]


def merge(base: Mapping[str, Any], extra: Mapping[str, Any]) -> dict[str, Any]:
    """``base`` with ``extra`` laid over it, mappings merged key by key (as Helm merges values)."""
    merged = dict(base)
    for key, value in extra.items():
        below = merged.get(key)
        if isinstance(value, Mapping) and isinstance(below, Mapping):
            merged[key] = merge(below, value)
        else:
            merged[key] = value
    return merged


def ci_values(name: str) -> dict[str, Any]:
    """A values file from the chart's ``ci/`` folder (the examples ``helm lint`` also checks)."""
    loaded: dict[str, Any] = yaml.safe_load((CHART / "ci" / name).read_text())
    return loaded


def helm_template(
    helm: Path, values: Mapping[str, Any], *, release: str = "rel", chart: Path = CHART
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(helm), "template", release, str(chart), "--namespace", NAMESPACE, "-f", "-"],
        input=yaml.safe_dump(dict(values)),
        capture_output=True,
        text=True,
        timeout=60,
    )


def render(helm: Path, values: Mapping[str, Any], *, release: str = "rel", chart: Path = CHART) -> Rendered:
    done = helm_template(helm, values, release=release, chart=chart)
    assert done.returncode == 0, f"helm template failed:\n{done.stderr}"
    return Rendered([doc for doc in yaml.safe_load_all(done.stdout) if doc])


def render_notes(helm: Path, values: Mapping[str, Any], scratch: Path, *, release: str = "rel") -> str:
    """The ``NOTES.txt`` that ``helm install`` prints. ``helm template`` never renders it, and
    ``helm install --dry-run`` wants a cluster; so a copy of the chart in ``scratch`` gets the file
    outside ``templates/`` and one ConfigMap template whose data is that file run through ``tpl`` with
    the release's own context (``.Release``, ``.Values``, the chart's helpers), as ``helm install`` does."""
    chart = scratch / "chart"
    shutil.copytree(CHART, chart)
    (chart / "notes-under-test.txt").write_text((CHART / "templates" / "NOTES.txt").read_text())
    (chart / "templates" / "notes-under-test.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: notes-under-test}\n"
        'data: {notes: {{ tpl (.Files.Get "notes-under-test.txt") . | toJson }}}\n'
    )
    notes = render(helm, values, release=release, chart=chart).one("ConfigMap", "notes-under-test")
    text: str = notes["data"]["notes"]
    return text


def refusal(helm: Path, values: Mapping[str, Any]) -> str:
    """What ``helm template`` says when it refuses ``values`` (fails the test if it renders)."""
    done = helm_template(helm, values)
    assert done.returncode != 0, f"helm template rendered values it should refuse: {values}"
    return done.stderr


# The kinds the chart renders whose schemas come with their operators (CRDs), not with Kubernetes.
CUSTOM_KINDS = frozenset({"ServiceMonitor", "PrometheusRule", "ScaledObject"})
CRD_VALIDATE = Path(__file__).with_name("crd_validate.mjs")


def custom_resource_errors(validators: Path, docs: Iterable[Doc]) -> list[list[str]]:
    """For each custom resource in ``docs``, what its published schema finds wrong ([] when valid).

    ``validators`` is the ``crd_validators`` fixture's folder; one ``node`` run checks them all. A kind
    the script knows no schema for is an error, so a new custom resource cannot slip through unchecked.
    """
    done = subprocess.run(
        ["node", str(CRD_VALIDATE), str(validators)],
        input=json.dumps(list(docs)),
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    errors: list[list[str]] = json.loads(done.stdout)
    return errors


def selects(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    """Whether a ``matchLabels`` selector matches ``labels``."""
    return all(labels.get(key) == value for key, value in selector.items())


@dataclass(frozen=True)
class Rendered:
    """The manifests of one ``helm template`` run."""

    docs: list[Doc]

    def of_kind(self, kind: str) -> list[Doc]:
        return [doc for doc in self.docs if doc["kind"] == kind]

    def one(self, kind: str, name: str) -> Doc:
        found = [doc for doc in self.of_kind(kind) if doc["metadata"]["name"] == name]
        assert len(found) == 1, f"expected one {kind} {name}, found {len(found)}"
        return found[0]

    def _workloads(self, component: str) -> list[Doc]:
        return [
            doc
            for doc in self.of_kind("Deployment") + self.of_kind("StatefulSet")
            if doc["metadata"]["labels"]["app.kubernetes.io/component"] == component
        ]

    @property
    def servers(self) -> list[Doc]:
        """The servers' workloads: a StatefulSet per group (each shard's, or the one without shards)."""
        return self._workloads("server")

    @property
    def routers(self) -> list[Doc]:
        """The routers' Deployment."""
        return self._workloads("router")

    def selecting(self, workload: Doc) -> set[str]:
        """The Services whose selector reaches ``workload``'s pods."""
        return {
            service["metadata"]["name"]
            for service in self.of_kind("Service")
            if selects(service["spec"]["selector"], pod_labels(workload))
        }

    @property
    def config_text(self) -> str:
        """The ``cronoq.yaml`` of the chart's ConfigMap (the helm test's and the dashboards' ConfigMaps
        are others)."""
        (config_map,) = [doc for doc in self.of_kind("ConfigMap") if CONFIG_FILE in doc.get("data", {})]
        text: str = config_map["data"][CONFIG_FILE]
        return text

    @property
    def config(self) -> dict[str, Any]:
        """The rendered file as the servers and routers read it: YAML through cronoq's own reader
        (so a number is an integer or a float as they see it), refused on any problem it finds."""
        problems = Problems()
        document = parse_document(self.config_text, syntax_of(CONFIG_FILE), problems)
        if document is None or problems:
            raise problems.error(CONFIG_FILE)
        return document


def pod_spec(deployment: Doc) -> Doc:
    spec: Doc = deployment["spec"]["template"]["spec"]
    return spec


def server_container(workload: Doc) -> Doc:
    """The one container of a server's or a router's pod."""
    (container,) = pod_spec(workload)["containers"]
    assert container["name"] in {"server", "router"}
    return dict(container)


def env_of(workload: Doc) -> dict[str, Doc]:
    """The container's environment, by variable name."""
    return {var["name"]: var for var in server_container(workload)["env"]}


def pod_labels(deployment: Doc) -> dict[str, str]:
    labels: dict[str, str] = deployment["spec"]["template"]["metadata"]["labels"]
    return labels


def names(docs: Iterable[Doc]) -> set[str]:
    return {doc["metadata"]["name"] for doc in docs}
