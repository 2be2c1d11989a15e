"""``cronoq-operator`` as a real process between a real ``cronoq-server`` and a fake Kubernetes API
(:mod:`tests.kube_fake`, its own process): Deployments follow their pool's desired capacity through the scale
subresource, and every case the operator must not scale in is left alone with a status that says why."""

from __future__ import annotations

import asyncio
import contextlib
import re
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest

from cronoq.client import Client, task
from tests.kube_fake import FakeKube
from tests.pki import issue, new_ca

from .helpers import token, toml_table
from .operator_proc import OperatorProcess, until
from .serverproc import ServerProcess, new_server

pytestmark = pytest.mark.asyncio

CLIENT_TOKEN = "client-token-0123456789abcdef"
METRICS_TOKEN = "metrics-token-0123456789abcdef"
KUBE_TOKEN = "kube-token-0123456789abcdef"
OPERATOR_DNS_NAME = "cronoq-operator.cronoq.svc"

# Desired capacity reacts within a second or two: no worker ever connects, so 20 queued tasks are a
# backlog of 20 one-second tasks to drain in one second (well above max = 8), and the autoscaler steps up
# by 4 per one-second evaluation. min = 0: with nothing queued the pool wants no slots at all.
SERVER_CONFIG = (
    toml_table("server", shutdown_grace_s=1)
    + token("CLIENT_TOKEN", "client", env=True)
    + token("METRICS_TOKEN", "metrics", env=True)
    + toml_table("[pools]", name="jobs", min=0, max=8, autoscale=True, drain_time_s=1, default_duration_s=1)
)
SERVER_ENV = {"CLIENT_TOKEN": CLIENT_TOKEN, "METRICS_TOKEN": METRICS_TOKEN}


def operator_config(server: ServerProcess, wrong_token_file: Path) -> str:
    """Four names for the same server: with the metrics token, a wrong token, and the client token
    (a role without Snapshot). ``interval_s`` 1 is the shortest the operator accepts."""
    url = f"http://{server.target}"
    return f"""
interval_s = 1
timeout_s = 2

[[servers]]
name = "main"
url = "{url}"
token_env = "OPERATOR_METRICS_TOKEN"

[[servers]]
name = "badtoken"
url = "{url}"
token_file = "{wrong_token_file}"

[[servers]]
name = "clientrole"
url = "{url}"
token_env = "OPERATOR_CLIENT_TOKEN"
"""


def scaler(server: str, pool: str, deployment: str, slots: int, low: int, high: int) -> dict[str, Any]:
    return {
        "server": server,
        "pool": pool,
        "deployment": deployment,
        "slotsPerReplica": slots,
        "minReplicas": low,
        "maxReplicas": high,
        "intervalSeconds": 1,
    }


@dataclass
class Cluster:
    kube: FakeKube
    server: ServerProcess
    operator: OperatorProcess

    async def status(self, namespace: str, name: str) -> dict[str, Any]:
        return await self.kube.scaler_status(namespace, name)

    async def status_where(self, namespace: str, name: str, **expected: object) -> dict[str, Any]:
        """Wait until the scaler's status has these field values."""

        def matches(status: dict[str, Any]) -> bool:
            return all(status.get(key) == value for key, value in expected.items())

        return await until(
            lambda: self.status(namespace, name), matches, f"{namespace}/{name} with {expected}"
        )

    async def replicas_become(self, namespace: str, deployment: str, replicas: int) -> None:
        await until(
            lambda: self.kube.replicas(namespace, deployment),
            lambda n: n == replicas,
            f"{deployment} at {replicas}",
        )

    async def scale_writes(self, deployment: str) -> int:
        return sum(
            1
            for method, path in await self.kube.operator_requests()
            if method == "PATCH" and path.endswith(f"/deployments/{deployment}/scale")
        )

    async def scale_reads(self, deployment: str) -> int:
        return sum(
            1
            for method, path in await self.kube.operator_requests()
            if method == "GET" and path.endswith(f"/deployments/{deployment}/scale")
        )


