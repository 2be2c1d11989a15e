"""The Go SDK (sdk/go) for the tests: its toolchain, its test worker built once per session, and that
worker run as a process whose JSON lines the tests wait on.

Go comes from Debian's packages here (``make sdk-go`` installs them where apt-get exists and we are
root). Where ``go`` is missing, the Go tests are skipped, saying why; where Debian's Go sources are
installed, ``sdk/go/scripts/debian-vendor.sh`` builds the module offline from them."""

from __future__ import annotations

import atexit
import functools
import json
import os
import queue
import shutil
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any, Self

import pytest

ROOT = Path(__file__).resolve().parents[2]
SDK = ROOT / "sdk" / "go"
DEBIAN_SOURCES = Path("/usr/share/gocode/src/google.golang.org/grpc")
# A build offline never asks a module proxy (there is none here); with vendor/ from Debian's sources it
# needs none.
GO_ENV = {"GOPROXY": "off", "GOFLAGS": "-mod=vendor", "GOTOOLCHAIN": "local"}


def go_env() -> dict[str, str]:
    """The environment of a ``go`` command on the module: offline from Debian's sources where they are
    installed, as the environment says otherwise."""
    if not DEBIAN_SOURCES.is_dir():
        return dict(os.environ)
    return {**os.environ, **GO_ENV}


@functools.cache
def go_tool() -> str:
    """``go``, prepared to build the module, or a skip saying why there is none."""
    go = shutil.which("go")
    if go is None:
        pytest.skip("go is not installed: `make sdk-go` installs it with apt-get (as root, where apt exists)")
    if DEBIAN_SOURCES.is_dir():
        subprocess.run([str(SDK / "scripts" / "debian-vendor.sh")], check=True, capture_output=True)
    return go


def go(
    *args: str, env: Mapping[str, str] | None = None, timeout: float = 600
) -> subprocess.CompletedProcess[str]:
    """A ``go`` command in sdk/go (with ``env`` added to its environment), its output captured."""
    return subprocess.run(
        [go_tool(), *args],
        cwd=SDK,
        env={**go_env(), **(env or {})},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@functools.cache
def built_testworker() -> Path:
    """sdk/go/internal/testworker built once per test session, into a folder removed at exit."""
    folder = Path(tempfile.mkdtemp(prefix="cronoq-go-"))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    binary = folder / "testworker"
    built = go("build", "-o", str(binary), "./internal/testworker")
    assert built.returncode == 0, built.stderr
    return binary


class GoWorker:
    """The Go test worker in its own process. Its JSON lines arrive in ``events`` (each with ``t``, the
    monotonic time it was read); :meth:`expect` waits for the next one of a kind. Another SDK's test
    worker taking the same flags and printing the same lines overrides :meth:`binary`."""

    def binary(self) -> Path:
        """The test worker's executable, built on first use."""
        return built_testworker()

    def __init__(
        self,
        target: str,
        *args: str,
        pool: str = "default",
        slots: int = 1,
        token: str | None = None,
        registered: bool = True,
    ) -> None:
        env = {**os.environ, "CRONOQ_TOKEN": token or ""}
        command = [str(self.binary()), "-target", target, "-pool", pool, "-slots", str(slots), *args]
        self.proc = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True
        )
        self.events: queue.Queue[dict[str, Any]] = queue.Queue()
        self.seen: list[dict[str, Any]] = []
        self.stderr: list[str] = []
        # Threads own the pipes: a full stderr pipe would block the worker.
        threading.Thread(target=self._pump, daemon=True).start()
        threading.Thread(target=self._drain_stderr, daemon=True).start()
        self.registration: dict[str, Any] = {}
        if registered:
            self.registration = self.expect("registered", timeout=20)

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            event = json.loads(line)
            event["t"] = time.monotonic()
            self.events.put(event)

    def _drain_stderr(self) -> None:
        assert self.proc.stderr is not None
        self.stderr.extend(self.proc.stderr)

    def expect(self, kind: str, timeout: float = 10, **match: object) -> dict[str, Any]:
        """The next event of ``kind`` whose fields equal ``match`` (others are kept in ``seen``)."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                event = self.events.get(timeout=max(deadline - time.monotonic(), 0))
            except queue.Empty:
                raise TimeoutError(
                    f"no {kind} event {match} from the {type(self).__name__} within {timeout} s; seen {self.seen}; "
                    f"stderr {''.join(self.stderr)[-3000:]}"
                ) from None
            self.seen.append(event)
            if event["event"] == kind and all(event.get(k) == v for k, v in match.items()):
                return event

    def all_events(self) -> Sequence[dict[str, Any]]:
        """Every event read so far, those still queued included."""
        while not self.events.empty():
            self.seen.append(self.events.get())
        return self.seen

    def kinds(self) -> Sequence[str]:
        return [event["event"] for event in self.all_events()]

    def stop(self, timeout: float = 30) -> int:
        """SIGTERM (the worker drains) and its exit status."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        return self.proc.wait(timeout)

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)  # a frozen one too
            self.proc.kill()
        self.proc.wait(10)

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
