"""Start real ``cronoq-server`` processes on free loopback ports for integration tests."""

from __future__ import annotations

import contextlib
import os
import signal
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from tests.ports import free_ports

# Runs a module (argv[3]) with the open-file limit set to (argv[1], argv[2]) first.
LIMITED_LAUNCH = (
    "import resource, runpy, sys; "
    "resource.setrlimit(resource.RLIMIT_NOFILE, (int(sys.argv[1]), int(sys.argv[2]))); "
    "sys.argv = sys.argv[3:]; runpy.run_module(sys.argv[0], run_name='__main__', alter_sys=True)"
)


@dataclass
class ServerProcess:
    """A running server; ``target`` is the gRPC address, ``http`` the HTTP base URL."""

    config_path: Path
    log_path: Path
    env: dict[str, str] = field(default_factory=dict)
    proc: subprocess.Popen[bytes] | None = None
    grpc_port: int = 0
    http_port: int = 0
    ssl_context: ssl.SSLContext | None = None  # set when the server serves HTTPS ([server.tls])
    module: str = "cronoq.shard.main"  # or "cronoq.router.main"
    open_files: tuple[int, int] | None = None  # (soft, hard) RLIMIT_NOFILE to start the process with

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.grpc_port}"

    @property
    def http(self) -> str:
        scheme = "https" if self.ssl_context is not None else "http"
        return f"{scheme}://127.0.0.1:{self.http_port}"

    def start(self, timeout: float = 20.0, *, ready: bool = True) -> None:
        """Start and wait until ``/readyz`` answers 200 (leading), or with ``ready=False`` until
        ``/healthz`` does (up, possibly a standby)."""
        probe = "readyz" if ready else "healthz"
        log = self.log_path.open("ab")
        command = ["-m", self.module, "--config", str(self.config_path)]
        if self.open_files is not None:  # set in the child before it runs (preexec_fn is unsafe with threads)
            command = ["-c", LIMITED_LAUNCH, *map(str, self.open_files), *command[1:]]
        self.proc = subprocess.Popen(
            [sys.executable, *command],
            stdout=log,
            stderr=subprocess.STDOUT,
            env={**os.environ, "CRONOQ_LOG": "info", **self.env},
        )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"cronoq-server exited with {self.proc.returncode}:\n{self.logs()}")
            with (
                contextlib.suppress(OSError, urllib.error.URLError),
                urllib.request.urlopen(f"{self.http}/{probe}", timeout=1, context=self.ssl_context) as r,
            ):
                if r.status == 200:
                    return
            time.sleep(0.05)
        # Nobody will stop a server whose start failed (the caller's cleanup starts after start()): it
        # would outlive the test run.
        self.proc.kill()
        self.proc.wait(10)
        raise TimeoutError(f"cronoq-server not ready after {timeout} s:\n{self.logs()}")

    def probe(self, path: str) -> int:
        """The HTTP status of GET ``path`` (0 when nothing answers)."""
        try:
            with urllib.request.urlopen(f"{self.http}{path}", timeout=2, context=self.ssl_context) as r:
                return int(r.status)
        except urllib.error.HTTPError as err:
            return err.code
        except (OSError, urllib.error.URLError):
            return 0

    def wait_probe(self, path: str, status: int, timeout: float = 20.0) -> None:
        """Poll ``path`` until it answers ``status`` (e.g. a standby's ``/readyz`` turning 200)."""
        deadline = time.monotonic() + timeout
        while (got := self.probe(path)) != status:
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{path} still answers {got}, not {status}, after {timeout} s:\n{self.logs()}"
                )
            time.sleep(0.05)

    def metric(self, name: str) -> float | None:
        """The value of an unlabelled metric from ``/metrics`` (None when absent)."""
        with urllib.request.urlopen(f"{self.http}/metrics", timeout=5, context=self.ssl_context) as r:
            text = r.read().decode()
        for line in text.splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
        return None

    def kill(self) -> None:
        """SIGKILL: no shutdown, nothing flushed, as in a crash."""
        assert self.proc is not None
        self.proc.kill()
        self.proc.wait(10)

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""

    def signal(self, sig: int) -> None:
        assert self.proc is not None
        self.proc.send_signal(sig)

    def wait(self, timeout: float = 30.0) -> int:
        assert self.proc is not None
        return self.proc.wait(timeout)

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(20)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


def write_config(directory: Path, body: str, grpc_port: int, http_port: int) -> Path:
    path = directory / "cronoq.toml"
    server = f'[server]\ngrpc_addr = "127.0.0.1:{grpc_port}"\nhttp_addr = "127.0.0.1:{http_port}"\n'
    body = body.replace("[server]\n", server, 1) if "[server]" in body else server + body
    path.write_text(body)
    return path


def new_server(
    directory: Path,
    body: str = "",
    env: dict[str, str] | None = None,
    ssl_context: ssl.SSLContext | None = None,
) -> ServerProcess:
    """A server process (not started) with its config and log in ``directory`` and free ports."""
    directory.mkdir(parents=True, exist_ok=True)
    grpc_port, http_port = free_ports(2)
    return ServerProcess(
        write_config(directory, body, grpc_port, http_port),
        directory / "server.log",
        env=env or {},
        grpc_port=grpc_port,
        http_port=http_port,
        ssl_context=ssl_context,
    )


@contextlib.contextmanager
def leader_and_standby(
    directory: Path, body: str, env: dict[str, str] | None = None, *, start_standby: bool = True
) -> Iterator[tuple[ServerProcess, ServerProcess]]:
    """Two servers on one durable store: the first started leads, the second stands by. With
    ``start_standby=False`` the caller starts the second (``start(ready=False)``) when it wants."""
    first = new_server(directory / "a", body, env)
    second = new_server(directory / "b", body, env)
    first.start()
    try:
        if start_standby:
            second.start(ready=False)
        yield first, second
    finally:
        first.stop()
        second.stop()


@contextlib.contextmanager
def running_server(
    directory: Path,
    body: str = "",
    env: dict[str, str] | None = None,
    ssl_context: ssl.SSLContext | None = None,
) -> Iterator[ServerProcess]:
    proc = new_server(directory, body, env, ssl_context)
    proc.start()
    try:
        yield proc
    finally:
        proc.stop()


def assert_clean_log(proc: ServerProcess) -> None:
    """Nothing went wrong unnoticed in the process: no traceback, no error-level line (ours, and those
    of the libraries that log through the standard library, asyncio's and grpc's, are all JSON)."""
    logs = proc.logs()
    assert "Traceback" not in logs, logs[-4000:]
    assert '"level": "error"' not in logs, logs[-4000:]