async def populate(kube: FakeKube) -> None:
    """Deployments at replicas the operator must change (or keep), and one scaler per case, in two
    namespaces (the fake pages lists by 2, so the operator follows ``continue`` too)."""
    for namespace, deployment, replicas in [
        ("team-a", "jobs-workers", 5),
        ("team-a", "capped-workers", 0),
        ("team-b", "ghost-workers", 2),
        ("team-b", "elsewhere-workers", 2),
        ("team-b", "wrong-token-workers", 2),
        ("team-b", "client-token-workers", 2),
        ("team-b", "invalid-workers", 2),
    ]:
        await kube.create_deployment(namespace, deployment, replicas)
    for namespace, name, spec in [
        ("team-a", "jobs", scaler("main", "jobs", "jobs-workers", 3, 1, 10)),
        ("team-a", "capped", scaler("main", "jobs", "capped-workers", 1, 0, 2)),
        ("team-b", "ghost", scaler("main", "no-such-pool", "ghost-workers", 1, 0, 10)),
        ("team-b", "elsewhere", scaler("nowhere", "jobs", "elsewhere-workers", 1, 0, 10)),
        ("team-b", "wrong-token", scaler("badtoken", "jobs", "wrong-token-workers", 1, 0, 10)),
        ("team-b", "client-token", scaler("clientrole", "jobs", "client-token-workers", 1, 0, 10)),
        ("team-b", "invalid", scaler("main", "jobs", "invalid-workers", 1, 3, 2)),
        ("team-b", "no-deployment", scaler("main", "jobs", "missing-workers", 1, 0, 10)),
    ]:
        await kube.create_scaler(namespace, name, spec)


@contextlib.asynccontextmanager
async def running(cluster: Cluster, objects: Callable[[FakeKube], Awaitable[None]]) -> AsyncIterator[Cluster]:
    """The fake API with ``objects`` in it, then the server, then the operator; all stopped after."""
    try:
        cluster.kube.start()
        await objects(cluster.kube)
        cluster.server.start()
        cluster.operator.start()
        yield cluster
    finally:
        cluster.operator.stop()
        cluster.server.stop()
        await cluster.kube.stop()


@pytest.fixture
async def cluster(tmp_path: Path) -> AsyncIterator[Cluster]:
    kube = FakeKube(tmp_path / "kube", KUBE_TOKEN, page_size=2)
    server = new_server(tmp_path / "server", SERVER_CONFIG, env=SERVER_ENV)
    wrong_token = tmp_path / "wrong-token"
    wrong_token.write_text("not-the-metrics-token-0123456789\n")
    operator = OperatorProcess(
        tmp_path / "operator",
        operator_config(server, wrong_token),
        kube,
        env={"OPERATOR_METRICS_TOKEN": METRICS_TOKEN, "OPERATOR_CLIENT_TOKEN": CLIENT_TOKEN},
    )
    async with running(Cluster(kube, server, operator), populate) as started:
        yield started


