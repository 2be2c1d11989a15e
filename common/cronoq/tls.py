"""TLS for the listeners of a server or a router, from ``[server.tls]``, and towards other shards, from
``[server.peer_tls]``.

gRPC and HTTP share one certificate. With ``client_ca_path`` (mTLS) gRPC refuses any connection without
a certificate signed by that CA; HTTP asks for one and verifies what it gets, but cannot refuse at the
handshake because Kubernetes probes (``/healthz``, ``/readyz``) present none, so the HTTP gateway
refuses every other route without a verified client certificate instead.

Calls to other shards (forwarding, fan-outs, a router's leader search) use ``https://`` endpoints with
:func:`load_peer_credentials`: the peers' certificates must chain to ``ca_path`` (default: the system
trust store), and ``cert_path``/``key_path`` are presented to peers that require client certificates.
"""

from __future__ import annotations

import ssl
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc

from cronoq.config import Config
from cronoq.config.model import PeerTlsSection, TlsSection


@dataclass(slots=True, frozen=True)
class ServerTls:
    grpc_credentials: Any  # grpc.ServerCredentials
    ssl_context: ssl.SSLContext
    client_certs_required: bool


def _read(key: str, path: str, section: str = "server.tls") -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError as err:
        raise OSError(f"{section}.{key}: cannot read {path} ({err.strerror})") from err


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


def load_peer_credentials(section: PeerTlsSection) -> Any:
    """``grpc.ChannelCredentials`` for ``https://`` peers. The files are read and checked now (gRPC would
    only find a bad one at the first handshake), and an unreadable or invalid one is an error naming
    its key."""
    where = "server.peer_tls"
    ca = _read("ca_path", section.ca_path, where) if section.ca_path else None
    cert = _read("cert_path", section.cert_path, where) if section.cert_path else None
    key = _read("key_path", section.key_path, where) if section.key_path else None
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH)
    if ca is not None:
        try:
            context.load_verify_locations(cadata=ca.decode("ascii", "replace"))
        except (ssl.SSLError, ValueError) as err:
            raise OSError(f"{where}.ca_path: not a usable CA certificate ({_reason(err)})") from err
    if section.cert_path and section.key_path:
        try:
            context.load_cert_chain(section.cert_path, section.key_path)
        except ssl.SSLError as err:
            raise OSError(
                f"{where}.cert_path/key_path: not a usable certificate and key ({_reason(err)})"
            ) from err
    return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)


def peer_credentials(config: Config) -> Any:
    """The credentials for ``https://`` peers: from ``[server.peer_tls]``, else None (system roots)."""
    section = config.server.peer_tls
    return load_peer_credentials(section) if section is not None else None


def _reason(err: Exception) -> str:
    return str(getattr(err, "reason", None) or err)
