"""What ``cronoq-server`` and ``cronoq-router`` check before they serve, beyond the file's own keys.

Reading a config (:func:`cronoq.config.parse_config`) never touches the filesystem, so it can be
tested and reused anywhere. A process about to serve also needs the files the config names (TLS
certificates, the SQLite directory) and must refuse settings this version cannot honour. ``--check``
runs these same checks, so a file that passes it does not then fail at startup; they live here,
not in either program, because the router may not import the server and both apply one set of rules
to the same file.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterable
from functools import partial

from cronoq.tls import load_peer_credentials, load_server_tls

from .model import Config, SqliteStore


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

    TLS files are loaded exactly as startup loads them (so an invalid certificate is caught too, not
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
    if not router and isinstance(store, SqliteStore):
        directory = os.path.dirname(os.path.abspath(store.path))
        if not os.path.isdir(directory):
            problems.append(
                f"store.path: directory {directory} does not exist (the database file is created in it, "
                "the directory is not)"
            )
    return problems


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
    if isinstance(config.store, SqliteStore):
        return [SQLITE_FAILOVER_NOTE]
    return []


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
