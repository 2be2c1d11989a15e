"""``cronoq-server`` as a command: --print-proto, --check, and graceful SIGTERM."""

from __future__ import annotations

import asyncio
import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import grpc
import pytest
from google.protobuf import descriptor_pb2
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc
from grpc_tools import protoc

from cronoq.client import Client, Lease
from cronoq.engine import compiled
from cronoq.serving import SQLITE_FAILOVER_NOTE
from tests.ports import free_port, free_ports

from . import test_tls
from .helpers import Metrics, sqlite_store, worker
from .serverproc import ServerProcess, running_server
from .test_auth import CLIENT, METRICS, WORKER
from .test_auth import CONFIG as AUTH_CONFIG
from .test_tls import Pki, _tls_config

ROOT = Path(__file__).resolve().parents[2]
AUTH_ENV = {"T_CLIENT": CLIENT, "T_WORKER": WORKER, "T_METRICS": METRICS}
tls_pki = test_tls.pki  # the fixture (a throwaway CA and its certificates), under this module's name


def run_server_cli(
    *args: str, env: dict[str, str] | None = None, module: str = "cronoq.shard.main"
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", module, *args], capture_output=True, text=True, timeout=60, env=env
    )


def run_router_cli(*args: str) -> subprocess.CompletedProcess[str]:
    return run_server_cli(*args, module="cronoq.router.main")


def environment(**changes: str | None) -> dict[str, str]:
    """This process's environment with ``changes`` applied (None removes a variable)."""
    env = {k: v for k, v in os.environ.items() if k not in changes}
    env.update({k: v for k, v in changes.items() if v is not None})
    return env


def test_print_proto_is_the_contract_and_needs_no_config(tmp_path: Path) -> None:
    out = run_server_cli("--print-proto", "--config", str(tmp_path / "missing.toml"))
    assert out.returncode == 0
    assert out.stdout == (ROOT / "proto/cronoq/v1/cronoq.proto").read_text()


def _fields(fd: descriptor_pb2.FileDescriptorProto) -> dict[str, object]:
    """Everything on the wire: messages with field numbers/types/labels/oneofs, enums, services."""
    shape: dict[str, object] = {"package": fd.package, "name": fd.name}
    for m in fd.message_type:
        shape[f"message {m.name}"] = sorted(
            (
                f.number,
                f.name,
                f.type,
                f.label,
                f.type_name,
                f.proto3_optional,
                f.oneof_index if f.HasField("oneof_index") else -1,
            )
            for f in m.field
        )
        for nested in m.nested_type:  # map entries
            shape[f"map {m.name}.{nested.name}"] = sorted((f.number, f.name, f.type) for f in nested.field)
    for e in fd.enum_type:
        shape[f"enum {e.name}"] = sorted((v.number, v.name) for v in e.value)
    for s in fd.service:
        shape[f"service {s.name}"] = sorted(
            (r.name, r.input_type, r.output_type, r.client_streaming, r.server_streaming) for r in s.method
        )
    return shape


@pytest.mark.asyncio
async def test_printed_proto_matches_the_served_descriptor(tmp_path: Path, server: ServerProcess) -> None:
    printed = run_server_cli("--print-proto").stdout
    src = tmp_path / "src" / "cronoq" / "v1"
    src.mkdir(parents=True)
    (src / "cronoq.proto").write_text(printed)
    out = tmp_path / "set.pb"
    assert (
        protoc.main(
            ["protoc", f"-I{tmp_path / 'src'}", f"--descriptor_set_out={out}", "cronoq/v1/cronoq.proto"]
        )
        == 0
    )
    compiled = descriptor_pb2.FileDescriptorSet.FromString(out.read_bytes()).file[0]

    async with grpc.aio.insecure_channel(server.target) as ch:
        stub = reflection_pb2_grpc.ServerReflectionStub(ch)

        async def ask() -> reflection_pb2.ServerReflectionResponse:
            call = stub.ServerReflectionInfo(
                iter([reflection_pb2.ServerReflectionRequest(file_containing_symbol="cronoq.v1.Tasks")])
            )
            async for response in call:
                return response
            raise AssertionError("no reflection answer")

        response = await ask()
    served = descriptor_pb2.FileDescriptorProto.FromString(
        response.file_descriptor_response.file_descriptor_proto[0]
    )
    assert served.name == "cronoq/v1/cronoq.proto"
    assert _fields(compiled) == _fields(served)
    # cronoq.v1's 43 messages and 3 services, and the BatchedWorkers extension's service and 2 messages.
    assert len(compiled.message_type) == 45 and len(compiled.enum_type) == 5
    assert [service.name for service in compiled.service] == ["Tasks", "Workers", "BatchedWorkers", "Admin"]


