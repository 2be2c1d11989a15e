"""``[server.peer_tls]``: shards call each other (and the router calls shards) at ``https://`` endpoints,
verifying them with ``ca_path`` and presenting ``cert_path`` to shards that require client certificates
(mTLS). Real processes: two memory-store shards with mTLS on their listeners, and a router; certificates
from a throwaway CA made by the openssl command."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import grpc
import pytest

from cronoq.client import Client
from cronoq.cluster.shards import SHARD_SHIFT
from cronoq.errors import FailedPrecondition, Unavailable
from tests.pki import issue, new_ca
from tests.ports import free_ports

from .helpers import Metrics, token
from .serverproc import ServerProcess, write_config
from .shardproc import ShardSpec, cluster_tables, stopped_after
from .test_tls import Pki, _https, _tls_config

pytestmark = pytest.mark.asyncio

SPECS = [ShardSpec("a", 1, ("a1",)), ShardSpec("b", 2, ("b1",))]
CLIENT_TOKEN = "client-token-0123456789abcdef"
METRICS_TOKEN = "metrics-token-0123456789abcdef"
TOKENS = token(CLIENT_TOKEN, "client") + token(METRICS_TOKEN, "metrics")
CERTS = '[[auth.certs]]\ndns_name = "worker-1.internal"\nrole = "client"\n'  # shards only (mTLS)


@dataclass
class PeerPki:
    """``base``: a CA, the 127.0.0.1 certificate (each shard's listener certificate, and its identity
    towards peers) and worker-1.internal's (a caller known by its certificate); ``other_ca`` signed
    none of them."""

    base: Pki
    other_ca: Path


@pytest.fixture(scope="module")
def peer_pki(tmp_path_factory: pytest.TempPathFactory) -> PeerPki:
    d = tmp_path_factory.mktemp("peer-pki")
    certs: dict[str, Path] = {}
    for name in ("ca", "other-ca"):
        certs[name], certs[f"{name}-key"] = new_ca(d / f"{name}.pem", d / f"{name}.key", f"cronoq {name}")
    ca, ca_key = certs["ca"], certs["ca-key"]
    server_cert, server_key = issue(d, "server", "/CN=127.0.0.1", "IP:127.0.0.1,DNS:localhost", ca, ca_key)
    client_cert, client_key = issue(d, "client", "/CN=worker-1", "DNS:worker-1.internal", ca, ca_key)
    return PeerPki(Pki(ca, server_cert, server_key, client_cert, client_key, ca_key), certs["other-ca"])


def _peer_tls(pki: PeerPki, ca: Path) -> str:
    return (
        f'[server.peer_tls]\nca_path = "{ca}"\n'
        f'cert_path = "{pki.base.server_cert}"\nkey_path = "{pki.base.server_key}"\n'
    )


@contextlib.contextmanager
def tls_cluster(
    directory: Path, pki: PeerPki, peer_ca: Path
) -> Iterator[tuple[dict[str, ServerProcess], ServerProcess]]:
    """Shards a and b (mTLS listeners, https endpoints, peers verified with ``peer_ca``) and a router
    (plain loopback listeners, the same ``[server.peer_tls]``), all started."""
    picked = iter(free_ports(2 * len(SPECS)))
    ports = {spec.name: (next(picked), next(picked)) for spec in SPECS}
    tables = cluster_tables(
        SPECS, {name: f"https://127.0.0.1:{grpc_port}" for name, (grpc_port, _) in ports.items()}
    )
    peer = _peer_tls(pki, peer_ca)
    procs: dict[str, ServerProcess] = {}
    for name, (grpc_port, http_port) in ports.items():
        folder = directory / name
        folder.mkdir()
        body = (
            f'[server]\nshard = "{name}"\n{_tls_config(pki.base, mtls=True)}{peer}{TOKENS}{CERTS}\n{tables}'
        )
        procs[name] = ServerProcess(
            write_config(folder, body, grpc_port, http_port),
            folder / "server.log",
            grpc_port=grpc_port,
            http_port=http_port,
            ssl_context=_https(pki.base, False),
        )
    router_grpc, router_http = free_ports(2)
    (directory / "router").mkdir()
    router_config = directory / "router" / "cronoq.toml"
    router_config.write_text(
        f'[router]\ngrpc_addr = "127.0.0.1:{router_grpc}"\nhttp_addr = "127.0.0.1:{router_http}"\n'
        f"[server]\n{peer}{TOKENS}\n{tables}"
    )
    router = ServerProcess(
        router_config,
        directory / "router" / "router.log",
        grpc_port=router_grpc,
        http_port=router_http,
        module="cronoq.router.main",
    )
    started = [*procs.values(), router]
    with stopped_after(started):
        for proc in started:
            proc.start()
        yield procs, router


def _credentials(pki: PeerPki) -> grpc.ChannelCredentials:
    """A client of the mTLS shards: trusts their CA and presents worker-1.internal's certificate."""
    base = pki.base
    return grpc.ssl_channel_credentials(
        base.ca.read_bytes(), base.client_key.read_bytes(), base.client_cert.read_bytes()
    )


