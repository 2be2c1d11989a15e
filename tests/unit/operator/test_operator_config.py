"""The operator's configuration file: what it accepts, and errors that name the key to fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from cronoq.config import ConfigError, Syntax
from kube_operator.config import OperatorConfig, ServerEntry, load_operator_config, parse_operator_config
from tests.unit.operator.operator_pki import OperatorPki
from tests.unit.test_config import in_syntax

ENV = {"METRICS_TOKEN": "metrics-token-0123456789"}


def problems(text: str, env: dict[str, str] | None = None, syntax: Syntax = "toml") -> list[str]:
    """Each problem as ``path: message``: its line (YAML's) is left out, so both syntaxes compare."""
    with pytest.raises(ConfigError) as caught:
        parse_operator_config(text, env=ENV if env is None else env, syntax=syntax)
    return [str(problem).replace(f" (line {problem.line})", "") for problem in caught.value.problems]


def test_a_full_configuration(tmp_path: Path, pki: OperatorPki) -> None:
    cert, key = pki.operator
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
ca_file = "{pki.ca}"

[[servers]]
name = "mtls"
url = "https://cronoq.cronoq.svc:7070"
ca_file = "{pki.ca}"
cert_file = "{cert}"
key_file = "{key}"
""",
        env=ENV,
    )
    assert config == OperatorConfig(
        servers=(
            ServerEntry("main", "http://cronoq.cronoq:7070", token_env="METRICS_TOKEN"),
            ServerEntry(
                "gpu", "https://cronoq-gpu.cronoq.svc:7070", token_file=str(token_file), ca_file=str(pki.ca)
            ),
            ServerEntry(
                "mtls",
                "https://cronoq.cronoq.svc:7070",
                ca_file=str(pki.ca),
                cert_file=str(cert),
                key_file=str(key),
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


@pytest.mark.parametrize("syntax", ["toml", "yaml"])
def test_every_problem_is_reported_with_its_key(tmp_path: Path, syntax: Syntax) -> None:
    text = f"""
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
    found = problems(in_syntax(text, syntax), syntax=syntax)
    assert found == [
        "interval_s: must be at least 1 and at most 3600 (got 0.5)",
        "namespaces[0]: expected a Kubernetes namespace name (got 'Bad_Namespace')",
        "servers[0].token_env: environment variable UNSET_TOKEN is not set",
        "servers[0].url: expected http://host:port or https://host:port (the server's gRPC port) (got 'http://cronoq.cronoq')",
        "servers[1].name: duplicate server name 'main' (also at servers[0].name)",
        "servers[1].token_file: token_env and token_file are exclusive: set one",
        "servers[1].url: expected http://host:port or https://host:port (the server's gRPC port) (got 'ftp://x:1')",
        "servers[2]: set token_env or token_file (a token with the metrics role), or cert_file and key_file "
        "(a client certificate the server maps to the metrics role): what the operator reads with",
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
    ],
)
def test_single_problems(text: str, expected: str) -> None:
    assert problems(text) == [expected]
    assert problems(in_syntax(text, "yaml"), syntax="yaml") == [expected]


def test_syntax_errors() -> None:
    assert problems("interval_s = [") == ["not valid TOML: Invalid value (at end of document)"]
    assert problems("interval_s: [", syntax="yaml") == [
        "not valid YAML: while parsing a flow node, expected the node content, but found '<stream end>' "
        "(at line 1, column 14)"
    ]


def test_a_yaml_file_reads_as_its_toml(tmp_path: Path) -> None:
    """The extension chooses the syntax; a YAML problem names its line."""
    toml_text = '[[servers]]\nname = "main"\nurl = "http://c:7070"\ntoken_env = "METRICS_TOKEN"\n'
    for name in ("operator.yaml", "operator.yml"):
        (tmp_path / name).write_text(in_syntax(toml_text, "yaml"))
        assert load_operator_config(tmp_path / name, env=ENV) == parse_operator_config(toml_text, env=ENV)
    (tmp_path / "operator.yaml").write_text(
        "servers:\n- name: main\n  url: c:7070\n  token_env: METRICS_TOKEN\n"
    )
    with pytest.raises(ConfigError) as caught:
        load_operator_config(tmp_path / "operator.yaml", env=ENV)
    assert [str(problem) for problem in caught.value.problems] == [
        "servers[0].url (line 3): expected http://host:port or https://host:port (the server's gRPC port) "
        "(got 'c:7070')"
    ]
    (tmp_path / "operator.cfg").write_text(toml_text)
    with pytest.raises(ConfigError, match=r"expected it to end in \.toml \(TOML\), \.yaml or \.yml \(YAML\)"):
        load_operator_config(tmp_path / "operator.cfg", env=ENV)


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