async def test_replicas_follow_desired_capacity(cluster: Cluster) -> None:
    # Nothing queued: 0 desired slots, so the Deployment goes from 5 down to minReplicas 1 ...
    await cluster.replicas_become("team-a", "jobs-workers", 1)
    jobs = await cluster.status_where("team-a", "jobs", reason="Scaled", desiredSlots=0, replicas=1)
    assert jobs["message"] == "0 desired slots / 3 per replica = 0 replicas, raised to minReplicas 1"
    assert jobs["observedGeneration"] == 1 and jobs["lastScaleTime"]
    assert jobs["conditions"][0]["type"] == "Ready" and jobs["conditions"][0]["status"] == "True"
    # ... and the one already at 0 (the scale omits replicas then) is not written to at all.
    await cluster.status_where("team-a", "capped", reason="Scaled", desiredSlots=0, replicas=0)
    reads = await cluster.scale_reads("capped-workers")
    await until(lambda: cluster.scale_reads("capped-workers"), lambda n: n >= reads + 2, "two more rounds")
    assert await cluster.scale_writes("capped-workers") == 0
    assert await cluster.scale_writes("jobs-workers") == 1

    # Queue pressure: desired climbs to the pool's max of 8 slots -> ceil(8 / 3) = 3 replicas, and the
    # scaler allowing at most 2 stops there.
    async with Client(cluster.server.target, token=CLIENT_TOKEN) as client:
        await client.submit_batch([task(str(i), pool="jobs") for i in range(20)])
    jobs = await cluster.status_where("team-a", "jobs", desiredSlots=8, replicas=3)
    assert await cluster.kube.replicas("team-a", "jobs-workers") == 3
    assert jobs["message"] == "8 desired slots / 3 per replica = 3 replicas"
    capped = await cluster.status_where("team-a", "capped", desiredSlots=8, replicas=2)
    assert capped["message"] == "8 desired slots / 1 per replica = 8 replicas, capped at maxReplicas 2"
    assert await cluster.kube.replicas("team-a", "capped-workers") == 2

    # The server stops: nothing is scaled, and the status says why.
    await asyncio.to_thread(cluster.server.stop)
    jobs = await cluster.status_where("team-a", "jobs", reason="ServerUnavailable")
    assert jobs["message"].startswith("server 'main' did not answer")
    assert jobs["message"].endswith("deployment 'jobs-workers' left at 3 replicas")
    assert "desiredSlots" not in jobs and jobs["replicas"] == 3
    assert jobs["conditions"][0]["status"] == "False"
    assert await cluster.kube.replicas("team-a", "jobs-workers") == 3

    # Back with an empty queue (memory store): down to minReplicas again.
    await asyncio.to_thread(cluster.server.start)
    await cluster.replicas_become("team-a", "jobs-workers", 1)
    await cluster.replicas_become("team-a", "capped-workers", 0)
    await cluster.status_where("team-a", "jobs", reason="Scaled", desiredSlots=0, replicas=1)

    assert cluster.operator.terminate() == 0
    logs = cluster.operator.logs()
    assert "deployment_scaled" in logs and "operator_stopped" in logs
    for secret in (METRICS_TOKEN, CLIENT_TOKEN, KUBE_TOKEN, "not-the-metrics-token"):
        assert secret not in logs


async def test_scalers_it_cannot_act_on_are_left_alone_and_say_why(cluster: Cluster) -> None:
    cases = {
        "ghost": ("PoolNotReported", "server 'main' does not report pool 'no-such-pool'"),
        "elsewhere": (
            "UnknownServer",
            "spec.server: no server named 'nowhere' in the operator's configuration",
        ),
        "wrong-token": ("Unauthenticated", "server 'badtoken' refused the operator's token"),
        "client-token": (
            "PermissionDenied",
            "server 'clientrole' does not let the operator's token read snapshots",
        ),
        "invalid": ("InvalidSpec", "spec.minReplicas (3) must not exceed spec.maxReplicas (2)"),
        "no-deployment": ("DeploymentNotFound", "no deployment 'missing-workers' in namespace 'team-b'"),
    }
    for name, (reason, message) in cases.items():
        status = await cluster.status_where("team-b", name, reason=reason)
        assert status["message"].startswith(message), status
        assert status["conditions"][0]["status"] == "False"
        assert status["observedGeneration"] == 1
    for deployment in (
        "ghost-workers",
        "elsewhere-workers",
        "wrong-token-workers",
        "client-token-workers",
        "invalid-workers",
    ):
        assert await cluster.kube.replicas("team-b", deployment) == 2
        assert await cluster.scale_writes(deployment) == 0
    assert (await cluster.status("team-b", "ghost"))["replicas"] == 2  # read, not changed

    # Fixing the spec is picked up (a new generation) and the Deployment then follows the pool.
    await cluster.kube.patch_scaler("team-b", "invalid", {"spec": {"minReplicas": 1}})
    fixed = await cluster.status_where("team-b", "invalid", reason="Scaled", observedGeneration=2)
    assert fixed["replicas"] == 1 and await cluster.kube.replicas("team-b", "invalid-workers") == 1

    # What the operator asked the API for is what its ClusterRole grants, and nothing more.
    allowed = {
        ("GET", r"/apis/cronoq\.io/v1alpha1/cronoqworkerscalers"),  # list and watch
        ("GET", r"/apis/coordination\.k8s\.io/v1/namespaces/cronoq/leases/cronoq-operator"),
        ("POST", r"/apis/coordination\.k8s\.io/v1/namespaces/cronoq/leases"),
        ("PUT", r"/apis/coordination\.k8s\.io/v1/namespaces/cronoq/leases/cronoq-operator"),
        ("POST", r"/api/v1/namespaces/[^/]+/events"),
        ("PATCH", r"/apis/cronoq\.io/v1alpha1/namespaces/[^/]+/cronoqworkerscalers/[^/]+/status"),
        ("GET", r"/apis/apps/v1/namespaces/[^/]+/deployments/[^/]+/scale"),
        ("PATCH", r"/apis/apps/v1/namespaces/[^/]+/deployments/[^/]+/scale"),
    }
    requested = set(await cluster.kube.operator_requests())
    assert requested
    for method, path in requested:
        assert any(method == verb and re.fullmatch(pattern, path) for verb, pattern in allowed), (
            method,
            path,
        )


