"""Where to connect and how: targets, channels, credentials, gRPC errors and shard redirects.

``Client`` and ``Worker`` accept the same target spellings (``host:port``, ``http://``, ``https://``,
``grpc://``) and options, so both build their channels here.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

import grpc

from cronoq.errors import ApiError, FailedPrecondition, error_for
from cronoq.hosts import is_loopback_name
from cronoq.transport import SHARD_ENDPOINT_KEY

ChannelOptions = Sequence[tuple[str, Any]]
Metadata = tuple[tuple[str, str], ...]

# Options naming the configured server; they would break TLS host checks against another shard.
HOST_BOUND_OPTIONS = frozenset({"grpc.ssl_target_name_override", "grpc.default_authority"})


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A gRPC address (``host:port``) and whether the channel to it uses TLS."""

    address: str
    secure: bool

    @classmethod
    def parse(cls, target: str, *, secure: bool) -> Endpoint:
        """Strips a scheme prefix; ``https://`` always means TLS, the others leave ``secure`` as given."""
        for prefix in ("https://", "http://", "grpc://"):
            if target.startswith(prefix):
                return cls(target[len(prefix) :].rstrip("/"), secure or prefix == "https://")
        return cls(target.rstrip("/"), secure)


def open_channel(endpoint: Endpoint, credentials: Any, options: ChannelOptions) -> Any:
    """A ``grpc.aio`` channel bound to the running event loop."""
    if endpoint.secure:
        creds = credentials if credentials is not None else grpc.ssl_channel_credentials()
        return grpc.aio.secure_channel(endpoint.address, creds, options=list(options))
    return grpc.aio.insecure_channel(endpoint.address, options=list(options))


def auth_metadata(token: str | None) -> Metadata:
    """Sent with every call instead of call credentials, which gRPC refuses on plain channels."""
    return (("authorization", f"Bearer {token}"),) if token else ()


def api_error(err: Any) -> ApiError:
    """The :class:`~cronoq.errors.ApiError` subclass for an ``AioRpcError``, by lower-case status name."""
    code: str = err.code().name.lower()
    return error_for(code, err.details() or "")


def shard_endpoint(err: Any) -> str | None:
    """The redirect URL a shard attaches to FAILED_PRECONDITION: trailing metadata first, then initial."""
    for metadata in (err.trailing_metadata(), err.initial_metadata()):
        for key, value in metadata or ():
            if key == SHARD_ENDPOINT_KEY:
                return value if isinstance(value, str) else bytes(value).decode()
    return None


def follow_redirect(current: Endpoint, url: str, *, sends_token: bool, allow_http: bool) -> Endpoint:
    """The endpoint a shard redirect points to, or FailedPrecondition when following it would be unsafe.

    A redirect comes from the network, so it must not strip TLS, smuggle credentials in the URL, or make
    the worker send its token in the clear to another machine.
    """
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - validates the port, which urlsplit otherwise parses lazily
    except ValueError as err:
        raise _refused(url, f"it is not a valid URL ({err})") from None
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise _refused(url, "it is not an http:// or https:// URL with a host")
    if "@" in parts.netloc:
        raise _refused(url, "it carries user information")
    secure = parts.scheme == "https"
    if current.secure and not secure:
        raise _refused(url, "it would downgrade the connection from TLS to plain http")
    if not secure and sends_token and not allow_http and not is_loopback_name(parts.hostname or ""):
        raise _refused(
            url,
            "it would send the token over plain http to another host "
            "(pass insecure_redirect_http=True on trusted networks)",
        )
    return Endpoint(parts.netloc, secure)


def _refused(url: str, why: str) -> ApiError:
    return FailedPrecondition(f"refusing shard redirect to {url!r}: {why}")
