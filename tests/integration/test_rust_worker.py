"""The Rust SDK (sdk/rust): its worker (``cronoq::worker::run_worker``) in the scenarios of
:mod:`.sdkworkers`, driving sdk/rust/examples/testworker.rs (the Go test worker's flags, payloads and
JSON lines; see :mod:`.rustsdk`); the crate's unit tests; and its generated messages."""

from __future__ import annotations

from pathlib import Path

import pytest

from .rustsdk import GENERATED, RustWorker, built_testworker, cargo, generate
from .sdkworkers import *  # noqa: F403 (the shared tests, collected here)
from .sdkworkers import Sdk


@pytest.fixture(scope="module")
def sdk() -> Sdk:
    # rustls 0.20 checks DNS names only: to the server's IP address, the name its certificate also has.
    return Sdk(RustWorker, built_testworker, cancelled="cancelled", ip_tls=("-domain", "localhost"))


async def test_the_crates_unit_tests_pass() -> None:
    tested = cargo("test", "--lib")
    assert tested.returncode == 0, tested.stdout[-3000:] + tested.stderr[-3000:]


async def test_the_generated_messages_are_current(tmp_path: Path) -> None:
    generate(tmp_path)
    assert (tmp_path / GENERATED.name).read_text() == GENERATED.read_text(), "run `make sdk-rust-proto`"


async def test_without_cargo_the_tests_are_skipped_saying_why(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))  # no cargo on it, nor in ~/.cargo/bin
    monkeypatch.setenv("HOME", str(tmp_path))
    with pytest.raises(pytest.skip.Exception, match="cargo is not installed"):
        built_testworker.__wrapped__()  # not the session's cached build
