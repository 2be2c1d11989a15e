"""What the serving programs (``cronoq-server``, ``cronoq-router``, ``cronoq-operator``) do alike, once.

- **The command line**: ``--version``, ``-c/--config`` (with its environment variable) and ``--check``
  (:func:`command_line`); running on the chosen event loop, with the open-file limit raised, and a
  start-up failure (a port in use) said in one line (:func:`run`).
- **The checks before serving**, beyond the file's own keys. Reading a configuration
  (:func:`cronoq.config.parse_config`) never touches the filesystem, so it can be tested and reused
  anywhere; a process about to serve also needs the files it names (TLS certificates, the SQLite
  directory) and must refuse settings this version cannot honour. ``--check`` runs these same checks,
  so a file that passes it does not then fail at start-up (:func:`preflight`), with one exception: it
  runs where the secrets often are not (CI), so the environment variables they come from are named as
  notes, and only start-up refuses one that is unset (:func:`secret_notes`).
- **The listeners**: the gRPC server with the ``[limits]`` gate and core options (:func:`grpc_server`,
  :func:`listen_grpc`) and the HTTP/JSON application (:func:`api_app`), as a shard server and a router
  both serve them. The router may not import the shard server, so this lives in the package both share.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Callable, Coroutine, Iterable
from functools import partial
from typing import Any

import grpc
from aiohttp import web
from grpc_health.v1 import health

from cronoq import __version__
from cronoq.api.handler import RequestHandler
from cronoq.api.http_api import build_http_app
from cronoq.api.limits import LimitsInterceptor, RequestLimits, grpc_server_options
from cronoq.config import Config, EnvVariable
from cronoq.config.model import SqliteStoreSection
from cronoq.process import choose_event_loop, raise_open_file_limit
from cronoq.prometheus import Exposition
from cronoq.tls import ServerTls, load_peer_credentials, load_server_tls

# Calls a gRPC listener takes at once beyond the cronoq.v1 ones its LimitsInterceptor counts (health,
# reflection): grpc's own backstop.
UNLIMITED_RPCS = 64

# ------------------------------------------------------------------------------------- command line


def command_line(
    program: str, description: str, config_help: str, config_env: str
) -> argparse.ArgumentParser:
    """The parser every serving program starts from: ``--version``, ``-c/--config`` (default from
    ``config_env``) and ``--check``."""
    p = argparse.ArgumentParser(prog=program, description=description)
    p.add_argument("--version", action="version", version=f"{program} {__version__}")
    p.add_argument(
        "-c",
        "--config",
        metavar="PATH",
        default=os.environ.get(config_env),
        help=f"{config_help} (env {config_env})",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="validate the configuration and the files it names, print every problem, exit 0 if valid "
        "and 1 if not",
    )
    return p


def run(program: str, serve: Callable[[], Coroutine[Any, Any, str | None]]) -> int:
    """Serve on the event loop ``CRONOQ_EVENT_LOOP`` chooses, with the open-file limit raised (every
    connection takes one); the exit status. ``serve`` returns why the process ended on its own, if it
    did; a listener that cannot open (``OSError``) ends it at once, said on stderr."""
    raise_open_file_limit()
    try:
        loop = choose_event_loop()
    except ValueError as err:
        return refuse(f"{program}: cannot start:", [err])
    try:
        failure = loop.run(serve())
    except OSError as err:
        print(f"{program}: cannot start: {err}", file=sys.stderr)
        return 1
    if failure is not None:
        print(f"{program}: stopped: {failure}", file=sys.stderr)
        return 1
    return 0


# ---------------------------------------------------------------------------- checks before serving


def unsupported(config: Config) -> list[str]:
    """One message per setting this version would otherwise ignore.

    Every key of the reference server is accepted so files stay portable, but a process must never
    *silently* ignore a setting a user relies on: gRPC-Web that quietly did nothing would be worse
    than a refusal.
    """
    problems: list[str] = []
    if config.server.grpc_web is not None:
        problems.append("server.grpc_web: not supported by this server version yet")
    return problems


def file_problems(config: Config, *, router: bool = False) -> list[str]:
    """The files the config names that the process could not use, each naming its key.

    TLS files are loaded exactly as start-up loads them (so an invalid certificate is caught too, not
    only a missing one). ``router=True`` skips ``[store]``, which the router ignores.
    """
    problems: list[str] = []
    server = config.server
    loads: list[Callable[[], object]] = []
    if server.tls is not None:
        loads.append(partial(load_server_tls, server.tls))
    if server.peer_tls is not None:
        loads.append(partial(load_peer_credentials, server.peer_tls))
    for load in loads:
        try:
            load()
        except OSError as err:  # the message names the key: "server.tls.cert_path: cannot read ..."
            problems.append(str(err))
    store = config.store
    if not router and isinstance(store, SqliteStoreSection):
        # A server opens its own shard's file; the whole file (--check without a shard) every shard's.
        shard = config.server.shard
        shards = [shard] if shard is not None or not config.shards else [s.name for s in config.shards]
        directories = (os.path.dirname(os.path.abspath(store.path_for(name))) for name in shards)
        for directory in dict.fromkeys(d for d in directories if not os.path.isdir(d)):
            problems.append(
                f"store.path: directory {directory} does not exist (the database file is created in it, "
                "the directory is not)"
            )
    return problems


def server_problems(config: Config) -> list[str]:
    """What a valid configuration still lacks to run a *server*. Validation accepts a sharded file
    without ``server.shard``, because the router, and ``--check`` of the whole file, read it without
    one; only a server about to serve must know which shard it is."""
    if config.shards and not config.server.shard:
        return [
            "server.shard: required with [[shards]]: name the shard this server serves "
            "(or pass --shard, or set CRONOQ_SHARD)"
        ]
    return []


# What a valid SQLite store's failover can and cannot do: said by --check, since no check can tell where
# the standbys will run.
SQLITE_FAILOVER_NOTE = (
    'store.kind = "sqlite": a standby takes over from a leader it can see, one in the same PID namespace '
    "on this host, at once when that leader ended, and ends (SIGKILL) one that stopped while holding the "
    "file's write lock once its lease ran out (10 s). A leader in another PID namespace (another "
    "container on a shared volume) that is paused inside a commit keeps the write lock: the standby then "
    "waits until it continues or ends. See docs/operations.md, Standbys."
)


def notes(config: Config) -> list[str]:
    """What a server with a valid configuration will do that its operator may not expect, for
    ``cronoq-server --check`` to say: facts, not problems (the exit status stays 0)."""
    if isinstance(config.store, SqliteStoreSection):
        return [SQLITE_FAILOVER_NOTE]
    return []


def secret_notes(program: str, needed: Iterable[EnvVariable]) -> list[str]:
    """The environment variables ``program`` reads secrets from at start, for ``--check`` to name
    (``needed`` of :func:`cronoq.config.load_config`): a check in CI, without the secrets, passes and
    says what the deployment must provide; start-up still refuses a variable that is unset."""
    return [
        f"{variable.path}: {program} needs environment variable {variable.name} at start ("
        + ("set here, its value checked" if variable.set else "not set here, so its value was not checked")
        + ")"
        for variable in needed
    ]


def preflight(
    program: str, invalid: str, config: Config, missing: list[str], *, router: bool = False
) -> int | None:
    """Print what keeps a valid ``config`` from running (``missing``, which the program found itself,
    and :func:`file_problems` under the ``invalid`` header; else :func:`unsupported` settings) and
    return the exit status; None when nothing does."""
    missing = missing + file_problems(config, router=router)
    if missing:
        return refuse(invalid, missing)
    refused = unsupported(config)
    if refused:
        return refuse(f"{program}: this configuration asks for what this version cannot do yet:", refused)
    return None


def refuse(header: str, problems: Iterable[object]) -> int:
    """Print why the configuration cannot run, one line per problem, to stderr; the exit status."""
    print(header, file=sys.stderr)
    for problem in problems:
        print(f"  - {problem}", file=sys.stderr)
    return 1


# ------------------------------------------------------------------------------------------ listeners


def grpc_server(
    config: Config, request_limits: RequestLimits, options: Iterable[tuple[str, Any]] = ()
) -> grpc.aio.Server:
    """A gRPC server (no services, not bound) with the process's ``[limits]`` gate and the core options
    they set, plus ``options``. Messages up to twice ``max_message_bytes`` reach the gate, which refuses
    those above the limit by name; ``max_concurrent_streams`` bounds Work and Watch streams there."""
    limits = config.limits
    return grpc.aio.server(
        options=[*grpc_server_options(limits, config.server.grpc_max_streams_per_connection), *options],
        interceptors=[LimitsInterceptor(request_limits)],
        maximum_concurrent_rpcs=limits.max_concurrent_requests
        + limits.max_concurrent_streams
        + UNLIMITED_RPCS,
    )


def grpc_services(config: Config) -> tuple[str, ...]:
    """The ``cronoq.v1`` services a shard server or router serves: all four, or all but the
    ``BatchedWorkers`` extension when ``[server] worker_batches`` is off."""
    return ("Tasks", "Workers", *(("BatchedWorkers",) if config.server.worker_batches else ()), "Admin")


async def set_health(servicer: health.aio.HealthServicer, status: int, config: Config) -> None:
    """Say ``status`` (SERVING, NOT_SERVING) for the process as a whole ("") and for each service it
    serves (:func:`grpc_services`). A client or balancer may ask about the one it uses; an unknown name
    answers NOT_FOUND, which health checkers take for a failure."""
    for name in ("", *(f"cronoq.v1.{s}" for s in grpc_services(config))):
        await servicer.set(name, status)


def bind_grpc(server: grpc.aio.Server, addr: str, tls: ServerTls | None) -> int:
    """Add the listening port (TLS with ``tls``); 0 when it cannot be bound."""
    try:
        if tls is None:
            return int(server.add_insecure_port(addr))
        return int(server.add_secure_port(addr, tls.grpc_credentials))
    except RuntimeError:  # grpc's way of saying the bind failed
        return 0


def listen_grpc(server: grpc.aio.Server, key: str, addr: str, tls: ServerTls | None) -> int:
    """:func:`bind_grpc`, refusing with an ``OSError`` naming the config ``key`` when it cannot."""
    port = bind_grpc(server, addr, tls)
    if port == 0:
        raise OSError(f"{key}: cannot listen on {addr} (in use, or not an address here)")
    return port


def api_app(
    service: RequestHandler,
    config: Config,
    addr: str,
    tls: ServerTls | None,
    metrics: Exposition,
    request_limits: RequestLimits,
) -> web.Application:
    """The HTTP/JSON API of ``service`` on ``addr``, with ``/metrics`` served from ``metrics``."""
    return build_http_app(
        service,
        max_body_bytes=config.limits.max_http_body_bytes,
        loopback_only_guard=config.host_guard(addr),
        metrics=metrics,
        require_client_cert=tls is not None and tls.client_certs_required,
        limits=request_limits,
    )
