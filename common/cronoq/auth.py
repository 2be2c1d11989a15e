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
from collections.abc import Iterable, Mapping
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

    def may(self, needed: Role) -> bool:
        return self.role is Role.ADMIN or self.role is needed

    def may_use_pool(self, pool: str) -> bool:
        return self.pools is None or pool in self.pools


ANONYMOUS_ADMIN = Principal(Role.ADMIN)


@dataclass(slots=True, frozen=True)
class TokenEntry:
    """One configured token, already resolved from ``token``/``token_env``."""

    token: str
    role: Role
    pools: frozenset[str] | None = None
    labels: Mapping[str, str] | None = None
    tenant: str | None = None
    name: str = ""


class Authenticator:
    """Maps an ``authorization`` header to a :class:`Principal`."""

    def __init__(self, entries: Iterable[TokenEntry]) -> None:
        self._table: list[tuple[bytes, Principal]] = []
        for i, e in enumerate(entries):
            principal = Principal(e.role, e.pools, e.labels, e.tenant, name=e.name or f"token[{i}]")
            self._table.append((_digest(e.token), principal))

    @property
    def enabled(self) -> bool:
        return bool(self._table)

    def authenticate(self, authorization: str | None) -> Principal:
        """The caller's principal; raises Unauthenticated for a missing or unknown token."""
        if not self._table:
            return ANONYMOUS_ADMIN
        if not authorization:
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

    def require(self, authorization: str | None, role: Role) -> Principal:
        """Authenticate and check the role in one step (the common case for an RPC)."""
        principal = self.authenticate(authorization)
        if not principal.may(role):
            raise PermissionDenied(
                f"a {principal.role.value} credential may not call this; it needs {role.value}"
            )
        return principal


def _digest(token: str) -> bytes:
    return hashlib.sha256(token.encode()).digest()
