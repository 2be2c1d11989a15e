"""``cronoq-operator``'s command line: ``--check``, a missing or invalid configuration, and the
Kubernetes API flags."""

from __future__ import annotations

import argparse
from collections.abc import Iterator
from pathlib import Path

import pytest
import structlog

from kube_operator.kube import KubeTarget
from kube_operator.main import kube_target, main, parser

VALID = '[[servers]]\nname = "main"\nurl = "http://cronoq.cronoq:7070"\ntoken_env = "OPERATOR_TEST_TOKEN"\n'


@pytest.fixture(autouse=True)
def logging_restored() -> Iterator[None]:
    """main() configures logging for the whole process, onto the stdout this test captures."""
    yield
    structlog.reset_defaults()


def args(*argv: str) -> argparse.Namespace:
    parsed: argparse.Namespace = parser().parse_args(list(argv))
    return parsed


@pytest.mark.parametrize(
    ("token", "noted"),
    [
        ("metrics-token-0123456789", "set here, its value checked"),
        (None, "not set here, so its value was not checked"),
    ],
)
def test_check_accepts_a_valid_file_naming_its_token_variable(
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    token: str | None,
    noted: str,
) -> None:
    """``--check`` names the variable the token comes from; it need not be set (CI, without the
    Secret)."""
    if token is None:
        monkeypatch.delenv("OPERATOR_TEST_TOKEN", raising=False)
    else:
        monkeypatch.setenv("OPERATOR_TEST_TOKEN", token)
    path = tmp_path / "operator.toml"
    path.write_text(VALID)
    assert main(["--config", str(path), "--check"]) == 0
    assert capsys.readouterr().out.splitlines() == [
        "configuration ok: 1 server(s): main",
        f"note: servers[0].token_env: cronoq-operator needs environment variable OPERATOR_TEST_TOKEN at start ({noted})",
    ]


def test_check_lists_every_problem(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OPERATOR_TEST_TOKEN", "metrics-token-0123456789")
    path = tmp_path / "operator.toml"
    path.write_text("interval_s = 0\n" + VALID.replace("cronoq.cronoq:7070", "cronoq"))
    assert main(["--config", str(path), "--check"]) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"cronoq-operator: invalid configuration {path}:",
        "  - interval_s: must be at least 1 and at most 3600 (got 0)",
        "  - servers[0].url: expected http://host:port or https://host:port (the server's gRPC port) "
        "(got 'http://cronoq')",
    ]


def test_check_reads_a_yaml_file_naming_lines(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OPERATOR_TEST_TOKEN", "metrics-token-0123456789")
    path = tmp_path / "operator.yaml"
    server = "servers:\n  - name: main\n    url: {url}\n    token_env: OPERATOR_TEST_TOKEN\n"
    path.write_text(server.format(url="http://cronoq.cronoq:7070"))
    assert main(["--config", str(path), "--check"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "configuration ok: 1 server(s): main"
    path.write_text("interval_s: 0\n" + server.format(url="http://cronoq"))
    assert main(["--config", str(path), "--check"]) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"cronoq-operator: invalid configuration {path}:",
        "  - interval_s (line 1): must be at least 1 and at most 3600 (got 0)",
        "  - servers[0].url (line 4): expected http://host:port or https://host:port (the server's gRPC port) "
        "(got 'http://cronoq')",
    ]


def test_starting_refuses_an_unset_token_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("OPERATOR_TEST_TOKEN", raising=False)
    path = tmp_path / "operator.toml"
    path.write_text(VALID)
    assert main(["--config", str(path)]) == 1
    assert capsys.readouterr().err.splitlines() == [
        f"cronoq-operator: invalid configuration {path}:",
        "  - servers[0].token_env: environment variable OPERATOR_TEST_TOKEN is not set",
    ]


def test_the_configuration_is_required(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.delenv("CRONOQ_OPERATOR_CONFIG", raising=False)
    assert main([]) == 1
    assert "--config (or CRONOQ_OPERATOR_CONFIG) is required" in capsys.readouterr().err


def test_the_configuration_path_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CRONOQ_OPERATOR_CONFIG", "/etc/cronoq-operator/operator.toml")
    assert parser().parse_args([]).config == "/etc/cronoq-operator/operator.toml"


def test_kube_api_flags(tmp_path: Path) -> None:
    token = tmp_path / "token"
    token.write_text("kube-token-0123456789")
    assert kube_target(args("--kube-api", "http://127.0.0.1:8001"), {}) == KubeTarget(
        "http://127.0.0.1:8001", None, None
    )
    assert (
        kube_target(args("--kube-api", "https://k:6443", "--kube-token-file", str(token)), {}).token_file
        == token
    )
    with pytest.raises(ValueError, match="--kube-api: expected an http:// or https:// URL"):
        kube_target(args("--kube-api", "k:6443"), {})
    with pytest.raises(ValueError, match="--kube-token-file: cannot read a token"):
        kube_target(args("--kube-api", "https://k:6443", "--kube-token-file", str(tmp_path / "absent")), {})
    with pytest.raises(ValueError, match="--kube-ca: not a readable PEM CA certificate"):
        kube_target(args("--kube-api", "https://k:6443", "--kube-ca", str(token)), {})
    with pytest.raises(ValueError, match="go with --kube-api"):
        kube_target(args("--kube-token-file", str(token)), {})
    with pytest.raises(ValueError, match="not running in a Kubernetes pod"):
        kube_target(args(), {})


def test_outside_a_cluster_without_flags_it_refuses_to_start(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("OPERATOR_TEST_TOKEN", "metrics-token-0123456789")
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    path = tmp_path / "operator.toml"
    path.write_text(VALID)
    assert main(["--config", str(path)]) == 1
    assert "not running in a Kubernetes pod" in capsys.readouterr().err
