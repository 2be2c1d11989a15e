"""A server's output is one stream of JSON lines, stdout and stderr together as a container runtime
collects them, also when the libraries under it have something to say: psycopg's connection pool
failing to connect, and grpc's core refusing a client's TLS handshake, used to write plain lines of
their own format in between. The CLI's stderr carries its own error line only, never grpc core's."""

from __future__ import annotations

import asyncio
import contextlib
import json
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import make_conninfo

from cronoq.client import Client
from cronoq.errors import ApiError

from . import test_tls
from .helpers import durable_config, postgres_store
from .serverproc import ServerProcess, new_server
from .shardproc import ShardSpec, routed_cluster
from .test_tls import Pki, _https, _tls_config

pytestmark = pytest.mark.asyncio
tls_pki = test_tls.pki  # the fixture (a throwaway CA and its certificates), under this module's name
LOGGED_WITHIN_S = 20.0


def not_json(text: str) -> list[str]:
    """The lines of ``text`` that are not a JSON object."""
    bad = []
    for line in text.splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            record = None
        if not isinstance(record, dict):
            bad.append(line)
    return bad


def records(server: ServerProcess, logger: str, saying: str) -> list[dict[str, Any]]:
    """The JSON records of the server's log from the standard-library logger ``logger`` whose event
    says ``saying``."""
    found = []
    for line in server.logs().splitlines():
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if isinstance(record, dict) and record.get("logger") == logger and saying in record["event"]:
                found.append(record)
    return found


def set_login(postgres_url: str, role: str, allowed: bool) -> None:
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(
            sql.SQL("ALTER ROLE {} " + ("LOGIN" if allowed else "NOLOGIN")).format(sql.Identifier(role))
        )


@contextlib.contextmanager
def login_role(postgres_url: str, schema: str) -> Iterator[tuple[str, str]]:
    """A role that owns ``schema`` and may log in, for the server to use; yields (role, its URL). The
    test takes its login away (``NOLOGIN``) to make new connections fail while the server's open ones
    go on working. Dropped afterwards with what it owns."""
    role = f"cq_role_{uuid.uuid4().hex[:12]}"
    password = uuid.uuid4().hex
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE ROLE {} LOGIN PASSWORD {}").format(sql.Identifier(role), password))
        conn.execute(
            sql.SQL("CREATE SCHEMA {} AUTHORIZATION {}").format(sql.Identifier(schema), sql.Identifier(role))
        )
    try:
        yield role, make_conninfo(postgres_url, user=role, password=password)
    finally:
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute("SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE usename = %s", (role,))
            conn.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(role)))
            conn.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


async def test_a_servers_output_stays_json_when_its_libraries_log(
    tmp_path: Path, tls_pki: Pki, postgres_url: str, pg_schema: str
) -> None:
    """The pool's "error connecting" warnings come out as JSON records naming their logger, and a
    refused TLS handshake leaves no line of grpc core's at all."""
    with login_role(postgres_url, pg_schema) as (role, url):
        body = _tls_config(tls_pki, mtls=False) + durable_config(postgres_store(pg_schema))
        server = new_server(tmp_path, body, env={"DATABASE_URL": url}, ssl_context=_https(tls_pki, False))
        server.start()
        try:
            # A client that does not trust the server's CA, and one that speaks plain HTTP/2 to its TLS
            # port: grpc core logged each failed handshake, on the client's side and on the server's.
            for target in (f"https://{server.target}", server.target):
                refused = await asyncio.to_thread(
                    subprocess.run,
                    [sys.executable, "-m", "cronoq.cli", "--retry-for", "0", "-t", target, "get", "1"],
                    capture_output=True,
                    text=True,
                    timeout=60,
                )
                assert refused.returncode == 1
                assert refused.stderr.startswith("cronoq: unavailable:"), refused.stderr
                assert len(refused.stderr.splitlines()) == 1, refused.stderr  # no line of grpc core's
            # The pool's connection dies and no new one may log in: the next commit makes it try.
            set_login(postgres_url, role, False)
            with psycopg.connect(postgres_url, autocommit=True) as conn:
                conn.execute(
                    "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                    "WHERE usename = %s AND application_name = 'cronoq'",
                    (role,),
                )
            async with Client(server.target, credentials=_credentials(tls_pki)) as client:
                with contextlib.suppress(ApiError, TimeoutError):
                    await client.submit(b"x", call_timeout=5)
            deadline = time.monotonic() + LOGGED_WITHIN_S
            while not records(server, "psycopg.pool", "error connecting"):
                assert time.monotonic() < deadline, f"no psycopg.pool record:\n{server.logs()[-4000:]}"
                await asyncio.sleep(0.1)
            set_login(postgres_url, role, True)  # the commit goes through, and the server stops at once
        finally:
            server.stop()
    logs = server.logs()
    assert not_json(logs) == [], logs[-4000:]
    warning = records(server, "psycopg.pool", "error connecting")[0]
    assert warning["level"] == "warning" and f'role "{role}" is not permitted to log in' in warning["event"]
    assert "Handshake failed" not in logs


def _credentials(pki: Pki) -> Any:
    import grpc

    return grpc.ssl_channel_credentials(root_certificates=pki.ca.read_bytes())


async def test_a_routers_output_is_json_with_a_library_opened_up_by_cronoq_log(tmp_path: Path) -> None:
    """The router writes one stream of JSON lines too, and ``CRONOQ_LOG`` sets a named library's level:
    with ``grpc=debug`` the debug records of grpc's Python layer (which loads its event loop on each
    channel and server) are JSON records of their logger, while cronoq's own level stays info."""
    spec = ShardSpec("a", 1, ("default",))
    with routed_cluster(tmp_path, [spec], "", {"CRONOQ_LOG": "info,grpc=debug"}) as (router, _):
        async with aiohttp.ClientSession(base_url=router.http) as http, http.get("/v1/snapshot") as resp:
            assert resp.status == 200
    logs = router.logs()
    assert not_json(logs) == [], logs[-4000:]
    grpc_debug = records(router, "grpc._cython.cygrpc", "Loaded running loop")
    assert grpc_debug and grpc_debug[0]["level"] == "debug", logs[-4000:]
    ours = [json.loads(line) for line in logs.splitlines()]
    assert not [r for r in ours if r["level"] == "debug" and "logger" not in r]  # cronoq's own: info
