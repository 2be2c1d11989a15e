"""The operator's configuration file: what it accepts, and errors that name the key to fix."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from cronoq.config import ConfigError
from kube_operator.config import OperatorConfig, ServerEntry, load_operator_config, parse_operator_config

ENV = {"METRICS_TOKEN": "metrics-token-0123456789"}


def problems(text: str, env: dict[str, str] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        parse_operator_config(text, env=ENV if env is None else env)
    return [str(problem) for problem in caught.value.problems]


@pytest.fixture(scope="module")
def ca_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    directory = tmp_path_factory.mktemp("ca")
    subprocess.run(
        ["openssl", "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes",
         "-days", "1", "-subj", "/CN=test CA", "-keyout", str(directory / "ca.key"), "-out", str(directory / "ca.pem")],
        check=True,
        capture_output=True,
    )  # fmt: skip
    return directory / "ca.pem"


def test_a_full_configuration(tmp_path: Path, ca_file: Path) -> None:
    token_file = tmp_path / "token"
    token_file.write_text("file-token-0123456789\n")
    config = parse_operator_config(
        f"""
interval_s = 30
timeout_s = 2.5
namespaces = ["workers", "batch"]

[[servers]]
name = "main"
url = "http://cronoq.cronoq:7070"
token_env = "METRICS_TOKEN"

[[servers]]
name = "gpu"
url = "https://cronoq-gpu.cronoq.svc:7070"
token_file = "{token_file}"
ca_file = "{ca_file}"
""",
        env=ENV,
    )
    assert config == OperatorConfig(
        servers=(
            ServerEntry("main", "http://cronoq.cronoq:7070", token_env="METRICS_TOKEN"),
            ServerEntry(
                "gpu", "https://cronoq-gpu.cronoq.svc:7070", token_file=str(token_file), ca_file=str(ca_file)
            ),
        ),
        interval_s=30.0,
        timeout_s=2.5,
        namespaces=("workers", "batch"),
    )
    assert config.server("gpu") is config.servers[1] and config.server("other") is None


def test_defaults() -> None:
    config = parse_operator_config(
        '[[servers]]\nname = "main"\nurl = "http://c:7070"\ntoken_env = "METRICS_TOKEN"\n', env=ENV
    )
    assert (config.interval_s, config.timeout_s, config.namespaces) == (15.0, 5.0, ())


def test_every_problem_is_reported_with_its_key(tmp_path: Path) -> None:
    found = problems(
        f"""
interval_s = 0.5
namespaces = ["Bad_Namespace"]

[[servers]]
name = "main"
url = "http://cronoq.cronoq"
token_env = "UNSET_TOKEN"

[[servers]]
name = "main"
url = "ftp://x:1"
token_env = "METRICS_TOKEN"
token_file = "/nonexistent"

[[servers]]
name = "third"
url = "http://c:7070"
ca_file = "{tmp_path / "ca.pem"}"
tokn_env = "METRICS_TOKEN"
"""
    )
    assert found == [
        "interval_s: must be at least 1 and at most 3600 (got 0.5)",
        "namespaces[0]: expected a Kubernetes namespace name (got 'Bad_Namespace')",
        "servers[0].token_env: environment variable UNSET_TOKEN is not set",
        "servers[0].url: expected http://host:port or https://host:port (the server's gRPC port) (got 'http://cronoq.cronoq')",
        "servers[1].name: duplicate server name 'main' (also at servers[0].name)",
        "servers[1].token_file: token_env and token_file are exclusive: set one",
        "servers[1].url: expected http://host:port or https://host:port (the server's gRPC port) (got 'ftp://x:1')",
        "servers[2]: set token_env or token_file: the token (metrics role) the operator reads with",
        "servers[2].ca_file: only used with an https:// url",
        "servers[2].tokn_env: unknown key (did you mean token_env?)",
    ]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("", "servers: required: at least one [[servers]] entry for scalers to name"),
        ("servers = 3", "servers: expected an array of tables (got integer)"),
        ('[[servers]]\nurl = "http://c:7070"\ntoken_env = "METRICS_TOKEN"', "servers[0].name: required"),
        (
            '[[servers]]\nname = "a b"\nurl = "http://c:7070"\ntoken_env = "METRICS_TOKEN"',
            "servers[0].name: must be 1 to 64 characters from A-Z a-z 0-9 _ . : - (got 'a b')",
        ),
        (
            '[[servers]]\nname = "a"\nurl = "http://u@c:7070"\ntoken_env = "METRICS_TOKEN"',
            "servers[0].url: expected http://host:port or https://host:port (the server's gRPC port) (got 'http://u@c:7070')",
        ),
        (
            '[[servers]]\nname = "a"\nurl = "http://c:7070/path"\ntoken_env = "METRICS_TOKEN"',
            "servers[0].url: expected http://host:port or https://host:port (the server's gRPC port) (got 'http://c:7070/path')",
        ),
        (
            '[[servers]]\nname = "a"\nurl = "http://c:7070"\ntoken_env = "1X"',
            "servers[0].token_env: expected an environment variable name (got '1X')",
        ),
        (
            '[[servers]]\nname = "a"\nurl = "http://c:7070"\ntoken_env = "METRICS_TOKEN"\ntimeout = 3',
            "servers[0].timeout: unknown key",
        ),
        (
            'timeout_s = 301\n[[servers]]\nname = "a"\nurl = "http://c:7070"\ntoken_env = "METRICS_TOKEN"',
            "timeout_s: must be at least 0.1 and at most 300 (got 301)",
        ),
        ("interval_s = [", "not valid TOML: Invalid value (at end of document)"),
    ],
)
def test_single_problems(text: str, expected: str) -> None:
    assert problems(text) == [expected]


def test_token_and_ca_files_are_checked(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.write_text("\n")
    not_pem = tmp_path / "not.pem"
    not_pem.write_text("hello")
    found = problems(
        f"""
[[servers]]
name = "a"
url = "https://c:7070"
token_file = "{empty}"
ca_file = "{not_pem}"
"""
    )
    assert len(found) == 2
    assert found[0].startswith(f"servers[0].ca_file: not a readable PEM CA certificate: {not_pem}")
    assert found[1] == f"servers[0].token_file: cannot read a token from {empty} ({empty} is empty)"


def test_a_missing_file_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_operator_config(tmp_path / "absent.toml")
    assert "cannot read the configuration" in str(caught.value)