@dataclass(frozen=True)
class Certificates:
    ca: Path
    cert: Path  # for 127.0.0.1: the server's listeners and the fake API's
    key: Path
    operator: tuple[Path, Path]  # the operator's client certificate (and key): DNS:cronoq-operator.cronoq.svc
    stranger: tuple[Path, Path]  # a client certificate of the same CA no [[auth.certs]] entry names


@pytest.fixture(scope="module")
def certificates(tmp_path_factory: pytest.TempPathFactory) -> Certificates:
    directory = tmp_path_factory.mktemp("operator-pki")
    ca, ca_key = new_ca(directory / "ca.pem", directory / "ca.key", "operator test CA")
    cert, key = issue(directory, "local", "/CN=127.0.0.1", "IP:127.0.0.1,DNS:localhost", ca, ca_key)
    operator = issue(directory, "operator", "/CN=cronoq-operator", f"DNS:{OPERATOR_DNS_NAME}", ca, ca_key)
    stranger = issue(directory, "stranger", "/CN=stranger", "DNS:stranger.cronoq.svc", ca, ca_key)
    return Certificates(ca, cert, key, operator, stranger)


async def test_over_tls_to_the_server_and_to_the_kubernetes_api(
    tmp_path: Path, certificates: Certificates
) -> None:
    """An https:// server read with ca_file, and the API server over https trusted with --kube-ca; the
    same server without its CA is not trusted, so that scaler is left alone."""
    tls = f'\n[server.tls]\ncert_path = "{certificates.cert}"\nkey_path = "{certificates.key}"\n'
    trusted = ssl.create_default_context(cafile=str(certificates.ca))
    server = new_server(tmp_path / "server", SERVER_CONFIG + tls, env=SERVER_ENV, ssl_context=trusted)
    kube = FakeKube(
        tmp_path / "kube", KUBE_TOKEN, cert=(certificates.cert, certificates.key), ca=certificates.ca
    )
    url = f"https://{server.target}"
    config = f"""
interval_s = 1

[[servers]]
name = "main"
url = "{url}"
token_env = "OPERATOR_METRICS_TOKEN"
ca_file = "{certificates.ca}"

[[servers]]
name = "untrusted"
url = "{url}"
token_env = "OPERATOR_METRICS_TOKEN"
"""
    operator = OperatorProcess(
        tmp_path / "operator", config, kube, env={"OPERATOR_METRICS_TOKEN": METRICS_TOKEN}
    )

    async def objects(kube: FakeKube) -> None:
        for name, server_name in (("secure", "main"), ("untrusted", "untrusted")):
            await kube.create_deployment("team-a", f"{name}-workers", 4)
            await kube.create_scaler("team-a", name, scaler(server_name, "jobs", f"{name}-workers", 2, 1, 5))

    async with running(Cluster(kube, server, operator), objects) as cluster:
        await cluster.replicas_become("team-a", "secure-workers", 1)
        await cluster.status_where("team-a", "secure", reason="Scaled", desiredSlots=0, replicas=1)
        untrusted = await cluster.status_where("team-a", "untrusted", reason="ServerUnavailable")
        assert untrusted["replicas"] == 4 and await cluster.kube.replicas("team-a", "untrusted-workers") == 4