def server_with(url: str, **keys: Path | str) -> str:
    """One [[servers]] entry with these extra keys."""
    lines = "".join(f'{key} = "{value}"\n' for key, value in keys.items())
    return f'[[servers]]\nname = "a"\nurl = "{url}"\n{lines}'


def test_a_client_certificate_stands_in_for_the_token_or_goes_with_one(pki: OperatorPki) -> None:
    """A server requiring client certificates may map the operator's to the metrics role (no token
    needed) or still require a token (both given: the server judges the token)."""
    cert, key = pki.operator
    alone = parse_operator_config(server_with("https://c:7070", cert_file=cert, key_file=key), env=ENV)
    assert alone.servers[0] == ServerEntry("a", "https://c:7070", cert_file=str(cert), key_file=str(key))
    both = server_with("https://c:7070", token_env="METRICS_TOKEN", cert_file=cert, key_file=key)
    assert parse_operator_config(both, env=ENV).servers[0].token_env == "METRICS_TOKEN"


@pytest.mark.parametrize(
    ("keys", "expected"),
    [
        (
            {"cert_file": "operator.pem"},
            ["servers[0].key_file: required with cert_file (the client certificate's private key)"],
        ),
        (
            {"key_file": "operator.key"},
            ["servers[0].cert_file: required with key_file (the client certificate of that key)"],
        ),
        (
            {"cert_file": "absent.pem", "key_file": "operator.key"},
            ["servers[0].cert_file: cannot read {dir}/absent.pem (No such file or directory)"],
        ),
        (
            {"cert_file": "operator.pem", "key_file": "absent.key"},
            ["servers[0].key_file: cannot read {dir}/absent.key (No such file or directory)"],
        ),
        (
            {"cert_file": "operator.key", "key_file": "operator.key"},
            ["servers[0].cert_file: not a PEM certificate: {dir}/operator.key"],
        ),
        (
            {"cert_file": "operator.pem", "key_file": "other.key"},
            ["servers[0].key_file: not the private key of cert_file {dir}/operator.pem: {dir}/other.key"],
        ),
        (
            {"cert_file": "operator.pem", "key_file": "operator.pem"},
            ["servers[0].key_file: not an unencrypted PEM private key: {dir}/operator.pem"],
        ),
        (
            {"cert_file": "operator.pem", "key_file": "encrypted.key"},
            ["servers[0].key_file: not an unencrypted PEM private key: {dir}/encrypted.key"],
        ),
    ],
    ids=[
        "cert-without-key",
        "key-without-cert",
        "cert-unreadable",
        "key-unreadable",
        "cert-not-a-certificate",
        "key-of-another-certificate",
        "key-not-a-key",
        "key-encrypted",
    ],
)
def test_client_certificate_problems_name_their_key(
    pki: OperatorPki, keys: dict[str, str], expected: list[str]
) -> None:
    """cert_file and key_file go together and must each be usable (without a token they are the
    operator's only credential), each problem naming its key; an encrypted key is refused at once
    (gRPC takes no passphrase) rather than OpenSSL prompting for one."""
    directory = pki.ca.parent
    paths = {key: directory / name for key, name in keys.items()}
    found = problems(server_with("https://c:7070", **paths))
    assert found == [line.format(dir=directory) for line in expected]


def test_tls_files_with_an_http_url_are_refused(pki: OperatorPki) -> None:
    cert, key = pki.operator
    assert problems(
        server_with("http://c:7070", token_env="METRICS_TOKEN", cert_file=cert, key_file=key)
    ) == [
        "servers[0].cert_file: only used with an https:// url",
        "servers[0].key_file: only used with an https:// url",
    ]
