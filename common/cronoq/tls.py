"""TLS for the listeners of a server or a router, from ``[server.tls]``.

gRPC and HTTP share one certificate. With ``client_ca_path`` (mTLS) gRPC refuses any connection without
a certificate signed by that CA; HTTP asks for one and verifies what it gets, but cannot refuse at the
handshake because Kubernetes probes (``/healthz``, ``/readyz``) present none, so the HTTP gateway
refuses every other route without a verified client certificate instead.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from cronoq.config.model import TlsSection


@dataclass(slots=True, frozen=True)
class ServerTls:
    grpc_credentials: Any  # grpc.ServerCredentials
    ssl_context: ssl.SSLContext
    client_certs_required: bool


def _read(key: str, path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as err:
        raise OSError(f"server.tls.{key}: cannot read {path} ({err.strerror})") from err


def load_server_tls(section: TlsSection) -> ServerTls:
    """Credentials for both listeners; unreadable or invalid files are errors naming their key."""
    cert = _read("cert_path", section.cert_path)
    key = _read("key_path", section.key_path)
    ca = _read("client_ca_path", section.client_ca_path) if section.client_ca_path else None
    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    context.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        context.load_cert_chain(section.cert_path, section.key_path)
    except ssl.SSLError as err:
        raise OSError(
            f"server.tls.cert_path/key_path: not a usable certificate and key ({err.reason})"
        ) from err
    if section.client_ca_path is not None:
        try:
            context.load_verify_locations(section.client_ca_path)
        except ssl.SSLError as err:
            raise OSError(f"server.tls.client_ca_path: not a usable CA certificate ({err.reason})") from err
        context.verify_mode = ssl.CERT_OPTIONAL
    credentials = grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=ca, require_client_auth=ca is not None
    )
    return ServerTls(credentials, context, client_certs_required=ca is not None)
