"""What the operator learnt in one round, before deciding anything: a pool's desired capacity or why it
is not known, and a Deployment's replicas or why they are not known.

Each "not known" carries a reason (a CamelCase word, as Kubernetes conditions use, shown by ``kubectl
get``) and a message for people. The reasons are the operator's vocabulary, listed here once.
"""

from __future__ import annotations

from dataclasses import dataclass

from cronoq.client import Snapshot
from cronoq.errors import ApiError, PermissionDenied, Unauthenticated

# Why a scaler did not scale (the status's ``reason`` and the Ready condition's).
INVALID_SPEC = "InvalidSpec"
UNKNOWN_SERVER = "UnknownServer"
SERVER_UNAVAILABLE = "ServerUnavailable"
UNAUTHENTICATED = "Unauthenticated"
PERMISSION_DENIED = "PermissionDenied"
TOKEN_UNREADABLE = "TokenUnreadable"
CERTIFICATE_UNREADABLE = "CertificateUnreadable"
POOL_NOT_REPORTED = "PoolNotReported"
DEPLOYMENT_NOT_FOUND = "DeploymentNotFound"
KUBERNETES_ERROR = "KubernetesError"
# It did: the Deployment has the replicas the pool needs (set now or earlier).
SCALED = "Scaled"

_MESSAGE_LIMIT = 300  # grpc's connection errors run long; a status line should not


@dataclass(frozen=True, slots=True)
class Desired:
    """A pool's desired capacity in slots, as its server reported it."""

    slots: int


@dataclass(frozen=True, slots=True)
class Unknown:
    """Something the operator could not learn, and why."""

    reason: str
    message: str


def unknown(reason: str, message: str) -> Unknown:
    """An :class:`Unknown` whose message is cut to a length a status line can show."""
    if len(message) > _MESSAGE_LIMIT:
        message = message[: _MESSAGE_LIMIT - 3] + "..."
    return Unknown(reason, message)


def server_failure(server: str, err: ApiError, *, identity: str) -> Unknown:
    """Why a server's snapshot could not be read, from the error its call ended with. A refused
    ``identity`` (what the server judged the operator by: its "token", or without one its "client
    certificate") is named as such, since the fix is in the operator's configuration or the server's;
    anything else means the server could not answer (down, a standby, overloaded, no leader for the
    moment, a TLS handshake it refused)."""
    if isinstance(err, Unauthenticated):
        return unknown(UNAUTHENTICATED, f"server {server!r} refused the operator's {identity}: {err.message}")
    if isinstance(err, PermissionDenied):
        return unknown(
            PERMISSION_DENIED,
            f"server {server!r} does not let the operator's {identity} read snapshots "
            f"(it needs the metrics role): {err.message}",
        )
    return unknown(SERVER_UNAVAILABLE, f"server {server!r} did not answer: {err}")


def pool_reading(server: str, pool: str, snapshot: Snapshot | Unknown | None) -> Desired | Unknown:
    """The pool's desired slots from its server's snapshot this round (None: no server of that name is
    configured). A snapshot without the pool leaves it unknown: the pool does not exist there, the
    token may not see it, or its shard could not be reached (named in ``unavailable_shards``), and in
    none of these cases is zero the right answer."""
    if snapshot is None:
        return unknown(
            UNKNOWN_SERVER, f"spec.server: no server named {server!r} in the operator's configuration"
        )
    if isinstance(snapshot, Unknown):
        return snapshot
    for entry in snapshot.pools:
        if entry.name == pool:
            return Desired(entry.desired)
    message = f"server {server!r} does not report pool {pool!r}"
    if snapshot.unavailable_shards:
        message += f" (unreachable shards: {', '.join(snapshot.unavailable_shards)})"
    return unknown(POOL_NOT_REPORTED, message)
