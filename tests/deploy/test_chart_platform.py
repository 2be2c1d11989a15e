"""What ``charts/cronoq`` offers a platform team around the cluster, rendered by the real ``helm``:
per-shard scheduling and its default spread over nodes, the ServiceAccount, the NetworkPolicy (who may
reach which port), the routers' autoscaler, KEDA ScaledObjects checked against KEDA's published schema,
the helm test hook, and the NOTES pointing clients at the routers."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest

from .chart_render import (
    REQUIRED,
    Doc,
    Rendered,
    ci_values,
    custom_resource_errors,
    merge,
    pod_labels,
    pod_spec,
    render,
    render_notes,
    selects,
    server_container,
)

THREE_SHARDS = ci_values("three-shards-values.yaml")
SHARDED_TLS = ci_values("sharded-tls-values.yaml")


@pytest.fixture(scope="module")
def three_shards(helm: Path) -> Rendered:
    return render(helm, THREE_SHARDS)


def _by_shard(rendered: Rendered) -> dict[str, Doc]:
    return {d["metadata"]["labels"]["cronoq.io/shard"]: d for d in rendered.servers}


# ---------------------------------------------------------------- scheduling


def test_a_shard_schedules_with_its_own_values_and_the_others_with_the_charts(three_shards: Rendered) -> None:
    shards = _by_shard(three_shards)
    gpu, cpu = pod_spec(shards["gpu"]), pod_spec(shards["cpu"])
    assert gpu["nodeSelector"] == {"pool": "gpu"}
    assert gpu["tolerations"] == [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    assert server_container(shards["gpu"])["resources"] == {"requests": {"cpu": "1", "memory": "1Gi"}}
    assert gpu["priorityClassName"] == "cronoq-critical"
    assert "nodeSelector" not in cpu and "tolerations" not in cpu
    assert server_container(shards["cpu"])["resources"] == {"requests": {"cpu": "100m", "memory": "128Mi"}}
    assert cpu["priorityClassName"] == "cronoq-standard"


def _spread_by_default(workload: Doc) -> None:
    (constraint,) = pod_spec(workload)["topologySpreadConstraints"]
    assert constraint == {
        "maxSkew": 1,
        "topologyKey": "kubernetes.io/hostname",
        "whenUnsatisfiable": "ScheduleAnyway",
        "labelSelector": {"matchLabels": workload["spec"]["selector"]["matchLabels"]},
    }
    assert "affinity" not in pod_spec(workload)


def test_without_shards_the_servers_and_the_routers_spread_over_nodes_by_default(helm: Path) -> None:
    """The leader and its standby prefer different nodes, and so do the two routers."""
    rendered = render(helm, REQUIRED)
    assert len(rendered.servers) == len(rendered.routers) == 1
    for workload in [*rendered.servers, *rendered.routers]:
        _spread_by_default(workload)


def test_every_workload_spreads_its_own_pods_over_nodes_by_default(three_shards: Rendered) -> None:
    """A shard's leader and standby (and two routers) prefer different nodes: the default constraint
    selects exactly that workload's pods. A shard's own constraint without a labelSelector gets the
    shard's."""
    shards = _by_shard(three_shards)
    for workload in [shards["cpu"], shards["gpu"], *three_shards.routers]:
        _spread_by_default(workload)
    (zone,) = pod_spec(shards["batch"])["topologySpreadConstraints"]
    assert zone["topologyKey"] == "topology.kubernetes.io/zone"
    assert zone["whenUnsatisfiable"] == "DoNotSchedule"
    assert zone["labelSelector"] == {"matchLabels": shards["batch"]["spec"]["selector"]["matchLabels"]}
    for name, workload in shards.items():  # each selector is one shard's pods and no other's
        for other, labels in ((o, pod_labels(w)) for o, w in shards.items()):
            assert selects(workload["spec"]["selector"]["matchLabels"], labels) == (name == other)


def test_the_service_account_is_created_annotated_and_used_without_a_token(three_shards: Rendered) -> None:
    (account,) = three_shards.of_kind("ServiceAccount")
    assert account["metadata"]["name"] == "rel-cronoq"
    assert account["metadata"]["annotations"] == {
        "eks.amazonaws.com/role-arn": "arn:aws:iam::123456789012:role/cronoq"
    }
    for workload in [*three_shards.servers, *three_shards.routers]:
        assert pod_spec(workload)["serviceAccountName"] == "rel-cronoq"
        assert pod_spec(workload)["automountServiceAccountToken"] is False