def test_check_accepts_a_good_config(tmp_path: Path) -> None:
    cfg = tmp_path / "good.toml"
    cfg.write_text('[[pools]]\nname = "default"\nmax = 4\n[[pools]]\nname = "gpu"\nlease_ttl_s = 10\n')
    out = run_server_cli("--config", str(cfg), "--check")
    assert out.returncode == 0, out.stderr
    assert "ok" in out.stdout


def test_check_rejects_a_bad_config_naming_every_key(tmp_path: Path) -> None:
    cfg = tmp_path / "bad.toml"
    cfg.write_text('[[pools]]\nname = "default"\nlease_ttl_s = -1\nbogus = 1\n[limits]\nmax_wait_sx = 3\n')
    out = run_server_cli("--config", str(cfg), "--check")
    assert out.returncode == 1
    assert "pools[0].lease_ttl_s" in out.stderr
    assert "pools[0].bogus" in out.stderr
    assert "limits.max_wait_sx" in out.stderr


def test_check_reads_yaml_by_the_extension_naming_lines(tmp_path: Path) -> None:
    """``.yaml`` and ``.yml`` files are YAML, for the server and the router alike; a problem names its
    key and its line; a name with any other extension is refused, naming the ones accepted."""
    good = [
        (
            run_server_cli,
            "pools:\n  - name: default\n    max: 4\n  - {name: gpu, lease_ttl_s: 10}\n",
            "2 pool(s)",
        ),
        (run_router_cli, "router:\n  members: [http://s-0:7070, http://s-1:7070]\n", "one unsharded cluster"),
    ]
    for run, text, summary in good:
        (tmp_path / "good.yaml").write_text(text)
        out = run("--config", str(tmp_path / "good.yaml"), "--check")
        assert out.returncode == 0, out.stderr
        assert out.stdout.startswith(f"configuration ok: {summary}")
    bad = tmp_path / "bad.yml"
    bad.write_text("pools:\n- name: default\n  lease_ttl_s: -1\n  bogus: 1\nlimits:\n  max_wait_sx: 3\n")
    out = run_server_cli("--config", str(bad), "--check")
    assert out.returncode == 1
    assert out.stderr.splitlines() == [
        f"cronoq-server: invalid configuration {bad}:",
        "  - limits.max_wait_sx (line 6): unknown key (did you mean max_wait_s?)",
        "  - pools[0].bogus (line 4): unknown key",
        "  - pools[0].lease_ttl_s (line 3): must be > 0 and at most 31536000 (got -1)",
    ]
    unknown = tmp_path / "cronoq.conf"
    unknown.write_text('[[pools]]\nname = "a"\n')
    for run in (run_server_cli, run_router_cli):
        out = run("--config", str(unknown), "--check")
        assert out.returncode == 1
        assert f"invalid configuration {unknown}:" in out.stderr
        assert (
            "cannot tell the syntax from the file name: expected it to end in .toml (TOML), .yaml or .yml (YAML)"
            in out.stderr
        )


def test_a_server_serves_from_a_yaml_file(tmp_path: Path) -> None:
    grpc_port, http_port = free_ports(2)
    config = tmp_path / "cronoq.yaml"
    config.write_text(
        f"server:\n  grpc_addr: 127.0.0.1:{grpc_port}\n  http_addr: 127.0.0.1:{http_port}\n"
        "pools:\n  - name: from-yaml\n    max: 3\n"
    )
    server = ServerProcess(config, tmp_path / "server.log", grpc_port=grpc_port, http_port=http_port)
    server.start()
    try:
        with urllib.request.urlopen(f"{server.http}/v1/snapshot", timeout=5) as response:
            pools = json.load(response)["pools"]
        assert [pool["name"] for pool in pools] == ["from-yaml"]
    finally:
        server.stop()


def test_check_rejects_missing_file(tmp_path: Path) -> None:
    out = run_server_cli("--config", str(tmp_path / "nope.toml"), "--check")
    assert out.returncode == 1
    assert "nope.toml" in out.stderr


