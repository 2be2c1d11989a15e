"""The Rust SDK (sdk/rust) for the tests and the benchmark: cargo, offline from Debian's crates where
they are installed, the test worker (sdk/rust/examples/testworker.rs) built once per session, and the
generated prost messages.

There is no crates.io here: ``make sdk-rust`` installs Debian's packages of the crates (``librust-*-dev``,
under /usr/share/cargo/registry), and cargo is pointed at that directory as a replacement of crates.io
by ``--config`` options, so that sdk/rust/Cargo.toml stays valid elsewhere. Where cargo is missing the
Rust tests are skipped, saying why.

``python -m tests.integration.rustsdk`` builds the test worker (``make sdk-rust``);
``python -m tests.integration.rustsdk proto`` regenerates sdk/rust/src/gen (``make sdk-rust-proto``).
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from .gosdk import GoWorker

ROOT = Path(__file__).resolve().parents[2]
SDK = ROOT / "sdk" / "rust"
GENERATED = SDK / "src" / "gen" / "cronoq.v1.rs"
PROTO = ROOT / "proto" / "cronoq" / "v1" / "cronoq.proto"
DEBIAN_REGISTRY = Path("/usr/share/cargo/registry")
# Out of the worktree and shared by the session's builds: a build is incremental after the first.
TARGET = Path(tempfile.gettempdir()) / "cronoq-rust-target"


def cargo_tool() -> str | None:
    """cargo from the PATH or rustup's default place."""
    found = shutil.which("cargo")
    rustup = Path.home() / ".cargo" / "bin" / "cargo"
    return found or (str(rustup) if rustup.is_file() else None)


def missing_toolchain() -> str | None:
    """Why the SDK cannot be built here, or None."""
    if cargo_tool() is None:
        return (
            "cargo is not installed: the Rust SDK's tests need a Rust toolchain (rustup, or Debian's cargo)"
        )
    if not DEBIAN_REGISTRY.is_dir() and not os.environ.get("CRONOQ_RUST_ONLINE"):
        return (
            "Debian's Rust crates are not installed (/usr/share/cargo/registry): `make sdk-rust` installs them "
            "with apt-get (as root, where apt exists); set CRONOQ_RUST_ONLINE=1 to build from crates.io instead"
        )
    return None


def cargo(*args: str, cwd: Path = SDK, timeout: float = 900) -> subprocess.CompletedProcess[str]:
    """A cargo command in ``cwd``, offline from Debian's crates where they are installed."""
    tool = cargo_tool()
    assert tool is not None
    offline: list[str] = []
    if DEBIAN_REGISTRY.is_dir():
        offline = [
            "--offline",
            "--config",
            'source.crates-io.replace-with="debian"',
            "--config",
            f'source.debian.directory="{DEBIAN_REGISTRY}"',
        ]
    env = {**os.environ, "PATH": f"{Path(tool).parent}{os.pathsep}{os.environ.get('PATH', '')}"}
    return subprocess.run(
        [tool, *args, *offline, "--target-dir", str(TARGET)],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


@functools.cache
def built_testworker(release: bool = False) -> Path:
    """sdk/rust/examples/testworker.rs, built (incrementally) once per test session, or a skip. The
    tests take a debug build, quicker to make; the benchmark an optimized one (``release``), as a user's
    worker would be."""
    if (why := missing_toolchain()) is not None:
        pytest.skip(why)
    built = cargo("build", "--example", "testworker", *(["--release"] if release else []))
    assert built.returncode == 0, built.stderr[-5000:]
    return TARGET / ("release" if release else "debug") / "examples" / "testworker"


def generate(out: Path) -> None:
    """Writes the prost messages of cronoq.v1 into ``out`` with prost-build (sdk/rust/codegen), whose
    protoc is grpcio-tools' (the one the Python stubs are made with)."""
    built = cargo("build", cwd=SDK / "codegen")
    assert built.returncode == 0, built.stderr[-5000:]
    with tempfile.TemporaryDirectory() as scratch:
        protoc = Path(scratch) / "protoc"
        protoc.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m grpc_tools.protoc "$@"\n')
        protoc.chmod(0o755)
        subprocess.run(
            [str(TARGET / "debug" / "cronoq-codegen"), str(out), str(PROTO)],
            env={**os.environ, "PROTOC": str(protoc)},
            check=True,
            capture_output=True,
        )


class RustWorker(GoWorker):
    """The Rust test worker in its own process: the same flags, payloads and JSON lines as the Go one."""

    def binary(self) -> Path:
        return built_testworker()


if __name__ == "__main__":
    if sys.argv[1:] == ["proto"]:
        generate(GENERATED.parent)
    elif (reason := missing_toolchain()) is not None:
        print(f"{reason}: the Rust SDK is not built and its tests will be skipped")
    else:
        result = cargo("build", "--example", "testworker")
        if result.returncode != 0:
            sys.exit(result.stderr)
        print(f"Rust SDK: the test worker is built in {TARGET}")