def test_an_existing_service_account_is_named_and_none_created(helm: Path) -> None:
    rendered = render(
        helm, merge(REQUIRED, {"serviceAccount": {"name": "jobs-runner", "automountToken": True}})
    )
    assert rendered.of_kind("ServiceAccount") == []
    for workload in [*rendered.servers, *rendered.routers]:
        assert pod_spec(workload)["serviceAccountName"] == "jobs-runner"
        assert pod_spec(workload)["automountServiceAccountToken"] is True
    default = render(helm, REQUIRED)
    for workload in [*default.servers, *default.routers]:
        assert "serviceAccountName" not in pod_spec(workload)


# ---------------------------------------------------------------- the routers


def test_the_routers_autoscale_on_cpu_instead_of_a_fixed_count(three_shards: Rendered) -> None:
    (router,) = three_shards.routers
    assert "replicas" not in router["spec"]  # the autoscaler owns it
    (autoscaler,) = three_shards.of_kind("HorizontalPodAutoscaler")
    assert autoscaler["spec"]["scaleTargetRef"] == {
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "name": "rel-cronoq-router",
    }
    assert (autoscaler["spec"]["minReplicas"], autoscaler["spec"]["maxReplicas"]) == (2, 6)
    (metric,) = autoscaler["spec"]["metrics"]
    assert metric["resource"] == {"name": "cpu", "target": {"type": "Utilization", "averageUtilization": 70}}


# ---------------------------------------------------------------- who reaches what


def _allowed(policies: list[Doc], pod: Mapping[str, str], source: Mapping[str, str], port: str) -> bool:
    """Whether ingress to a pod labelled ``pod`` on the named ``port`` from a pod labelled ``source`` in
    the same namespace (``{"namespace": ...}`` for a pod of another namespace, matched by the
    policies' namespaceSelectors on kubernetes.io/metadata.name) is allowed: a pod no policy selects
    accepts anything; otherwise some rule of a selecting policy must allow it."""
    selecting = [p for p in policies if selects(p["spec"]["podSelector"]["matchLabels"], pod)]
    if not selecting:
        return True
    namespace = source.get("namespace")

    def peer_matches(peer: Doc) -> bool:
        if "namespaceSelector" in peer:
            wanted = peer["namespaceSelector"]["matchLabels"].get("kubernetes.io/metadata.name")
            return namespace is not None and wanted == namespace
        return namespace is None and selects(peer["podSelector"]["matchLabels"], source)

    for policy in selecting:
        for rule in policy["spec"]["ingress"]:
            ports = {p["port"] for p in rule["ports"]}
            if port in ports and ("from" not in rule or any(peer_matches(peer) for peer in rule["from"])):
                return True
    return False


SERVER = {
    "app.kubernetes.io/name": "cronoq",
    "app.kubernetes.io/instance": "rel",
    "app.kubernetes.io/component": "server",
}
ROUTER = {**SERVER, "app.kubernetes.io/component": "router"}
TEST_POD = {**SERVER, "app.kubernetes.io/component": "test"}
WORKER = {"app.kubernetes.io/part-of": "cronoq-workers"}
STRANGER = {"app": "something-else"}
OTHER_RELEASE = {**SERVER, "app.kubernetes.io/instance": "other"}
MONITORING = {"namespace": "monitoring"}


@pytest.mark.parametrize(
    ("target", "source", "port", "allowed"),
    [
        (SERVER, ROUTER, "grpc", True),  # the router forwards to the leaders
        (SERVER, SERVER, "grpc", True),  # shards forward to each other
        (SERVER, TEST_POD, "grpc", True),  # the helm test's worker, redirected to its shard
        (SERVER, WORKER, "grpc", True),  # networkPolicy.workers
        (SERVER, STRANGER, "grpc", False),
        (SERVER, STRANGER, "http", False),
        (SERVER, OTHER_RELEASE, "grpc", False),
        (SERVER, MONITORING, "grpc", False),
        (SERVER, MONITORING, "metrics", True),  # networkPolicy.metrics
        (SERVER, ROUTER, "metrics", False),  # the metrics port is fenced
        (SERVER, STRANGER, "metrics", False),
        (ROUTER, STRANGER, "grpc", True),  # the front door: clients
        (ROUTER, STRANGER, "http", True),
    ],
)
def test_the_network_policy_lets_through_only_the_clusters_own_traffic(
    three_shards: Rendered, target: dict[str, str], source: dict[str, str], port: str, allowed: bool
) -> None:
    policies = three_shards.of_kind("NetworkPolicy")
    assert len(policies) == 2
    assert _allowed(policies, target, source, port) is allowed


