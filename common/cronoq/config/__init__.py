"""The ``cronoq.toml`` configuration shared by every cronoq process (server, router, CLI checks).

Reading follows the reference server: read the file (keys and types), apply command-line overrides,
then validate (ranges, cross-references, secrets from the environment)::

    config = load_config(path, shard=args.shard, insecure_no_auth=args.insecure_no_auth)

or in steps, ``validate_config(read_config(text).with_overrides(...))``. Without a file a server runs
``validate_config(default_config().with_overrides(...))``: one pool ``default``, memory store, loopback,
no auth. Overrides go on before validation, since validation is what checks them.
Every failure is a :class:`ConfigError` whose ``problems`` name the exact keys; ``docs/configuration.md``
is the reference of all keys.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

from cronoq.auth import Role
from cronoq.engine.model import Overflow

from .model import (
    AuthSection,
    CertSection,
    Config,
    ExternalScaler,
    GrpcWebSection,
    Limits,
    MemoryStoreSection,
    OutputsSection,
    PeerTlsSection,
    PoolSection,
    PostgresStoreSection,
    Resource,
    RetrySection,
    RouterSection,
    Scaler,
    SemaphoreResource,
    ServerSection,
    ShardSection,
    SqliteStoreSection,
    StoreSection,
    TlsSection,
    TokenBucketResource,
    TokenSection,
    WebhookScaler,
    default_config,
)
from .problems import ConfigError, Problem, Problems
from .reader import read_toml
from .validate import EnvVariable, check_config, validate_config

__all__ = [
    "AuthSection",
    "CertSection",
    "Config",
    "ConfigError",
    "EnvVariable",
    "ExternalScaler",
    "GrpcWebSection",
    "Limits",
    "MemoryStoreSection",
    "OutputsSection",
    "Overflow",
    "PeerTlsSection",
    "PoolSection",
    "PostgresStoreSection",
    "Problem",
    "Resource",
    "RetrySection",
    "Role",
    "RouterSection",
    "Scaler",
    "SemaphoreResource",
    "ServerSection",
    "ShardSection",
    "SqliteStoreSection",
    "StoreSection",
    "TlsSection",
    "TokenBucketResource",
    "TokenSection",
    "WebhookScaler",
    "default_config",
    "load_config",
    "parse_config",
    "read_config",
    "validate_config",
]


def read_config(text: str, *, source: str = "<string>") -> Config:
    """The config in ``text`` with keys and types checked but not validated (secrets unresolved)."""
    problems = Problems()
    config = read_toml(text, problems)
    if config is None or problems:
        raise problems.error(source)
    return config


def parse_config(
    text: str,
    *,
    source: str = "<string>",
    env: Mapping[str, str] | None = None,
    shard: str | None = None,
    insecure_no_auth: bool = False,
    router: bool = False,
    needed: list[EnvVariable] | None = None,
) -> Config:
    """Read, override and validate in one go, reporting the problems of every stage together.

    ``source`` names the text in the error; ``env`` is where ``token_env``/``url_env`` are looked up
    (default: the process environment); ``shard`` and ``insecure_no_auth`` are the command-line flags;
    ``router=True`` is for ``cronoq-router``, which ignores ``[store]`` and sends no webhook, so it
    needs neither's secrets. ``needed`` is for ``--check``: the variables secrets are read from are
    listed there, and unset ones are not problems (see :func:`~cronoq.config.validate.check_config`).
    """
    problems = Problems()
    config = read_toml(text, problems)
    if config is None:
        raise problems.error(source)
    overridden = config.with_overrides(shard, insecure_no_auth)
    checked = check_config(
        overridden, os.environ if env is None else env, problems, router=router, needed=needed
    )
    if problems:
        raise problems.error(source)
    return checked


def load_config(
    path: str | os.PathLike[str],
    *,
    env: Mapping[str, str] | None = None,
    shard: str | None = None,
    insecure_no_auth: bool = False,
    router: bool = False,
    needed: list[EnvVariable] | None = None,
) -> Config:
    """:func:`parse_config` on a file (UTF-8; a byte-order mark left by some editors is ignored)."""
    try:
        with open(path, encoding="utf-8-sig") as file:
            text = file.read()
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError([Problem("", f"cannot read the configuration: {exc}")], os.fspath(path)) from exc
    return parse_config(
        text,
        source=os.fspath(path),
        env=env,
        shard=shard,
        insecure_no_auth=insecure_no_auth,
        router=router,
        needed=needed,
    )
