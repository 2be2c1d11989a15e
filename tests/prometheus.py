"""Prometheus for the tests of the alerts and dashboards: ``promtool`` and a real ``prometheus`` server.

Both come from Debian's ``prometheus`` package, which ``make test`` installs where they are missing and
``apt-get`` runs as root. Elsewhere the fixtures skip the tests that need them, saying why (``pytest
-rs``, as ``make test`` runs it, prints the reason in the summary).

:func:`running_prometheus` starts a server of the test's own, whatever the package may have started as
a service: its own configuration, a temporary storage directory, a free loopback port; it is stopped
at the end of the block.
"""

from __future__ import annotations

import contextlib
import json
import shutil
import subprocess
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tests.ports import free_port

START_TIMEOUT = 30.0
MISSING = (
    "{name} is not installed: it comes with Debian's prometheus package, which `make test` installs "
    "where apt-get runs as root"
)


def _binary(name: str) -> Path:
    found = shutil.which(name)
    if found is None:
        pytest.skip(MISSING.format(name=name))
    return Path(found)


@pytest.fixture(scope="session")
def promtool() -> Path:
    return _binary("promtool")


@pytest.fixture(scope="session")
def prometheus_binary() -> Path:
    return _binary("prometheus")


@dataclass
class PrometheusServer:
    """A running Prometheus; ``url`` is its HTTP API's base."""

    url: str
    process: subprocess.Popen[bytes]
    log_path: Path

    def api(self, path: str, **params: str) -> Any:
        """The ``data`` of a successful answer of the HTTP API at ``/api/v1/<path>``."""
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=10) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The series an instant query of ``expr`` returns now (an error, e.g. bad PromQL, raises)."""
        try:
            data = self.api("query", query=expr)
        except urllib.error.HTTPError as err:
            raise AssertionError(f"{expr}: {err.read().decode(errors='replace')}") from None
        assert data["resultType"] == "vector", (expr, data)
        result: list[dict[str, Any]] = data["result"]
        return result

    def label_values(self, label: str, match: str) -> list[str]:
        values: list[str] = self.api(f"label/{label}/values", **{"match[]": match})
        return values

    def logs(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path.exists() else ""


@contextlib.contextmanager
def running_prometheus(binary: Path, directory: Path, config: str) -> Iterator[PrometheusServer]:
    """``binary`` serving ``config`` (the text of a prometheus.yml; relative paths in it, such as
    ``rule_files``, are read from ``directory``) on a free loopback port, until the block ends. Ready
    (``/-/ready``) when it is yielded; its log is printed on a failure inside the block."""
    directory.mkdir(parents=True, exist_ok=True)
    config_path = directory / "prometheus.yml"
    config_path.write_text(config)
    log_path = directory / "prometheus.log"
    url = f"http://127.0.0.1:{free_port()}"
    with log_path.open("ab") as log:
        process = subprocess.Popen(
            [
                str(binary),
                f"--config.file={config_path}",
                f"--storage.tsdb.path={directory / 'data'}",
                f"--web.listen-address={url.removeprefix('http://')}",
            ],
            stdout=log,
            stderr=subprocess.STDOUT,
            cwd=directory,
        )
    server = PrometheusServer(url, process, log_path)
    try:
        _wait_ready(server)
        yield server
    except BaseException:
        print(f"----- log of prometheus ({url}) -----\n{server.logs()[-8000:]}")
        raise
    finally:
        process.terminate()
        try:
            process.wait(10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(5)


def _wait_ready(server: PrometheusServer) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            raise RuntimeError(f"prometheus exited with {server.process.returncode}:\n{server.logs()}")
        with (
            contextlib.suppress(OSError, urllib.error.URLError),
            urllib.request.urlopen(f"{server.url}/-/ready", timeout=1) as response,
        ):
            if response.status == 200:
                return
        time.sleep(0.05)
    raise TimeoutError(f"prometheus not ready after {START_TIMEOUT} s:\n{server.logs()}")
