"""Everything about a config beyond types: ranges, cross-references, listener safety and secrets.

:func:`check_config` runs every rule and adds what fails to a :class:`Problems` collector (so
:func:`cronoq.config.parse_config` can report type and range mistakes of one file together);
:func:`validate_config` is the stand-alone form that raises. Secrets named by ``token_env``,
``url_env`` and a webhook's ``token_env`` are looked up here, in the mapping given (the process
environment by default), so a missing variable is a config error at start-up, not a surprise at the
first request. ``--check`` runs where the secrets often are not (CI): given a ``needed`` list, a variable
that is unset is listed there instead of reported, and a set one is checked as at start-up. Only the
secrets the reading process sends are looked up: the router keeps no store and sends no webhook, and a
shard sends only its own pools' webhooks, so a secret need not be shipped to a process that never uses
it.
"""

from __future__ import annotations

import os
from collections.abc import Hashable, Iterable, Iterator, Mapping
from dataclasses import dataclass, fields, is_dataclass, replace
from typing import TYPE_CHECKING
from urllib.parse import urlsplit

from cronoq.hosts import is_loopback_name

from .model import (
    DEFAULT_URL_ENV,
    PRIORITY_NAMES,
    AuthSection,
    Config,
    PoolSection,
    PostgresStoreSection,
    SqliteStoreSection,
    StoreSection,
    TokenSection,
    WebhookScaler,
)
from .problems import Problems, key_path, show
from .rules import (
    RESOLVED_KEY,
    RULE,
    SHARD_PLACEHOLDER,
    Check,
    Range,
    check_schema_name,
    check_token,
    is_loopback,
)

if TYPE_CHECKING:
    from _typeshed import DataclassInstance


@dataclass(frozen=True, slots=True)
class EnvVariable:
    """An environment variable a process of the configuration reads a secret from at start: the key
    naming it (``auth.tokens[0].token_env``), its name, and whether it was set where the file was
    checked (then its value was checked too)."""

    path: str
    name: str
    set: bool


def validate_config(
    config: Config, *, env: Mapping[str, str] | None = None, source: str = "<config>"
) -> Config:
    """``config`` with its secrets resolved from ``env`` (default: the process environment).

    Raises :class:`~cronoq.config.ConfigError` listing every problem. Apply
    :meth:`Config.with_overrides` first: validation checks the overridden values.
    """
    problems = Problems()
    checked = check_config(config, os.environ if env is None else env, problems)
    if problems:
        raise problems.error(source)
    return checked


def check_config(
    config: Config,
    env: Mapping[str, str],
    problems: Problems,
    *,
    router: bool = False,
    needed: list[EnvVariable] | None = None,
) -> Config:
    """Add every problem of ``config`` to ``problems``; return it with secrets resolved.

    ``router=True`` checks the file as ``cronoq-router`` uses it: it keeps nothing and schedules no
    pool, so ``[store]`` and the webhook scalers' secrets are left alone. With ``needed`` (``--check``)
    every variable a secret is read from is added to it, and one that is unset or empty is no problem:
    its secret stays "", and only start-up refuses it.
    """
    secrets = _Secrets(env, problems, needed)
    check_rules(config, "", problems)
    _check_listeners(config, problems)
    _check_pools(config, problems)
    _check_shards(config, problems)
    _check_resources(config, problems)
    sending = set() if router else _scheduled_pools(config)
    return replace(
        config,
        auth=_resolve_auth(config, secrets, problems),
        store=config.store if router else _resolve_store(config, secrets, problems),
        pools=tuple(
            _resolve_scaler(i, pool, secrets, problems, sends=pool.name in sending)
            for i, pool in enumerate(config.pools)
        ),
    )


def _scheduled_pools(config: Config) -> set[str]:
    """The pools a server of this config schedules, whose webhooks it sends: its own shard's, or all of
    them when unsharded. A sharded file checked without a shard (``--check`` in CI, where one file
    serves every shard) stands for every shard, so it needs what any of them would send."""
    if not config.shards or config.server.shard is None:
        return {pool.name for pool in config.pools}
    return {pool for shard in config.shards if shard.name == config.server.shard for pool in shard.pools}


# ------------------------------------------------------------------------------ per-value rules


def check_rules(section: DataclassInstance, path: str, problems: Problems) -> None:
    """Apply each field's rule (see :mod:`cronoq.config.rules`) throughout the section, recursively
    (any model of a file: the operator's too)."""
    for spec in fields(section):
        if not spec.metadata.get(RESOLVED_KEY):
            _check_value(
                getattr(section, spec.name), spec.metadata.get(RULE), key_path(path, spec.name), problems
            )


