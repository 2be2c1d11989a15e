"""Throwaway certificates for the tests that need TLS, made with the openssl command: a CA, and
certificates it issues for a subject and subject alternative names.

They carry the extensions RFC 5280 asks for (key usage on the CA, key identifiers, basic constraints):
Python 3.13's default TLS context verifies strictly (``VERIFY_X509_STRICT``) and refuses certificates
without them, as a real client of a real deployment would."""

from __future__ import annotations

import subprocess
from pathlib import Path


def openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True)


def new_ca(cert: Path, key: Path, name: str) -> tuple[Path, Path]:
    """A self-signed CA called ``name``, valid for a day, written to ``cert`` and ``key``."""
    openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj", f"/CN={name}",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign",
        "-keyout", str(key), "-out", str(cert),
    )  # fmt: skip
    return cert, key


def issue(directory: Path, name: str, subject: str, san: str, ca: Path, ca_key: Path) -> tuple[Path, Path]:
    """A certificate (and its key) for ``subject`` with the subjectAltName ``san``, signed by the CA,
    written to ``directory`` as ``{name}.pem`` and ``{name}.key``."""
    key, csr, cert, ext = (directory / f"{name}.{s}" for s in ("key", "csr", "pem", "ext"))
    ext.write_text(
        f"subjectAltName={san}\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment\n"
        "extendedKeyUsage=serverAuth,clientAuth\nsubjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid,issuer\n"
    )
    openssl("req", "-newkey", "rsa:2048", "-nodes", "-subj", subject, "-keyout", str(key), "-out", str(csr))
    openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(ca), "-CAkey", str(ca_key), "-CAcreateserial",
        "-days", "1", "-out", str(cert), "-extfile", str(ext),
    )  # fmt: skip
    return cert, key
