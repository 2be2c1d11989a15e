"""How the TypeScript SDK connects, against real processes: TLS and mTLS (a throwaway CA made by the
openssl command), refused tokens, and a sharded cluster where a worker pointed at the router, or at the
wrong shard, is redirected to the shard that serves its pool, while a Python worker serves another pool
of the same cluster."""

from __future__ import annotations

import ssl
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from cronoq.client import Client, Lease
from tests.pki import issue, new_ca
from tests.typescript import sdk_dist

from .helpers import token, worker
from .serverproc import running_server
from .shardproc import ShardSpec, routed_cluster
from .test_sdk_typescript_client import echo as client_echo
from .test_sdk_typescript_client import node_tests
from .tsworker import TsWorker, registered

WORKER_TOKEN = "worker-token-0123456789abcdef"
CLIENT_TOKEN = "client-token-0123456789abcdef"
TOKENS = token(WORKER_TOKEN, "worker") + token(CLIENT_TOKEN, "client")
POOLS = '[[pools]]\nname = "default"\nmax = 8\n'


@pytest.fixture(scope="module")
def dist() -> Path:
    return sdk_dist()


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A CA, the server's certificate for 127.0.0.1, and a client certificate, by name."""
    d = tmp_path_factory.mktemp("pki")
    ca, ca_key = new_ca(d / "ca.pem", d / "ca.key", "cronoq test CA")
    server, server_key = issue(d, "server", "/CN=127.0.0.1", "IP:127.0.0.1,DNS:localhost", ca, ca_key)
    client, client_key = issue(d, "client", "/CN=ts-worker", "DNS:ts-worker.internal", ca, ca_key)
    return {"ca": ca, "server": server, "server_key": server_key, "client": client, "client_key": client_key}


def tls_server_config(certs: dict[str, Path], *, mutual: bool) -> str:
    client_ca = f'client_ca_path = "{certs["ca"]}"\n' if mutual else ""
    return f'[server.tls]\ncert_path = "{certs["server"]}"\nkey_path = "{certs["server_key"]}"\n{client_ca}{POOLS}'


async def echo(lease: Lease) -> str:
    return f"{lease.pool}:{lease.text()}"


@pytest.mark.parametrize("mutual", [False, True], ids=["tls", "mtls"])
async def test_a_worker_and_a_client_over_tls(
    dist: Path, tmp_path: Path, certs: dict[str, Path], mutual: bool
) -> None:
    probe = ssl.create_default_context(cafile=str(certs["ca"]))
    identity = {"cert": str(certs["client"]), "key": str(certs["client_key"])} if mutual else {}
    with running_server(tmp_path, tls_server_config(certs, mutual=mutual), ssl_context=probe) as server:
        target = f"https://{server.target}"
        with registered(dist, target=target, pool="default", tls={"ca": str(certs["ca"]), **identity}):
            credentials = grpc.ssl_channel_credentials(
                certs["ca"].read_bytes(), certs["client_key"].read_bytes(), certs["client"].read_bytes()
            )
            async with Client(target, credentials=credentials) as client:
                done = await client.submit(
                    {"do": "complete", "value": "over tls"}, wait=True, wait_timeout=10
                )
            assert done.result is not None and done.result.text() == "over tls"
        env = {"CRONOQ_TARGET": target, "CRONOQ_TLS_CA": str(certs["ca"])}
        if mutual:
            env |= {"CRONOQ_TLS_CERT": str(certs["client"]), "CRONOQ_TLS_KEY": str(certs["client_key"])}
        async with worker(target, client_echo, credentials=credentials):
            await node_tests(dist, "test/integration/client.test.js", env, pattern="submit with wait")


async def test_without_a_client_certificate_mtls_refuses_the_worker(
    dist: Path, tmp_path: Path, certs: dict[str, Path]
) -> None:
    """The handshake fails: unavailable, which the worker retries (the server may be restarting with
    its certificates), so it never registers."""
    probe = ssl.create_default_context(cafile=str(certs["ca"]))
    with (
        running_server(tmp_path, tls_server_config(certs, mutual=True), ssl_context=probe) as server,
        TsWorker(dist, target=f"https://{server.target}", pool="default", tls={"ca": str(certs["ca"])}) as ts,
    ):
        ts.expect("disconnected", code="unavailable")
        assert ts.stop() == 0
        assert not ts.seen("registered")


# ------------------------------------------------------------------------------- tokens and shards

SHARDS = (ShardSpec("a", 1, ("a1",)), ShardSpec("b", 2, ("b1",)))


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[str, dict[str, str]]]:
    """A router in front of shards a (pool a1) and b (pool b1), all requiring tokens: the router's
    target and each shard's."""
    with routed_cluster(tmp_path_factory.mktemp("cluster"), SHARDS, TOKENS) as (router, shards):
        yield router.target, {name: proc.target for name, proc in shards.items()}


@pytest.mark.parametrize(
    ("given", "code"),
    [
        ("not-a-token-0123456789abcdef", "unauthenticated"),
        (CLIENT_TOKEN, "permission_denied"),
        (None, "unauthenticated"),
    ],
    ids=["unknown", "not-a-worker-token", "none"],
)
def test_a_refused_token_rejects_run_worker(
    dist: Path, cluster: tuple[str, dict[str, str]], given: str | None, code: str
) -> None:
    _, shards = cluster
    options = {"token": given} if given else {}
    with TsWorker(dist, target=shards["a"], pool="a1", **options) as ts:
        refused = ts.expect("error")
        assert refused["code"] == code, refused
        assert ts.proc.wait(10) == 1
        assert not ts.seen("registered")


@pytest.mark.parametrize("via", ["router", "wrong-shard"])
async def test_a_worker_is_redirected_to_the_shard_of_its_pool(
    dist: Path, cluster: tuple[str, dict[str, str]], via: str
) -> None:
    """Pointed at the router, or at shard a, a worker of pool b1 ends up registered on shard b, and
    serves b1's tasks; meanwhile a Python worker, also given the router, serves a1 on shard a."""
    router, shards = cluster
    target = router if via == "router" else shards["a"]
    with registered(dist, target=target, pool="b1", token=WORKER_TOKEN) as ts:
        (first,) = ts.seen("registered")
        assert first["endpoint"] == f"http://{shards['b']}" and first["connections"] == 1
        async with (
            worker(router, echo, pool="a1", token=WORKER_TOKEN),
            Client(router, token=CLIENT_TOKEN) as client,
        ):
            on_b = await client.submit(
                {"do": "complete", "value": "from b1"}, pool="b1", wait=True, wait_timeout=10
            )
            on_a = await client.submit(b"x", pool="a1", wait=True, wait_timeout=10)
        assert on_b.result is not None and on_b.result.text() == "from b1"
        assert on_b.id >> 56 == 2  # shard b's ids
        assert on_a.result is not None and on_a.result.text() == "a1:x"
        assert ts.stop() == 0