def _check_value(value: object, rule: object, path: str, problems: Problems) -> None:
    if value is None or problems.failed(path):
        return
    if is_dataclass(value) and not isinstance(value, type):
        check_rules(value, path, problems)
    elif isinstance(value, tuple):
        for index, item in enumerate(value):
            _check_value(item, rule, f"{path}[{index}]", problems)
    elif isinstance(value, Mapping):
        for key, item in value.items():
            _check_value(item, rule, key_path(path, key), problems)
    elif isinstance(rule, Range) and isinstance(value, int | float) and not isinstance(value, bool):
        _report(rule.problem(value), value, path, problems, secret=False)
    elif isinstance(rule, Check) and isinstance(value, str):
        _report(rule.test(value), value, path, problems, secret=rule.secret)


def _report(problem: str | None, value: object, path: str, problems: Problems, *, secret: bool) -> None:
    if problem is not None:
        problems.add(path, problem if secret else f"{problem} (got {show(value)})")


# ---------------------------------------------------------------------------------- cross-checks


def _unique(
    entries: Iterable[tuple[str, Hashable]], what: str, problems: Problems, *, secret: bool = False
) -> None:
    """Report every entry whose value an earlier entry already has, naming that earlier key."""
    first: dict[Hashable, str] = {}
    for path, value in entries:
        if problems.failed(path):
            continue
        earlier = first.setdefault(value, path)
        if earlier != path:
            named = what if secret else f"{what} {show(value)}"
            problems.add(path, f"duplicate {named} (also at {earlier})")


def _check_listeners(config: Config, problems: Problems) -> None:
    server = config.server
    own = [("server.grpc_addr", server.grpc_addr), ("server.http_addr", server.http_addr)]
    if server.metrics_addr is not None:
        own.append(("server.metrics_addr", server.metrics_addr))
    router = [("router.grpc_addr", config.router.grpc_addr), ("router.http_addr", config.router.http_addr)]
    # Servers and routers are separate processes (usually on separate hosts): each set on its own.
    for listeners in (own, router):
        _unique(((p, a) for p, a in listeners if not a.endswith(":0")), "listener address", problems)
    if not config.auth_enabled and not server.insecure_no_auth:
        for path, address in own + router:
            if not problems.failed(path) and not is_loopback(address):
                problems.add(
                    path,
                    f"{address} is not a loopback address and no credentials are configured: add "
                    "[[auth.tokens]] or [[auth.certs]], or set server.insecure_no_auth = true "
                    "(--insecure-no-auth) on a trusted network only",
                )
    peer = server.peer_tls
    if peer is not None and (peer.cert_path is None) != (peer.key_path is None):
        problems.add("server.peer_tls", "cert_path and key_path go together (a client identity needs both)")
    elif peer is not None and not any(url.startswith("https://") for url in _peer_urls(config)):
        problems.add(
            "server.peer_tls",
            "no [[shards]] endpoint or member (nor [router] endpoint or member) is an https:// URL, so it "
            "would never be used (peers are called over TLS at their https:// endpoints)",
        )
    if config.auth.certs and (server.tls is None or server.tls.client_ca_path is None):
        problems.add(
            "auth.certs", "client certificates are only requested with mTLS: set server.tls.client_ca_path"
        )


def _peer_urls(config: Config) -> Iterator[str]:
    """Every URL a router or a server may call a peer at."""
    for shard in config.shards:
        yield from (shard.endpoint, *shard.members)
    yield from config.router.members
    if config.router.endpoint is not None:
        yield config.router.endpoint


def _check_pools(config: Config, problems: Problems) -> None:
    if not config.pools:
        problems.add(
            "pools", "at least one [[pools]] entry is needed (without [[pools]] there is a pool 'default')"
        )
    _unique(((f"pools[{i}].name", p.name) for i, p in enumerate(config.pools)), "pool name", problems)
    for i, pool in enumerate(config.pools):
        path = f"pools[{i}]"
        if not problems.failed(f"{path}.min", f"{path}.max") and pool.min > pool.max:
            problems.add(f"{path}.min", f"must not exceed max ({pool.min} > {pool.max})")
        for name in pool.slo:
            if name not in PRIORITY_NAMES:
                problems.add(
                    f"{path}.slo.{name}", f"not a priority class (one of {', '.join(PRIORITY_NAMES)})"
                )


