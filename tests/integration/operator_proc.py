"""Real processes for the operator's integration tests: the fake Kubernetes API (:mod:`.kube_fake`) and
``cronoq-operator`` itself, each on loopback, plus the calls a test makes to the fake (as kubectl would)
and a poll-until helper."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import aiohttp

from .serverproc import free_port

T = TypeVar("T")

SCALERS = "/apis/cronoq.io/v1alpha1"
APPS = "/apis/apps/v1"


async def until(
    probe: Callable[[], Awaitable[T]], check: Callable[[T], bool], what: str, timeout: float = 20.0
) -> T:
    """Poll ``probe`` until ``check`` holds for its value; fail naming ``what`` and the last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = await probe()
        if check(value):
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"after {timeout} s, still not {what}: {value!r}")
        await asyncio.sleep(0.05)


@dataclass
class FakeKube:
    """The fake API server process; :meth:`start` runs it, the other methods talk to it."""

    directory: Path
    token: str
    page_size: int = 0
    cert: tuple[Path, Path] | None = None  # (certificate, key): serve https
    ca: Path | None = None  # trusted by the test's own calls over https
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    _session: aiohttp.ClientSession | None = None

    @property
    def url(self) -> str:
        return f"{'https' if self.cert else 'http'}://127.0.0.1:{self.port}"

    @property
    def token_file(self) -> Path:
        return self.directory / "kube-token"

    def start(self, timeout: float = 10.0) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        self.token_file.write_text(self.token + "\n")
        command = [sys.executable, "-m", "tests.integration.kube_fake", "--port", str(self.port)]
        command += ["--page-size", str(self.page_size)]
        if self.cert is not None:
            command += ["--cert", str(self.cert[0]), "--key", str(self.cert[1])]
        log = (self.directory / "kube.log").open("ab")
        self.proc = subprocess.Popen(
            command, stdout=log, stderr=subprocess.STDOUT, env={**os.environ, "KUBE_FAKE_TOKEN": self.token}
        )
        context = ssl.create_default_context(cafile=str(self.ca)) if self.ca else None
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the fake Kubernetes API exited with {self.proc.returncode}")
            with (
                contextlib.suppress(OSError, urllib.error.URLError),
                urllib.request.urlopen(f"{self.url}/_fake/ready", timeout=1, context=context) as r,
            ):
                if r.status == 200:
                    return
            time.sleep(0.05)
        self.proc.kill()  # a failed start has no cleanup to stop it
        self.proc.wait(10)
        raise TimeoutError(f"the fake Kubernetes API did not start within {timeout} s")

    async def stop(self) -> None:
        if self._session is not None:
            await self._session.close()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)

    async def call(self, method: str, path: str, body: object = None, *, patch: bool = False) -> Any:
        if self._session is None:
            ssl_option: ssl.SSLContext | bool = (
                ssl.create_default_context(cafile=str(self.ca)) if self.ca else True
            )
            self._session = aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=ssl_option))
        headers = {"Authorization": f"Bearer {self.token}"}
        if patch:
            headers["Content-Type"] = "application/merge-patch+json"
        async with self._session.request(
            method, self.url + path, json=body, headers=headers, timeout=aiohttp.ClientTimeout(total=5)
        ) as response:
            answer = await response.json()
            assert response.status < 400, (method, path, response.status, answer)
            return answer

    async def create_deployment(self, namespace: str, name: str, replicas: int) -> None:
        body = {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": name},
            "spec": {"replicas": replicas},
        }
        await self.call("POST", f"{APPS}/namespaces/{namespace}/deployments", body)

    async def create_scaler(self, namespace: str, name: str, spec: dict[str, Any]) -> None:
        body = {
            "apiVersion": "cronoq.io/v1alpha1",
            "kind": "CronoqWorkerScaler",
            "metadata": {"name": name},
            "spec": spec,
        }
        await self.call("POST", f"{SCALERS}/namespaces/{namespace}/cronoqworkerscalers", body)

    async def patch_scaler(self, namespace: str, name: str, patch: dict[str, Any]) -> None:
        await self.call(
            "PATCH", f"{SCALERS}/namespaces/{namespace}/cronoqworkerscalers/{name}", patch, patch=True
        )

    async def scaler_status(self, namespace: str, name: str) -> dict[str, Any]:
        obj = await self.call("GET", f"{SCALERS}/namespaces/{namespace}/cronoqworkerscalers/{name}")
        return dict(obj.get("status", {}))

    async def replicas(self, namespace: str, deployment: str) -> int:
        obj = await self.call("GET", f"{APPS}/namespaces/{namespace}/deployments/{deployment}")
        return int(obj["spec"]["replicas"])

    async def operator_requests(self) -> list[tuple[str, str]]:
        """Every request the operator made so far (told from the test's own by its user agent), in order."""
        return [
            (entry["method"], entry["path"])
            for entry in await self.call("GET", "/_fake/requests")
            if entry["agent"].startswith("cronoq-operator/")
        ]


@dataclass
class OperatorProcess:
    """A ``cronoq-operator`` process (``python -m cronoq.operator.main``) with its log in ``directory``."""

    directory: Path
    config: str
    kube: FakeKube
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return self.directory / "operator.log"

    def start(self, timeout: float = 20.0) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        config_path = self.directory / "operator.toml"
        config_path.write_text(self.config)
        command = [sys.executable, "-m", "cronoq.operator.main", "--config", str(config_path)]
        command += ["--kube-api", self.kube.url, "--kube-token-file", str(self.kube.token_file)]
        if self.kube.ca is not None:
            command += ["--kube-ca", str(self.kube.ca)]
        self.proc = subprocess.Popen(
            command,
            stdout=self.log_path.open("ab"),
            stderr=subprocess.STDOUT,
            env={**os.environ, "CRONOQ_LOG": "info", **self.env},
        )
        deadline = time.monotonic() + timeout
        while "operator_started" not in self.logs():
            if self.proc.poll() is not None:
                raise RuntimeError(f"cronoq-operator exited with {self.proc.returncode}:\n{self.logs()}")
            if time.monotonic() > deadline:
                self.proc.kill()  # a failed start has no cleanup to stop it
                self.proc.wait(10)
                raise TimeoutError(f"cronoq-operator did not start within {timeout} s:\n{self.logs()}")
            time.sleep(0.05)

    def terminate(self, timeout: float = 15.0) -> int:
        """SIGTERM, then the exit status."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(5)

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""
