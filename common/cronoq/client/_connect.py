"""Where to connect and how: targets, channels, credentials, gRPC errors and shard redirects.

``Client`` and ``Worker`` accept the same target spellings (``host:port``, ``http://``, ``https://``,
``grpc://``) and options, so both build their channels here.
"""

from __future__ import annotations

import contextlib
import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any
from urllib.parse import SplitResult, urlsplit

from cronoq.errors import ApiError, FailedPrecondition
from cronoq.hosts import is_loopback_name
from cronoq.transport import (
    SHARD_ENDPOINT_KEY,
    SHARD_ENDPOINTS_KEY,
    ChannelOptions,
    Endpoint,
    Metadata,
    metadata_text,
)

# Options naming the configured server; they would break TLS host checks against another shard.
HOST_BOUND_OPTIONS = frozenset({"grpc.ssl_target_name_override", "grpc.default_authority"})

# What every SDK channel (Client and Worker) sets unless the caller's ``options`` name the same key.
#
# A server sends messages up to its ``limits.max_message_bytes``, which may be above grpc's 4 MiB default
# receive limit: with that default a large lease would end the worker's stream at every dispatch and a
# large output could never be read. The server bounds what it sends, so the SDK takes whatever arrives
# (-1: no limit).
#
# HTTP/2 keepalive while a call is open (grpc pings only on a connection with a call, unless
# ``grpc.keepalive_permit_without_calls`` is set). Without it a worker attached to a server that froze,
# or that a partition cut off, waits for leases forever, and after a failover the new leader has no
# workers; a producer's Wait or Watch hangs the same way. With it the call fails UNAVAILABLE (and a
# worker reconnects). A ping every 20 s, answered within 10 s: cronoq servers accept pings down to 5 s
# apart on a quiet connection (``grpc.http2.min_ping_interval_without_data_ms`` in
# ``cronoq.api.limits.grpc_server_options``), so they never answer these with GOAWAY too_many_pings. grpc
# core (1.85) does not close the connection promptly on ``keepalive_timeout_ms`` alone (measured: 11 s
# for a 0.1 s timeout; the server found the same), so ``grpc.http2.ping_timeout_ms`` gets the same
# value. ``max_pings_without_data`` 0 lifts grpc's cap on pings sent while no message flows (2 by
# default), since a worker with no lease sends nothing.
#
# Reconnection: while a channel is down, grpc waits longer and longer between connection attempts (up to
# 120 s by default) and fails calls at once meanwhile, so a producer whose server was away for a few
# minutes went on failing UNAVAILABLE for up to two minutes after it came back. 5 s at most between
# attempts bounds that, for one connection attempt every 5 s at worst.
#
# Each Client and Worker has a connection of its own (grpc otherwise shares one between channels to the
# same target with the same options): a server holds back calls beyond
# ``server.grpc_max_streams_per_connection`` (1,000) on one connection, so a producer with more calls
# in flight spreads them over several Clients, and a worker's stream never waits behind them.
CHANNEL_DEFAULTS: ChannelOptions = (
    ("grpc.max_receive_message_length", -1),
    ("grpc.use_local_subchannel_pool", 1),
    ("grpc.max_reconnect_backoff_ms", 5_000),
    ("grpc.keepalive_time_ms", 20_000),
    ("grpc.keepalive_timeout_ms", 10_000),
    ("grpc.http2.ping_timeout_ms", 10_000),
    ("grpc.http2.max_pings_without_data", 0),
)


def with_defaults(options: ChannelOptions, defaults: ChannelOptions) -> ChannelOptions:
    """``options`` followed by each default whose key they do not set, so the caller's value wins."""
    given = {key for key, _ in options}
    return (*options, *(option for option in defaults if option[0] not in given))


def auth_metadata(token: str | None) -> Metadata:
    """Sent with every call instead of call credentials, which gRPC refuses on plain channels."""
    return (("authorization", f"Bearer {token}"),) if token else ()


# ------------------------------------------------------------------------------------- shard redirects

DEFAULT_PORTS = {"http": 80, "https": 443}
# A host name as redirect_allow takes it (lower-case already): dot-separated labels, no port.
_HOST_NAME = re.compile(r"[a-z0-9_-]+(\.[a-z0-9_-]+)*")