def _check_shards(config: Config, problems: Problems) -> None:
    shards = config.shards
    _unique(((f"shards[{i}].name", s.name) for i, s in enumerate(shards)), "shard name", problems)
    _unique(((f"shards[{i}].number", s.number) for i, s in enumerate(shards)), "shard number", problems)
    known = {pool.name for pool in config.pools}
    names_unreadable = problems.failed(*(f"pools[{i}].name" for i in range(len(config.pools))))
    owner: dict[str, str] = {}
    for i, shard in enumerate(shards):
        for j, pool in enumerate(shard.pools):
            path = f"shards[{i}].pools[{j}]"
            if problems.failed(path):
                continue
            if pool not in known:
                if not names_unreadable:  # else it may be the pool whose bad name was reported
                    problems.add(path, f"no [[pools]] entry is named {show(pool)}")
            elif (earlier := owner.setdefault(pool, path)) != path:
                problems.add(path, f"pool {show(pool)} is already assigned at {earlier}")
    if shards:
        for i, section in enumerate(config.pools):
            if section.name not in owner and not problems.failed(f"pools[{i}].name"):
                problems.add(
                    f"pools[{i}].name", f"pool {show(section.name)} is in no [[shards]] entry's pools"
                )
    _check_shard_ref(config, config.server.shard, "server.shard", problems)
    if shards:
        for path, given in (
            ("router.members", config.router.members),
            ("router.endpoint", config.router.endpoint),
        ):
            if given and not problems.failed(path):
                problems.add(
                    path,
                    "only for a cluster without [[shards]]: list a shard's servers in its [[shards]] "
                    "entry (members, endpoint)",
                )


def _check_resources(config: Config, problems: Problems) -> None:
    resources = config.resources
    _unique(((f"resources[{i}].name", r.name) for i, r in enumerate(resources)), "resource name", problems)
    for i, resource in enumerate(resources):
        path = f"resources[{i}].shard"
        if resource.shard is None and config.shards and not problems.failed(f"resources[{i}]"):
            problems.add(path, "required with [[shards]]: name the shard that owns this resource")
        _check_shard_ref(config, resource.shard, path, problems)


def _check_shard_ref(config: Config, name: str | None, path: str, problems: Problems) -> None:
    if name is None or problems.failed(path):
        return
    names = [shard.name for shard in config.shards]
    if not names:
        problems.add(path, f"names shard {show(name)} but no [[shards]] are configured")
    elif name not in names:
        problems.add(path, f"no [[shards]] entry is named {show(name)} (known: {', '.join(names)})")


# ------------------------------------------------------------------------------------------ secrets


class _Secrets:
    """Where one check looks secrets up (see :func:`check_config` for ``needed``)."""

    __slots__ = ("env", "needed", "problems")

    def __init__(self, env: Mapping[str, str], problems: Problems, needed: list[EnvVariable] | None) -> None:
        self.env = env
        self.problems = problems
        self.needed = needed

    def get(self, name: str, path: str) -> str:
        """The variable's value; "" when it is unset or empty, reported as a problem (never its content)
        unless the variables are being listed instead."""
        if self.problems.failed(path):
            return ""
        value = self.env.get(name)
        if self.needed is not None:
            self.needed.append(EnvVariable(path, name, bool(value)))
        elif not value:
            self.problems.add(path, f"environment variable {name} is {'empty' if value == '' else 'not set'}")
        return value or ""


def _resolve_auth(config: Config, secrets: _Secrets, problems: Problems) -> AuthSection:
    auth = config.auth
    tokens = tuple(
        replace(t, resolved_token=_token_value(i, t, secrets, problems)) for i, t in enumerate(auth.tokens)
    )
    values = ((_token_key(i, t), t.resolved_token) for i, t in enumerate(tokens) if t.resolved_token)
    _unique(values, "token", problems, secret=True)
    # Certificate names match case-insensitively, so two spellings of one name would be one credential.
    _unique(
        ((f"auth.certs[{i}].dns_name", c.dns_name.lower()) for i, c in enumerate(auth.certs)),
        "dns_name",
        problems,
    )
    known = {pool.name for pool in config.pools}
    scoped = [(f"auth.tokens[{i}]", t.pools) for i, t in enumerate(auth.tokens)]
    scoped += [(f"auth.certs[{i}]", c.pools) for i, c in enumerate(auth.certs)]
    for path, pools in scoped:
        for j, pool in enumerate(pools or ()):
            if pool not in known and not problems.failed(f"{path}.pools[{j}]"):
                problems.add(f"{path}.pools[{j}]", f"no [[pools]] entry is named {show(pool)}")
    scopes = [(f"auth.tokens[{i}]", t.labels) for i, t in enumerate(auth.tokens)]
    scopes += [(f"auth.certs[{i}]", c.labels) for i, c in enumerate(auth.certs)]
    for path, labels in scopes:
        names = ((f"{path}.labels[{j}]", label.partition("=")[0]) for j, label in enumerate(labels or ()))
        _unique(names, "label", problems)
    return replace(auth, tokens=tokens)


