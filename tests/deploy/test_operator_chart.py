"""The ``charts/cronoq-operator`` Helm chart, checked statically: it lints, its manifests are valid
Kubernetes objects, its CRD accepts the seed's scaler (and what the operator writes to a status) and
refuses bad ones, its RBAC is exactly what the seed promises, and the configuration it renders is one
the operator itself loads."""

from __future__ import annotations

import functools
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate  # type: ignore[import-untyped]  # ships no type information
import pytest
import yaml

from kube_operator.config import parse_operator_config
from kube_operator.decision import Observation, decide
from kube_operator.readings import Desired, Unknown
from kube_operator.scaler import ScalerSpec, parse_spec
from tests.pki import issue, new_ca

from .conftest import KUBERNETES_VERSION, REPO

CHART = REPO / "charts" / "cronoq-operator"
DEFAULT_VALUES = CHART / "ci" / "default-values.yaml"
TLS_VALUES = CHART / "ci" / "tls-namespaces-values.yaml"
MTLS_VALUES = CHART / "ci" / "mtls-values.yaml"
# Every example values file in ci/ (helm lint's own examples): each must lint, render valid objects and
# give a configuration the operator loads.
CI_VALUES = pytest.mark.parametrize(
    "values", [DEFAULT_VALUES, TLS_VALUES, MTLS_VALUES], ids=["default", "tls-namespaces", "mtls"]
)
# The seed's install command, as --set flags.
SEED_SETS = (
    "servers[0].name=main",
    "servers[0].url=http://cronoq.cronoq:7070",
    "servers[0].tokenSecret.name=cronoq-tokens",
    "servers[0].tokenSecret.key=metrics",
)
SEED_SCALER = """
apiVersion: cronoq.io/v1alpha1
kind: CronoqWorkerScaler
metadata: { name: default-workers }
spec:
  server: main              # a server from the operator's configuration
  pool: default
  deployment: default-workers
  slotsPerReplica: 4        # the slots each worker pod registers
  minReplicas: 0
  maxReplicas: 100
"""
# Exactly what docs/operator.md says: read and watch scalers, write their status, read and change
# deployments/scale, record Events; the Lease in a Role of its own namespace (LEASE_RULES).
EXPECTED_RULES = [
    {"apiGroups": ["cronoq.io"], "resources": ["cronoqworkerscalers"], "verbs": ["get", "list", "watch"]},
    {
        "apiGroups": ["cronoq.io"],
        "resources": ["cronoqworkerscalers/status"],
        "verbs": ["get", "update", "patch"],
    },
    {"apiGroups": ["apps"], "resources": ["deployments/scale"], "verbs": ["get", "update", "patch"]},
    {"apiGroups": [""], "resources": ["events"], "verbs": ["create"]},
]
LEASE_RULES = [
    {"apiGroups": ["coordination.k8s.io"], "resources": ["leases"], "verbs": ["create"]},
    {
        "apiGroups": ["coordination.k8s.io"],
        "resources": ["leases"],
        "resourceNames": ["ops-cronoq-operator"],
        "verbs": ["get", "update"],
    },
]


def helm_run(helm: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(helm), *args], capture_output=True, text=True, timeout=60, check=False)


def render(
    helm: Path, values: Sequence[Path] = (DEFAULT_VALUES,), sets: Sequence[str] = ()
) -> list[dict[str, Any]]:
    """The chart's manifests for these values files and --set flags (parsed afresh for each caller)."""
    return [doc for doc in yaml.safe_load_all(_rendered(helm, tuple(values), tuple(sets))) if doc]


@functools.cache
def _rendered(helm: Path, values: tuple[Path, ...], sets: tuple[str, ...]) -> str:
    """helm template's output, once per combination: the same values always render the same text."""
    args = ["template", "ops", str(CHART), "--namespace", "cronoq-system"]
    for path in values:
        args += ["-f", str(path)]
    for item in sets:
        args += ["--set", item]
    done = helm_run(helm, *args)
    assert done.returncode == 0, done.stderr
    return done.stdout


