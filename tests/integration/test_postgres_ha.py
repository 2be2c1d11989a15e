"""High availability on Postgres with real server processes: a leader and a standby on one schema.

Failover by ``kill -9`` under load, by terminating the leader's lock session, by pausing the leader
past the session timeout, and by a clean SIGTERM; plus migrations and the refusal of a newer schema.
Producers and workers reach both servers through one gRPC target listing both addresses (round robin),
as they would through a Kubernetes Service, and retry what the standby refuses.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psycopg
import pytest
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

from chaos.proxy import LinkProxy
from cronoq.client import Client, Lease
from cronoq.errors import ApiError, Unavailable
from tests.ports import free_ports

from .helpers import durable_config, postgres_store, worker
from .serverproc import ServerProcess, leader_and_standby, new_server

pytestmark = pytest.mark.asyncio

ROUND_ROBIN = [("grpc.lb_policy_name", "round_robin")]


def pg_config(schema: str) -> str:
    return durable_config(postgres_store(schema), max_attempts=5)


def pair(
    tmp_path: Path, postgres_url: str, schema: str, *, start_standby: bool = True
) -> contextlib.AbstractContextManager[tuple[ServerProcess, ServerProcess]]:
    return leader_and_standby(
        tmp_path, pg_config(schema), {"DATABASE_URL": postgres_url}, start_standby=start_standby
    )


def both(a: ServerProcess, b: ServerProcess) -> str:
    return f"ipv4:{a.target},{b.target}"


def lock_holders(postgres_url: str) -> list[int]:
    """Backend pids holding a granted advisory lock (the leaders' lock sessions)."""
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        rows = conn.execute("SELECT pid FROM pg_locks WHERE locktype = 'advisory' AND granted").fetchall()
    return [int(r[0]) for r in rows]


async def submit_until_acknowledged(client: Client, key: str, deadline: float) -> int:
    """Submit with a key, retrying whatever fails (standby, failover) until the server acknowledges:
    the key makes retries safe, a retry of a committed submission is answered as a duplicate."""
    while True:
        try:
            return (await client.submit({"key": key}, key=key, call_timeout=5)).id
        except (ApiError, TimeoutError):
            if time.monotonic() > deadline:
                raise
            await asyncio.sleep(0.05)


async def wait_until_succeeded(client: Client, keys: list[str], timeout: float) -> dict[str, str]:
    """Final status of each key, retrying calls that land on the standby."""
    deadline = time.monotonic() + timeout
    statuses: dict[str, str] = {}
    for key in keys:
        while key not in statuses:
            try:
                statuses[key] = (await client.wait(key, timeout=max(1.0, deadline - time.monotonic()))).status
            except (ApiError, TimeoutError):
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.05)
    return statuses


async def test_kill_9_of_the_leader_under_load_loses_no_acknowledged_task(
    tmp_path: Path, postgres_url: str, pg_schema: str
) -> None:
    with pair(tmp_path, postgres_url, pg_schema) as (leader, standby):
        ran: list[str] = []

        async def handler(lease: Lease) -> str:
            ran.append(lease.key or "")
            return "ok"

        target = both(leader, standby)
        async with (
            Client(target, options=ROUND_ROBIN) as client,
            worker(target, handler, slots=8, options=ROUND_ROBIN, backoff=(0.05, 0.2)) as w,
        ):
            acknowledged: list[str] = []
            killed_at = 0.0
            deadline = time.monotonic() + 60
            for i in range(400):
                key = f"t{i}"
                await submit_until_acknowledged(client, key, deadline)
                acknowledged.append(key)
                if i == 200:
                    leader.kill()
                    killed_at = time.monotonic()
            standby.wait_probe("/readyz", 200, timeout=30)
            print(
                f"failover after kill -9: standby serving {time.monotonic() - killed_at:.2f} s after the kill"
            )
            statuses = await wait_until_succeeded(client, acknowledged, 60)
            assert w.connections >= 2  # it followed the failover
        assert set(statuses.values()) == {"succeeded"}
        assert set(acknowledged) <= set(ran)


async def test_terminating_the_lock_session_hands_leadership_to_the_standby(
    tmp_path: Path, postgres_url: str, pg_schema: str
) -> None:
    with pair(tmp_path, postgres_url, pg_schema, start_standby=False) as (leader, standby):

        async def handler(lease: Lease) -> str:
            return f"ran {lease.key}"

        # The worker registers while only the leader listens, so round robin can offer it nothing
        # else; with the 5 s backoff below, a first pick of the standby would cost whole backoffs.
        async with (
            Client(both(leader, standby), options=ROUND_ROBIN) as client,
            worker(both(leader, standby), handler, options=ROUND_ROBIN, backoff=(5.0, 5.0)) as w,
        ):
            standby.start(ready=False)
            before = await submit_until_acknowledged(client, "before", time.monotonic() + 10)
            assert await wait_until_succeeded(client, ["before"], 10) == {"before": "succeeded"}
            [pid] = lock_holders(postgres_url)
            with psycopg.connect(postgres_url, autocommit=True) as conn:
                conn.execute("SELECT pg_terminate_backend(%s)", (pid,))
            standby.wait_probe("/readyz", 200, timeout=15)
            leader.wait_probe("/readyz", 503, timeout=15)  # stepped down, still running, standing by
            assert leader.proc is not None and leader.proc.poll() is None
            assert "stepped_down" in leader.logs()
            # The worker was told Shutdown{not_leader} and reconnected at once: with a 5 s backoff
            # for any other reason, only that makes it serve the new leader within the wait below.
            after = await submit_until_acknowledged(client, "after", time.monotonic() + 10)
            async with Client(standby.target) as new_leader:
                result = await new_leader.wait(after, timeout=4)
                assert result.text() == "ran after"
                assert (await new_leader.get("before")).id == before
            assert w.last_shutdown == "not the leader" and w.connections == 2