def _token_key(index: int, token: TokenSection) -> str:
    """The key a token came from, so a problem with its value points at the line to change."""
    return f"auth.tokens[{index}].{'token' if token.token is not None else 'token_env'}"


def _token_value(index: int, token: TokenSection, secrets: _Secrets, problems: Problems) -> str:
    path = _token_key(index, token)
    literal, env_name = token.token, token.token_env
    if (literal is None) == (env_name is None):
        problems.add(f"auth.tokens[{index}]", "set exactly one of token and token_env")
        return ""
    if env_name is None:
        return "" if literal is None or problems.failed(path) else literal
    value = secrets.get(env_name, path)
    problem = check_token(value) if value else None
    if problem is not None:
        problems.add(path, f"the token in {env_name} {problem}")
        return ""
    return value


def _resolve_store(config: Config, secrets: _Secrets, problems: Problems) -> StoreSection:
    store = config.store
    if isinstance(store, SqliteStoreSection):
        _check_sqlite_path(config, store, problems)
    if not isinstance(store, PostgresStoreSection):
        return store
    _check_schema(config, store, problems)
    if store.url is not None:
        if store.url_env is not None:
            problems.add("store.url", "set url or url_env, not both")
        return replace(store, resolved_url=store.url)
    return replace(store, resolved_url=secrets.get(store.url_env or DEFAULT_URL_ENV, "store.url_env"))


def _check_sqlite_path(config: Config, store: SqliteStoreSection, problems: Problems) -> None:
    """Every shard needs a file of its own. The servers on one SQLite file are one leader group, so
    the second shard's servers would stand by behind the first shard's leader forever, serving nothing
    while looking healthy: refused, naming the shards."""
    if problems.failed("store.path"):
        return
    if SHARD_PLACEHOLDER in store.path and not config.shards:
        problems.add("store.path", f"uses {SHARD_PLACEHOLDER} but no [[shards]] are configured")
        return
    sharing: dict[str, list[str]] = {}
    for name in dict.fromkeys(shard.name for shard in config.shards):
        sharing.setdefault(os.path.normpath(store.path_for(name)), []).append(name)
    for path, names in sharing.items():
        if len(names) > 1:
            shards = ", ".join(show(name) for name in names[:-1]) + f" and {show(names[-1])}"
            problems.add(
                "store.path",
                f"shards {shards} would share the SQLite file {show(path)}, where only one server "
                "leads: put {shard} in the path to give each shard its own file "
                '(e.g. path = "/var/lib/cronoq/{shard}.db")',
            )


def _check_schema(config: Config, store: PostgresStoreSection, problems: Problems) -> None:
    """Every shard's schema, after ``{shard}`` is replaced, must be a usable Postgres identifier."""
    if problems.failed("store.schema"):
        return
    template = store.schema or ""
    if SHARD_PLACEHOLDER in template and not config.shards:
        problems.add("store.schema", f"uses {SHARD_PLACEHOLDER} but no [[shards]] are configured")
        return
    shards: list[str | None] = [shard.name for shard in config.shards] or [None]
    for shard in shards:
        schema = store.schema_for(shard)
        problem = check_schema_name(schema)
        if problem is not None:
            for_shard = f" for shard {show(shard)}" if shard is not None else ""
            problems.add("store.schema", f"{problem} (the schema{for_shard} would be {show(schema)})")


def _resolve_scaler(
    index: int, pool: PoolSection, secrets: _Secrets, problems: Problems, *, sends: bool
) -> PoolSection:
    """Check the webhook's URL everywhere (it is the file's mistake), but look its token up only where
    ``sends``: in the process that posts for the pool."""
    scaler = pool.scaler
    if not isinstance(scaler, WebhookScaler):
        return pool
    url_key = f"pools[{index}].scaler.url"
    if not problems.failed(url_key):
        parts = urlsplit(scaler.url)
        if parts.scheme == "http" and not is_loopback_name(parts.hostname or ""):
            problems.add(
                url_key,
                f"plain http to {show(parts.hostname or '')} would send the desired capacity (and the "
                "token) in the clear; use https (plain http is accepted only for loopback receivers)",
            )
    if scaler.token_env is None or not sends:
        return pool
    token = secrets.get(scaler.token_env, f"pools[{index}].scaler.token_env")
    return replace(pool, scaler=replace(scaler, resolved_token=token))
