"""TLS and mTLS on a real server's listeners, with a throwaway CA made by the openssl command."""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import grpc
import pytest

from cronoq.client import Client, ClientError
from cronoq.errors import PermissionDenied, Unauthenticated
from tests.pki import issue, new_ca
from tests.ports import free_ports

from .helpers import token
from .serverproc import ServerProcess, running_server, write_config

pytestmark = pytest.mark.asyncio


@dataclass
class Pki:
    ca: Path
    server_cert: Path
    server_key: Path
    client_cert: Path
    client_key: Path
    ca_key: Path  # to issue a certificate a test needs of its own


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    d = tmp_path_factory.mktemp("pki")
    ca, ca_key = new_ca(d / "ca.pem", d / "ca.key", "cronoq test CA")
    server_cert, server_key = issue(d, "server", "/CN=127.0.0.1", "IP:127.0.0.1,DNS:localhost", ca, ca_key)
    client_cert, client_key = issue(d, "client", "/CN=worker-1", "DNS:worker-1.internal", ca, ca_key)
    return Pki(ca, server_cert, server_key, client_cert, client_key, ca_key)


def _tls_config(pki: Pki, mtls: bool) -> str:
    ca_line = f'client_ca_path = "{pki.ca}"\n' if mtls else ""
    return f'[server.tls]\ncert_path = "{pki.server_cert}"\nkey_path = "{pki.server_key}"\n{ca_line}'


def _https(pki: Pki, with_client_cert: bool) -> ssl.SSLContext:
    context = ssl.create_default_context(cafile=str(pki.ca))
    if with_client_cert:
        context.load_cert_chain(str(pki.client_cert), str(pki.client_key))
    return context


def _status(url: str, context: ssl.SSLContext | None) -> int:
    try:
        with urllib.request.urlopen(url, timeout=5, context=context) as r:
            return int(r.status)
    except urllib.error.HTTPError as err:
        return err.code


def _refused(url: str) -> bool:
    try:
        urllib.request.urlopen(url, timeout=5)
    except OSError:  # URLError, or the connection dropped mid-handshake
        return True
    return False


async def test_tls_on_grpc_and_http(tmp_path: Path, pki: Pki) -> None:
    with running_server(tmp_path, _tls_config(pki, mtls=False), ssl_context=_https(pki, False)) as server:
        trusted = grpc.ssl_channel_credentials(root_certificates=pki.ca.read_bytes())
        async with Client(f"https://{server.target}", credentials=trusted) as client:
            sub = await client.submit(b"over tls")
            assert (await client.get(sub.id)).status == "ready"
        async with Client(server.target) as plaintext:
            with pytest.raises(ClientError) as err:
                await plaintext.get(sub.id)
            assert err.value.code == "unavailable"
        assert _status(f"{server.http}/v1/tasks/{sub.id}", _https(pki, False)) == 200
        assert _refused(f"http://127.0.0.1:{server.http_port}/healthz")  # plain http to the TLS port


async def test_mtls_requires_a_client_certificate(tmp_path: Path, pki: Pki) -> None:
    with running_server(tmp_path, _tls_config(pki, mtls=True), ssl_context=_https(pki, False)) as server:
        ca = pki.ca.read_bytes()
        with_cert = grpc.ssl_channel_credentials(
            ca, pki.client_key.read_bytes(), pki.client_cert.read_bytes()
        )
        async with Client(f"https://{server.target}", credentials=with_cert) as client:
            sub = await client.submit(b"mutual")
        without = grpc.ssl_channel_credentials(root_certificates=ca)
        async with Client(f"https://{server.target}", credentials=without) as anonymous:
            with pytest.raises(ClientError) as err:
                await anonymous.get(sub.id)
            assert err.value.code == "unavailable"  # the handshake itself is refused
        # HTTP: probes answer without a certificate (kubelets have none); everything else needs one.
        assert _status(f"{server.http}/healthz", _https(pki, False)) == 200
        assert _status(f"{server.http}/v1/tasks/{sub.id}", _https(pki, False)) == 401
        assert _status(f"{server.http}/v1/tasks/{sub.id}", _https(pki, True)) == 200


ADMIN_TOKEN = "admin-token-0123456789abcdef"


