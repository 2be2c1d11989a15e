"""The operator's configuration file: which cronoq servers scalers may name, and how to reach them.

A scaler names a server, never a URL or a token: only servers listed here can be read, with the
credentials given here. Tokens come from the environment (``token_env``, filled from a Secret by
``secretKeyRef``) or from a file (``token_file``, a mounted Secret); they never appear in the file
itself. A server that requires client certificates (mTLS) is read with ``cert_file`` and ``key_file``
(a mounted ``kubernetes.io/tls`` Secret), with or without a token. Every file is read again each round,
so a rotated token or a renewed certificate is picked up without a restart. The file is TOML or YAML (by
its extension, as ``cronoq.toml``), read with the same key and type checks as the server's configuration
(unknown keys are errors, with a suggestion), and every mistake is reported at once, naming its key
(``servers[1].url: ...``). As there, the rule of a key's value is in its field's metadata, which the JSON
Schema of the file is generated from too (:mod:`cronoq.operator.schema`).
"""

from __future__ import annotations

import os
import re
import ssl
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

from cronoq.config import EnvVariable, Syntax
from cronoq.config.problems import Problems, show
from cronoq.config.reader import read_text
from cronoq.config.rules import (
    ADDRESS,
    ENV_NAME,
    HTTP_SCHEME,
    NAME,
    between,
    check_env_name,
    checked,
    matching,
)
from cronoq.config.syntax import read_file
from cronoq.config.validate import check_rules

DEFAULT_INTERVAL_S = 15.0
DEFAULT_TIMEOUT_S = 5.0
MAX_INTERVAL_S = 3600.0
MAX_TIMEOUT_S = 300.0
DEFAULT_HTTP_ADDR = "127.0.0.1:8080"
DEFAULT_LEASE_NAME = "cronoq-operator"
DEFAULT_LEASE_DURATION_S = 15.0
# A Kubernetes namespace name (RFC 1123 label).
_NAMESPACE = re.compile(r"[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?")


def check_server_url(url: str) -> str | None:
    """A server's gRPC address as ``http://host:port`` or ``https://host:port``: the port is required
    (gRPC would otherwise pick 443 for both), and nothing may follow it (gRPC has no path)."""
    expected = "expected http://host:port or https://host:port (the server's gRPC port)"
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return expected
    if parts.scheme not in ("http", "https") or not parts.hostname or port is None:
        return expected
    if parts.username is not None or parts.path not in ("", "/") or parts.query or parts.fragment:
        return expected
    return None


def check_namespace(name: str) -> str | None:
    return None if _NAMESPACE.fullmatch(name) else "expected a Kubernetes namespace name"


def check_lease_name(name: str) -> str | None:
    return None if _NAMESPACE.fullmatch(name) else "expected a Lease name (lower-case letters, digits and -)"


@dataclass(frozen=True, slots=True)
class ServerEntry:
    """A cronoq server (or router) the operator may read: ``[[servers]]`` in the file."""

    name: str = field(metadata=NAME)
    url: str = field(metadata=checked(check_server_url, schema=HTTP_SCHEME))
    token_env: str | None = field(default=None, metadata=ENV_NAME)
    token_file: str | None = None
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None


@dataclass(frozen=True, slots=True)
class OperatorConfig:
    """The whole file. ``interval_s`` applies to scalers without ``intervalSeconds``; ``timeout_s``
    bounds one snapshot read; ``namespaces`` (empty: all) restricts the scalers the operator acts on;
    ``http_addr`` serves its probes and ``/metrics``; the ``lease_*`` keys are its leader election's
    Lease (``lease_namespace`` None: the operator's own namespace)."""

    servers: tuple[ServerEntry, ...] = ()
    interval_s: float = field(default=DEFAULT_INTERVAL_S, metadata=between(1, MAX_INTERVAL_S))
    timeout_s: float = field(default=DEFAULT_TIMEOUT_S, metadata=between(0.1, MAX_TIMEOUT_S))
    namespaces: tuple[str, ...] = field(
        default=(), metadata=checked(check_namespace, schema=matching(_NAMESPACE))
    )
    http_addr: str = field(default=DEFAULT_HTTP_ADDR, metadata=ADDRESS)
    lease_name: str = field(
        default=DEFAULT_LEASE_NAME, metadata=checked(check_lease_name, schema=matching(_NAMESPACE))
    )
    lease_namespace: str | None = field(
        default=None, metadata=checked(check_namespace, schema=matching(_NAMESPACE))
    )
    lease_duration_s: float = field(default=DEFAULT_LEASE_DURATION_S, metadata=between(2, 300))

    def server(self, name: str) -> ServerEntry | None:
        return next((entry for entry in self.servers if entry.name == name), None)