@pytest.mark.asyncio
async def test_sigterm_lets_running_attempts_finish_then_exits_zero(server: ServerProcess) -> None:
    started = asyncio.Event()
    release = asyncio.Event()

    async def handler(lease: Lease) -> str:
        started.set()
        await release.wait()
        return "finished during shutdown"

    async with worker(server.target, handler) as w, Client(server.target) as client:
        # The handler starting proves the server accepted this Submit, whose wait is now in flight.
        waiting = asyncio.create_task(client.submit(b"x", wait=True, wait_timeout=20))
        await asyncio.wait_for(started.wait(), 10)
        server.signal(signal.SIGTERM)
        # New work is refused while the running attempt is given its grace period.
        for _ in range(100):
            try:
                await client.submit(b"late")
            except Exception as err:
                assert getattr(err, "code", None) == "unavailable", err
                break
            await asyncio.sleep(0.02)
        else:
            pytest.fail("server kept admitting work after SIGTERM")
        release.set()
        done = await waiting
        assert done.result is not None
        assert done.result.status == "succeeded" and done.result.text() == "finished during shutdown"
        assert await asyncio.to_thread(server.wait, 20) == 0
        for _ in range(100):
            if w.last_shutdown:
                break
            await asyncio.sleep(0.02)
        assert w.last_shutdown
    assert '"left_running": 0' in server.logs()


@pytest.mark.asyncio
async def test_metrics_exposition(server: ServerProcess) -> None:
    async def handler(lease: Lease) -> None:
        return None

    async with worker(server.target, handler, slots=2), Client(server.target) as client:
        done = await client.submit(b"x", wait=True, wait_timeout=10)
        assert done.result is not None and done.result.status == "succeeded"
        await client.submit(b"y", pool="other")
        body = await asyncio.to_thread(
            lambda: urllib.request.urlopen(f"{server.http}/metrics", timeout=5).read()
        )
    text = body.decode()
    metrics = Metrics(text)
    assert metrics("cronoq_tasks_total", pool="default", outcome="succeeded") == 1
    assert metrics("cronoq_pool_capacity", pool="default") == 2
    assert metrics("cronoq_pool_pending", pool="other", priority="normal") == 1
    # autoscale = true (the default): the autoscaler's target, within [min, max] = [1, 16]
    assert 1 <= metrics("cronoq_pool_desired_workers", pool="default") <= 16
    assert metrics("cronoq_pool_held", pool="default") == 0
    assert metrics("cronoq_pool_reservations", pool="default") == 0
    assert metrics("cronoq_recurring_conflicts_total") == 0
    assert "# TYPE cronoq_tasks_total counter" in text


def _serving(server: ServerProcess) -> dict[str, object]:
    serving = [json.loads(line) for line in server.logs().splitlines() if '"event": "serving"' in line]
    assert len(serving) == 1, server.logs()
    return dict(serving[0])


def _serving_event_loop(server: ServerProcess) -> str:
    return str(_serving(server)["event_loop"])


def test_the_serving_line_says_which_engine_build_runs(tmp_path: Path) -> None:
    """The server runs the engine this test process runs (test_compiled checks that it is the compiled
    one unless CRONOQ_COMPILE=0), and says so."""
    with running_server(tmp_path) as server:
        assert _serving(server)["engine"] == ("compiled" if compiled() else "interpreted")


@pytest.mark.parametrize(("choice", "loop"), [("", "uvloop"), ("asyncio", "asyncio")])
def test_the_server_runs_on_the_event_loop_chosen(tmp_path: Path, choice: str, loop: str) -> None:
    """uvloop by default (a dependency on this platform), the standard loop when asked; the serving log
    line says which, and the server works on either."""
    with running_server(tmp_path, env={"CRONOQ_EVENT_LOOP": choice}) as server:
        assert _serving_event_loop(server) == loop
        with urllib.request.urlopen(f"{server.http}/v1/snapshot", timeout=5) as response:
            assert response.status == 200


def test_an_unknown_event_loop_is_refused_by_every_program(tmp_path: Path) -> None:
    bad = environment(CRONOQ_EVENT_LOOP="tokio")
    message = "CRONOQ_EVENT_LOOP='tokio': expected one of auto, uvloop, asyncio"
    out = run_server_cli(env=bad)
    assert out.returncode == 1 and out.stderr == f"cronoq-server: cannot start:\n  - {message}\n"
    cli = subprocess.run(
        [sys.executable, "-m", "cronoq.cli", "snapshot"], capture_output=True, text=True, timeout=60, env=bad
    )
    assert cli.returncode == 2 and f"cronoq: error: {message}" in cli.stderr


