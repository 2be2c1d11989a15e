"""Bearer-token authentication and role checks, shared by the shard servers and the router.

Tokens are kept only as SHA-256 digests and compared with ``hmac.compare_digest`` against every
configured digest, so neither the token nor its position in the table leaks through timing. With no
credential configured authentication is off and every caller is an unrestricted admin; the config layer
refuses that on non-loopback addresses.
"""

from __future__ import annotations

import enum
import hashlib
import hmac
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from cronoq.errors import PermissionDenied, Unauthenticated


class Role(enum.Enum):
    CLIENT = "client"
    WORKER = "worker"
    METRICS = "metrics"
    ADMIN = "admin"


@dataclass(slots=True, frozen=True)
class Principal:
    """Who is calling: a role, optionally restricted to some pools, labels and a tenant."""

    role: Role
    pools: frozenset[str] | None = None  # None: every pool
    labels: Mapping[str, str] | None = None  # worker labels it may claim; None: any
    tenant: str | None = None
    name: str = "anonymous"
    # Per call, set only where calls may be forwarded to another shard: the caller's own
    # ``authorization`` value, presented again to the shard that owns the call (never logged), and
    # whether this call was itself forwarded (it is then answered here or refused, never forwarded on).
    credential: str = field(default="", repr=False, compare=False)
    forwarded: bool = False
    # Authenticated by a client certificate ([[auth.certs]]): such a caller cannot be forwarded to
    # another shard, because the certificate cannot travel with the call.
    certificate: bool = False

    def may(self, needed: Role) -> bool:
        """Each call needs one role; ``admin`` covers all of them, the others only themselves (the
        table is in docs/configuration.md, "Who may call what")."""
        return self.role is Role.ADMIN or self.role is needed

    def may_use_pool(self, pool: str) -> bool:
        return self.pools is None or pool in self.pools


ANONYMOUS_ADMIN = Principal(Role.ADMIN)


@dataclass(slots=True, frozen=True)
class TokenEntry:
    """One configured token, already resolved from ``token``/``token_env`` (never in its repr)."""

    token: str = field(repr=False)
    role: Role
    pools: frozenset[str] | None = None
    labels: Mapping[str, str] | None = None
    tenant: str | None = None
    name: str = ""


@dataclass(slots=True, frozen=True)
class CertEntry:
    """One configured client-certificate identity: the certificate's DNS SAN and what it may do."""

    dns_name: str
    role: Role
    pools: frozenset[str] | None = None
    labels: Mapping[str, str] | None = None
    tenant: str | None = None
    name: str = ""


class Authenticator:
    """Maps an ``authorization`` header, or else a verified client certificate's DNS names, to a
    :class:`Principal`. A bearer token, when sent, decides alone."""

    def __init__(self, entries: Iterable[TokenEntry], certs: Iterable[CertEntry] = ()) -> None:
        self._table: list[tuple[bytes, Principal]] = []
        for i, e in enumerate(entries):
            principal = Principal(e.role, e.pools, e.labels, e.tenant, name=e.name or f"token[{i}]")
            self._table.append((_digest(e.token), principal))
        self._certs = {
            c.dns_name.lower(): Principal(
                c.role, c.pools, c.labels, c.tenant, name=c.name or f"cert[{i}]", certificate=True
            )
            for i, c in enumerate(certs)
        }

    @property
    def enabled(self) -> bool:
        return bool(self._table or self._certs)

    def authenticate(self, authorization: str | None, cert_names: Sequence[str] = ()) -> Principal:
        """The caller's principal; raises Unauthenticated for a missing or unknown credential.
        ``cert_names`` are the DNS names of the caller's verified client certificate, if any."""
        if not self.enabled:
            return ANONYMOUS_ADMIN
        if not authorization:
            for dns_name in cert_names:
                principal = self._certs.get(dns_name.lower())
                if principal is not None:
                    return principal
            if cert_names:
                raise Unauthenticated("this client certificate names no configured identity ([[auth.certs]])")
            raise Unauthenticated("missing credentials: send 'authorization: Bearer <token>'")
        scheme, _, token = authorization.strip().partition(" ")
        if scheme.lower() != "bearer" or not token.strip():
            raise Unauthenticated("malformed authorization header: expected 'Bearer <token>'")
        digest = _digest(token.strip())
        found: Principal | None = None
        for known, principal in self._table:
            if hmac.compare_digest(known, digest) and found is None:
                found = principal
        if found is None:
            raise Unauthenticated("unknown token")
        return found

    def require(self, authorization: str | None, role: Role, cert_names: Sequence[str] = ()) -> Principal:
        """Authenticate and check the role in one step (the common case for an RPC)."""
        principal = self.authenticate(authorization, cert_names)
        if not principal.may(role):
            raise PermissionDenied(
                f"a {principal.role.value} credential may not call this; it needs {role.value}"
            )
        return principal


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()