def test_listed_clients_alone_reach_the_front_door(helm: Path) -> None:
    clients = [{"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": "apps"}}}]
    values = merge(THREE_SHARDS, {"networkPolicy": {"clients": clients}})
    policies = render(helm, values).of_kind("NetworkPolicy")
    assert _allowed(policies, ROUTER, {"namespace": "apps"}, "grpc")
    assert _allowed(policies, ROUTER, TEST_POD, "grpc")  # the release's own pods (the helm test)
    assert not _allowed(policies, ROUTER, STRANGER, "grpc")
    assert not _allowed(policies, ROUTER, {"namespace": "elsewhere"}, "http")


@pytest.mark.parametrize(
    ("target", "source", "port", "allowed"),
    [
        (ROUTER, STRANGER, "grpc", True),  # the front door: clients
        (ROUTER, STRANGER, "http", True),
        (SERVER, ROUTER, "grpc", True),  # the routers forward to the leader
        (SERVER, TEST_POD, "grpc", True),  # the helm test's worker, redirected to the leader
        (SERVER, WORKER, "grpc", True),  # networkPolicy.workers, redirected there by the routers
        (SERVER, STRANGER, "grpc", False),  # no client reaches a server past the routers
        (SERVER, STRANGER, "http", False),
        (SERVER, MONITORING, "metrics", True),  # networkPolicy.metrics
        (SERVER, STRANGER, "metrics", False),
        (SERVER, SERVER, "metrics", False),
    ],
)
def test_without_shards_the_routers_are_the_front_door_and_the_servers_fenced(
    helm: Path, target: dict[str, str], source: dict[str, str], port: str, allowed: bool
) -> None:
    np = {key: THREE_SHARDS["networkPolicy"][key] for key in ("enabled", "workers", "metrics")}
    values = merge(REQUIRED, {"networkPolicy": np, "metrics": {"enabled": True}})
    policies = render(helm, values).of_kind("NetworkPolicy")
    assert len(policies) == 2
    assert _allowed(policies, target, source, port) is allowed


def test_no_network_policy_unless_enabled(helm: Path) -> None:
    assert (
        render(helm, merge(THREE_SHARDS, {"networkPolicy": {"enabled": False}})).of_kind("NetworkPolicy")
        == []
    )


# ---------------------------------------------------------------- KEDA


def test_each_listed_worker_deployment_gets_a_scaled_object_from_desired_workers(
    three_shards: Rendered, crd_validators: Path
) -> None:
    objects = {o["spec"]["scaleTargetRef"]["name"]: o["spec"] for o in three_shards.of_kind("ScaledObject")}
    assert set(objects) == {"default-workers", "llm-workers"}
    default, llm = objects["default-workers"], objects["llm-workers"]
    (trigger,) = default["triggers"]
    assert trigger["type"] == "prometheus"
    assert trigger["metadata"] == {
        "serverAddress": "http://prometheus-operated.monitoring.svc:9090",
        "query": 'ceil(max(cronoq_pool_desired_workers{pool="default",namespace="jobs"}) / 4)',
        "threshold": "1",
        "ignoreNullValues": "false",
    }
    assert (default["minReplicaCount"], default["maxReplicaCount"]) == (0, 50)
    assert (llm["minReplicaCount"], llm["maxReplicaCount"]) == (1, 8)
    assert llm["triggers"][0]["metadata"]["query"].endswith("/ 1)")
    for spec in objects.values():
        assert spec["fallback"] == {"failureThreshold": 3, "replicas": 1}
    assert custom_resource_errors(crd_validators, three_shards.of_kind("ScaledObject")) == [[], []]


def test_the_published_schemas_do_find_mistakes(crd_validators: Path) -> None:
    """A control: the check of the custom resources rejects a wrongly typed field and an unknown kind."""
    scaled: dict[str, Any] = {
        "apiVersion": "keda.sh/v1alpha1",
        "kind": "ScaledObject",
        "metadata": {"name": "w"},
        "spec": {
            "scaleTargetRef": {"name": "w"},
            "triggers": [{"type": "prometheus", "metadata": {}}],
            "minReplicaCount": "0",
        },
    }
    monitor: dict[str, Any] = {
        "apiVersion": "monitoring.coreos.com/v1",
        "kind": "ServiceMonitor",
        "metadata": {"name": "m"},
        "spec": {"selector": {}, "endpoints": [{"port": "metrics", "interval": 30}]},
    }
    unknown = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "x"}}
    errors = custom_resource_errors(crd_validators, [scaled, monitor, unknown])
    assert ["minReplicaCount must be integer" in e for e in errors[0]] == [True]
    assert ["interval must be string" in e for e in errors[1]] == [True]
    assert errors[2] == ["no published schema known here for example.com/v1 Widget"]


