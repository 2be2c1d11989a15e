"""Certificates for the operator's TLS unit tests (its configuration's file checks, its mTLS channels),
made with :mod:`tests.pki`; :mod:`conftest` makes them once per session as the ``pki`` fixture."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from tests.pki import issue, new_ca, openssl


@dataclass(frozen=True)
class OperatorPki:
    ca: Path
    server: tuple[Path, Path]  # (certificate, key) for 127.0.0.1
    operator: tuple[Path, Path]  # the operator's client certificate: DNS:cronoq-operator.cronoq.svc
    other: tuple[Path, Path]  # another client certificate of the same CA: DNS:other.cronoq.svc
    encrypted_key: Path  # the operator's key, encrypted with a passphrase


def make_pki(directory: Path) -> OperatorPki:
    ca, ca_key = new_ca(directory / "ca.pem", directory / "ca.key", "operator unit test CA")
    operator = issue(
        directory, "operator", "/CN=cronoq-operator", "DNS:cronoq-operator.cronoq.svc", ca, ca_key
    )
    encrypted = directory / "encrypted.key"
    openssl("pkey", "-in", str(operator[1]), "-aes128", "-passout", "pass:secret", "-out", str(encrypted))
    return OperatorPki(
        ca,
        issue(directory, "server", "/CN=127.0.0.1", "IP:127.0.0.1", ca, ca_key),
        operator,
        issue(directory, "other", "/CN=other", "DNS:other.cronoq.svc", ca, ca_key),
        encrypted,
    )