async def test_shards_and_the_router_forward_over_mutual_tls(tmp_path: Path, peer_pki: PeerPki) -> None:
    with tls_cluster(tmp_path, peer_pki, peer_pki.base.ca) as (shards, router):
        a_target = f"https://{shards['a'].target}"
        async with Client(a_target, credentials=_credentials(peer_pki), token=CLIENT_TOKEN) as client:
            # Shard a forwards b's pool to b over TLS, presenting its own certificate (b requires one).
            sub = await client.submit(b"via a", pool="b1", key="over-tls")
            assert sub.id >> SHARD_SHIFT == 2
            assert (await client.get(sub.id)).pool == "b1"  # by id, forwarded again
            assert (await client.get("over-tls")).id == sub.id  # by key: a asks b
        async with Client(a_target, credentials=_credentials(peer_pki)) as by_certificate:
            # The caller's certificate cannot travel: refused with b's endpoint, not forwarded.
            with pytest.raises(FailedPrecondition) as refused:
                await by_certificate.submit(b"x", pool="b1")
            assert "cannot be forwarded" in str(refused.value)
            assert (await by_certificate.submit(b"mine", pool="a1")).id >> SHARD_SHIFT == 1

        async with Client(router.target, token=CLIENT_TOKEN) as client:
            for number, pool in ((1, "a1"), (2, "b1")):
                done = await client.submit(b"via router", pool=pool)
                assert done.id >> SHARD_SHIFT == number
            page = await client.list_tasks()
            assert len(page.tasks) == 4 and not page.unavailable_shards

        # The router's /metrics needs a metrics (or admin) token, like a server's.
        async with aiohttp.ClientSession(base_url=router.http) as http:
            async with http.get("/metrics") as resp:
                assert resp.status == 401
            async with http.get("/metrics", headers={"authorization": f"Bearer {CLIENT_TOKEN}"}) as resp:
                assert resp.status == 403
            async with http.get("/metrics", headers={"authorization": f"Bearer {METRICS_TOKEN}"}) as resp:
                assert resp.status == 200
                metrics = Metrics(await resp.text())
        endpoint = f"https://{shards['b'].target}"
        assert metrics("cronoq_router_shard_leader", shard="b", endpoint=endpoint) == 1
        assert metrics("cronoq_router_forwarded_total", shard="b", method="Submit", outcome="ok") == 1


async def test_forwarding_to_a_shard_whose_certificate_does_not_verify_fails_clearly(
    tmp_path: Path, peer_pki: PeerPki
) -> None:
    with tls_cluster(tmp_path, peer_pki, peer_pki.other_ca) as (shards, router):
        a_target = f"https://{shards['a'].target}"
        async with Client(a_target, credentials=_credentials(peer_pki), token=CLIENT_TOKEN) as client:
            assert (await client.submit(b"local", pool="a1")).id >> SHARD_SHIFT == 1  # a itself works
            with pytest.raises(Unavailable) as failed:
                await client.submit(b"x", pool="b1")
        message = str(failed.value)
        print(message)
        assert "shard 'b'" in message and "server.peer_tls" in message
        async with Client(router.target, token=CLIENT_TOKEN) as client:
            with pytest.raises(Unavailable) as failed:
                await client.submit(b"x", pool="a1")
        assert "shard 'a'" in str(failed.value) and "server.peer_tls" in str(failed.value)


async def test_an_unreadable_or_invalid_peer_file_is_a_startup_error(
    tmp_path: Path, peer_pki: PeerPki
) -> None:
    tables = cluster_tables(SPECS, {"a": "https://127.0.0.1:1", "b": "https://127.0.0.1:2"})
    for name, ca, expected in (
        ("missing", tmp_path / "missing.pem", "server.peer_tls.ca_path: cannot read"),
        ("invalid", peer_pki.base.server_key, "server.peer_tls.ca_path: not a usable CA certificate"),
    ):
        folder = tmp_path / name
        folder.mkdir()
        body = f'[server]\nshard = "a"\n{_peer_tls(peer_pki, ca)}\n{tables}'
        grpc_port, http_port = free_ports(2)
        config = write_config(folder, body, grpc_port, http_port)
        server = ServerProcess(config, folder / "server.log", grpc_port=grpc_port, http_port=http_port)
        with pytest.raises(RuntimeError) as failed:
            server.start()
        assert expected in str(failed.value)
