"""The Helm chart ``charts/cronoq``, rendered by the real ``helm`` binary: lint, Kubernetes schemas,
selectors, probes, pod security, tokens, the refusals, and the rendered ``cronoq.yaml`` checked (and
run) by the real ``cronoq-server`` and ``cronoq-router``."""

from __future__ import annotations

import contextlib
import json
import os
import re
import ssl
import subprocess
import sys
import textwrap
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Iterator, Mapping
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import kubernetes_validate  # type: ignore[import-untyped]  # ships no type information
import pytest
import yaml

from cronoq.cluster.shards import SHARD_SHIFT, UNSHARDED
from tests.integration.serverproc import ServerProcess
from tests.pki import issue, new_ca
from tests.ports import free_ports

from .chart_render import (
    CHART,
    CONFIG_FILE,
    CUSTOM_KINDS,
    DATABASE_URL_ENV,
    NAMESPACE,
    REQUIRED,
    TOKEN_ENVS,
    TOKENS_SECRET,
    Doc,
    Rendered,
    ci_values,
    custom_resource_errors,
    env_of,
    merge,
    names,
    pod_labels,
    pod_spec,
    refusal,
    render,
    render_notes,
    selects,
    server_container,
)
from .conftest import KUBERNETES_VERSION, REPO

SHARDED_TLS = ci_values("sharded-tls-values.yaml")
THREE_SHARDS = ci_values("three-shards-values.yaml")
# Numbers a platform team sets, many past a million: Helm reads them as floats, and the file must
# still give them to the server as integers (it refuses a float where it expects an integer).
TUNED_CONFIG: dict[str, Any] = {
    "pools": [{"name": "default", "max": 1_000_000, "lease_ttl_s": 30}, {"name": "batch", "min": 0}],
    "resources": [{"kind": "semaphore", "name": "gpu_mem", "permits": 1_000_000}],
    "limits": {"max_pending_total": 1_000_000_000, "max_message_bytes": 16_777_216, "max_wait_s": 1.5},
    "outputs": {"cache_bytes": 67_108_864, "cache_entries": 2_000_000},
    "server": {"http_max_connections": 1_000_000},
}
TUNED = merge(
    REQUIRED, {"store": {"keepFinishedS": 31_536_000}, "shutdownGraceS": 3_600, "config": TUNED_CONFIG}
)
SHARDED_INSECURE = merge({k: v for k, v in SHARDED_TLS.items() if k != "tls"}, {"insecurePeerHttp": True})
# Without shards, over TLS only (no plain-http trust), and with client certificates.
UNSHARDED_TLS = merge(
    {k: v for k, v in REQUIRED.items() if k != "insecurePeerHttp"}, {"tls": {"secretName": "cronoq-tls"}}
)
UNSHARDED_MTLS = merge(UNSHARDED_TLS, {"tls": {"clientCerts": True}})
SCENARIOS: dict[str, dict[str, Any]] = {
    "default": REQUIRED,
    "sharded-tls": SHARDED_TLS,
    "sharded-insecure": SHARDED_INSECURE,
    "three-shards": THREE_SHARDS,
    "mtls": UNSHARDED_MTLS,
    "sqlite": merge(REQUIRED, {"store": {"kind": "sqlite"}, "replicas": 1}),
    "database-ca": merge(
        REQUIRED,
        {
            "store": {"postgres": {"caSecret": {"name": "cronoq-db-ca", "key": "root.pem"}}},
            "extraVolumes": [{"name": "db-client", "secret": {"secretName": "cronoq-db-client"}}],
            "extraVolumeMounts": [
                {"name": "db-client", "mountPath": "/etc/cronoq-db-client", "readOnly": True}
            ],
        },
    ),
    "sharded-mtls": merge(
        SHARDED_TLS,
        {
            "tls": {"clientCerts": True},
            "config": {"auth": {"certs": [{"dns_name": "worker-1.internal", "role": "worker"}]}},
        },
    ),
    "tuned": TUNED,
}
SHARD_POOLS = {"cpu": ["default"], "gpu": ["llm"]}  # the shards of ci/sharded-tls-values.yaml
APP_VERSION = yaml.safe_load((CHART / "Chart.yaml").read_text())["appVersion"]  # the default image tag


@pytest.fixture(scope="module", params=sorted(SCENARIOS))
def scenario(request: pytest.FixtureRequest, helm: Path) -> tuple[str, Rendered]:
    name: str = request.param
    return name, render(helm, SCENARIOS[name])


def _tokens() -> dict[str, str]:
    return {env: os.urandom(24).hex() for env in TOKEN_ENVS.values()}


# ---------------------------------------------------------------- lint and Kubernetes schemas


