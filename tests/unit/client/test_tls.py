"""TLS end to end with a throwaway self-signed certificate: Client and Worker connect over https://,
and a redirect from a TLS server to plain http is refused."""

from __future__ import annotations

import asyncio
import shutil
import subprocess
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest

from cronoq import errors
from cronoq.client import Client, Lease, Worker
from cronoq.v1 import cronoq_pb2 as pb

from .scripted import TIMEOUT, ApiServer, WorkersServer, redirect_to, running, serve

pytestmark = pytest.mark.skipif(shutil.which("openssl") is None, reason="needs the openssl command")


@pytest.fixture(scope="module")
def certificate(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, bytes]:
    """(certificate, key) PEM for 127.0.0.1."""
    directory: Path = tmp_path_factory.mktemp("tls")
    subprocess.run(
        [
            "openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1",
            "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1",
            "-keyout", str(directory / "key.pem"), "-out", str(directory / "cert.pem"),
        ],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return (directory / "cert.pem").read_bytes(), (directory / "key.pem").read_bytes()


@pytest.fixture
async def tls_workers(certificate: tuple[bytes, bytes]) -> AsyncIterator[WorkersServer]:
    cert, key = certificate
    servicer = WorkersServer()
    async with serve(servicer, credentials=grpc.ssl_server_credentials([(key, cert)])):
        yield servicer


async def _never(lease: Lease) -> None:
    await asyncio.Event().wait()


async def test_worker_and_client_connect_over_tls(
    certificate: tuple[bytes, bytes], tls_workers: WorkersServer
) -> None:
    cert, key = certificate
    credentials = grpc.ssl_channel_credentials(root_certificates=cert)
    worker = Worker(f"https://{tls_workers.target}", "p", _never, credentials=credentials)
    async with running(worker):
        await (await tls_workers.accept()).handshake()
        await worker.wait_registered(TIMEOUT)

    api = ApiServer(responses={"Get": pb.TaskInfo(id=3, status=pb.TASK_STATUS_READY)})
    async with (
        serve(api, credentials=grpc.ssl_server_credentials([(key, cert)])),
        Client(api.target, tls=True, credentials=credentials) as client,
    ):
        assert (await client.get(3)).status == "ready"


async def test_a_redirect_from_tls_to_plain_http_is_refused(
    certificate: tuple[bytes, bytes], tls_workers: WorkersServer, workers: WorkersServer
) -> None:
    tls_workers.refusals = [redirect_to(workers.url)]
    credentials = grpc.ssl_channel_credentials(root_certificates=certificate[0])
    worker = Worker(tls_workers.target, "p", _never, tls=True, credentials=credentials)
    with pytest.raises(errors.FailedPrecondition, match="downgrade"):
        await worker.run()
    assert (tls_workers.connects, workers.connects) == (1, 0)