async def test_with_a_client_certificate_to_a_server_that_requires_one(
    tmp_path: Path, certificates: Certificates
) -> None:
    """A server requiring client certificates (``client_ca_path``) whose ``[[auth.certs]]`` gives the
    operator's certificate the metrics role: read with that certificate and no token, the Deployment
    follows the pool down and up. The same server named without a certificate (a token does not get
    past the handshake) is unavailable, and with a certificate the server does not map, refused; those
    Deployments are left alone."""
    mtls = (
        f'\n[server.tls]\ncert_path = "{certificates.cert}"\nkey_path = "{certificates.key}"\n'
        f'client_ca_path = "{certificates.ca}"\n'
        f'\n[[auth.certs]]\ndns_name = "{OPERATOR_DNS_NAME}"\nrole = "metrics"\n'
    )
    trusted = ssl.create_default_context(cafile=str(certificates.ca))  # probes need no certificate
    server = new_server(tmp_path / "server", SERVER_CONFIG + mtls, env=SERVER_ENV, ssl_context=trusted)
    kube = FakeKube(tmp_path / "kube", KUBE_TOKEN)
    url = f"https://{server.target}"
    (operator_cert, operator_key), (stranger_cert, stranger_key) = (
        certificates.operator,
        certificates.stranger,
    )
    config = f"""
interval_s = 1

[[servers]]
name = "mtls"
url = "{url}"
ca_file = "{certificates.ca}"
cert_file = "{operator_cert}"
key_file = "{operator_key}"

[[servers]]
name = "tokenonly"
url = "{url}"
ca_file = "{certificates.ca}"
token_env = "OPERATOR_METRICS_TOKEN"

[[servers]]
name = "stranger"
url = "{url}"
ca_file = "{certificates.ca}"
cert_file = "{stranger_cert}"
key_file = "{stranger_key}"
"""
    operator = OperatorProcess(
        tmp_path / "operator", config, kube, env={"OPERATOR_METRICS_TOKEN": METRICS_TOKEN}
    )

    async def objects(kube: FakeKube) -> None:
        for name in ("mtls", "tokenonly", "stranger"):
            await kube.create_deployment("team-a", f"{name}-workers", 4)
            await kube.create_scaler("team-a", name, scaler(name, "jobs", f"{name}-workers", 3, 1, 5))

    async with running(Cluster(kube, server, operator), objects) as cluster:
        await cluster.replicas_become("team-a", "mtls-workers", 1)
        await cluster.status_where("team-a", "mtls", reason="Scaled", desiredSlots=0, replicas=1)
        unavailable = await cluster.status_where("team-a", "tokenonly", reason="ServerUnavailable")
        assert unavailable["message"].startswith("server 'tokenonly' did not answer")
        refused = await cluster.status_where("team-a", "stranger", reason="Unauthenticated")
        assert refused["message"].startswith("server 'stranger' refused the operator's client certificate")

        # Queue pressure (submitted with the client token, over a connection the certificate opens):
        # 8 desired slots / 3 per replica = 3 replicas.
        submit = grpc.ssl_channel_credentials(
            certificates.ca.read_bytes(), operator_key.read_bytes(), operator_cert.read_bytes()
        )
        async with Client(url, token=CLIENT_TOKEN, credentials=submit) as client:
            await client.submit_batch([task(str(i), pool="jobs") for i in range(20)])
        await cluster.status_where("team-a", "mtls", reason="Scaled", desiredSlots=8, replicas=3)
        assert await cluster.kube.replicas("team-a", "mtls-workers") == 3

        for name in ("tokenonly", "stranger"):
            assert await cluster.kube.replicas("team-a", f"{name}-workers") == 4
            assert await cluster.scale_writes(f"{name}-workers") == 0
        assert "PRIVATE KEY" not in cluster.operator.logs()


async def scrape(operator: OperatorProcess, path: str = "/metrics") -> tuple[int, str]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(operator.http_url + path, timeout=aiohttp.ClientTimeout(total=5)) as response,
    ):
        return response.status, await response.text()


def sample(page: str, name: str) -> float:
    """The value of the sample ``name`` (with its labels, if any) on a metrics page; 0 when absent."""
    for line in page.splitlines():
        if line.startswith(name + " "):
            return float(line.split()[-1])
    return 0.0


