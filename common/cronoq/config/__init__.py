"""The configuration file shared by every cronoq process (server, router, CLI checks).

The file is TOML (``cronoq.toml``) or YAML (``cronoq.yaml``, ``cronoq.yml``), chosen by its extension
(:mod:`cronoq.config.syntax`); both are read into the same model with the same checks and messages.

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
    TelemetrySection,
    TlsSection,
    TokenBucketResource,
    TokenSection,
    WebhookScaler,
    default_config,
)
from .problems import ConfigError, Problem, Problems
from .reader import read_text
from .syntax import SYNTAXES, Syntax, read_file, syntax_of
from .validate import EnvVariable, check_config, validate_config

__all__ = [
    "SYNTAXES",
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
    "Syntax",
    "TelemetrySection",
    "TlsSection",
    "TokenBucketResource",
    "TokenSection",
    "WebhookScaler",
    "default_config",
    "load_config",
    "parse_config",
    "read_config",
    "syntax_of",
    "validate_config",
]


def read_config(text: str, *, source: str = "<string>", syntax: Syntax = "toml") -> Config:
    """The config in ``text`` with keys and types checked but not validated (secrets unresolved)."""
    problems = Problems()
    config = read_text(Config, text, syntax, problems)
    if config is None or problems:
        raise problems.error(source)
    return config


def parse_config(
    text: str,
    *,
    source: str = "<string>",
    syntax: Syntax = "toml",
    env: Mapping[str, str] | None = None,
    shard: str | None = None,
    insecure_no_auth: bool = False,
    router: bool = False,
    needed: list[EnvVariable] | None = None,
) -> Config:
    """Read, override and validate in one go, reporting the problems of every stage together.

    ``source`` names the text in the error; ``syntax`` is ``"toml"`` or ``"yaml"``; ``env`` is where
    ``token_env``/``url_env`` are looked up (default: the process environment); ``shard`` and
    ``insecure_no_auth`` are the command-line flags; ``router=True`` is for ``cronoq-router``, which
    ignores ``[store]`` and sends no webhook, so it needs neither's secrets. ``needed`` is for
    ``--check``: the variables secrets are read from are listed there, and unset ones are not problems
    (see :func:`~cronoq.config.validate.check_config`).
    """
    problems = Problems()
    config = read_text(Config, text, syntax, problems)
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
    """:func:`parse_config` on a file (UTF-8; a byte-order mark left by some editors is ignored), in the
    syntax its extension names: ``.toml``, ``.yaml`` or ``.yml`` (any other is a :class:`ConfigError`)."""
    text, syntax = read_file(path)
    return parse_config(
        text,
        source=os.fspath(path),
        syntax=syntax,
        env=env,
        shard=shard,
        insecure_no_auth=insecure_no_auth,
        router=router,
        needed=needed,
    )