def test_version_flags() -> None:
    out = run_server_cli("--version")
    assert out.returncode == 0 and out.stdout.startswith("cronoq-server ")
    cli = subprocess.run(
        [sys.executable, "-m", "cronoq.cli", "--version"], capture_output=True, text=True, timeout=60
    )
    assert cli.returncode == 0 and cli.stdout.startswith("cronoq ")


@pytest.mark.parametrize(
    ("body", "key"),
    [
        ('[server.grpc_web]\nallowed_origins = ["https://app.example.com"]\n', "server.grpc_web"),
    ],
)
def test_settings_this_version_cannot_honour_are_refused(tmp_path: Path, body: str, key: str) -> None:
    cfg = tmp_path / "later.toml"
    cfg.write_text(body)
    for args in (("--check",), ()):
        out = run_server_cli("--config", str(cfg), *args)
        assert out.returncode == 1, out.stdout
        assert f"  - {key}:" in out.stderr and "not supported by this server version" in out.stderr


def test_resources_fair_share_and_the_webhook_scaler_are_accepted(tmp_path: Path) -> None:
    cfg = tmp_path / "now.toml"
    cfg.write_text(
        '[[pools]]\nname = "default"\nfair_share = true\ntenant_weights = { gold = 3.0 }\n'
        "await_unknown_dependencies_s = 30\n"
        'scaler = { kind = "webhook", url = "https://scaler.example.com/hook" }\n'
        '[[resources]]\nkind = "semaphore"\nname = "gpu"\npermits = 2\n'
        '[[resources]]\nkind = "token_bucket"\nname = "api"\nrate = 5.0\nburst = 10\n'
    )
    out = run_server_cli("--config", str(cfg), "--check")
    assert out.returncode == 0, out.stderr
    cfg.write_text(
        '[[pools]]\nname = "default"\nscaler = { kind = "webhook", url = "http://scaler.example.com/" }\n'
    )
    out = run_server_cli("--config", str(cfg), "--check")
    assert out.returncode == 1 and "  - pools[0].scaler.url: plain http to 'scaler.example.com'" in out.stderr


SHARDED = (
    '[[pools]]\nname = "a1"\n'
    'scaler = { kind = "webhook", url = "https://scaler.example.com/hook", token_env = "HOOK_TOKEN" }\n'
    '[[pools]]\nname = "b1"\n'
    '[[shards]]\nname = "a"\nnumber = 1\nendpoint = "http://127.0.0.1:7070"\npools = ["a1"]\n'
    '[[shards]]\nname = "b"\nnumber = 2\nendpoint = "http://127.0.0.1:7080"\npools = ["b1"]\n'
)


def test_check_without_a_shard_checks_the_file_for_every_shard(tmp_path: Path) -> None:
    """One file serves every shard and CI checks it once: without a shard ``--check`` passes a good
    sharded file, naming every shard's secrets; only serving needs the shard (an empty CRONOQ_SHARD
    counts as none, like an empty CRONOQ_CONFIG)."""
    cfg = tmp_path / "sharded.toml"
    cfg.write_text(SHARDED)
    unset = environment(CRONOQ_SHARD="", HOOK_TOKEN=None)
    out = run_server_cli("--config", str(cfg), "--check", env=unset)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("configuration ok for every shard (a, b)")
    assert (
        "note: pools[0].scaler.token_env: cronoq-server needs environment variable HOOK_TOKEN" in out.stdout
    )
    # Shard b never sends a1's webhook, so it runs without that secret.
    out = run_server_cli("--config", str(cfg), "--check", "--shard", "b", env=unset)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("configuration ok for shard b") and "HOOK_TOKEN" not in out.stdout
    serving = run_server_cli("--config", str(cfg), env=environment(CRONOQ_SHARD="", HOOK_TOKEN="t"))
    assert serving.returncode == 1
    assert "  - server.shard: required with [[shards]]" in serving.stderr
    assert "1 to 64 characters" not in serving.stderr


