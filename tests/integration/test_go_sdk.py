"""The Go SDK's own tests (``go test`` in sdk/go), its formatting and its generated stubs, driven from
pytest so that ``make test`` runs them: unit tests against scripted servers in the test process, and the
producer ``Client`` against a real server started here (``CRONOQ_TEST_TARGET``)."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from .conftest import DEFAULT_CONFIG
from .gosdk import ROOT, SDK, go, go_tool
from .serverproc import running_server

GO_TESTS = (
    "TestParseTarget",
    "TestRedirects",
    "TestRedirectsKeepHomesList",
    "TestFallbackSlotsAndNotLeader",
    "TestRedirectThenFatal",
    "TestOutcomes",
    "TestWireText",
    "TestBatchedFramesStayWithinTheLimit",
    "TestClientAgainstServer",
    "TestTaskSpec",
)


def test_go_test_with_a_real_server(tmp_path: Path) -> None:
    go_tool()
    with running_server(tmp_path, DEFAULT_CONFIG) as server:
        ran = go("test", "-count=1", "-v", "./...", env={"CRONOQ_TEST_TARGET": server.target})
    assert ran.returncode == 0, ran.stdout[-6000:] + ran.stderr[-3000:]
    for name in GO_TESTS:  # ran, not skipped
        assert f"--- PASS: {name} " in ran.stdout, ran.stdout[-6000:]


def test_go_vet_and_gofmt() -> None:
    vet = go("vet", "./...")
    assert vet.returncode == 0, vet.stderr
    gofmt = shutil.which("gofmt") or "gofmt"
    unformatted = subprocess.run(
        [gofmt, "-l", *(str(p) for p in SDK.rglob("*.go") if "vendor" not in p.parts)],
        capture_output=True,
        text=True,
        check=True,
    )
    assert unformatted.stdout == "", f"not gofmt-formatted: {unformatted.stdout}"


def test_the_committed_stubs_are_what_make_generates(tmp_path: Path) -> None:
    go_tool()
    if subprocess.run(["which", "protoc-gen-go", "protoc-gen-go-grpc"], capture_output=True).returncode:
        pytest.skip(
            "protoc-gen-go or protoc-gen-go-grpc is missing: `make sdk-go` installs them with apt-get"
        )
    subprocess.run(["make", "-s", "sdk-go-proto", f"SDK_GO_PROTO_OUT={tmp_path}"], cwd=ROOT, check=True)
    for name in ("cronoq.pb.go", "cronoq_grpc.pb.go"):
        generated = tmp_path / "cronoqv1" / name
        assert generated.read_text() == (SDK / "cronoqv1" / name).read_text(), (
            f"run make sdk-go-proto ({name})"
        )