def refused(helm: Path, *sets: str) -> str:
    """helm's error for values the chart must refuse."""
    args = ["template", "ops", str(CHART)]
    for item in sets:
        args += ["--set", item]
    done = helm_run(helm, *args)
    assert done.returncode != 0, done.stdout
    return done.stderr


def one(docs: list[dict[str, Any]], kind: str) -> dict[str, Any]:
    [found] = [doc for doc in docs if doc["kind"] == kind]
    return found


def crd_schema(helm: Path) -> dict[str, Any]:
    [version] = one(render(helm), "CustomResourceDefinition")["spec"]["versions"]
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]
    return schema


@CI_VALUES
def test_helm_lint(helm: Path, values: Path) -> None:
    done = helm_run(helm, "lint", "--strict", str(CHART), "-f", str(values))
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 chart(s) linted, 0 chart(s) failed" in done.stdout


@CI_VALUES
def test_rendered_manifests_are_valid_kubernetes_objects(helm: Path, values: Path) -> None:
    docs = render(helm, [values])
    assert {doc["kind"] for doc in docs} >= {
        "CustomResourceDefinition",
        "ServiceAccount",
        "ConfigMap",
        "ClusterRole",
        "Deployment",
    }
    for doc in docs:
        kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)


def test_the_seed_install_command_renders_the_default_values(helm: Path) -> None:
    assert render(helm, [], SEED_SETS) == render(helm, [DEFAULT_VALUES])


def test_the_crd_accepts_the_seed_scaler(helm: Path) -> None:
    scaler = yaml.safe_load(SEED_SCALER)
    jsonschema.validate(scaler, crd_schema(helm))
    assert parse_spec(scaler) == ScalerSpec("main", "default", "default-workers", 4, 0, 100)


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"slotsPerReplica": 0}, "slotsPerReplica"),
        ({"minReplicas": -1}, "minReplicas"),
        ({"maxReplicas": 0}, "maxReplicas"),
        ({"intervalSeconds": 0}, "intervalSeconds"),
        ({"slotsPerReplica": "4"}, "slotsPerReplica"),
        ({"deployment": "Default_Workers"}, "deployment"),
        ({"pool": "a pool"}, "pool"),
        ({"server": None}, "server"),
    ],
)
def test_the_crd_refuses_a_bad_scaler_as_the_operator_does(
    helm: Path, change: dict[str, Any], field: str
) -> None:
    scaler = yaml.safe_load(SEED_SCALER)
    scaler["spec"] = {key: value for key, value in (scaler["spec"] | change).items() if value is not None}
    with pytest.raises(jsonschema.ValidationError) as caught:
        jsonschema.validate(scaler, crd_schema(helm))
    where = list(caught.value.absolute_path)
    assert where == ["spec", field] or (where == ["spec"] and field in caught.value.message)
    assert parse_spec(scaler).__class__.__name__ == "InvalidSpec"  # the operator's own check agrees


def test_the_crd_checks_min_against_max(helm: Path) -> None:
    """JSON Schema cannot compare two fields; the API server's CEL rule does."""
    [rule] = crd_schema(helm)["properties"]["spec"]["x-kubernetes-validations"]
    assert rule == {
        "rule": "!has(self.minReplicas) || self.minReplicas <= self.maxReplicas",
        "message": "minReplicas must not exceed maxReplicas",
    }


def test_statuses_the_operator_writes_fit_the_crd(helm: Path) -> None:
    schema = crd_schema(helm)
    spec = ScalerSpec("main", "default", "default-workers", 4, 0, 100)
    now = datetime(2026, 1, 1, tzinfo=UTC)
    for reading in (Desired(9), Unknown("ServerUnavailable", "down")):
        status = decide(Observation(spec, reading, 1), generation=2, previous={}, now=now).status
        written = {key: value for key, value in status.items() if value is not None}
        jsonschema.validate({"spec": yaml.safe_load(SEED_SCALER)["spec"], "status": written}, schema)
    with pytest.raises(jsonschema.ValidationError):
        jsonschema.validate(
            {"spec": yaml.safe_load(SEED_SCALER)["spec"], "status": {"replicas": "3"}}, schema
        )