@pytest.mark.parametrize(
    "values", ["default-values.yaml", "sharded-tls-values.yaml", "three-shards-values.yaml"]
)
def test_helm_lint_strict_passes(helm: Path, values: str) -> None:
    done = subprocess.run(
        [str(helm), "lint", "--strict", str(CHART), "-f", str(CHART / "ci" / values)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "0 chart(s) failed" in done.stdout


def test_every_manifest_is_valid_for_kubernetes(scenario: tuple[str, Rendered], crd_validators: Path) -> None:
    """Kubernetes' own kinds against its schemas (strict: no unknown field), the custom resources
    against the schemas their operators publish."""
    _, rendered = scenario
    assert rendered.docs
    custom = [doc for doc in rendered.docs if doc["kind"] in CUSTOM_KINDS]
    for doc in rendered.docs:
        if doc["kind"] not in CUSTOM_KINDS:
            kubernetes_validate.validate(doc, KUBERNETES_VERSION, strict=True)
    assert custom_resource_errors(crd_validators, custom) == [[] for _ in custom]


# ---------------------------------------------------------------- what selects what


def test_each_workload_owns_its_pods(scenario: tuple[str, Rendered]) -> None:
    _, rendered = scenario
    workloads = rendered.servers + rendered.routers
    for workload in workloads:
        selector = workload["spec"]["selector"]["matchLabels"]
        assert selects(selector, pod_labels(workload))
        for other in workloads:  # no workload (nor its budget, which has its selector) claims another's pods
            if other is not workload:
                assert not selects(selector, pod_labels(other))


def test_every_workload_has_a_disruption_budget(scenario: tuple[str, Rendered]) -> None:
    """Every group of servers (standbys are ready while healthy, so a drain can evict them one at a
    time, the leader included) and the routers' Deployment get a budget over exactly their pods."""
    _, rendered = scenario
    budgets = {pdb["metadata"]["name"]: pdb["spec"] for pdb in rendered.of_kind("PodDisruptionBudget")}
    workloads = rendered.servers + rendered.routers
    assert set(budgets) == names(workloads)
    for workload in workloads:
        budget = budgets[workload["metadata"]["name"]]
        assert budget["selector"]["matchLabels"] == workload["spec"]["selector"]["matchLabels"]
        assert budget["maxUnavailable"] == 1


def test_main_service_reaches_the_routers_and_each_shard_service_only_its_own(helm: Path) -> None:
    """With shards the main Service (the address of the NOTES and the docs) selects the routers and no
    server, so no client lands on a standby; each shard's endpoint Service and its headless members
    Service select that shard's servers only."""
    rendered = render(helm, SHARDED_TLS)
    main = rendered.one("Service", "rel-cronoq")["spec"]["selector"]
    shard_sets = {d["metadata"]["name"]: d for d in rendered.servers}
    assert set(shard_sets) == {"rel-cronoq-cpu", "rel-cronoq-gpu"}
    assert {d["kind"] for d in shard_sets.values()} == {"StatefulSet"}
    (router,) = rendered.routers
    assert selects(main, pod_labels(router))
    assert not any(selects(main, pod_labels(d)) for d in shard_sets.values())
    for shard in SHARD_POOLS:
        service = rendered.one("Service", f"rel-cronoq-{shard}")["spec"]
        members = rendered.one("Service", f"rel-cronoq-{shard}-members")["spec"]
        assert members["clusterIP"] == "None" and members["publishNotReadyAddresses"] is True
        assert shard_sets[f"rel-cronoq-{shard}"]["spec"]["serviceName"] == f"rel-cronoq-{shard}-members"
        for spec in (service, members):
            for name, statefulset in shard_sets.items():
                assert selects(spec["selector"], pod_labels(statefulset)) == (name == f"rel-cronoq-{shard}")
            assert not selects(spec["selector"], pod_labels(router))
        assert {p["name"]: p["port"] for p in service["ports"]} == {
            "grpc": 7070,
            "http": 7071,
            "metrics": 7072,
        }
    assert shard_sets["rel-cronoq-gpu"]["spec"]["replicas"] == 3  # its own replicas
    assert shard_sets["rel-cronoq-cpu"]["spec"]["replicas"] == 2  # the chart's


def test_clients_reach_only_the_routers_and_each_group_service_only_its_servers(
    scenario: tuple[str, Rendered],
) -> None:
    """In every install the main Service (the address of the NOTES and the docs) selects the routers
    only, so no client lands on a standby; the only Services that reach a server are its own group's
    endpoint and headless members Services (the StatefulSet's serviceName), whichever group it is in."""
    _, rendered = scenario
    (router,) = rendered.routers
    assert rendered.selecting(router) == {"rel-cronoq"}
    assert rendered.servers
    for statefulset in rendered.servers:
        assert statefulset["kind"] == "StatefulSet"
        name = statefulset["metadata"]["name"]
        assert statefulset["spec"]["serviceName"] == f"{name}-members"
        assert rendered.selecting(statefulset) == {name, f"{name}-members"}
        members = rendered.one("Service", f"{name}-members")["spec"]
        assert members["clusterIP"] == "None" and members["publishNotReadyAddresses"] is True


def _groups(config: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """Each group's endpoint and members as the config gives them to the routers, by shard: each
    ``shards`` entry, or without shards ``router`` under the name the router gives that group."""
    if "shards" in config:
        return {shard["name"]: shard for shard in config["shards"]}
    return {UNSHARDED: config["router"]}


def test_the_members_are_the_statefulsets_pods_by_their_stable_names(scenario: tuple[str, Rendered]) -> None:
    """The routers (and the other shards) find a group's leader by asking each of its ``members``:
    exactly its StatefulSet's pods, one per replica, by the names its headless Service gives them; the
    ``endpoint`` is the group's Service. Without shards they are ``router.members`` and ``endpoint``."""
    name, rendered = scenario
    scheme = "https" if "tls" in SCENARIOS[name] else "http"
    sets = {s["metadata"]["labels"].get("cronoq.io/shard", UNSHARDED): s for s in rendered.servers}
    groups = _groups(rendered.config)
    assert set(groups) == set(sets)
    for shard, group in groups.items():
        statefulset = sets[shard]["metadata"]["name"]
        service = sets[shard]["spec"]["serviceName"]
        assert group["members"] == [
            f"{scheme}://{statefulset}-{i}.{service}.{NAMESPACE}.svc.cluster.local:7070"
            for i in range(sets[shard]["spec"]["replicas"])
        ]
        assert group["endpoint"] == f"{scheme}://{statefulset}.{NAMESPACE}.svc.cluster.local:7070"
        rendered.one("Service", statefulset)


def test_without_shards_the_servers_are_one_statefulset_behind_the_routers(helm: Path) -> None:
    """The names of the unsharded group: none is the main Service's or the routers'."""
    rendered = render(helm, REQUIRED)
    (server,) = rendered.servers
    assert (server["kind"], server["metadata"]["name"]) == ("StatefulSet", "rel-cronoq-server")
    assert "cronoq.io/shard" not in pod_labels(server) and "CRONOQ_SHARD" not in env_of(server)
    assert "shards" not in rendered.config
    assert names(rendered.of_kind("Service")) == {
        "rel-cronoq",
        "rel-cronoq-server",
        "rel-cronoq-server-members",
    }
    assert names(rendered.of_kind("PodDisruptionBudget")) == {"rel-cronoq-server", "rel-cronoq-router"}


def test_each_shard_pod_serves_its_shard_from_one_shared_config(helm: Path) -> None:
    rendered = render(helm, SHARDED_INSECURE)
    config = rendered.config
    assert {s["name"]: s["pools"] for s in config["shards"]} == SHARD_POOLS
    assert {s["name"]: s["endpoint"] for s in config["shards"]} == {
        shard: f"http://rel-cronoq-{shard}.{NAMESPACE}.svc.cluster.local:7070" for shard in SHARD_POOLS
    }
    assert config["server"]["insecure_peer_http"] is True
    assert config["store"]["schema"] == "cronoq_{shard}"
    assert config["resources"][0]["shard"] == "gpu"  # [[resources]] shard, through `config`
    for deployment in rendered.servers:
        shard = deployment["metadata"]["name"].removeprefix("rel-cronoq-")
        assert env_of(deployment)["CRONOQ_SHARD"]["value"] == shard
        assert pod_labels(deployment)["cronoq.io/shard"] == shard


TLS_FILES = {"cert_path": "/etc/cronoq-tls/tls.crt", "key_path": "/etc/cronoq-tls/tls.key"}
CA_FILE = "/etc/cronoq-tls/ca.crt"


@pytest.mark.parametrize(
    ("name", "server_tls", "peer_tls"),
    [
        ("sharded-tls", TLS_FILES, {"ca_path": CA_FILE}),
        ("sharded-mtls", {**TLS_FILES, "client_ca_path": CA_FILE}, {"ca_path": CA_FILE, **TLS_FILES}),
        ("sharded-insecure", None, None),
        ("mtls", {**TLS_FILES, "client_ca_path": CA_FILE}, {"ca_path": CA_FILE, **TLS_FILES}),
        ("default", None, None),
    ],
)
def test_tls_secret_becomes_server_and_peer_tls(
    helm: Path, name: str, server_tls: dict[str, str] | None, peer_tls: dict[str, str] | None
) -> None:
    """``server.peer_tls`` with TLS, shards or not: the routers verify the servers (and present tls.crt to
    them under mTLS) as shards do each other."""
    rendered = render(helm, SCENARIOS[name])
    server = rendered.config["server"]
    assert server.get("tls") == server_tls
    assert server.get("peer_tls") == peer_tls
    for deployment in rendered.servers + rendered.routers:
        mounts = {m["name"]: m["mountPath"] for m in server_container(deployment)["volumeMounts"]}
        volumes = {v["name"]: v for v in pod_spec(deployment)["volumes"]}
        if server_tls is None:
            assert "tls" not in mounts
        else:
            assert mounts["tls"] == "/etc/cronoq-tls"
            assert volumes["tls"]["secret"]["secretName"] == "cronoq-tls"


def _service_names(service: str) -> set[str]:
    """What clients in the cluster call a Service: short, with the namespace, and fully qualified."""
    return {
        service,
        f"{service}.{NAMESPACE}",
        f"{service}.{NAMESPACE}.svc",
        f"{service}.{NAMESPACE}.svc.cluster.local",
    }


def _covered(host: str, names: set[str]) -> bool:
    """Whether a certificate naming ``names`` is valid for ``host`` (a ``*.`` name covers one label)."""
    return host in names or f"*.{host.split('.', 1)[1]}" in names


def _names_cover_the_cluster(rendered: Rendered, given: set[str]) -> None:
    """``given`` (a certificate's DNS names) are every Service with a ClusterIP in each form clients use
    (``cronoq.cronoq:7070`` in the operator's docs) and, for each group, one wildcard that covers the
    names of its servers its ``members`` use, and nothing more."""
    services = {
        service["metadata"]["name"]
        for service in rendered.of_kind("Service")
        if service["spec"].get("clusterIP") != "None"
    }
    groups = _groups(rendered.config)
    members = {re.sub(r"^https://|:7070$", "", url) for group in groups.values() for url in group["members"]}
    assert len(members) == sum(s["spec"]["replicas"] for s in rendered.servers)
    plain = {name for name in given if not name.startswith("*.")}
    assert plain == set().union(*(_service_names(service) for service in services))
    assert all(_covered(member, given) for member in members)
    assert len(given - plain) == len(groups)  # one wildcard per group, nothing more


def _notes_dns_names(notes: str) -> set[str]:
    listed: list[str] = yaml.safe_load(notes.split("dnsNames:\n", 1)[1].split("\n\n", 1)[0])
    return set(listed)


def test_tls_names_in_the_notes_and_the_docs_cover_every_name_clients_use(helm: Path, tmp_path: Path) -> None:
    """The certificate names the NOTES list, and the docs' cert-manager example's dnsNames, cover the
    cluster for the docs' own example (release ``cronoq`` in namespace ``jobs``, shards ``cpu`` and
    ``gpu``)."""
    rendered = render(helm, SHARDED_TLS, release="cronoq")
    assert names(rendered.of_kind("Service")) >= {"cronoq", "cronoq-cpu", "cronoq-gpu"}
    docs = (REPO / "docs" / "kubernetes.md").read_text()
    (certificate,) = (
        yaml.safe_load(block)
        for block in re.findall(r"```yaml\n(.*?)```", docs, re.DOTALL)
        if "kind: Certificate" in block
    )
    _names_cover_the_cluster(
        rendered, _notes_dns_names(render_notes(helm, SHARDED_TLS, tmp_path, release="cronoq"))
    )
    _names_cover_the_cluster(rendered, set(certificate["spec"]["dnsNames"]))


def test_tls_names_in_the_notes_without_shards_cover_the_routers_and_the_servers(
    helm: Path, tmp_path: Path
) -> None:
    """Without shards too: the main Service (the routers), the servers' Service and each server by its
    members name, which the routers and redirected workers dial."""
    rendered = render(helm, UNSHARDED_MTLS, release="cronoq")
    assert names(rendered.of_kind("Service")) == {"cronoq", "cronoq-server", "cronoq-server-members"}
    listed = _notes_dns_names(render_notes(helm, UNSHARDED_MTLS, tmp_path, release="cronoq"))
    _names_cover_the_cluster(rendered, listed)
    assert "*.cronoq-server-members.jobs.svc.cluster.local" in listed


DB_CA_SECRET = {"name": "cronoq-db-ca", "key": "root.pem"}


@pytest.mark.parametrize(
    ("values", "mounted"),
    [
        pytest.param(SCENARIOS["database-ca"], True, id="set"),
        pytest.param(
            merge(SHARDED_TLS, {"store": {"postgres": {"caSecret": DB_CA_SECRET}}}), True, id="shards"
        ),
        pytest.param(REQUIRED, False, id="unset"),
        pytest.param(
            merge(SCENARIOS["sqlite"], {"store": {"postgres": {"caSecret": DB_CA_SECRET}}}),
            False,
            id="sqlite",
        ),
    ],
)
def test_database_ca_is_mounted_and_named_to_libpq_when_set(
    helm: Path, values: dict[str, Any], mounted: bool
) -> None:
    """``store.postgres.caSecret``: that Secret's one key, read-only, and PGSSLROOTCERT naming the file
    it becomes in the container (libpq's default, ~/.postgresql/root.crt, does not exist in a pod);
    nothing at all when it is unset or the store is not Postgres."""
    for deployment in render(helm, values).servers:
        env = env_of(deployment)
        mounts = {m["name"]: m for m in server_container(deployment)["volumeMounts"]}
        volumes = {v["name"]: v for v in pod_spec(deployment)["volumes"]}
        if not mounted:
            assert "PGSSLROOTCERT" not in env and "db-ca" not in mounts and "db-ca" not in volumes
            continue
        assert volumes["db-ca"]["secret"] == {
            "secretName": "cronoq-db-ca",
            "items": [{"key": "root.pem", "path": "ca.crt"}],  # only the CA, whatever else the Secret holds
        }
        assert mounts["db-ca"]["readOnly"] is True
        (item,) = volumes["db-ca"]["secret"]["items"]
        assert env["PGSSLROOTCERT"] == {
            "name": "PGSSLROOTCERT",
            "value": f"{mounts['db-ca']['mountPath']}/{item['path']}",
        }
        assert env["PGSSLROOTCERT"]["value"] == "/etc/cronoq-db/ca.crt"


def test_extra_volumes_and_mounts_reach_the_pods(helm: Path) -> None:
    """Passed through as given, after the chart's own (which stay as they are)."""
    values = SCENARIOS["database-ca"]
    for deployment in render(helm, values).servers:
        volumes = pod_spec(deployment)["volumes"]
        mounts = server_container(deployment)["volumeMounts"]
        assert volumes[-1:] == values["extraVolumes"]
        assert mounts[-1:] == values["extraVolumeMounts"]
        assert [v["name"] for v in volumes[:-1]] == ["config", "tmp", "db-ca"]


# ---------------------------------------------------------------- probes and rollout


def _probe(deployment: Doc, kind: str) -> Doc:
    probe: Doc = server_container(deployment)[kind]["httpGet"]
    return probe


def test_servers_are_ready_while_healthy_and_roll_one_at_a_time(scenario: tuple[str, Rendered]) -> None:
    """Every group of servers, SQLite's one server included: readiness is /healthz (the routers, not
    a Service, keep calls off the standbys), and a StatefulSet update replaces one server at a time,
    stopping each before its replacement starts (so SQLite's one volume is free), with no Recreate."""
    name, rendered = scenario
    scheme = "HTTPS" if "tls" in SCENARIOS[name] else "HTTP"
    grace = rendered.config["server"]["shutdown_grace_s"]
    for statefulset in rendered.servers:
        for kind in ("startupProbe", "livenessProbe", "readinessProbe"):
            assert _probe(statefulset, kind) == {"path": "/healthz", "port": "http", "scheme": scheme}
        assert statefulset["kind"] == "StatefulSet"
        assert statefulset["spec"]["updateStrategy"] == {"type": "RollingUpdate"}
        assert statefulset["spec"]["podManagementPolicy"] == "Parallel"
        ports = {p["name"]: p["containerPort"] for p in server_container(statefulset)["ports"]}
        assert ports["grpc"] == 7070 and ports["http"] == 7071
        # shutdown_grace_s for running attempts, then up to 5 s of listener drain.
        assert pod_spec(statefulset)["terminationGracePeriodSeconds"] > grace + 5


@pytest.mark.parametrize(("name", "scheme"), [("sharded-tls", "HTTPS"), ("default", "HTTP")])
def test_routers_are_ready_while_they_run_and_roll_one_at_a_time(helm: Path, name: str, scheme: str) -> None:
    """A router's ``/readyz`` answers 200 whenever it runs, so every replica takes traffic and a rolling
    update starts a new router before it stops an old one; with shards or without."""
    (router,) = render(helm, SCENARIOS[name]).routers
    for kind, path in (
        ("startupProbe", "/healthz"),
        ("livenessProbe", "/healthz"),
        ("readinessProbe", "/readyz"),
    ):
        assert _probe(router, kind) == {"path": path, "port": "http", "scheme": scheme}
    assert router["spec"]["strategy"] == {
        "type": "RollingUpdate",
        "rollingUpdate": {"maxSurge": 1, "maxUnavailable": 0},
    }
    assert router["spec"]["replicas"] == 2


@pytest.mark.parametrize(
    ("grace", "config"), [(45, {}), (0, {"server": {"http_max_connections": 500}})], ids=["45", "0-merged"]
)
def test_termination_grace_follows_shutdown_grace(helm: Path, grace: int, config: dict[str, Any]) -> None:
    """0 too, next to a `config` that adds to ``server``: merging must not drop a value that is empty."""
    rendered = render(helm, merge(REQUIRED, {"shutdownGraceS": grace, "config": config}))
    assert _typed(rendered.config["server"]["shutdown_grace_s"]) == ("int", grace)
    (deployment,) = rendered.servers
    assert pod_spec(deployment)["terminationGracePeriodSeconds"] == grace + 10


# ---------------------------------------------------------------- pods


def test_pods_run_locked_down(scenario: tuple[str, Rendered]) -> None:
    """Servers, routers and the helm test's pod alike: non-root, read-only, no capability, no token."""
    _, rendered = scenario
    (test_pod,) = rendered.of_kind("Pod")
    workloads = [*rendered.servers, *rendered.routers]
    for pod in [*(pod_spec(w) for w in workloads), test_pod["spec"]]:
        assert pod["automountServiceAccountToken"] is False
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["runAsUser"] == 65532
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        (container,) = pod["containers"]
        security = container["securityContext"]
        assert security["readOnlyRootFilesystem"] is True
        assert security["allowPrivilegeEscalation"] is False
        assert security["capabilities"]["drop"] == ["ALL"]
        assert security["seccompProfile"] == {"type": "RuntimeDefault"}
        assert container["image"] == f"cronoq:{APP_VERSION}"
    for workload in workloads:
        container = server_container(workload)
        mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
        volumes = {v["name"]: v for v in pod_spec(workload)["volumes"]}
        assert volumes[mounts["/etc/cronoq"]]["configMap"]["name"] == "rel-cronoq-config"
        assert container["args"] == ["--config", f"/etc/cronoq/{CONFIG_FILE}"]
    for router in rendered.routers:  # the image's entrypoint is the server
        assert server_container(router)["command"] == ["/opt/cronoq/bin/cronoq-router"]


def test_a_config_change_rolls_the_pods(helm: Path) -> None:
    """The servers' and the routers' pod templates carry a hash of the rendered file, which the same
    values keep and a change of `config` changes."""

    def checksums(values: Mapping[str, Any]) -> list[str]:
        rendered = render(helm, values)
        return [
            workload["spec"]["template"]["metadata"]["annotations"]["checksum/config"]
            for workload in rendered.servers + rendered.routers
        ]

    before = checksums(REQUIRED)
    assert len(before) == 2 and checksums(REQUIRED) == before
    after = checksums(merge(REQUIRED, {"config": {"pools": [{"name": "default", "max": 7}]}}))
    assert all(new != old for new, old in zip(after, before, strict=True))


@pytest.mark.parametrize(("existing", "claim"), [("", "rel-cronoq-data"), ("cronoq-state", "cronoq-state")])
def test_sqlite_keeps_its_database_on_a_claim(helm: Path, existing: str, claim: str) -> None:
    """The one server's StatefulSet mounts the claim the chart creates (kept on uninstall), or the
    user's own (store.sqlite.existingClaim), which the chart then leaves alone."""
    rendered = render(helm, merge(SCENARIOS["sqlite"], {"store": {"sqlite": {"existingClaim": existing}}}))
    created = rendered.of_kind("PersistentVolumeClaim")
    if existing:
        assert created == []
    else:
        (pvc,) = created
        assert pvc["metadata"]["name"] == claim
        assert pvc["metadata"]["annotations"]["helm.sh/resource-policy"] == "keep"
    (statefulset,) = rendered.servers
    assert statefulset["kind"] == "StatefulSet" and statefulset["spec"]["replicas"] == 1
    assert "volumeClaimTemplates" not in statefulset["spec"]
    mounts = {m["name"]: m["mountPath"] for m in server_container(statefulset)["volumeMounts"]}
    volumes = {v["name"]: v for v in pod_spec(statefulset)["volumes"]}
    assert volumes["data"]["persistentVolumeClaim"]["claimName"] == claim
    assert rendered.config["store"] == {
        "kind": "sqlite",
        "path": f"{mounts['data']}/state.db",
        "keep_finished_s": 604800,
    }
    assert DATABASE_URL_ENV not in env_of(statefulset)
    (router,) = rendered.routers  # the router keeps no state: no volume of the database
    assert "data" not in {v["name"] for v in pod_spec(router)["volumes"]}


def test_scheduling_service_and_metrics_values_reach_the_manifests(helm: Path) -> None:
    values = merge(
        SHARDED_TLS,
        {
            "nodeSelector": {"pool": "system"},
            "tolerations": [{"key": "dedicated", "operator": "Exists", "effect": "NoSchedule"}],
            "podAnnotations": {"team": "jobs"},
            "resources": {"limits": {"memory": "1Gi"}},
            "service": {"type": "LoadBalancer", "annotations": {"lb": "internal"}},
            "metrics": {"serviceMonitor": {"enabled": True, "labels": {"release": "prometheus"}}},
        },
    )
    rendered = render(helm, values)
    for deployment in rendered.servers:
        pod = pod_spec(deployment)
        assert pod["nodeSelector"] == {"pool": "system"}
        assert pod["tolerations"][0]["key"] == "dedicated"
        assert deployment["spec"]["template"]["metadata"]["annotations"]["team"] == "jobs"
        assert server_container(deployment)["resources"]["limits"] == {"memory": "1Gi"}
        assert {p["name"]: p["containerPort"] for p in server_container(deployment)["ports"]}[
            "metrics"
        ] == 7072
    assert rendered.config["server"]["metrics_addr"] == "0.0.0.0:7072"
    main = rendered.one("Service", "rel-cronoq")
    assert main["spec"]["type"] == "LoadBalancer" and main["metadata"]["annotations"] == {"lb": "internal"}
    assert {p["name"] for p in main["spec"]["ports"]} == {"grpc", "http"}  # the routers': no metrics port
    monitors = {m["metadata"]["name"]: m for m in rendered.of_kind("ServiceMonitor")}
    assert set(monitors) == {"rel-cronoq", "rel-cronoq-router"}
    for monitor in monitors.values():
        assert monitor["metadata"]["labels"]["release"] == "prometheus"
    # The servers' monitor scrapes each server once, on its metrics port, through its shard's endpoint
    # Service (not the members Service, which selects the same pods, nor the routers' main Service).
    (endpoint,) = monitors["rel-cronoq"]["spec"]["endpoints"]
    assert endpoint["port"] == "metrics" and endpoint["scheme"] == "https"
    assert endpoint["tlsConfig"]["ca"]["secret"] == {"name": "cronoq-tls", "key": "ca.crt"}
    assert _scraped(rendered) == {
        "rel-cronoq": {"rel-cronoq-cpu", "rel-cronoq-gpu"},
        "rel-cronoq-router": {"rel-cronoq"},
    }
    # The routers' monitor scrapes their HTTP port with the metrics token, from the tokens Secret.
    (endpoint,) = monitors["rel-cronoq-router"]["spec"]["endpoints"]
    assert endpoint["port"] == "http" and endpoint["path"] == "/metrics"
    assert endpoint["authorization"] == {
        "type": "Bearer",
        "credentials": {"name": TOKENS_SECRET, "key": "metrics"},
    }


def _scraped(rendered: Rendered) -> dict[str, set[str]]:
    """ServiceMonitor -> the Services it scrapes through (those its selector matches)."""
    return {
        monitor["metadata"]["name"]: {
            service["metadata"]["name"]
            for service in rendered.of_kind("Service")
            if selects(monitor["spec"]["selector"]["matchLabels"], service["metadata"]["labels"])
        }
        for monitor in rendered.of_kind("ServiceMonitor")
    }


def test_without_shards_the_monitors_scrape_the_servers_service_and_the_routers(helm: Path) -> None:
    """The servers are scraped through their own Service (labelled cronoq.io/scrape: server, with the
    metrics port), once each; the routers through the main Service, which has no metrics port."""
    values = merge(REQUIRED, {"metrics": {"enabled": True, "serviceMonitor": {"enabled": True}}})
    rendered = render(helm, values)
    assert _scraped(rendered) == {"rel-cronoq": {"rel-cronoq-server"}, "rel-cronoq-router": {"rel-cronoq"}}
    ports = {
        s["metadata"]["name"]: {p["name"] for p in s["spec"]["ports"]} for s in rendered.of_kind("Service")
    }
    assert ports == {
        "rel-cronoq": {"grpc", "http"},
        "rel-cronoq-server": {"grpc", "http", "metrics"},
        "rel-cronoq-server-members": {"grpc"},
    }


def test_log_level_with_library_targets_reaches_every_server_and_router(helm: Path) -> None:
    """``logLevel`` is CRONOQ_LOG, which takes per-library targets (docs/operations.md, Logs)."""
    level = "info,grpc=debug,psycopg.pool=info"
    rendered = render(helm, merge(SHARDED, {"logLevel": level}))
    workloads = [*rendered.servers, *rendered.routers]
    assert len(workloads) == 3 and all(env_of(w)["CRONOQ_LOG"]["value"] == level for w in workloads)


# ---------------------------------------------------------------- tokens and secrets


def test_tokens_and_database_url_only_through_secret_refs(scenario: tuple[str, Rendered]) -> None:
    name, rendered = scenario
    assert not rendered.of_kind("Secret")
    config = rendered.config
    assert sorted(config["auth"]["tokens"], key=lambda t: t["role"]) == sorted(
        ({"role": role, "token_env": env} for role, env in TOKEN_ENVS.items()), key=lambda t: t["role"]
    )
    if config["store"]["kind"] == "postgres":
        assert "url" not in config["store"] and config["store"]["url_env"] == DATABASE_URL_ENV
    for deployment in rendered.servers:
        env = env_of(deployment)
        for role, variable in TOKEN_ENVS.items():
            assert env[variable] == {
                "name": variable,
                "valueFrom": {"secretKeyRef": {"name": TOKENS_SECRET, "key": role}},
            }
        if name != "sqlite":
            assert env[DATABASE_URL_ENV]["valueFrom"]["secretKeyRef"] == {"name": "cronoq-db", "key": "url"}
        literal = {var["name"] for var in env.values() if "value" in var}
        assert literal <= {"CRONOQ_LOG", "CRONOQ_SHARD", "PGSSLROOTCERT"}  # PGSSLROOTCERT: a path
    for router in rendered.routers:  # the tokens it authenticates callers with; no database
        env = env_of(router)
        assert {variable for variable in env if "valueFrom" in env[variable]} == set(TOKEN_ENVS.values())
        assert all(env[v]["valueFrom"]["secretKeyRef"]["name"] == TOKENS_SECRET for v in TOKEN_ENVS.values())
    (test_pod,) = rendered.of_kind("Pod")  # the helm test: the client and worker tokens only
    secret_refs = {
        var["name"]: var["valueFrom"]["secretKeyRef"]
        for var in test_pod["spec"]["containers"][0]["env"]
        if "valueFrom" in var
    }
    assert secret_refs == {
        TOKEN_ENVS[role]: {"name": TOKENS_SECRET, "key": role} for role in ("client", "worker")
    }


# ---------------------------------------------------------------- refusals

TWO_SHARDS = [
    {"name": "cpu", "number": 1, "pools": ["default"]},
    {"name": "gpu", "number": 2, "pools": ["llm"]},
]
POOLS = {"pools": [{"name": "default"}, {"name": "llm"}]}
SHARDED = merge(REQUIRED, {"shards": TWO_SHARDS, "insecurePeerHttp": True, "config": POOLS})


# `config` values the chart cannot merge or read its pools from, and what it says of each.
CONFIG_SHAPE_MISTAKES: dict[str, tuple[object, str]] = {
    "server-not-a-mapping": (
        {"server": "0.0.0.0:7070"},
        "config.server must be a mapping of keys (got string)",
    ),
    "pools-not-a-list": (
        {"pools": {"name": "default"}},
        "config.pools must be a list (got map[string]interface {})",
    ),
    "pool-without-name": (
        {"pools": [{"name": "default"}, {"max": 5}]},
        'config.pools[1] must be a mapping with a name (got {"max":5})',
    ),
    "tokens-not-a-list": (
        {"auth": {"tokens": {"role": "client", "token_env": "T"}}},
        "config.auth.tokens must be a list of tokens, added to the chart's four (got map",
    ),
    "list": ([{"pools": []}], "config: Invalid type. Expected: [object,string], given: array"),
}


def _shards(*entries: dict[str, Any]) -> dict[str, Any]:
    return merge(SHARDED, {"shards": list(entries)})


@pytest.mark.parametrize(
    ("values", "message"),
    [
        pytest.param({"store": REQUIRED["store"]}, "auth.existingSecret is required", id="no-tokens"),
        pytest.param({"auth": REQUIRED["auth"]}, "store.postgres.urlSecret.name is required", id="no-db-url"),
        pytest.param(
            merge(SHARDED, {"insecurePeerHttp": False}),
            "set tls.secretName or insecurePeerHttp: true: the routers (the front door) forward callers'",
            id="shards-without-tls",
        ),
        pytest.param(
            merge(REQUIRED, {"insecurePeerHttp": False}),
            "set tls.secretName or insecurePeerHttp: true: the routers (the front door) forward callers'",
            id="without-tls",
        ),
        pytest.param(
            _shards(TWO_SHARDS[0], {"name": "cpu", "number": 2, "pools": ["llm"]}),
            'shards[1]: name "cpu" is used twice',
            id="duplicate-name",
        ),
        pytest.param(
            _shards(TWO_SHARDS[0], {"name": "gpu", "number": 1, "pools": ["llm"]}),
            "shards[1] (gpu): number 1 is used twice",
            id="duplicate-number",
        ),
        pytest.param(
            _shards(TWO_SHARDS[0], {"name": "gpu", "number": 256, "pools": ["llm"]}),
            "shards.1.number: Must be less than or equal to 255",
            id="number-too-large",
        ),
        pytest.param(
            _shards({"name": "cpu", "number": -1, "pools": ["default", "llm"]}),
            "shards.0.number: Must be greater than or equal to 0",
            id="number-negative",
        ),
        pytest.param(
            _shards(TWO_SHARDS[0], {"name": "gpu", "number": 2, "pools": ["llm", "default"]}),
            'shards[1] (gpu): pool "default" is already in shard cpu',
            id="pool-in-two-shards",
        ),
        pytest.param(
            _shards(TWO_SHARDS[0], {"name": "gpu", "number": 2, "pools": ["llm", "batch"]}),
            'shards[1] (gpu): pool "batch" is not declared in config',
            id="undeclared-pool",
        ),
        pytest.param(
            _shards(TWO_SHARDS[0]), 'config: pool "llm" belongs to no shard', id="pool-without-shard"
        ),
        pytest.param(
            _shards({"name": "GPU", "number": 2, "pools": []}),
            "shards.0.name: Does not match pattern",
            id="bad-name",
        ),
        pytest.param(
            merge(SHARDED, {"fullnameOverride": "x" * 60}),
            "longer than 63 characters",
            id="long-service-name",
        ),
        pytest.param(
            merge(SHARDED, {"store": {"postgres": {"schema": "cronoq"}}}),
            'store.postgres.schema "cronoq" must contain {shard}',
            id="shared-schema",
        ),
        pytest.param(
            merge(REQUIRED, {"store": {"postgres": {"schema": "cronoq_{shard}"}}}),
            "uses {shard} but no shards are set",
            id="shard-schema-unsharded",
        ),
        pytest.param(
            merge(REQUIRED, {"store": {"kind": "sqlite"}}),
            "store.kind sqlite needs replicas: 1 (got 2)",
            id="sqlite-standby",
        ),
        pytest.param(
            merge(SHARDED, {"store": {"kind": "sqlite"}, "replicas": 1}),
            "store.kind sqlite does not support shards",
            id="sqlite-shards",
        ),
        *(
            pytest.param(merge(REQUIRED, {"config": config}), message, id=f"config-{name}")
            for name, (config, message) in CONFIG_SHAPE_MISTAKES.items()
        ),
        pytest.param(
            merge(REQUIRED, {"metrics": {"serviceMonitor": {"enabled": True}}}),
            "metrics.serviceMonitor.enabled needs metrics.enabled",
            id="monitor-without-metrics",
        ),
        pytest.param(
            merge(REQUIRED, {"tls": {"clientCerts": True}}),
            "tls.clientCerts needs tls.secretName",
            id="mtls-without-tls",
        ),
        pytest.param(merge(REQUIRED, {"replicas": "two"}), "replicas: Invalid type", id="replicas-string"),
        pytest.param(
            merge(REQUIRED, {"store": {"postgres": {"caSecret": {"name": "ca", "file": "ca.crt"}}}}),
            "Additional property file is not allowed",
            id="ca-secret-typo",
        ),
        pytest.param(
            merge(REQUIRED, {"store": {"postgres": {"caSecret": {"name": "ca", "key": "../ca.crt"}}}}),
            "store.postgres.caSecret.key: Does not match pattern",
            id="ca-secret-key-path",
        ),
        pytest.param(
            merge(REQUIRED, {"store": {"postgres": {"caSecret": "cronoq-db-ca"}}}),
            "store.postgres.caSecret: Invalid type",
            id="ca-secret-string",
        ),
        pytest.param(
            merge(REQUIRED, {"extraVolumes": {"name": "x", "emptyDir": {}}}),
            "extraVolumes: Invalid type",
            id="extra-volumes-not-a-list",
        ),
        pytest.param(
            merge(REQUIRED, {"extraVolumes": [{"emptyDir": {}}]}),
            "extraVolumes.0: name is required",
            id="extra-volume-without-name",
        ),
        pytest.param(
            merge(REQUIRED, {"extraVolumeMounts": [{"name": "x", "mountPath": "relative"}]}),
            "extraVolumeMounts.0.mountPath: Does not match pattern",
            id="extra-mount-relative",
        ),
        pytest.param(
            merge(REQUIRED, {"extraVolumeMounts": [{"name": "x"}]}),
            "extraVolumeMounts.0: mountPath is required",
            id="extra-mount-without-path",
        ),
        pytest.param(
            merge(REQUIRED, {"extraVolumes": [{"name": "tls", "emptyDir": {}}]}),
            'extraVolumes[0]: name "tls" is one of the chart\'s own volumes',
            id="extra-volume-clash",
        ),
        pytest.param(
            _shards(TWO_SHARDS[0], {"name": "router", "number": 2, "pools": ["llm"]}),
            'shards[1]: the name "router" is the router\'s (rel-cronoq-router)',
            id="shard-named-router",
        ),
        pytest.param(
            _shards({"name": "server", "number": 1, "pools": ["default"]}, TWO_SHARDS[1]),
            'shards[0]: the name "server" is that of the servers of an install without shards '
            "(rel-cronoq-server, rel-cronoq-server-members): choose another",
            id="shard-named-server",
        ),
        pytest.param(
            merge(SHARDED, {"fullnameOverride": "x" * 49}),
            "shards[0] (cpu): its StatefulSet name " + "x" * 49 + "-cpu is longer than 52 characters",
            id="long-statefulset-name",
        ),
        pytest.param(
            merge(REQUIRED, {"fullnameOverride": "x" * 46}),
            "the servers: its StatefulSet name " + "x" * 46 + "-server is longer than 52 characters",
            id="long-unsharded-statefulset-name",
        ),
        pytest.param(
            merge(SHARDED, {"router": {"autoscaling": {"enabled": True}, "resources": {"requests": None}}}),
            "router.autoscaling.enabled needs router.resources.requests.cpu",
            id="router-hpa-without-cpu-request",
        ),
        pytest.param(
            merge(
                SHARDED, {"router": {"autoscaling": {"enabled": True, "minReplicas": 4, "maxReplicas": 3}}}
            ),
            "router.autoscaling.maxReplicas (3) is less than minReplicas (4)",
            id="router-hpa-bounds",
        ),
        pytest.param(
            merge(SHARDED, {"helmTest": {"pool": "batch"}}),
            'helmTest.pool "batch" is not declared in config (pools: default, llm)',
            id="helm-test-pool",
        ),
        pytest.param(
            merge(REQUIRED, {"keda": {"scaledObjects": [{"name": "w", "pool": "llm", "slotsPerWorker": 2}]}}),
            'keda.scaledObjects[0] (w): pool "llm" is not declared in config (pools: default)',
            id="keda-pool",
        ),
        pytest.param(
            merge(REQUIRED, {"keda": {"scaledObjects": [{"name": "w", "pool": "default"}]}}),
            "keda.scaledObjects.0: slotsPerWorker is required",
            id="keda-slots",
        ),
        pytest.param(
            merge(REQUIRED, {"networkPolicy": {"workers": [{"podSelecter": {}}]}}),
            "Additional property podSelecter is not allowed",
            id="network-policy-peer-typo",
        ),
        pytest.param(
            _shards(TWO_SHARDS[0], {**TWO_SHARDS[1], "topologySpreadConstraints": [{"maxSkew": 1}]}),
            "shards.1.topologySpreadConstraints.0: topologyKey is required",
            id="shard-spread-incomplete",
        ),
        pytest.param(
            merge(REQUIRED, {"replica": 3}), "Additional property replica is not allowed", id="typo"
        ),
        pytest.param(
            merge(REQUIRED, {"logLevel": "info,grpc=loud"}),
            "logLevel: Does not match pattern",
            id="log-level",
        ),
    ],
)
def test_refused(helm: Path, values: dict[str, Any], message: str) -> None:
    assert message in refusal(helm, values)


READINESS_GONE = (
    "readiness was removed in chart 0.2.0: the routers are now the front door of every install and find "
    "the leader among the servers themselves, so the servers are always ready while healthy (/healthz)"
)


@pytest.mark.parametrize("base", [REQUIRED, SHARDED], ids=["unsharded", "sharded"])
@pytest.mark.parametrize("value", ["all", "leader"])
def test_a_values_file_that_still_sets_readiness_is_refused_saying_what_replaced_it(
    helm: Path, tmp_path: Path, base: dict[str, Any], value: str
) -> None:
    """Whatever it was set to (``all``, the old default, included): ``helm template`` (``helm install``
    and ``helm upgrade`` render alike) with a values file carrying ``readiness`` fails naming it and
    what replaced it, not with the schema's bare "Additional property readiness is not allowed"."""
    values = tmp_path / "values.yaml"
    values.write_text(yaml.safe_dump(merge(base, {"readiness": value})))
    done = subprocess.run(
        [str(helm), "template", "rel", str(CHART), "-f", str(values)],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode != 0
    assert READINESS_GONE in done.stderr
    assert "Additional property" not in done.stderr


# ---------------------------------------------------------------- the `config` value


def test_the_configuration_is_cronoq_yaml_and_every_pod_is_given_it(helm: Path) -> None:
    """The ConfigMap holds one file, cronoq.yaml, mounted at /etc/cronoq, which every server's and
    router's ``--config`` names."""
    rendered = render(helm, SHARDED_TLS)
    assert list(rendered.one("ConfigMap", "rel-cronoq-config")["data"]) == [CONFIG_FILE]
    assert len(rendered.servers + rendered.routers) == 3
    for workload in rendered.servers + rendered.routers:
        container = server_container(workload)
        (mount,) = [m for m in container["volumeMounts"] if m["name"] == "config"]
        (volume,) = [v for v in pod_spec(workload)["volumes"] if v["name"] == "config"]
        assert volume["configMap"] == {"name": "rel-cronoq-config"}
        assert container["args"] == ["--config", f"{mount['mountPath']}/{CONFIG_FILE}"]
        assert container["args"][1] == "/etc/cronoq/cronoq.yaml"


def test_the_config_mapping_is_merged_into_the_file_and_the_server_accepts_it(
    helm: Path, tmp_path: Path
) -> None:
    """What `config` sets is in the file as given, next to the chart's keys: a pool added, a limit
    changed, keys of ``server`` the chart leaves alone, and tokens added after the chart's four; the
    rest is the chart's. The server checks the result."""
    token = {"token_env": "CRONOQ_REPORTS_TOKEN", "role": "client", "pools": ["reports"]}
    given: dict[str, Any] = {
        "pools": [{"name": "default", "max": 50}, {"name": "reports", "max": 5, "overflow": "reject"}],
        "limits": {"max_wait_s": 60},
        "server": {"http_max_connections": 5000, "http_idle_timeout_s": 120},
        "auth": {"tokens": [token], "certs": [{"dns_name": "worker-1.internal", "role": "worker"}]},
    }
    chart = render(helm, UNSHARDED_MTLS).config
    rendered = render(helm, merge(UNSHARDED_MTLS, {"config": given}))
    config = rendered.config
    assert config["pools"] == given["pools"] and config["limits"] == given["limits"]
    assert config["server"] == {**chart["server"], **given["server"]}
    assert config["auth"] == {"tokens": [*chart["auth"]["tokens"], token], "certs": given["auth"]["certs"]}
    assert {k: v for k, v in config.items() if k not in given} == {
        k: v for k, v in chart.items() if k not in given
    }
    path = tmp_path / CONFIG_FILE
    path.write_text(_with_tls_dir(rendered.config_text, _pki(tmp_path / "tls", [])))
    env = {
        **_tokens(),
        "CRONOQ_REPORTS_TOKEN": os.urandom(24).hex(),
        DATABASE_URL_ENV: "postgres://db/cronoq",
    }
    check = _check(path, env, None)
    output, _ = check.communicate(timeout=60)
    assert check.returncode == 0 and "configuration ok" in output, output


# Each key the chart writes from its values, and (for some) the values the refusal names instead.
CHART_OWNED = {
    "server.grpc_addr": "every pod listens on 0.0.0.0:7070",
    "server.http_addr": "every pod listens on 0.0.0.0:7071",
    "server.metrics_addr": "from metrics.enabled and metrics.port",
    "server.shutdown_grace_s": "from shutdownGraceS",
    "server.insecure_peer_http": "from insecurePeerHttp",
    "server.insecure_no_auth": "the servers always require the tokens of auth.existingSecret",
    "server.tls": "from tls.secretName and tls.clientCerts",
    "server.peer_tls": "from tls.secretName and tls.clientCerts",
    "server.shard": "CRONOQ_SHARD",
    "store": "from store.kind, store.postgres, store.sqlite and store.keepFinishedS",
    "router.grpc_addr": "every router listens on 0.0.0.0:7070",
    "router.http_addr": "every router listens on 0.0.0.0:7071",
    "router.endpoint": "the servers' Service",
    "router.members": "from replicas",
    "shards": "from shards",
}


@pytest.mark.parametrize(("key", "source"), CHART_OWNED.items(), ids=list(CHART_OWNED))
@pytest.mark.parametrize("base", [REQUIRED, SHARDED], ids=["unsharded", "sharded"])
def test_config_setting_a_key_the_chart_writes_is_refused_naming_it(
    helm: Path, base: dict[str, Any], key: str, source: str
) -> None:
    """Whatever the value, even one equal to the chart's: the key is the chart's, set from its values."""
    section, _, name = key.partition(".")
    config = {section: {name: "0.0.0.0:7070"}} if name else {section: {}}
    message = refusal(helm, merge(base, {"config": config}))
    assert f"config.{key} is written by the chart (" in message and source in message
    assert "remove it from config" in message


CONFIG_CHANGED = (
    "config is a string, but since chart 0.3.0 the servers and routers read cronoq.yaml and `config` is "
    "a YAML mapping merged into it, no longer TOML text appended to cronoq.toml: write each table as a key"
)


@pytest.mark.parametrize(
    "config",
    ['[[pools]]\nname = "default"\n[[pools]]\nname = "llm"\n', ""],
    ids=["toml", "empty"],
)
@pytest.mark.parametrize("base", [REQUIRED, SHARDED], ids=["unsharded", "sharded"])
def test_a_values_file_with_the_old_toml_config_is_refused_saying_what_changed(
    helm: Path, base: dict[str, Any], config: str
) -> None:
    """``config`` of chart 0.2.0, TOML text (its default, "", too), in a values file: ``helm template``
    (``helm install`` and ``helm upgrade`` render alike) fails saying what the value is now and how
    to write it, not with the schema's bare "Invalid type"."""
    message = refusal(helm, {**base, "config": config})
    assert CONFIG_CHANGED in message
    assert "(docs/kubernetes.md, Upgrades)" in message and "Invalid type" not in message


def test_the_upgrade_notes_rewrite_a_toml_config_as_the_same_configuration() -> None:
    """docs/kubernetes.md's example of a chart 0.2.0 `config` and of what it becomes are one document."""
    notes = (REPO / "docs" / "kubernetes.md").read_text().split("**From chart 0.2.0**", 1)[1]
    before, after = (
        textwrap.dedent(block) for block in re.findall(r"```(?:toml|yaml)\n(.*?)```", notes, re.S)[:2]
    )
    assert tomllib.loads(before) == yaml.safe_load(after)["config"] != {}


def _typed(value: object) -> object:
    """``value`` with every scalar paired with its type's name, so that 1000000 and 1000000.0 differ."""
    if isinstance(value, dict):
        return {key: _typed(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_typed(item) for item in value]
    return (type(value).__name__, value)


def test_large_numbers_reach_the_file_as_the_integers_they_are(helm: Path) -> None:
    """Helm reads the values' numbers as floats and prints a large one as 1e+06 in text; the file
    (read as the server reads it) has each of `config`'s and the chart's integers as an integer, and a
    float as a float."""
    rendered = render(helm, TUNED)
    config = rendered.config
    for key, value in TUNED_CONFIG.items():
        got = {name: config[key][name] for name in value} if key == "server" else config[key]
        assert _typed(got) == _typed(value), key
    assert _typed(config["store"]["keep_finished_s"]) == ("int", 31_536_000)
    assert _typed(config["server"]["shutdown_grace_s"]) == ("int", 3_600)
    assert "e+" not in rendered.config_text and "cache_bytes: 67108864" in rendered.config_text


# ---------------------------------------------------------------- the real server reads the config


def _pki(directory: Path, hosts: list[str]) -> Path:
    """A CA and a server certificate naming ``hosts`` (and 127.0.0.1), laid out as the kubernetes.io/tls
    Secret the pods mount: ``tls.crt``, ``tls.key``, ``ca.crt``."""
    directory.mkdir(parents=True, exist_ok=True)
    ca, ca_key = new_ca(directory / "ca.crt", directory / "ca.key", "cronoq chart test CA")
    san = ",".join(["IP:127.0.0.1", *(f"DNS:{host}" for host in hosts)])
    cert, key = issue(directory, "server", "/CN=cronoq", san, ca, ca_key)
    cert.rename(directory / "tls.crt")
    key.rename(directory / "tls.key")
    return directory


def _with_tls_dir(config_text: str, tls_dir: Path | None) -> str:
    """The TLS files where this test wrote them, not where the pods mount the Secret (``--check`` and
    the servers read them)."""
    assert "/etc/cronoq-tls/" in config_text or tls_dir is None
    return config_text if tls_dir is None else config_text.replace("/etc/cronoq-tls/", f"{tls_dir}/")


# What the pods receive, so that none of it leaks into a check from the environment running the tests.
OWN_ENV = {*TOKEN_ENVS.values(), DATABASE_URL_ENV, "CRONOQ_SHARD"}


def _check(
    config: Path, env: Mapping[str, str], shard: str | None, module: str = "cronoq.shard.main"
) -> subprocess.Popen[str]:
    shard_env = {"CRONOQ_SHARD": shard} if shard else {}
    return subprocess.Popen(
        [sys.executable, "-m", module, "--config", str(config), "--check"],
        env={**{k: v for k, v in os.environ.items() if k not in OWN_ENV}, **env, **shard_env},
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


def test_rendered_config_passes_the_servers_and_the_routers_check(helm: Path, tmp_path: Path) -> None:
    """Each distinct config of the scenarios, checked as the pods run it: by ``cronoq-server`` for each
    shard (with CRONOQ_SHARD) or for the servers without shards, and by ``cronoq-router`` with the
    router pod's environment (no database URL), all at once. Control runs with one token too short
    must fail, so the checks are real ones."""
    env = {**_tokens(), DATABASE_URL_ENV: "postgres://cronoq:secret@db:5432/cronoq?sslmode=verify-full"}
    router_env = {k: v for k, v in env.items() if k != DATABASE_URL_ENV}
    tls_dir = _pki(tmp_path / "tls", [])
    checks: dict[str, subprocess.Popen[str]] = {}
    seen: set[str] = set()
    for name, values in SCENARIOS.items():
        rendered = render(helm, values)
        server = rendered.config["server"]
        assert (server["grpc_addr"], server["http_addr"]) == ("0.0.0.0:7070", "0.0.0.0:7071")  # in the pod
        groups = _groups(rendered.config).values()
        schemes = {url.split("://")[0] for group in groups for url in [group["endpoint"], *group["members"]]}
        assert schemes == ({"https"} if "tls" in values else {"http"})
        if rendered.config_text in seen:  # e.g. the database's CA changes the pods, not the config
            continue
        seen.add(rendered.config_text)
        config = tmp_path / f"{name}.yaml"
        config.write_text(_with_tls_dir(rendered.config_text, tls_dir if "tls" in values else None))
        if name == "sqlite":  # --check wants the database's directory: the pod's volume, here tmp_path
            config.write_text(config.read_text().replace("/var/lib/cronoq/", f"{tmp_path}/"))
        for shard in [s["name"] for s in rendered.config.get("shards", [])] or [None]:
            checks[f"{name}/{shard}"] = _check(config, env, shard)
        router = rendered.config["router"]
        assert (router["grpc_addr"], router["http_addr"]) == ("0.0.0.0:7070", "0.0.0.0:7071")
        checks[f"{name}/router"] = _check(config, router_env, None, "cronoq.router.main")
    assert {
        "three-shards/router",
        "sharded-tls/router",
        "default/None",
        "default/router",
        "sqlite/router",
    } <= set(checks)
    control = _check(tmp_path / "default.yaml", {**env, "CRONOQ_WORKER_TOKEN": "short"}, None)
    router_control = _check(
        tmp_path / "three-shards.yaml",
        {**router_env, "CRONOQ_WORKER_TOKEN": "short"},
        None,
        "cronoq.router.main",
    )
    unsharded = {"default/router": 2, "mtls/router": 2, "sqlite/router": 1}
    for label, proc in checks.items():
        output, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, f"{label}: {output}"
        assert "configuration ok" in output
        if label in unsharded:
            assert f"one unsharded cluster of {unsharded[label]} member(s)" in output, output
    for proc in (control, router_control):
        output, _ = proc.communicate(timeout=60)
        assert proc.returncode == 1 and "the token in CRONOQ_WORKER_TOKEN must be at least" in output


# ---------------------------------------------------------------- the real servers run it


def _listen_on(config: Mapping[str, Any], section: str, grpc_port: int, http_port: int) -> str:
    """``config`` as a file with the ``section`` (``server`` or ``router``) listeners, 0.0.0.0:7070/7071
    in the pod, on loopback ports: pods have their own IPs, processes here do not."""
    listeners = {"grpc_addr": f"127.0.0.1:{grpc_port}", "http_addr": f"127.0.0.1:{http_port}"}
    assert {key: config[section][key] for key in listeners} == {
        "grpc_addr": "0.0.0.0:7070",
        "http_addr": "0.0.0.0:7071",
    }
    return yaml.safe_dump({**config, section: {**config[section], **listeners}})


@contextlib.contextmanager
def _cluster_from_chart(
    rendered: Rendered, tmp_path: Path, tls_dir: Path, env: Mapping[str, str]
) -> Iterator[tuple[dict[str, list[ServerProcess]], ServerProcess]]:
    """Every server of every group, as the StatefulSets' pods would run them, and a router, from the
    chart's config; the servers by the name the router gives their group (each shard's, or
    ``UNSHARDED``).

    The adjustments, all explicit: the TLS files where this test wrote them; each process's own
    loopback ports instead of 0.0.0.0:7070/7071; each ``members`` entry (a pod's DNS name) pointing at
    that server's process, and each group's endpoint (its Service) at its first server, which leads.
    """
    context = ssl.create_default_context(cafile=str(tls_dir / "ca.crt"))
    base = yaml.safe_load(_with_tls_dir(rendered.config_text, tls_dir))
    groups = _groups(base)
    picked = iter(free_ports(2 * sum(len(group["members"]) for group in groups.values()) + 2))
    ports = {
        shard: [(next(picked), next(picked)) for _ in group["members"]] for shard, group in groups.items()
    }
    for shard, group in groups.items():  # each entry of base's shards, or its router
        group["members"] = [f"https://127.0.0.1:{grpc}" for grpc, _ in ports[shard]]
        group["endpoint"] = group["members"][0]
    procs: dict[str, list[ServerProcess]] = {}
    for shard in groups:
        procs[shard] = []
        shard_env = {"CRONOQ_SHARD": shard} if "shards" in rendered.config else {}
        for index, (grpc_port, http_port) in enumerate(ports[shard]):
            folder = tmp_path / f"{shard}-{index}"
            folder.mkdir()
            (folder / CONFIG_FILE).write_text(_listen_on(base, "server", grpc_port, http_port))
            procs[shard].append(
                ServerProcess(
                    folder / CONFIG_FILE,
                    folder / "server.log",
                    env={**env, **shard_env},
                    grpc_port=grpc_port,
                    http_port=http_port,
                    ssl_context=context,
                )
            )
    router_ports = (next(picked), next(picked))
    (tmp_path / "router").mkdir()
    (tmp_path / "router" / CONFIG_FILE).write_text(_listen_on(base, "router", *router_ports))
    router = ServerProcess(
        tmp_path / "router" / CONFIG_FILE,
        tmp_path / "router" / "router.log",
        env={k: v for k, v in env.items() if k != DATABASE_URL_ENV},  # as its pod: no database
        grpc_port=router_ports[0],
        http_port=router_ports[1],
        ssl_context=context,
        module="cronoq.router.main",
    )
    everyone = [*(proc for group in procs.values() for proc in group), router]
    try:
        with ThreadPoolExecutor() as pool:  # the groups start side by side
            list(pool.map(lambda group: group[0].start(), procs.values()))  # the first of each leads...
            list(pool.map(lambda proc: proc.start(ready=False), [p for g in procs.values() for p in g[1:]]))
        router.start()
        yield procs, router
    except BaseException:
        for proc in everyone:
            print(f"----- {proc.log_path} -----\n{proc.logs()}")
        raise
    finally:
        for proc in everyone:
            proc.stop()


def _submit(server: ServerProcess, token: str, pool: str) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        f"{server.http}/v1/tasks",
        data=json.dumps({"pool": pool, "payload": {"from": "chart"}}).encode(),
        headers={"authorization": f"Bearer {token}", "content-type": "application/json"},
        method="POST",
    )
    try:
        with urllib.request.urlopen(request, timeout=15, context=server.ssl_context) as answer:
            return answer.status, json.loads(answer.read())
    except urllib.error.HTTPError as err:
        return err.code, {}


def _router_view(router: ServerProcess, token: str) -> dict[str, str]:
    """Shard -> the leader the router found (``cronoq_router_shard_leader`` 1), from its ``/metrics``."""
    request = urllib.request.Request(f"{router.http}/metrics", headers={"authorization": f"Bearer {token}"})
    with urllib.request.urlopen(request, timeout=5, context=router.ssl_context) as answer:
        text = answer.read().decode()
    found = re.findall(
        r'^cronoq_router_shard_leader\{(?=.*shard="([^"]+)")(?=.*endpoint="([^"]*)").*\} 1(?:\.0)?$',
        text,
        re.M,
    )
    return dict(found)


def _helm_test_env(rendered: Rendered, target: str, tls_dir: Path, env: Mapping[str, str]) -> dict[str, str]:
    """The environment the helm test's pod gives its script, with this test's router as the main
    Service, the CA where this test wrote it and the tokens its Secret holds."""
    (pod,) = rendered.of_kind("Pod")
    (container,) = pod["spec"]["containers"]
    given = {var["name"]: var.get("value") for var in container["env"]}
    assert given.pop("CRONOQ_TEST_TARGET") == f"https://rel-cronoq.{NAMESPACE}.svc.cluster.local:7070"
    assert given.pop("CRONOQ_TEST_CA_FILE") == CA_FILE
    assert container["command"] == ["/opt/cronoq/bin/python3", "/etc/cronoq-test/helm_test.py"]
    tokens = {name: env[name] for name, value in given.items() if value is None}  # the secretKeyRefs
    assert set(tokens) == {"CRONOQ_CLIENT_TOKEN", "CRONOQ_WORKER_TOKEN"}
    plain = {name: str(value) for name, value in given.items() if value is not None}
    return {**plain, **tokens, "CRONOQ_TEST_TARGET": target, "CRONOQ_TEST_CA_FILE": str(tls_dir / "ca.crt")}


HELM_TEST = CHART / "files" / "helm_test.py"


def test_servers_and_router_started_from_the_rendered_config_route_to_the_leaders(
    helm: Path, tmp_path: Path, postgres_url: str, pg_schema: str
) -> None:
    """The chart's config run for real: each shard's servers lead and stand by, the router finds each
    leader among the members (never the standby), a task submitted through the router or forwarded by
    another shard lands on its shard, and the helm test's script, run as its pod runs it against the
    router, brings its worker and gets its task done."""
    values = merge(
        SHARDED_TLS,
        {
            "store": {"postgres": {"schema": f"{pg_schema}_{{shard}}"}},
            "metrics": {"enabled": False},
            "shards": [{**shard, "replicas": 2} for shard in SHARDED_TLS["shards"]],
        },
    )
    rendered = render(helm, values)
    tls_dir = _pki(tmp_path / "tls", [])
    env = {**_tokens(), DATABASE_URL_ENV: postgres_url}
    numbers = {s["name"]: s["number"] for s in rendered.config["shards"]}
    with _cluster_from_chart(rendered, tmp_path, tls_dir, env) as (procs, router):
        for leader, standby in procs.values():
            assert (leader.probe("/readyz"), leader.probe("/healthz")) == (200, 200)
            assert (standby.probe("/readyz"), standby.probe("/healthz")) == (503, 200)
        _wait_for_the_leaders(router, env["CRONOQ_METRICS_TOKEN"], procs)
        for shard, pool in SHARD_POOLS.items():
            status, answer = _submit(router, env["CRONOQ_CLIENT_TOKEN"], pool[0])
            assert status == 200, answer
            assert int(answer["id"]) >> SHARD_SHIFT == numbers[shard]
        # A task for the gpu shard's pool, sent to the cpu shard's leader, is forwarded over https to
        # the gpu leader (verified with ca.crt, as server.peer_tls says) and gets a gpu task id.
        status, answer = _submit(procs["cpu"][0], env["CRONOQ_CLIENT_TOKEN"], "llm")
        assert status == 200, answer
        assert int(answer["id"]) >> SHARD_SHIFT == numbers["gpu"]
        assert _submit(router, "not-a-token-at-all-0000", "llm")[0] == 401
        _run_the_helm_test(rendered, router, tls_dir, env)


def test_without_shards_the_rendered_config_sends_every_call_and_worker_to_the_leader(
    helm: Path, tmp_path: Path, postgres_url: str, pg_schema: str
) -> None:
    """The unsharded config run for real: its servers lead and stand by, the router finds the leader
    among ``router.members`` (the group it calls ``main``), never the standby, serves a task
    submitted to it, refuses a bad token, and the helm test's script, run against the router as its pod
    runs it, gets its worker redirected to the leader (over https, to a members name) and its task
    done."""
    rendered = render(helm, merge(UNSHARDED_TLS, {"store": {"postgres": {"schema": pg_schema}}}))
    tls_dir = _pki(tmp_path / "tls", [])
    env = {**_tokens(), DATABASE_URL_ENV: postgres_url}
    with _cluster_from_chart(rendered, tmp_path, tls_dir, env) as (procs, router):
        assert list(procs) == [UNSHARDED]
        ((leader, standby),) = procs.values()
        assert (leader.probe("/readyz"), standby.probe("/readyz"), standby.probe("/healthz")) == (
            200,
            503,
            200,
        )
        _wait_for_the_leaders(router, env["CRONOQ_METRICS_TOKEN"], procs)
        status, answer = _submit(router, env["CRONOQ_CLIENT_TOKEN"], "default")
        assert status == 200, answer
        assert _submit(router, "not-a-token-at-all-0000", "default")[0] == 401
        _run_the_helm_test(rendered, router, tls_dir, env)


def _wait_for_the_leaders(
    router: ServerProcess, token: str, procs: Mapping[str, list[ServerProcess]]
) -> None:
    """Until the router has found every group's leader among its members (the rendered members, here on
    loopback): the first server of each, never its standby."""
    deadline = time.monotonic() + 10
    while _router_view(router, token).keys() != procs.keys():
        assert time.monotonic() < deadline, router.logs()
        time.sleep(0.1)
    assert _router_view(router, token) == {
        shard: f"https://127.0.0.1:{group[0].grpc_port}" for shard, group in procs.items()
    }


def _run_the_helm_test(
    rendered: Rendered, router: ServerProcess, tls_dir: Path, env: Mapping[str, str]
) -> None:
    """The helm test's script, run as its pod runs it against the main Service, here the router."""
    test_env = _helm_test_env(rendered, f"https://127.0.0.1:{router.grpc_port}", tls_dir, env)
    done = subprocess.run(
        [sys.executable, str(HELM_TEST)],
        env={**{k: v for k, v in os.environ.items() if k not in OWN_ENV}, **test_env},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"in pool default through https://127.0.0.1:{router.grpc_port}" in done.stdout
