"""Reading snapshots from the configured servers, against a scripted Admin service on loopback: the
token sent (a rotated token file is read again), the client certificate presented to a server that
requires one (a renewed one is read again), slow servers, unreadable tokens and certificates, one read
per server."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest

from cronoq.client import Snapshot
from cronoq.v1 import cronoq_pb2 as pb
from kube_operator.config import OperatorConfig, ServerEntry
from kube_operator.readings import Unknown
from kube_operator.servers import Servers, ServerSource
from tests.ports import free_port
from tests.unit.client.scripted import ApiServer, Refusal, serve
from tests.unit.operator.operator_pki import OperatorPki

SNAPSHOT = pb.SnapshotResponse(pools=[pb.PoolSnapshot(name="default", desired=7)])


@pytest.fixture
async def api() -> AsyncIterator[ApiServer]:
    servicer = ApiServer(responses={"Snapshot": SNAPSHOT})
    async with serve(servicer):
        yield servicer


def bearer(api: ApiServer) -> list[str]:
    return [call.metadata.get("authorization", "") for call in api.calls if call.method == "Snapshot"]


async def test_a_rotated_token_file_is_used_at_the_next_read(api: ApiServer, tmp_path: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("first-token-0123456789\n")
    source = ServerSource(ServerEntry("main", f"http://{api.target}", token_file=str(token_file)), {}, 5.0)
    try:
        first = await source.read()
        token_file.write_text("second-token-0123456789\n")
        await source.read()
    finally:
        await source.close()
    assert isinstance(first, Snapshot) and first.pools[0].desired == 7
    assert bearer(api) == ["Bearer first-token-0123456789", "Bearer second-token-0123456789"]


async def test_an_unreadable_token_is_said_and_nothing_is_sent(api: ApiServer, tmp_path: Path) -> None:
    source = ServerSource(
        ServerEntry("main", f"http://{api.target}", token_file=str(tmp_path / "gone")), {}, 5.0
    )
    reading = await source.read()
    assert isinstance(reading, Unknown) and reading.reason == "TokenUnreadable"
    assert api.calls == []


async def test_a_slow_server_counts_as_unavailable(api: ApiServer) -> None:
    async def slow(request: object) -> object:
        await asyncio.sleep(5)
        return SNAPSHOT

    api.responses["Snapshot"] = lambda request: slow(request)
    source = ServerSource(ServerEntry("main", f"http://{api.target}", token_env="T"), {"T": "t" * 20}, 0.2)
    try:
        reading = await source.read()
    finally:
        await source.close()
    assert reading == Unknown("ServerUnavailable", "server 'main' did not answer within 0.2 s")


async def test_a_refused_token_is_named(api: ApiServer) -> None:
    api.responses["Snapshot"] = Refusal(grpc.StatusCode.UNAUTHENTICATED, "unknown token")
    source = ServerSource(ServerEntry("main", f"http://{api.target}", token_env="T"), {"T": "t" * 20}, 5.0)
    try:
        reading = await source.read()
    finally:
        await source.close()
    assert reading == Unknown("Unauthenticated", "server 'main' refused the operator's token: unknown token")


async def test_each_named_server_is_read_once_and_unknown_names_not_at_all(api: ApiServer) -> None:
    config = OperatorConfig(servers=(ServerEntry("main", f"http://{api.target}", token_env="T"),))
    servers = Servers(config, {"T": "t" * 20})
    try:
        found = await servers.snapshots(["main", "main", "nowhere"])
    finally:
        await servers.close()
    assert list(found) == ["main"]
    assert len(bearer(api)) == 1


async def test_a_server_that_comes_back_is_read_at_once() -> None:
    """After a failed read the next one opens a fresh channel, instead of waiting out grpc's
    reconnection backoff on the old one."""
    servicer = ApiServer(responses={"Snapshot": SNAPSHOT})
    port = free_port()
    source = ServerSource(
        ServerEntry("main", f"http://127.0.0.1:{port}", token_env="T"), {"T": "t" * 20}, 5.0
    )
    try:
        async with serve(servicer, port=port):
            assert isinstance(await source.read(), Snapshot)
        down = await source.read()
        assert isinstance(down, Unknown) and down.reason == "ServerUnavailable"
        async with serve(servicer, port=port):
            assert isinstance(await source.read(), Snapshot)
    finally:
        await source.close()


@dataclass
class MutualTlsApi(ApiServer):
    """The scripted Admin service, also recording the DNS names of the client certificate each
    Snapshot call came with."""

    client_names: list[list[str]] = field(default_factory=list)

    async def Snapshot(self, request: Any, context: Any) -> Any:
        names = context.auth_context().get("x509_subject_alternative_name", [])
        self.client_names.append([name.decode() for name in names])
        return await self._answer("Snapshot", request, context)


@pytest.fixture
async def mtls_api(pki: OperatorPki) -> AsyncIterator[MutualTlsApi]:
    """Served over TLS, refusing connections without a client certificate of the test CA."""
    cert, key = pki.server
    credentials = grpc.ssl_server_credentials(
        [(key.read_bytes(), cert.read_bytes())],
        root_certificates=pki.ca.read_bytes(),
        require_client_auth=True,
    )
    servicer = MutualTlsApi(responses={"Snapshot": SNAPSHOT})
    async with serve(servicer, credentials=credentials):
        yield servicer


def client_certificate_files(directory: Path, pair: tuple[Path, Path]) -> tuple[Path, Path]:
    """The certificate and key copied to ``directory/tls.crt`` and ``tls.key``, as a Secret mounts them
    (and as cert-manager replaces them when it renews the certificate)."""
    cert, key = directory / "tls.crt", directory / "tls.key"
    cert.write_bytes(pair[0].read_bytes())
    key.write_bytes(pair[1].read_bytes())
    return cert, key


async def test_a_client_certificate_is_presented_and_a_renewed_one_used_at_the_next_read(
    mtls_api: MutualTlsApi, pki: OperatorPki, tmp_path: Path
) -> None:
    cert, key = client_certificate_files(tmp_path, pki.operator)
    entry = ServerEntry(
        "main", f"https://{mtls_api.target}", ca_file=str(pki.ca), cert_file=str(cert), key_file=str(key)
    )
    source = ServerSource(entry, {}, 5.0)
    try:
        first = await source.read()
        client_certificate_files(tmp_path, pki.other)
        second = await source.read()
    finally:
        await source.close()
    assert isinstance(first, Snapshot) and isinstance(second, Snapshot)
    assert mtls_api.client_names == [["cronoq-operator.cronoq.svc"], ["other.cronoq.svc"]]
    assert bearer(mtls_api) == ["", ""]  # no token configured, none sent: the certificate is the identity


async def test_without_a_client_certificate_the_server_is_unavailable(
    mtls_api: MutualTlsApi, pki: OperatorPki
) -> None:
    entry = ServerEntry("main", f"https://{mtls_api.target}", token_env="T", ca_file=str(pki.ca))
    source = ServerSource(entry, {"T": "t" * 20}, 5.0)
    try:
        reading = await source.read()
    finally:
        await source.close()
    assert isinstance(reading, Unknown) and reading.reason == "ServerUnavailable", reading
    assert mtls_api.calls == []  # refused at the handshake, before any call


async def test_an_unreadable_certificate_is_said_and_nothing_is_sent(
    mtls_api: MutualTlsApi, pki: OperatorPki, tmp_path: Path
) -> None:
    cert, key = client_certificate_files(tmp_path, pki.operator)
    key.unlink()
    entry = ServerEntry(
        "main", f"https://{mtls_api.target}", ca_file=str(pki.ca), cert_file=str(cert), key_file=str(key)
    )
    reading = await ServerSource(entry, {}, 5.0).read()
    assert isinstance(reading, Unknown) and reading.reason == "CertificateUnreadable"
    assert (
        reading.message.startswith("server 'main': cannot read the operator's TLS files")
        and str(key) in reading.message
    )
    assert mtls_api.calls == []