SECRETS = (
    '[[auth.tokens]]\ntoken_env = "T_ADMIN"\nrole = "admin"\n'
    '[store]\nkind = "postgres"\nurl_env = "T_DB_URL"\n'
    '[[shards]]\nname = "a"\nnumber = 1\nendpoint = "http://127.0.0.1:7070"\npools = ["default"]\n'
)


def test_check_names_the_secrets_variables_without_needing_them(tmp_path: Path) -> None:
    """``--check`` in CI, where the secrets are not: each program passes a good file and names, as notes,
    the variables it reads secrets from at start (the router no store URL); start-up still refuses them
    unset, and a variable that is set is checked as start-up checks it."""
    cfg = tmp_path / "secrets.toml"
    cfg.write_text(SECRETS)
    unset = environment(T_ADMIN=None, T_DB_URL=None, CRONOQ_SHARD="a")
    admin, url = "auth.tokens[0].token_env", "store.url_env"
    out = run_server_cli("--config", str(cfg), "--check", env=unset)
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[1:] == [
        f"note: {admin}: cronoq-server needs environment variable T_ADMIN at start (not set here, so its "
        "value was not checked)",
        f"note: {url}: cronoq-server needs environment variable T_DB_URL at start (not set here, so its "
        "value was not checked)",
    ]
    router = run_server_cli("--config", str(cfg), "--check", env=unset, module="cronoq.router.main")
    assert router.returncode == 0, router.stderr
    assert router.stdout.splitlines()[1:] == [
        f"note: {admin}: cronoq-router needs environment variable T_ADMIN at start (not set here, so its "
        "value was not checked)"
    ]
    started = run_server_cli("--config", str(cfg), env=unset)
    assert started.returncode == 1
    assert f"  - {admin}: environment variable T_ADMIN is not set" in started.stderr
    assert f"  - {url}: environment variable T_DB_URL is not set" in started.stderr
    set_here = environment(T_ADMIN="too-short", T_DB_URL="postgresql://db/cronoq", CRONOQ_SHARD="a")
    out = run_server_cli("--config", str(cfg), "--check", env=set_here)
    assert out.returncode == 1
    assert f"  - {admin}: the token in T_ADMIN must be at least 16 characters" in out.stderr
    out = run_server_cli("--config", str(cfg), "--check", env={**set_here, "T_ADMIN": "a" * 16})
    assert out.returncode == 0, out.stderr
    assert f"note: {url}: cronoq-server needs environment variable T_DB_URL at start (set here" in out.stdout


def test_check_reads_the_files_the_config_names(tmp_path: Path, tls_pki: Pki) -> None:
    """What startup would fail to open fails ``--check`` too, naming the key: TLS files and the
    directory of a SQLite store."""
    missing = tmp_path / "missing"
    cfg = tmp_path / "files.toml"
    cfg.write_text(
        f'[server.tls]\ncert_path = "{missing / "server.pem"}"\nkey_path = "{tls_pki.server_key}"\n'
        + sqlite_store(missing / "state.db")
    )
    out = run_server_cli("--config", str(cfg), "--check")
    assert out.returncode == 1
    assert f"  - server.tls.cert_path: cannot read {missing / 'server.pem'}" in out.stderr
    assert f"  - store.path: directory {missing} does not exist" in out.stderr
    cfg.write_text(_tls_config(tls_pki, mtls=True) + sqlite_store(tmp_path / "state.db"))
    out = run_server_cli("--config", str(cfg), "--check")
    assert out.returncode == 0, out.stderr


def test_check_notes_how_far_a_sqlite_standby_can_take_over(tmp_path: Path) -> None:
    """Whether a SQLite standby can end a paused leader depends on where the two run, which no check can
    see: ``--check`` says so, as a note that does not fail the check."""
    cfg = tmp_path / "sqlite.toml"
    cfg.write_text(sqlite_store(tmp_path / "state.db"))
    out = run_server_cli("--config", str(cfg), "--check")
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines()[1:] == [f"note: {SQLITE_FAILOVER_NOTE}"]
    cfg.write_text('[store]\nkind = "memory"\n')
    out = run_server_cli("--config", str(cfg), "--check")
    assert out.returncode == 0 and "note:" not in out.stdout, out


