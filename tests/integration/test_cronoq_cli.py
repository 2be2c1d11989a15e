"""The ``cronoq`` command-line client against a real server."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from cronoq.client import Client, Lease

from . import test_tls
from .helpers import durable_config, sqlite_store, worker
from .serverproc import ServerProcess, leader_and_standby, running_server
from .shardproc import ShardSpec, running_cluster
from .test_tls import Pki, _https, _tls_config

tls_pki = test_tls.pki  # the fixture (a throwaway CA and its certificates), under this module's name


def run_cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cronoq.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=None if env is None else {**os.environ, **env},
    )


def cronoq(server: ServerProcess, *args: str) -> subprocess.CompletedProcess[str]:
    return run_cli("--target", server.target, *args)


def test_submit_get_cancel_list_snapshot(server: ServerProcess) -> None:
    out = cronoq(server, "submit", "--json", '{"a": 1}', "--key", "cli-1", "--priority", "high")
    assert out.returncode == 0, out.stderr
    submitted = json.loads(out.stdout)
    assert submitted["duplicate"] is False
    again = json.loads(cronoq(server, "submit", "--data", "x", "--key", "cli-1").stdout)
    assert again == {**submitted, "duplicate": True}

    info = json.loads(cronoq(server, "get", "cli-1").stdout)
    assert info["id"] == submitted["id"] and info["status"] == "ready" and info["priority"] == "high"

    assert json.loads(cronoq(server, "cancel", submitted["id"]).stdout) == {"cancelled": True}
    assert json.loads(cronoq(server, "get", "cli-1").stdout)["status"] == "cancelled"

    page = json.loads(cronoq(server, "list", "--status", "cancelled").stdout)
    assert [t["id"] for t in page["tasks"]] == [submitted["id"]]

    snap = json.loads(cronoq(server, "snapshot").stdout)
    assert snap["totals"]["submitted"] == 1 and snap["totals"]["cancelled"] == 1


async def test_ids_are_printed_as_strings_that_survive_jq(tmp_path: Path) -> None:
    """Every id of a shard numbered 1 or more is above 2^53, where jq (which reads every JSON number as a
    double) changes its last digits: ids come out as strings, read back here as jq reads numbers, and
    are taken back as given."""

    def as_jq(out: subprocess.CompletedProcess[str]) -> Any:
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout, parse_int=float)

    async def handler(lease: Lease) -> str:
        return "done"

    with running_cluster(tmp_path, [ShardSpec("a", 1, ("default",))]) as procs:
        server = procs["a"]
        task_id = as_jq(await asyncio.to_thread(cronoq, server, "submit", "--key", "big"))["id"]
        assert isinstance(task_id, str) and int(task_id) > 2**53
        assert as_jq(await asyncio.to_thread(cronoq, server, "get", task_id))["id"] == task_id
        page = as_jq(await asyncio.to_thread(cronoq, server, "list"))
        assert [t["id"] for t in page["tasks"]] == [task_id] and page["next_after"] == "0"
        async with worker(server.target, handler):
            result = as_jq(await asyncio.to_thread(cronoq, server, "wait", task_id, "--timeout", "10"))
            assert result == {**result, "id": task_id, "status": "succeeded"}
            [connected] = as_jq(await asyncio.to_thread(cronoq, server, "workers"))
            assert isinstance(connected["id"], str)
        added = await asyncio.to_thread(cronoq, server, "recurring", "add", "hourly", "0 * * * *")
        assert added.returncode == 0, added.stderr
        [schedule] = as_jq(await asyncio.to_thread(cronoq, server, "recurring", "list"))
        assert int(schedule["last_task_id"]) > int(task_id)


def test_a_standby_is_asked_again_until_it_leads(tmp_path: Path) -> None:
    """A standby answers UNAVAILABLE (a balancer picked it, a failover is under way): the CLI asks again
    with backoff, saying so on stderr, as the SDK's worker reconnects, and is answered once the standby
    leads, here when the leader stops. (A standby's refusal says the call never ran, so even a keyless
    submit is sent again.)"""
    body = durable_config(sqlite_store(tmp_path / "state.db"))
    with leader_and_standby(tmp_path, body) as (leader, standby):
        cli = subprocess.Popen(
            [sys.executable, "-m", "cronoq.cli", "--target", standby.target, "submit", "--data", "x"],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**os.environ, "CRONOQ_RETRY_FOR": "30"},
        )
        try:
            assert cli.stderr is not None
            first = cli.stderr.readline()  # the CLI either asks again or exits: this returns
            assert first.startswith("cronoq: unavailable: this server is a standby"), first
            assert first.rstrip().endswith("(asking again in 0.1 s)"), first
            leader.stop()  # the standby takes over at once
            out, err = cli.communicate(timeout=40)
        finally:
            cli.kill()
        assert cli.returncode == 0, first + err
        task_id = json.loads(out)["id"]
        assert json.loads(cronoq(standby, "get", task_id).stdout)["status"] == "ready"


def test_errors_are_reported_with_their_code(server: ServerProcess) -> None:
    out = cronoq(server, "get", "no-such-key")
    assert out.returncode == 1
    assert out.stderr.startswith("cronoq: not_found:")
    out = cronoq(server, "submit", "--pool", "nope")
    assert out.returncode == 1
    assert "unknown pool 'nope'" in out.stderr


def test_recurring_add_list_remove_and_task_options(server: ServerProcess) -> None:
    out = cronoq(
        server,
        "recurring",
        "add",
        "every-hour",
        "0 * * * *",
        "--tz",
        "Europe/Paris",
        "--overlap",
        "queue",
        "--pool",
        "other",
        "--kind",
        "report",
        "--key",
        "hourly",
        "--json",
        '{"r": 1}',
        "--tolerance",
        "5",
    )
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout) == {"name": "every-hour"}
    [schedule] = json.loads(cronoq(server, "recurring", "list").stdout)
    assert (schedule["name"], schedule["pool"], schedule["kind"], schedule["overlap"]) == (
        "every-hour",
        "other",
        "report",
        "queue",
    )
    assert schedule["tz"] == "Europe/Paris" and schedule["next_at"] > 0 and int(schedule["last_task_id"]) > 0
    occurrence = json.loads(cronoq(server, "get", schedule["last_task_id"]).stdout)
    assert occurrence["status"] == "scheduled" and occurrence["key"].startswith("hourly@")

    bad = cronoq(server, "recurring", "add", "x", "61 * * * *")
    assert bad.returncode == 1 and bad.stderr.startswith("cronoq: invalid_argument: cron: invalid cron")
    assert json.loads(cronoq(server, "recurring", "remove", "every-hour").stdout) == {"removed": True}
    assert json.loads(cronoq(server, "recurring", "remove", "every-hour").stdout) == {"removed": False}
    assert json.loads(cronoq(server, "recurring", "list").stdout) == []
    # Its next occurrence goes with it: left scheduled, it would run once more.
    removed = json.loads(cronoq(server, "get", schedule["last_task_id"]).stdout)
    assert (removed["status"], removed["message"]) == (
        "cancelled",
        "cancelled: its recurring schedule was removed",
    )

    first = json.loads(cronoq(server, "submit", "--key", "first").stdout)
    later = cronoq(server, "submit", "--after", "first", "--start-in", "3600", "--on-miss", "skip")
    assert later.returncode == 0, later.stderr
    assert json.loads(cronoq(server, "get", json.loads(later.stdout)["id"]).stdout)["status"] == "blocked"
    unknown = cronoq(server, "submit", "--resource", "gpu=1")
    assert (
        unknown.returncode == 1
        and "cronoq: not_found: task.resources: unknown resource 'gpu'" in unknown.stderr
    )
    assert first["duplicate"] is False


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (("submit", "--wait-timeout", "3", "--data", "x"), "--wait-timeout needs --wait"),
        (("submit", "--tag", "foo"), "--tag expects K=V (got 'foo')"),
        (("submit", "--resource", "a=x"), "--resource expects NAME=N with a whole number N (got 'x')"),
        (("submit", "--json", "{"), "--json expects a JSON document"),
        (("recurring", "add", "n", "* * * * *", "--label", "gpu"), "--label expects K=V (got 'gpu')"),
        (("--ca", "/nonexistent/ca.pem", "get", "1"), "--ca: cannot read /nonexistent/ca.pem"),
        (("--cert", "c.pem", "get", "1"), "--cert and --cert-key go together"),
        (("top", "--interval", "0"), "argument --interval: must be > 0 seconds"),
    ],
)
def test_usage_errors_exit_2_naming_the_option(args: tuple[str, ...], message: str) -> None:
    """Caught before anything is sent (nothing listens on the default target here)."""
    out = run_cli("--target", "127.0.0.1:1", *args)
    assert out.returncode == 2, out.stderr
    assert message in out.stderr and "usage: cronoq" in out.stderr


async def test_a_private_ca_and_a_client_certificate(tmp_path: Path, tls_pki: Pki) -> None:
    """``--ca`` trusts a private CA and ``--cert``/``--cert-key`` present a client certificate (mTLS), as
    options or as CRONOQ_CA/CRONOQ_CERT/CRONOQ_CERT_KEY; a certificate that cannot be used is a usage
    error naming the option."""
    pki = tls_pki
    with running_server(tmp_path, _tls_config(pki, mtls=True), ssl_context=_https(pki, False)) as server:
        target = f"https://{server.target}"
        identity = ("--cert", str(pki.client_cert), "--cert-key", str(pki.client_key))
        out = await asyncio.to_thread(run_cli, "--target", target, "--ca", str(pki.ca), *identity, "submit")
        assert out.returncode == 0, out.stderr
        task = json.loads(out.stdout)["id"]
        env = {
            "CRONOQ_CA": str(pki.ca),
            "CRONOQ_CERT": str(pki.client_cert),
            "CRONOQ_CERT_KEY": str(pki.client_key),
        }
        out = await asyncio.to_thread(run_cli, "--target", target, "get", str(task), env=env)
        assert out.returncode == 0, out.stderr
        assert json.loads(out.stdout)["status"] == "ready"
        # Without a client certificate the mTLS handshake is refused.
        # (Not asked again: a refused handshake is as "unavailable" as a server on its way back.)
        out = await asyncio.to_thread(
            run_cli, "--target", target, "--ca", str(pki.ca), "--retry-for", "0", "get", str(task)
        )
        assert out.returncode == 1 and out.stderr.startswith("cronoq: unavailable:")
        out = run_cli(
            "--target",
            target,
            "--ca",
            str(pki.ca),
            "--cert",
            str(pki.client_key),
            "--cert-key",
            str(pki.client_key),
            "get",
            "1",
        )
        assert out.returncode == 2 and "--cert/--cert-key: not a usable PEM certificate and key" in out.stderr


async def test_top_once_shows_every_pool(server: ServerProcess) -> None:
    async def handler(lease: Lease) -> str:
        return "done"

    async with worker(server.target, handler, slots=2), Client(server.target) as client:
        for _ in range(3):
            done = await client.submit(b"x", wait=True, wait_timeout=10)
            assert done.result is not None and done.result.status == "succeeded"
        for _ in range(2):
            await client.submit(b"y", pool="other", priority="high")
        out = await asyncio.to_thread(cronoq, server, "top", "--once")
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines[0].startswith(f"cronoq top  {server.target}")
    header = lines[2].split()
    assert header[:6] == ["POOL", "CAP", "BUSY", "HELD", "DESIRED", "PENDING"]
    rows = {line.split()[0]: line.split() for line in lines[3:5]}
    # POOL CAP BUSY HELD DESIRED PENDING CRIT/HIGH/NORM/LOW P50 P99 UTIL OK FAILED WORKERS
    default, other = rows["default"], rows["other"]
    assert (default[1], default[2], default[5], default[10], default[11], default[12]) == (
        "2",
        "0",
        "0",
        "3",
        "0",
        "1",
    )
    assert (other[1], other[5], other[6], other[10], other[12]) == ("0", "2", "0/2/0/0", "0", "0")
    assert "totals: submitted 5, succeeded 3, failed 0" in out.stdout
    assert "unavailable shards" not in out.stdout