@dataclass(frozen=True, slots=True)
class Origin:
    """Where a URL connects (scheme, host, port): what redirects are compared by.

    The host is lower-case without a trailing dot (an IP address in its canonical form), the port the
    scheme's default when the URL names none, so ``https://Shard-B.:443/`` and ``https://shard-b`` are
    one origin."""

    scheme: str
    host: str
    port: int

    @classmethod
    def of(cls, url: str) -> Origin:
        """ValueError, saying why, for anything but an ``http://`` or ``https://`` URL with a host."""
        return cls.of_parts(_split(url))

    @classmethod
    def of_parts(cls, parts: SplitResult) -> Origin:
        """The origin of a URL :func:`_split` accepted."""
        port = parts.port
        return cls(
            parts.scheme,
            _canonical(parts.hostname or ""),
            DEFAULT_PORTS[parts.scheme] if port is None else port,
        )

    def __str__(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{self.scheme}://{host}:{self.port}"


@dataclass(frozen=True, slots=True)
class Redirect:
    """A shard redirect as received: the URL to go to, and the origins of every URL the server gives
    that shard (None from a server that does not say: a reference server, or an older one)."""

    url: str
    named: frozenset[Origin] | None


def shard_redirect(err: Any) -> Redirect | None:
    """The redirect a shard attaches to FAILED_PRECONDITION (trailing metadata first, then initial), or
    None when the error is not one."""
    url = _metadata_text(err, SHARD_ENDPOINT_KEY)
    if url is None:
        return None
    listed = _metadata_text(err, SHARD_ENDPOINTS_KEY)
    return Redirect(url, None if listed is None else _origins(listed))


def _metadata_text(err: Any, key: str) -> str | None:
    for metadata in (err.trailing_metadata(), err.initial_metadata()):
        for name, value in metadata or ():
            if name == key:
                return metadata_text(value)
    return None


def _origins(listed: str) -> frozenset[Origin]:
    """The origins of a comma-separated list of URLs. An entry that is no http(s) URL is left out: it
    names nowhere a worker could go, and leaving it out only narrows where it may go."""
    found: set[Origin] = set()
    for entry in listed.split(","):
        with contextlib.suppress(ValueError):
            found.add(Origin.of(entry.strip()))
    return frozenset(found)


def _split(url: str) -> SplitResult:
    """``url`` split, or ValueError saying why it is no ``http://`` or ``https://`` URL with a host."""
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - validates the port, which urlsplit otherwise parses lazily
    except ValueError as err:
        raise ValueError(f"it is not a valid URL ({err})") from None
    if parts.scheme not in DEFAULT_PORTS or not parts.hostname:
        raise ValueError("it is not an http:// or https:// URL with a host")
    return parts


def _canonical(host: str) -> str:
    """A host as origins compare it: lower-case, no trailing dot, an IP address in its canonical form."""
    host = host.lower().rstrip(".")
    try:
        return str(ipaddress.ip_address(host))
    except ValueError:
        return host


def _address_host(address: str) -> str:
    """The host of a gRPC ``host:port`` address (``[v6]:port`` too), canonical; "" when it has none."""
    try:
        return _canonical(urlsplit(f"//{address}").hostname or "")
    except ValueError:
        return ""


@dataclass(frozen=True, slots=True)
class AllowedHost:
    """One ``redirect_allow`` entry: an ``http(s)://`` URL admits that scheme, host and port; a host
    alone admits it on any port. A host written ``*.suffix`` stands for every name under ``suffix``
    (not ``suffix`` itself), kept here as ``.suffix``."""

    host: str
    scheme: str | None = None
    port: int | None = None

    @classmethod
    def parse(cls, entry: str) -> AllowedHost:
        """ValueError, saying why, for anything else (a bare ``*`` too: it would admit every host)."""
        if "://" in entry:
            parts = _split(entry)
            if "@" in parts.netloc or parts.path not in ("", "/") or parts.query or parts.fragment:
                raise ValueError("a URL here names a scheme, host and port, and nothing else")
            origin = Origin.of_parts(parts)
            return cls(_host_pattern(origin.host), origin.scheme, origin.port)
        return cls(_host_pattern(_canonical(entry.removeprefix("[").removesuffix("]"))))

    def admits(self, origin: Origin) -> bool:
        if self.scheme is not None and (self.scheme, self.port) != (origin.scheme, origin.port):
            return False
        if self.host.startswith("."):
            return origin.host.endswith(self.host)
        return origin.host == self.host


def _host_pattern(host: str) -> str:
    """A canonical host as :class:`AllowedHost` keeps it (``*.suffix`` as ``.suffix``), or ValueError."""
    with contextlib.suppress(ValueError):
        return str(ipaddress.ip_address(host))
    name = host.removeprefix("*.")
    if not _HOST_NAME.fullmatch(name):
        raise ValueError(
            "expected an http:// or https:// URL, a host name, or *.suffix for the names under it"
        )
    return f".{name}" if name != host else name


def allowed_hosts(entries: Iterable[str] | None) -> tuple[AllowedHost, ...] | None:
    """``Worker(redirect_allow=...)`` parsed; ValueError naming the entry that is not one."""
    if entries is None:
        return None
    if isinstance(entries, str):
        raise ValueError(f"redirect_allow: expected a list of URLs or host names, not a string ({entries!r})")
    parsed: list[AllowedHost] = []
    for i, entry in enumerate(entries):
        try:
            if not isinstance(entry, str):
                raise ValueError("expected a string")
            parsed.append(AllowedHost.parse(entry))
        except ValueError as err:
            raise ValueError(f"redirect_allow[{i}]: {err} (got {entry!r})") from None
    return tuple(parsed)


@dataclass(slots=True)
class Redirects:
    """Whether a worker follows a shard redirect, and where to: its configured target (``home``), its
    options, and the shard URLs that target named.

    A redirect comes from the network, so it must not strip TLS, smuggle credentials in the URL, or
    send the token in the clear to another machine (a loopback URL counts as this machine only when
    ``home`` is on it too: a server's loopback address is a port any local program may hold here).
    And it must lead only where the cluster says its shards are: the worker hands ``home`` its token
    already, so what ``home`` says is trusted, but a shard it was sent to could be sending it anywhere.
    ``named`` is the set of URLs ``home`` last named with a redirect (``SHARD_ENDPOINTS_KEY``), kept
    for the life of the worker and replaced only by ``home``'s next answer: a redirect must lead into
    it. ``allow`` (``redirect_allow``), when given, decides alone instead. A server that names nothing
    (a reference server, or an older one) is followed only to ``home``'s own host.
    """

    home: Endpoint
    sends_token: bool
    allow_http: bool = False
    allow: tuple[AllowedHost, ...] | None = None
    named: frozenset[Origin] | None = None

    def follow(self, current: Endpoint, redirect: Redirect) -> Endpoint:
        """The endpoint ``redirect`` (answered by ``current``) leads to, or FailedPrecondition naming
        the URL and why following it would be unsafe."""
        url = redirect.url
        try:
            parts = _split(url)
        except ValueError as err:
            raise _refused(url, str(err)) from None
        if "@" in parts.netloc:
            raise _refused(url, "it carries user information")
        origin = Origin.of_parts(parts)
        secure = origin.scheme == "https"
        if current.secure and not secure:
            raise _refused(url, "it would downgrade the connection from TLS to plain http")
        if not secure and self.sends_token and not self.allow_http:
            self._check_plain(url, origin)
        if current == self.home and redirect.named is not None:
            self.named = redirect.named
        self._check_named(url, origin)
        return Endpoint(parts.netloc, secure)

    def _check_plain(self, url: str, origin: Origin) -> None:
        """The token may go over plain http only to this machine, and only when ``home`` is on it."""
        if not is_loopback_name(origin.host):
            raise _refused(
                url,
                "it would send the token over plain http to another host "
                "(pass insecure_redirect_http=True on trusted networks)",
            )
        if not is_loopback_name(_address_host(self.home.address)):
            raise _refused(
                url,
                "it would send the token over plain http to a port of this machine, which any local "
                "program may hold, while the configured target is another host "
                "(pass insecure_redirect_http=True on trusted networks)",
            )

    def _check_named(self, url: str, origin: Origin) -> None:
        """The redirect leads where ``allow`` admits, else into ``named``, else to ``home``'s host."""
        if self.allow is not None:
            if not any(entry.admits(origin) for entry in self.allow):
                raise _refused(url, "redirect_allow does not admit it")
        elif self.named is not None:
            if origin not in self.named:
                known = ", ".join(sorted(map(str, self.named))) or "none"
                raise _refused(
                    url, f"it is not one of the shard endpoints the configured target named ({known})"
                )
        elif origin.host != _address_host(self.home.address):
            raise _refused(
                url,
                "the server named no shard endpoints to check it against (an older or a reference "
                "server) and it is not the configured target's host; pass redirect_allow=[...] naming "
                "the shard endpoints workers may follow",
            )


def _refused(url: str, why: str) -> ApiError:
    return FailedPrecondition(f"refusing shard redirect to {url!r}: {why}")