def test_kubectl_get_shows_desired_replicas_and_why(helm: Path) -> None:
    [version] = one(render(helm), "CustomResourceDefinition")["spec"]["versions"]
    assert version["subresources"] == {"status": {}}
    columns = {column["name"]: column for column in version["additionalPrinterColumns"]}
    shown = {name: column["jsonPath"] for name, column in columns.items() if not column.get("priority")}
    assert shown["Desired"] == ".status.desiredSlots"
    assert shown["Replicas"] == ".status.replicas"
    assert shown["Reason"] == ".status.reason"


def test_the_cluster_role_grants_exactly_what_the_seed_says(helm: Path) -> None:
    docs = render(helm)
    role = one(docs, "ClusterRole")
    assert role["rules"] == EXPECTED_RULES
    binding = one(docs, "ClusterRoleBinding")
    account = one(docs, "ServiceAccount")
    assert binding["roleRef"] == {
        "apiGroup": "rbac.authorization.k8s.io",
        "kind": "ClusterRole",
        "name": role["metadata"]["name"],
    }
    assert binding["subjects"] == [
        {"kind": "ServiceAccount", "name": account["metadata"]["name"], "namespace": "cronoq-system"}
    ]
    lease_role = one(docs, "Role")
    assert lease_role["rules"] == LEASE_RULES and lease_role["metadata"]["namespace"] == "cronoq-system"
    [lease_binding] = [doc for doc in docs if doc["kind"] == "RoleBinding"]
    assert lease_binding["roleRef"]["name"] == lease_role["metadata"]["name"]
    assert lease_binding["subjects"] == binding["subjects"]
    config = yaml.safe_load(one(docs, "ConfigMap")["data"]["operator.yaml"])
    assert config["lease_name"] == "ops-cronoq-operator"  # the name the Role allows
    for doc in docs:
        if doc["kind"] in ("ClusterRole", "Role"):
            for rule in doc["rules"]:
                assert not {"secrets", "*"} & set(rule["resources"]), rule
                assert "*" not in rule["verbs"] and "*" not in rule["apiGroups"]


def test_restricted_to_namespaces_the_role_is_bound_only_there(helm: Path) -> None:
    docs = render(helm, [TLS_VALUES])
    assert not [doc for doc in docs if doc["kind"] == "ClusterRoleBinding"]
    bindings = [
        doc for doc in docs if doc["kind"] == "RoleBinding" and doc["roleRef"]["kind"] == "ClusterRole"
    ]
    assert sorted(doc["metadata"]["namespace"] for doc in bindings) == ["batch", "workers"]
    assert {doc["roleRef"]["kind"] for doc in bindings} == {"ClusterRole"}
    assert one(docs, "ClusterRole")["rules"] == EXPECTED_RULES