async def test_two_replicas_one_leader_and_a_takeover(tmp_path: Path) -> None:
    """Two operators on one fake API: one leads and scales, the other stands by (ready, but acting on
    nothing); killed without a chance to release its Lease, the leader is replaced within
    lease_duration_s and a bit (the bound docs/operator.md gives) and the standby scales what changed."""
    server = new_server(tmp_path / "server", SERVER_CONFIG, env=SERVER_ENV)
    kube = FakeKube(tmp_path / "kube", KUBE_TOKEN)
    config = f'interval_s = 1\n\n[[servers]]\nname = "main"\nurl = "http://{server.target}"\n'
    config += 'token_env = "OPERATOR_METRICS_TOKEN"\n'
    env = {"OPERATOR_METRICS_TOKEN": METRICS_TOKEN}
    one, two = (OperatorProcess(tmp_path / name, config, kube, env=env) for name in ("one", "two"))

    async def objects(kube: FakeKube) -> None:
        await kube.create_deployment("team-a", "jobs-workers", 5)
        await kube.create_scaler("team-a", "jobs", scaler("main", "jobs", "jobs-workers", 3, 1, 10))

    async with running(Cluster(kube, server, one), objects) as cluster:
        two.start()
        try:
            await cluster.replicas_become("team-a", "jobs-workers", 1)
            pages = await until(
                lambda: asyncio.gather(scrape(one), scrape(two)),
                lambda got: sorted(sample(page, "cronoq_operator_leader") for _, page in got) == [0.0, 1.0],
                "one leader",
            )
            leader, standby = (one, two) if sample(pages[0][1], "cronoq_operator_leader") else (two, one)
            _, standby_page = await scrape(standby)
            assert sample(standby_page, "cronoq_operator_replicas_set_total") == 0
            assert 'cronoq_operator_decisions_total{reason="Scaled"}' not in standby_page
            for operator in (leader, standby):
                assert await scrape(operator, "/healthz") == (200, "ok\n")
                assert await scrape(operator, "/readyz") == (200, "ok\n")
            _, leader_page = await scrape(leader)
            assert sample(leader_page, "cronoq_operator_replicas_set_total") == 1
            assert 'cronoq_build_info{engine="' in leader_page and 'store="none"' in leader_page
            assert "process_cpu_seconds_total" in leader_page

            assert leader.proc is not None
            leader.proc.kill()  # no release: the standby must wait for the Lease to expire
            leader.proc.wait(5)
            await cluster.kube.patch_scaler("team-a", "jobs", {"spec": {"minReplicas": 2}})
            bound = leader.lease_duration_s * 1.4 + 1 + 2  # the documented bound, a round, slack
            await until(
                lambda: scrape(standby),
                lambda got: sample(got[1], "cronoq_operator_leader") == 1,
                "a takeover",
                timeout=bound,
            )
            await cluster.replicas_become("team-a", "jobs-workers", 2)
            lease = await cluster.kube.lease("cronoq", "cronoq-operator")
            assert lease["spec"]["leaseTransitions"] == 1
        finally:
            two.stop()


async def test_a_watch_too_old_to_resume_is_listed_again(cluster: Cluster) -> None:
    """The API server forgets the changes the operator's watch would resume from (410 Gone) and ends
    the watch: the operator lists again, counts the restart, and a scaler created after is acted on."""
    await cluster.status_where("team-a", "jobs", reason="Scaled")
    await cluster.kube.call("POST", "/_fake/compact")
    await cluster.kube.call("POST", "/_fake/close-watches")
    await until(
        lambda: scrape(cluster.operator),
        lambda got: sample(got[1], 'cronoq_operator_watch_restarts_total{cause="expired"}') >= 1,
        "a watch restarted after 410",
    )
    await cluster.kube.create_deployment("team-a", "late-workers", 4)
    await cluster.kube.create_scaler("team-a", "late", scaler("main", "jobs", "late-workers", 3, 1, 10))
    await cluster.replicas_become("team-a", "late-workers", 1)
    events = await cluster.kube.events("team-a")
    assert any(e["involvedObject"]["name"] == "late" and e["reason"] == "Scaled" for e in events)
    assert "scalers_watch_restarted" in cluster.operator.logs()
