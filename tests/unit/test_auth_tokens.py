"""Bearer tokens and roles without a server: digests, constant-time comparison, header parsing, which
role covers which call, the config errors about tokens, and what a pool-scoped snapshot shows."""

from __future__ import annotations

import contextlib
import hashlib
import hmac
from collections.abc import Callable

import pytest

from cronoq.auth import ANONYMOUS_ADMIN, Authenticator, Principal, Role, TokenEntry
from cronoq.config import ConfigError, parse_config
from cronoq.engine.snapshot import EngineSnapshot, PoolStats, Totals
from cronoq.errors import PermissionDenied, Unauthenticated
from shard.service import scoped_snapshot

TOKENS = {role: f"{role.value}-token-0123456789abcdef" for role in Role}
AUTH = Authenticator([TokenEntry(token, role) for role, token in TOKENS.items()])


def test_tokens_are_kept_only_as_sha256_digests() -> None:
    kept = [digest for digest, _ in AUTH._table]
    assert kept == [hashlib.sha256(t.encode()).digest() for t in TOKENS.values()]
    everything = repr(vars(AUTH)) + repr(AUTH._table)
    assert not any(token in everything for token in TOKENS.values())
    assert TOKENS[Role.ADMIN] not in repr(TokenEntry(TOKENS[Role.ADMIN], Role.ADMIN))


def test_every_configured_digest_is_compared_in_constant_time(monkeypatch: pytest.MonkeyPatch) -> None:
    """The first entry matching does not end the loop early: timing tells neither whether nor where."""
    calls: list[tuple[bytes, bytes]] = []
    real: Callable[[bytes, bytes], bool] = hmac.compare_digest

    def counting(a: bytes, b: bytes) -> bool:
        calls.append((a, b))
        return real(a, b)

    monkeypatch.setattr(hmac, "compare_digest", counting)
    for presented in (TOKENS[Role.CLIENT], "an-unknown-token-0123456789"):
        calls.clear()
        with contextlib.suppress(Unauthenticated):
            AUTH.authenticate(f"Bearer {presented}")
        assert len(calls) == len(TOKENS)
        assert all(b == hashlib.sha256(presented.encode()).digest() for _, b in calls)


@pytest.mark.parametrize(
    ("header", "message"),
    [
        (None, "missing credentials"),
        ("", "missing credentials"),
        ("Basic dXNlcjpwYXNz", "malformed authorization header"),
        ("Bearer", "malformed authorization header"),
        ("Bearer    ", "malformed authorization header"),
        ("Bearer not-a-configured-token-at-all", "unknown token"),
    ],
)
def test_missing_malformed_and_unknown_credentials_are_unauthenticated(
    header: str | None, message: str
) -> None:
    with pytest.raises(Unauthenticated, match=message) as err:
        AUTH.authenticate(header)
    assert "not-a-configured-token" not in err.value.message  # never echoed back


def test_the_scheme_is_case_blind_and_surrounding_space_ignored() -> None:
    token = TOKENS[Role.WORKER]
    for header in (f"Bearer {token}", f"bearer {token}", f"  BEARER   {token}  "):
        assert AUTH.authenticate(header).role is Role.WORKER


@pytest.mark.parametrize("held", list(Role))
@pytest.mark.parametrize("needed", list(Role))
def test_each_call_needs_one_role_and_admin_covers_all(held: Role, needed: Role) -> None:
    header = f"Bearer {TOKENS[held]}"
    if held is Role.ADMIN or held is needed:
        assert AUTH.require(header, needed).role is held
    else:
        with pytest.raises(PermissionDenied, match=f"a {held.value} credential .* needs {needed.value}"):
            AUTH.require(header, needed)


def test_without_credentials_every_caller_is_an_unrestricted_admin() -> None:
    off = Authenticator([])
    assert not off.enabled
    assert off.require(None, Role.WORKER) is ANONYMOUS_ADMIN
    assert off.require("Bearer anything-at-all-really", Role.ADMIN) is ANONYMOUS_ADMIN
    assert ANONYMOUS_ADMIN.pools is None and ANONYMOUS_ADMIN.may_use_pool("any")


def test_pool_scope() -> None:
    scoped = Principal(Role.CLIENT, pools=frozenset({"a"}))
    assert scoped.may_use_pool("a") and not scoped.may_use_pool("b")
    assert Principal(Role.CLIENT).may_use_pool("b")


# ---------------------------------------------------------------------------------- config


@pytest.mark.parametrize(
    ("body", "env", "key", "problem"),
    [
        ("token = 'short-secret'", {}, "auth.tokens[0].token", "at least 16 characters"),
        ("token_env = 'T'", {"T": "short-secret"}, "auth.tokens[0].token_env", "at least 16 characters"),
        ("token = 'padded-secret-0123456789 '", {}, "auth.tokens[0].token", "whitespace"),
    ],
)
def test_bad_tokens_are_config_errors_that_do_not_show_them(
    body: str, env: dict[str, str], key: str, problem: str
) -> None:
    with pytest.raises(ConfigError) as err:
        parse_config(f"[[auth.tokens]]\n{body}\nrole = 'client'\n", env=env)
    text = str(err.value)
    assert key in text and problem in text
    assert "secret" not in text


def test_every_missing_token_variable_is_named_at_once() -> None:
    body = "".join(
        f"[[auth.tokens]]\ntoken_env = '{name}'\nrole = 'client'\n" for name in ("T_ONE", "T_TWO", "T_SET")
    )
    with pytest.raises(ConfigError) as err:
        parse_config(body, env={"T_SET": "a-token-that-is-long-enough"})
    text = str(err.value)
    assert "T_ONE is not set" in text and "T_TWO is not set" in text and "T_SET" not in text


def test_non_loopback_listeners_need_credentials_or_insecure_no_auth() -> None:
    open_bind = "[server]\ngrpc_addr = '0.0.0.0:7070'\n"
    with pytest.raises(ConfigError, match="insecure_no_auth"):
        parse_config(open_bind, env={})
    assert parse_config(open_bind, env={}, insecure_no_auth=True).server.insecure_no_auth
    with_token = open_bind + "[[auth.tokens]]\ntoken_env = 'T'\nrole = 'client'\n"
    assert parse_config(with_token, env={"T": "a-token-that-is-long-enough"}).auth.tokens


# -------------------------------------------------------------------------------- snapshot


def pool_stats(name: str, busy: int, pending: int, workers: int) -> PoolStats:
    return PoolStats(
        name, 8, busy, 0, 0, [pending, 0, 0, 0], 0, 5, 4, 1, 1.0, 1.0, 0.5, 1.0, 0, 0, 0, 0.0, workers
    )


def test_a_scoped_snapshot_shows_its_pools_and_no_process_wide_figures() -> None:
    snap = EngineSnapshot(
        [pool_stats("a", 1, 2, 3), pool_stats("b", 10, 20, 30)],
        live_tasks=99,
        running=11,
        pending=22,
        totals=Totals(submitted=50, succeeded=40),
        workers_connected=33,
    )
    mine = scoped_snapshot(snap, frozenset({"a"}))
    assert [p.name for p in mine.pools] == ["a"]
    assert (mine.running, mine.pending, mine.workers_connected) == (1, 2, 3)
    assert (mine.live_tasks, mine.totals) == (0, Totals())
    assert [p.name for p in snap.pools] == ["a", "b"]  # the engine's snapshot is left as it was