def test_the_operator_pod_runs_locked_down(helm: Path) -> None:
    deployment = one(render(helm), "Deployment")
    # Two replicas electing a leader, so the default rolling update is safe too.
    assert deployment["spec"]["replicas"] == 2 and "strategy" not in deployment["spec"]
    pod = deployment["spec"]["template"]["spec"]
    assert pod["securityContext"] == {
        "runAsNonRoot": True,
        "runAsUser": 65532,
        "runAsGroup": 65532,
        "seccompProfile": {"type": "RuntimeDefault"},
    }
    assert pod["automountServiceAccountToken"] is True
    [container] = pod["containers"]
    assert container["image"].startswith("cronoq:")
    assert container["command"] == ["/opt/cronoq/bin/cronoq-operator"]
    assert container["securityContext"] == {
        "allowPrivilegeEscalation": False,
        "readOnlyRootFilesystem": True,
        "runAsNonRoot": True,
        "capabilities": {"drop": ["ALL"]},
    }
    assert container["resources"]["limits"]["memory"] == "128Mi"
    assert container["ports"] == [{"name": "http", "containerPort": 8080, "protocol": "TCP"}]
    assert container["livenessProbe"]["httpGet"] == {"path": "/healthz", "port": "http"}
    assert container["readinessProbe"]["httpGet"] == {"path": "/readyz", "port": "http"}
    env = {
        entry["name"]: entry.get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        for entry in container["env"]
    }
    assert env["POD_NAME"] == "metadata.name" and env["POD_NAMESPACE"] == "metadata.namespace"
    config = yaml.safe_load(one(render(helm), "ConfigMap")["data"]["operator.yaml"])
    assert config["http_addr"] == "0.0.0.0:8080" and config["lease_duration_s"] == 15


def test_a_service_monitor_scrapes_every_replica_when_asked(helm: Path) -> None:
    assert not [doc for doc in render(helm) if doc["kind"] in ("Service", "ServiceMonitor")]
    docs = render(
        helm, sets=("metrics.serviceMonitor.enabled=true", "metrics.serviceMonitor.labels.release=prom")
    )
    service, monitor = one(docs, "Service"), one(docs, "ServiceMonitor")
    assert service["spec"]["clusterIP"] == "None" and service["spec"]["ports"][0]["targetPort"] == "http"
    assert monitor["spec"]["endpoints"] == [{"port": "http", "path": "/metrics", "interval": "30s"}]
    assert monitor["metadata"]["labels"]["release"] == "prom"
    assert monitor["spec"]["selector"]["matchLabels"] == service["spec"]["selector"]


@dataclass(frozen=True)
class PodFiles:
    """Real files for what the pod's Secret volumes hold: a CA certificate, a client certificate and
    its key."""

    ca: Path
    cert: Path
    key: Path


@pytest.fixture(scope="module")
def pod_files(tmp_path_factory: pytest.TempPathFactory) -> PodFiles:
    directory = tmp_path_factory.mktemp("operator-chart-pki")
    ca, ca_key = new_ca(directory / "ca.crt", directory / "ca.key", "chart test CA")
    cert, key = issue(
        directory, "client", "/CN=cronoq-operator", "DNS:cronoq-operator.cronoq.svc", ca, ca_key
    )
    return PodFiles(ca, cert, key)