async def test_a_paused_leader_is_replaced_and_never_commits_after_it_resumes(
    tmp_path: Path, postgres_url: str, pg_schema: str
) -> None:
    with pair(tmp_path, postgres_url, pg_schema) as (leader, standby):
        async with Client(leader.target) as client:
            await client.submit(b"x", key="before")
            leader.signal(signal.SIGSTOP)
            try:
                standby.wait_probe("/readyz", 200, timeout=30)  # after the 10 s session timeout
                # Sent to the paused leader: it is read as soon as the process runs again, racing the
                # leader's own discovery that it lost the lock. Whichever wins, the commit it would make
                # is fenced by the epoch, and the caller is never told that the task exists.
                late = asyncio.create_task(client.submit(b"z", key="sent-while-paused"))
                await asyncio.sleep(0.2)  # on its way (only which side wins depends on it)
            finally:
                leader.signal(signal.SIGCONT)
            # Refused, either way: UNAVAILABLE from the fenced commit or the standby, or from gRPC
            # core when the leader's listener is replaced at step-down with the call still in it
            # (which the SDK reads as UNAVAILABLE, never received).
            with pytest.raises(Unavailable):
                await asyncio.wait_for(late, 15)
        leader.wait_probe("/readyz", 503, timeout=15)
        async with Client(standby.target) as client:
            assert (await client.get("before")).status == "ready"
            after = await client.submit(b"y", key="after")
        with psycopg.connect(postgres_url, autocommit=True) as conn:
            conn.execute(sql.SQL("SET search_path = {}").format(sql.Identifier(pg_schema)))
            epoch = conn.execute("SELECT epoch FROM cronoq_leader WHERE id = 1").fetchone()
            keys = conn.execute("SELECT key FROM cronoq_tasks ORDER BY id").fetchall()
        assert epoch is not None and epoch[0] == 2
        assert [k[0] for k in keys] == ["before", "after"]
        assert after.id >> 48 == 2


async def test_a_clean_shutdown_hands_over_at_once(tmp_path: Path, postgres_url: str, pg_schema: str) -> None:
    with pair(tmp_path, postgres_url, pg_schema) as (leader, standby):
        assert (standby.probe("/healthz"), standby.probe("/readyz")) == (200, 503)
        leader.signal(signal.SIGTERM)
        assert leader.wait(20) == 0
        began = time.monotonic()
        standby.wait_probe("/readyz", 200, timeout=5)
        print(f"takeover after SIGTERM: {time.monotonic() - began:.2f} s")


async def test_migrations_create_the_schema_and_a_newer_schema_is_refused(
    tmp_path: Path, postgres_url: str, pg_schema: str
) -> None:
    env = {"DATABASE_URL": postgres_url}
    server = new_server(tmp_path / "a", pg_config(pg_schema), env)
    server.start()
    server.stop()
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        tables = conn.execute(
            "SELECT table_name FROM information_schema.tables WHERE table_schema = %s ORDER BY 1",
            (pg_schema,),
        ).fetchall()
        assert {"cronoq_leader", "cronoq_schema_version", "cronoq_tasks"} <= {t[0] for t in tables}
        conn.execute(
            sql.SQL("UPDATE {}.cronoq_schema_version SET version = 999").format(sql.Identifier(pg_schema))
        )
    out = await asyncio.to_thread(
        subprocess.run,
        [sys.executable, "-m", "cronoq.shard.main", "--config", str(server.config_path)],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, **server.env},
    )
    assert out.returncode == 1
    assert "999" in out.stderr and "upgrade" in out.stderr
    assert postgres_url.split("@")[0].split(":")[-1] not in out.stderr + out.stdout  # no password


async def test_a_server_started_while_postgres_is_down_waits_for_it(
    tmp_path: Path, postgres_url: str, pg_schema: str
) -> None:
    """Started while nothing answers at the store's address, the server does not exit: it listens as a
    standby (``/healthz`` 200, ``/readyz`` 503), logs why once, keeps trying, and leads as soon as
    Postgres answers there (here: a forwarder to the real server, opened on that port later)."""
    params = conninfo_to_dict(postgres_url)
    port = free_ports(1)[0]
    env = {"DATABASE_URL": make_conninfo(postgres_url, host="127.0.0.1", port=port)}
    server = new_server(tmp_path / "a", pg_config(pg_schema), env)
    server.start(ready=False)
    try:
        assert server.probe("/readyz") == 503
        assert "store_unreachable" in server.logs() and "Connection refused" in server.logs()
        upstream = (str(params.get("host") or "127.0.0.1"), int(params.get("port") or 5432))
        link = LinkProxy("postgres", upstream, seed=0)
        await link.start(port=port)
        try:
            await asyncio.to_thread(server.wait_probe, "/readyz", 200, 20.0)
            assert "store_reachable" in server.logs()
            async with Client(server.target) as client:
                submitted = await client.submit({"n": 1})
            with psycopg.connect(postgres_url, autocommit=True) as conn:
                stored = conn.execute(
                    sql.SQL("SELECT count(*) FROM {}.cronoq_tasks WHERE id = %s").format(
                        sql.Identifier(pg_schema)
                    ),
                    (submitted.id,),
                ).fetchone()
            assert stored == (1,)
        finally:
            await asyncio.to_thread(server.stop)  # this loop carries the store's bytes meanwhile
            await link.close()
    finally:
        server.stop()
    assert server.proc is not None and server.proc.returncode == 0, server.logs()
    assert server.logs().count("store_unreachable") == 1, server.logs()
