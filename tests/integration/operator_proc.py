"""``cronoq-operator`` as a real process on loopback for the operator's integration tests (the fake
Kubernetes API it talks to is :mod:`tests.kube_fake`), and a poll-until helper."""

from __future__ import annotations

import asyncio
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from tests.kube_fake import FakeKube
from tests.ports import free_port

T = TypeVar("T")


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
class OperatorProcess:
    """A ``cronoq-operator`` process (``python -m cronoq.operator.main``) with its log in ``directory``.
    Its configuration gets ``http_addr`` (a free loopback port), the Lease's namespace (outside a pod
    there is no own namespace) and a short ``lease_duration_s``, before the test's ``config``."""

    directory: Path
    config: str
    kube: FakeKube
    env: dict[str, str] = field(default_factory=dict)
    http_port: int = field(default_factory=free_port)
    lease_duration_s: float = 2
    proc: subprocess.Popen[bytes] | None = None

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def log_path(self) -> Path:
        return self.directory / "operator.log"

    def start(self, timeout: float = 20.0) -> None:
        self.directory.mkdir(parents=True, exist_ok=True)
        config_path = self.directory / "operator.toml"
        config_path.write_text(
            f'http_addr = "127.0.0.1:{self.http_port}"\nlease_namespace = "cronoq"\n'
            f"lease_duration_s = {self.lease_duration_s}\n{self.config}"
        )
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