def parse_operator_config(
    text: str,
    *,
    source: str = "<string>",
    syntax: Syntax = "toml",
    env: Mapping[str, str] | None = None,
    needed: list[EnvVariable] | None = None,
) -> OperatorConfig:
    """The configuration in ``text`` (``syntax``: ``"toml"`` or ``"yaml"``), checked: keys, types,
    ranges, names, URLs, and the secrets and files it names (every ``token_env`` set, every
    ``token_file``, ``ca_file``, ``cert_file`` and ``key_file`` readable), so that a file that loads is
    one the operator can run with. ``env`` defaults to the process environment. With ``needed``
    (``--check``, which runs where the secrets often are not) every ``token_env`` is added to it
    instead, and an unset one is no problem."""
    problems = Problems()
    config = read_text(OperatorConfig, text, syntax, problems)
    if config is None:
        raise problems.error(source)
    _check(config, os.environ if env is None else env, problems, needed)
    if problems:
        raise problems.error(source)
    return config


def load_operator_config(
    path: str | os.PathLike[str],
    *,
    env: Mapping[str, str] | None = None,
    needed: list[EnvVariable] | None = None,
) -> OperatorConfig:
    """:func:`parse_operator_config` on a file, in the syntax its extension names (``.toml``,
    ``.yaml`` or ``.yml``)."""
    text, syntax = read_file(path)
    return parse_operator_config(text, source=os.fspath(path), syntax=syntax, env=env, needed=needed)


def _check(
    config: OperatorConfig, env: Mapping[str, str], problems: Problems, needed: list[EnvVariable] | None
) -> None:
    check_rules(config, "", problems)
    if not config.servers and not problems.failed("servers"):
        problems.add("servers", "required: at least one [[servers]] entry for scalers to name")
    seen: dict[str, str] = {}
    for index, entry in enumerate(config.servers):
        path = f"servers[{index}]"
        _check_server(path, entry, env, problems, needed)
        name = f"{path}.name"
        if not problems.failed(name):
            earlier = seen.setdefault(entry.name, name)
            if earlier != name:
                problems.add(name, f"duplicate server name {show(entry.name)} (also at {earlier})")


def _check_server(
    path: str,
    entry: ServerEntry,
    env: Mapping[str, str],
    problems: Problems,
    needed: list[EnvVariable] | None,
) -> None:
    """Each key's problem beyond its rule, unless reading or the rules already reported that key (a wrong
    type, a missing name)."""
    found = [
        _token_problem(entry, env, None if needed is None else (needed, f"{path}.token_env")),
        *_tls_problems(entry),
    ]
    # Judged before adding any: a problem about the entry as a whole is no reason to hide its keys'.
    keep = [
        (here, problem)
        for key, problem in found
        if problem is not None and not problems.failed(here := f"{path}.{key}" if key else path)
    ]
    for here, problem in keep:
        problems.add(here, problem)