def test_the_router_checks_the_file_by_the_servers_rules(tmp_path: Path, tls_pki: Pki) -> None:
    """The router reads the server's file and applies its rules: mTLS certificates are credentials
    for a non-loopback listener, [server.grpc_web] is refused, its two listeners need two addresses,
    and its TLS files must be readable."""
    cluster = (
        '[[pools]]\nname = "a1"\n'
        '[[shards]]\nname = "a"\nnumber = 1\nendpoint = "http://127.0.0.1:7070"\npools = ["a1"]\n'
        '[router]\ngrpc_addr = "0.0.0.0:8070"\nhttp_addr = "0.0.0.0:8071"\n'
    )
    mtls_only = (
        _tls_config(tls_pki, mtls=True) + '[[auth.certs]]\ndns_name = "worker-1.internal"\nrole = "admin"\n'
    )
    cfg = tmp_path / "router.toml"
    cfg.write_text(mtls_only + cluster)
    out = run_router_cli("--config", str(cfg), "--check")
    assert out.returncode == 0, out.stderr
    cfg.write_text(mtls_only + cluster + "[server.grpc_web]\n")
    for checked in (
        run_router_cli("--config", str(cfg), "--check"),
        run_server_cli("--config", str(cfg), "--check", "--shard", "a"),
    ):
        assert checked.returncode == 1, checked.stdout
        assert "  - server.grpc_web: not supported by this server version yet" in checked.stderr
    cfg.write_text(mtls_only + cluster.replace("8071", "8070"))
    out = run_router_cli("--config", str(cfg), "--check")
    assert out.returncode == 1
    assert (
        "  - router.http_addr: duplicate listener address '0.0.0.0:8070' (also at router.grpc_addr)"
        in out.stderr
    )
    cfg.write_text(mtls_only.replace(str(tls_pki.ca), str(tmp_path / "no-ca.pem")) + cluster)
    out = run_router_cli("--config", str(cfg), "--check")
    assert out.returncode == 1
    assert f"  - server.tls.client_ca_path: cannot read {tmp_path / 'no-ca.pem'}" in out.stderr


def test_the_router_checks_it_has_something_to_route_to(tmp_path: Path) -> None:
    """A router routes by [[shards]] or, in front of a cluster without them, by ``[router] members``;
    with neither it would have nowhere to send a call."""
    cfg = tmp_path / "router.toml"
    cfg.write_text('[[pools]]\nname = "a1"\n')
    out = run_router_cli("--config", str(cfg), "--check")
    assert out.returncode == 1
    assert "  - shards: a router needs the [[shards]] it routes to or, in front of a cluster" in out.stderr
    cfg.write_text('[router]\nmembers = ["http://s-0:7070", "http://s-1:7070"]\n[[pools]]\nname = "a1"\n')
    out = run_router_cli("--config", str(cfg), "--check")
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("configuration ok: one unsharded cluster of 2 member(s)")
    assert run_server_cli("--config", str(cfg), "--check").returncode == 0  # servers ignore [router]


def test_non_loopback_without_credentials_is_refused(tmp_path: Path) -> None:
    cfg = tmp_path / "open.toml"
    cfg.write_text('[server]\ngrpc_addr = "0.0.0.0:7070"\n')
    out = run_server_cli("--config", str(cfg), "--check")
    assert out.returncode == 1 and "server.grpc_addr" in out.stderr
    assert run_server_cli("--config", str(cfg), "--check", "--insecure-no-auth").returncode == 0


def test_a_port_in_use_is_a_clear_startup_error(tmp_path: Path, server: ServerProcess) -> None:
    cfg = tmp_path / "clash.toml"
    cfg.write_text(f'[server]\ngrpc_addr = "{server.target}"\nhttp_addr = "127.0.0.1:{server.http_port}"\n')
    out = run_server_cli("--config", str(cfg))
    assert out.returncode == 1
    assert f"cronoq-server: cannot start: server.grpc_addr: cannot listen on {server.target}" in out.stderr


def test_metrics_addr_serves_metrics_without_a_token(tmp_path: Path) -> None:
    port = free_port()
    body = f'[server]\nmetrics_addr = "127.0.0.1:{port}"\n' + AUTH_CONFIG
    with running_server(tmp_path, body, env=AUTH_ENV) as server:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as r:
            assert r.status == 200 and b"cronoq_pool_capacity" in r.read()
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/readyz", timeout=5) as r:
            assert r.status == 200
        # Only metrics and probes live there; the API stays on the authenticated port.
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/v1/snapshot", timeout=5)
        assert err.value.code == 404
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"{server.http}/metrics", timeout=5)
        assert err.value.code == 401