def test_the_matchers_of_the_keda_query_can_be_replaced(helm: Path) -> None:
    values = merge(THREE_SHARDS, {"keda": {"prometheus": {"matchers": 'job="rel-cronoq-cpu"'}}})
    (default, _) = render(helm, values).of_kind("ScaledObject")
    assert default["spec"]["triggers"][0]["metadata"]["query"] == (
        'ceil(max(cronoq_pool_desired_workers{pool="default",job="rel-cronoq-cpu"}) / 4)'
    )


# ---------------------------------------------------------------- helm test and NOTES


def test_the_helm_test_is_a_hook_that_talks_to_the_main_service_with_its_own_worker(helm: Path) -> None:
    rendered = render(helm, SHARDED_TLS)
    (pod,) = rendered.of_kind("Pod")
    script = rendered.one("ConfigMap", "rel-cronoq-test")
    for hook in (pod, script):
        assert hook["metadata"]["annotations"]["helm.sh/hook"] == "test"
    assert (
        script["data"]["helm_test.py"]
        == (Path(__file__).parents[2] / "charts/cronoq/files/helm_test.py").read_text()
    )
    env = _test_env(rendered)
    assert env["CRONOQ_TEST_POOL"] == "default"
    assert pod["spec"]["restartPolicy"] == "Never"
    assert render(helm, merge(REQUIRED, {"helmTest": {"enabled": False}})).of_kind("Pod") == []


@pytest.mark.parametrize(
    ("values", "scheme", "insecure_redirect"),
    [
        pytest.param(SHARDED_TLS, "https", False, id="sharded-tls"),
        pytest.param(
            merge({k: v for k, v in SHARDED_TLS.items() if k != "tls"}, {"insecurePeerHttp": True}),
            "http",
            True,
            id="sharded-insecure",
        ),
        pytest.param(REQUIRED, "http", True, id="unsharded-insecure"),
    ],
)
def test_the_helm_test_goes_through_the_routers_and_follows_them_to_plain_http_only_if_trusted(
    helm: Path, values: dict[str, Any], scheme: str, insecure_redirect: bool
) -> None:
    """Its target is the main Service, the routers, shards or not; its worker may follow their
    redirect to a server over plain http:// only where the chart trusts it (insecurePeerHttp, no TLS)."""
    env = _test_env(render(helm, values))
    assert env["CRONOQ_TEST_TARGET"] == f"{scheme}://rel-cronoq.jobs.svc.cluster.local:7070"
    assert env.get("CRONOQ_TEST_INSECURE_REDIRECT_HTTP") == ("1" if insecure_redirect else None)


def _test_env(rendered: Rendered) -> dict[str, Any]:
    """The helm test pod's environment, by name (None for a secretKeyRef)."""
    (pod,) = rendered.of_kind("Pod")
    return {var["name"]: var.get("value") for var in pod["spec"]["containers"][0]["env"]}


def test_the_helm_test_uses_the_first_declared_pool_unless_told(helm: Path) -> None:
    """So that a release whose pools have other names renders (and tests) without a helmTest value."""
    values = merge(REQUIRED, {"config": {"pools": [{"name": "gpu"}, {"name": "cpu"}]}})
    for extra, pool in (({}, "gpu"), ({"helmTest": {"pool": "cpu"}}, "cpu")):
        assert _test_env(render(helm, merge(values, extra)))["CRONOQ_TEST_POOL"] == pool


def test_the_notes_send_clients_to_the_routers_never_to_a_shard(helm: Path, tmp_path: Path) -> None:
    notes = render_notes(helm, SHARDED_TLS, tmp_path)
    assert "port-forward svc/rel-cronoq 7071:7071" in notes
    assert "gRPC  https://rel-cronoq.jobs.svc.cluster.local:7070" in notes
    assert "helm test rel -n jobs" in notes
    for shard in ("cpu", "gpu"):
        assert f"svc/rel-cronoq-{shard}" not in notes


def test_the_notes_without_shards_send_clients_to_the_routers(helm: Path, tmp_path: Path) -> None:
    """Without shards too the NOTES forward to the main Service, the routers (a port-forward to it
    reaches a router, which sends each call to the leader), never to a server pod or the servers'
    Service, and tell workers they need the insecure-redirect option over plain http."""
    notes = render_notes(helm, REQUIRED, tmp_path)
    assert "port-forward svc/rel-cronoq 7071:7071" in notes
    assert "gRPC  http://rel-cronoq.jobs.svc.cluster.local:7070" in notes
    assert "behind 2 routers" in notes
    assert "proxy/readyz" not in notes and "svc/rel-cronoq-server" not in notes
    assert "servers: http://rel-cronoq-server.jobs.svc.cluster.local:7070" in notes
    assert "workers need their own insecure-redirect\noption" in notes