def _token_problem(
    entry: ServerEntry, env: Mapping[str, str], listing: tuple[list[EnvVariable], str] | None
) -> tuple[str, str | None]:
    """The key at fault and its problem: at most one of ``token_env`` (set in ``env``, unless the
    variables are being ``listing``: into that list, under that key) and ``token_file`` (readable, not
    empty), and one of them unless a client certificate stands in for the token (the server then gives
    the operator the role its ``[[auth.certs]]`` maps the certificate to; whether that certificate is
    usable is :func:`_tls_problems`' to say)."""
    if entry.token_env is not None and entry.token_file is not None:
        return "token_file", "token_env and token_file are exclusive: set one"
    if entry.token_env is not None:
        if check_env_name(entry.token_env) is not None:  # not a variable's name: the key's rule says so
            return "token_env", None
        is_set = bool(env.get(entry.token_env, "").strip())
        if listing is not None:
            listing[0].append(EnvVariable(listing[1], entry.token_env, is_set))
        elif not is_set:
            return "token_env", f"environment variable {entry.token_env} is not set"
        return "token_env", None
    if entry.token_file is not None:
        return "token_file", check_token_file(entry.token_file)
    if entry.cert_file is not None or entry.key_file is not None:
        return "", None
    return "", (
        "set token_env or token_file (a token with the metrics role), or cert_file and key_file "
        "(a client certificate the server maps to the metrics role): what the operator reads with"
    )


def _tls_problems(entry: ServerEntry) -> list[tuple[str, str | None]]:
    """The problems of ``ca_file``, ``cert_file`` and ``key_file``: https:// only, the certificate and
    its key set together, and every file usable."""
    if not entry.url.startswith("https://"):
        given = {"ca_file": entry.ca_file, "cert_file": entry.cert_file, "key_file": entry.key_file}
        return [(key, "only used with an https:// url") for key, path in given.items() if path is not None]
    found: list[tuple[str, str | None]] = []
    if entry.ca_file is not None:
        found.append(("ca_file", check_ca_file(entry.ca_file)))
    if entry.cert_file is not None and entry.key_file is not None:
        cert_problem, key_problem = check_client_certificate(entry.cert_file, entry.key_file)
        found += [("cert_file", cert_problem), ("key_file", key_problem)]
    elif entry.key_file is not None:
        found.append(("cert_file", "required with key_file (the client certificate of that key)"))
    elif entry.cert_file is not None:
        found.append(("key_file", "required with cert_file (the client certificate's private key)"))
    return found


def read_token_file(path: str) -> str:
    """The token in a file (a mounted Secret key), without the trailing newline editors add; OSError
    when unreadable, ValueError when empty."""
    token = Path(path).read_text(encoding="utf-8").strip()
    if not token:
        raise ValueError(f"{path} is empty")
    return token


def check_token_file(path: str) -> str | None:
    try:
        read_token_file(path)
    except (OSError, UnicodeDecodeError, ValueError) as err:
        return f"cannot read a token from {path} ({err})"
    return None


def check_ca_file(path: str) -> str | None:
    try:
        ssl.create_default_context(cafile=path)
    except (OSError, ssl.SSLError) as err:
        return f"not a readable PEM CA certificate: {path} ({err})"
    return None


def check_client_certificate(cert_file: str, key_file: str) -> tuple[str | None, str | None]:
    """The problems of ``cert_file`` and of ``key_file`` (None: none): each readable, the first holding
    a PEM certificate (chain), the second that certificate's private key, PEM and unencrypted (gRPC
    takes no passphrase). OpenSSL's own errors say little ("PEM lib"), so each is said here."""
    cert_problem = _unreadable(cert_file)
    key_problem = _unreadable(key_file)
    if cert_problem is None:
        try:
            pem = Path(cert_file).read_bytes().decode("ascii", "replace")
            ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_verify_locations(cadata=pem)
        except (OSError, ssl.SSLError):
            cert_problem = f"not a PEM certificate: {cert_file}"
    if cert_problem is None and key_problem is None:
        try:
            ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT).load_cert_chain(
                cert_file, key_file, password=_no_passphrase
            )
        except (OSError, ssl.SSLError) as err:
            if getattr(err, "reason", None) == "KEY_VALUES_MISMATCH":
                key_problem = f"not the private key of cert_file {cert_file}: {key_file}"
            else:
                key_problem = f"not an unencrypted PEM private key: {key_file}"
    return cert_problem, key_problem


def _unreadable(path: str) -> str | None:
    try:
        Path(path).read_bytes()
    except OSError as err:
        return f"cannot read {path} ({err.strerror or err})"
    return None


def _no_passphrase() -> bytes:
    """Asked for an encrypted key's passphrase: none, so that loading fails at once instead of OpenSSL
    prompting for one (and waiting, when there is a terminal)."""
    return b""
