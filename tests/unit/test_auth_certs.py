"""Client-certificate identities ([[auth.certs]]) and why their callers are never forwarded."""

from __future__ import annotations

from dataclasses import replace

import pytest

from cronoq.auth import Authenticator, CertEntry, Principal, Role, TokenEntry
from cronoq.cluster.forward import Peers
from cronoq.cluster.shards import Shard, ShardMap
from cronoq.errors import FailedPrecondition, Unauthenticated

TOKEN = "admin-token-0123456789abcdef"
AUTH = Authenticator(
    [TokenEntry(TOKEN, Role.ADMIN)],
    [CertEntry("worker-1.internal", Role.WORKER, pools=frozenset({"gpu"}), labels={"zone": "a"})],
)


def test_a_certificate_name_is_an_identity_when_no_token_is_sent() -> None:
    caller = AUTH.require(None, Role.WORKER, ["other.internal", "WORKER-1.internal"])  # DNS is case-blind
    assert (caller.role, caller.pools, caller.certificate) == (Role.WORKER, frozenset({"gpu"}), True)
    assert dict(caller.labels or {}) == {"zone": "a"}


def test_a_token_decides_alone_and_unknown_certificates_are_refused() -> None:
    assert AUTH.authenticate(f"Bearer {TOKEN}", ["worker-1.internal"]).role is Role.ADMIN
    with pytest.raises(Unauthenticated, match=r"\[\[auth\.certs\]\]"):
        AUTH.authenticate(None, ["stranger.internal"])
    with pytest.raises(Unauthenticated, match="missing credentials"):
        AUTH.authenticate(None, [])
    assert Authenticator([], [CertEntry("x", Role.CLIENT)]).enabled  # certificates alone turn auth on


def test_a_certificate_caller_is_refused_forwarding_with_the_owners_address() -> None:
    shard = Shard("b", 2, "http://127.0.0.1:7070", frozenset({"gpu"}))
    peers = Peers(ShardMap([shard]), insecure_peer_http=False, timeout=1.0)
    by_cert = AUTH.authenticate(None, ["worker-1.internal"])
    with pytest.raises(FailedPrecondition) as refused:
        peers.check(shard, by_cert, shard.endpoint)
    assert dict(refused.value.metadata) == {
        "cronoq-shard": "b",
        "cronoq-shard-endpoint": shard.endpoint,
        "cronoq-shard-endpoints": shard.endpoint,
    }
    peers.check(shard, replace(Principal(Role.ADMIN), credential=f"Bearer {TOKEN}"), shard.endpoint)