@CI_VALUES
def test_the_rendered_configuration_loads_in_the_operator(
    helm: Path, values: Path, pod_files: PodFiles
) -> None:
    """The ConfigMap's operator.yaml, the one file it holds and the one the operator is given, is loaded
    by the operator's own loader, in the environment and with the files the pod gets: each server's
    token variable filled from its Secret by secretKeyRef, each CA certificate and client certificate
    at its Secret volume's mount path (real ones here)."""
    docs = render(helm, [values])
    config_map = one(docs, "ConfigMap")
    pod = one(docs, "Deployment")["spec"]["template"]["spec"]
    [container] = pod["containers"]
    assert list(config_map["data"]) == ["operator.yaml"]
    assert container["args"] == ["--config", "/etc/cronoq-operator/config/operator.yaml"]
    assert {"name": "config", "mountPath": "/etc/cronoq-operator/config", "readOnly": True} in container[
        "volumeMounts"
    ]

    env = {
        item["name"]: f"token-from-{item['valueFrom']['secretKeyRef']['name']}-0123456789"
        for item in container["env"]
        if "secretKeyRef" in item.get("valueFrom", {})
    }
    text = config_map["data"]["operator.yaml"]
    in_pod = {"ca.crt": pod_files.ca, "tls.crt": pod_files.cert, "tls.key": pod_files.key}
    mounts = {mount["name"]: mount for mount in container["volumeMounts"]}
    for mount in mounts.values():
        for name, real in in_pod.items():
            text = text.replace(f" {mount['mountPath']}/{name}\n", f" {real}\n")
    config = parse_operator_config(text, source="operator.yaml", syntax="yaml", env=env)

    chart_values = yaml.safe_load(values.read_text())
    assert [server.name for server in config.servers] == [
        server["name"] for server in chart_values["servers"]
    ]
    refs = {
        item["name"]: item["valueFrom"]["secretKeyRef"]
        for item in container["env"]
        if "secretKeyRef" in item.get("valueFrom", {})
    }
    volumes = {volume["name"]: volume for volume in pod["volumes"]}
    for index, (server, given) in enumerate(zip(config.servers, chart_values["servers"], strict=True)):
        assert server.url == given["url"]
        assert (server.token_env is not None) == ("tokenSecret" in given)
        if server.token_env is not None:
            assert refs[server.token_env] == given["tokenSecret"]
        assert (server.ca_file is not None) == ("caSecret" in given)
        secret = given.get("clientCertSecret")
        assert (server.cert_file, server.key_file) == (
            (str(pod_files.cert), str(pod_files.key)) if secret else (None, None)
        )
        if secret:
            assert mounts[f"client-cert-{index}"]["readOnly"] is True
            assert "subPath" not in mounts[f"client-cert-{index}"]  # or a renewed certificate never shows
            assert volumes[f"client-cert-{index}"]["secret"] == {
                "secretName": secret["name"],
                "items": [
                    {"key": secret.get("certKey", "tls.crt"), "path": "tls.crt"},
                    {"key": secret.get("keyKey", "tls.key"), "path": "tls.key"},
                ],
            }
    assert config.interval_s == chart_values.get("intervalSeconds", 15)
    assert list(config.namespaces) == chart_values.get("namespaces", [])


@pytest.mark.parametrize(
    ("sets", "message"),
    [
        ((), "servers: name at least one cronoq server"),
        (
            (
                *SEED_SETS,
                "servers[1].name=main",
                "servers[1].url=http://other:7070",
                "servers[1].tokenSecret.name=t",
                "servers[1].tokenSecret.key=k",
            ),
            'servers[1].name: "main" is already the name of another server',
        ),
        (
            (*SEED_SETS, "servers[0].caSecret.name=ca", "servers[0].caSecret.key=ca.crt"),
            "servers[0].caSecret: only used with an https:// url",
        ),
        (
            (*SEED_SETS, "servers[0].clientCertSecret.name=operator-tls"),
            "servers[0].clientCertSecret: only used with an https:// url",
        ),
        (
            ("servers[0].name=main", "servers[0].url=https://cronoq.cronoq.svc:7070"),
            "servers[0]: set tokenSecret (a metrics token) or clientCertSecret",
        ),
        (
            (
                "servers[0].name=main",
                "servers[0].url=https://cronoq.cronoq.svc:7070",
                "servers[0].clientCertSecret.certKey=tls.crt",
            ),
            "servers.0.clientCertSecret: name is required",
        ),
        (
            (
                "servers[0].name=main",
                "servers[0].url=http://cronoq.cronoq",
                "servers[0].tokenSecret.name=t",
                "servers[0].tokenSecret.key=k",
            ),
            "servers.0.url",
        ),
        ((*SEED_SETS, "intervalSeconds=0"), "intervalSeconds"),
        ((*SEED_SETS, "replicas=2"), "replicas"),
        ((*SEED_SETS, "leaseDurationSeconds=1"), "leaseDurationSeconds"),
        ((*SEED_SETS, "logLevel=verbose"), "logLevel: Does not match pattern"),
    ],
)
def test_the_chart_refuses_values_the_operator_could_not_run_with(
    helm: Path, sets: tuple[str, ...], message: str
) -> None:
    assert message in refused(helm, *sets)