async def test_a_client_certificate_is_an_identity_from_auth_certs(tmp_path: Path, pki: Pki) -> None:
    """With mTLS, a verified certificate whose DNS SAN is an ``[[auth.certs]]`` entry is that identity
    (role and pools); a bearer token, when sent, decides instead."""
    body = _tls_config(pki, mtls=True) + (
        '[[auth.certs]]\ndns_name = "worker-1.internal"\nrole = "client"\npools = ["default"]\n'
        + token(ADMIN_TOKEN, "admin")
        + '[[pools]]\nname = "default"\n[[pools]]\nname = "other"\n'
    )
    with running_server(tmp_path, body, ssl_context=_https(pki, True)) as server:
        target = f"https://{server.target}"
        with_cert = grpc.ssl_channel_credentials(
            pki.ca.read_bytes(), pki.client_key.read_bytes(), pki.client_cert.read_bytes()
        )
        async with Client(target, credentials=with_cert) as client:
            sub = await client.submit(b"by certificate")  # no token: the certificate is the identity
            with pytest.raises(PermissionDenied):
                await client.submit(b"x", pool="other")  # its pools
            with pytest.raises(PermissionDenied):
                await client.snapshot()  # its role: client, not metrics
        async with Client(target, credentials=with_cert, token=ADMIN_TOKEN) as admin:
            assert (await admin.snapshot()).totals.submitted == 1  # the token decides
        assert _status(f"{server.http}/v1/tasks/{sub.id}", _https(pki, True)) == 200
        assert _status(f"{server.http}/v1/snapshot", _https(pki, True)) == 403
        # The configured name as a URI (and email) SAN, not a DNS one: it must not pass for the dns_name.
        uri_cert, uri_key = issue(
            tmp_path, "uri", "/CN=worker-1.internal", "URI:worker-1.internal,email:worker-1.internal",
            pki.ca, pki.ca_key,
        )  # fmt: skip
        uri_only = grpc.ssl_channel_credentials(
            pki.ca.read_bytes(), uri_key.read_bytes(), uri_cert.read_bytes()
        )
        async with Client(target, credentials=uri_only) as stranger:
            with pytest.raises(Unauthenticated):  # verified, but names worker-1.internal as no DNS SAN
                await stranger.submit(b"by a URI SAN")
        uri_https = ssl.create_default_context(cafile=str(pki.ca))
        uri_https.load_cert_chain(str(uri_cert), str(uri_key))
        assert _status(f"{server.http}/v1/tasks/{sub.id}", uri_https) == 401


async def test_unreadable_certificate_is_a_startup_error(tmp_path: Path, pki: Pki) -> None:
    body = f'[server.tls]\ncert_path = "{tmp_path / "missing.pem"}"\nkey_path = "{pki.server_key}"\n'
    with pytest.raises(RuntimeError) as err, running_server(tmp_path, body):
        pass
    assert "server.tls.cert_path: cannot read" in str(err.value)


async def test_the_router_serves_tls_from_server_tls(tmp_path: Path, pki: Pki) -> None:
    """The router reads ``[server.tls]`` like a server: TLS on its gRPC and HTTP listeners, plaintext
    refused; here its one shard is a plain loopback server."""
    shard_grpc, shard_http, router_grpc, router_http = free_ports(4)
    cluster = (
        '[[pools]]\nname = "default"\n'
        f'[[shards]]\nname = "a"\nnumber = 1\nendpoint = "http://127.0.0.1:{shard_grpc}"\npools = ["default"]\n'
        f'[router]\ngrpc_addr = "127.0.0.1:{router_grpc}"\nhttp_addr = "127.0.0.1:{router_http}"\n'
    )
    shard = ServerProcess(
        write_config(tmp_path, f'[server]\nshard = "a"\n{cluster}', shard_grpc, shard_http),
        tmp_path / "shard.log",
        grpc_port=shard_grpc,
        http_port=shard_http,
    )
    router_config = tmp_path / "router.toml"
    router_config.write_text(_tls_config(pki, mtls=False) + cluster)
    router = ServerProcess(
        router_config,
        tmp_path / "router.log",
        grpc_port=router_grpc,
        http_port=router_http,
        ssl_context=_https(pki, False),
        module="cronoq.router.main",
    )
    shard.start()
    try:
        router.start()
        trusted = grpc.ssl_channel_credentials(root_certificates=pki.ca.read_bytes())
        async with Client(f"https://{router.target}", credentials=trusted) as client:
            sub = await client.submit(b"through a TLS router")
            assert sub.id >> 56 == 1 and (await client.get(sub.id)).status == "ready"
        async with Client(router.target) as plaintext:
            with pytest.raises(ClientError) as err:
                await plaintext.get(sub.id)
            assert err.value.code == "unavailable"
        assert _status(f"{router.http}/v1/tasks/{sub.id}", _https(pki, False)) == 200
        assert _refused(f"http://127.0.0.1:{router_http}/healthz")
    finally:
        router.stop()
        shard.stop()
