"""The configuration layer: good files load with the right values, bad ones name the offending key, in
TOML and in YAML alike (every bad TOML case is also checked as the same document in YAML).

No sockets and no real environment: every test passes ``env`` explicitly.
"""

from __future__ import annotations

import copy
import itertools
import json
import math
import tomllib
from collections.abc import Mapping
from dataclasses import fields
from pathlib import Path
from typing import Any

import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cronoq.config import (
    CertSection,
    Config,
    ConfigError,
    ExternalScaler,
    GrpcWebSection,
    Limits,
    MemoryStoreSection,
    OutputsSection,
    Overflow,
    PeerTlsSection,
    PoolSection,
    PostgresStoreSection,
    Problem,
    RetrySection,
    Role,
    RouterSection,
    SemaphoreResource,
    ServerSection,
    ShardSection,
    SqliteStoreSection,
    Syntax,
    TlsSection,
    TokenBucketResource,
    TokenSection,
    WebhookScaler,
    default_config,
    load_config,
    parse_config,
    read_config,
    validate_config,
)
from cronoq.config.model import MAX_KEY_BYTES
from cronoq.config.rules import RESOLVED_KEY
from cronoq.config.syntax import MAX_DEPTH, MAX_VALUES
from cronoq.engine.model import (
    AutoscaleRule,
    EngineLimits,
    PoolConfig,
    Priority,
    RetryRule,
    Semaphore,
    TokenBucket,
    UnknownDependency,
)
from cronoq.errors import CronoqError
from cronoq.serving import file_problems
from shard.store.factory import make_store
from shard.store.postgres import Keepalives, PostgresStore

ROOT = Path(__file__).resolve().parents[2]
EXAMPLE = ROOT / "examples" / "cronoq.toml"
DOCS = ROOT / "docs" / "configuration.md"

WORKER_TOKEN = "worker-token-from-env-0123456789"
LITERAL_TOKEN = "literal-admin-token-0123456789"
ENV = {
    "WORKER_TOKEN": WORKER_TOKEN,
    "PG_URL": "postgres://cronoq:pw@db:5432/cronoq?sslmode=verify-full",
    "SCALER_TOKEN": "scaler-token-0123456789",
}

# Every table and every key, each with a value other than its default.
FULL = """
[server]
grpc_addr = "0.0.0.0:7070"
http_addr = "[::]:7071"
metrics_addr = "127.0.0.1:9090"
insecure_no_auth = false
shutdown_grace_s = 5.5
shard = "cpu"
insecure_peer_http = true
http_max_connections = 300
http_header_timeout_s = 4.5
http_idle_timeout_s = 20
grpc_max_streams_per_connection = 250

[server.tls]
cert_path = "/tls/server.crt"
key_path = "/tls/server.key"
client_ca_path = "/tls/clients-ca.crt"

[server.peer_tls]
ca_path = "/tls/peers-ca.crt"
cert_path = "/tls/peer.crt"
key_path = "/tls/peer.key"

[server.grpc_web]
allowed_origins = ["https://app.example.com", "http://localhost:3000", "*"]

[[auth.tokens]]
token = "literal-admin-token-0123456789"
role = "admin"

[[auth.tokens]]
token_env = "WORKER_TOKEN"
role = "worker"
pools = ["default"]
labels = ["gpu=a100", "region=eu"]
tenant = "acme"

[[auth.certs]]
dns_name = "worker-1.internal"
role = "worker"
pools = ["llm"]
labels = ["gpu=h100"]
tenant = "acme"

[store]
kind = "postgres"
url_env = "PG_URL"
schema = "cronoq_{shard}"
keep_finished_s = 86400
keepalives_idle_s = 7
keepalives_interval_s = 2
keepalives_count = 3
tcp_user_timeout_s = 4.5

[limits]
max_tasks_per_batch = 10
max_pending_total = 20
max_pending_per_pool = 30
max_message_bytes = 65536
max_http_body_bytes = 131072
max_key_len = 40
max_kind_len = 50
max_tags = 6
max_tag_len = 70
max_deps = 8
max_resources = 9
max_wait_s = 11.5
request_timeout_s = 12
max_concurrent_requests = 13
max_concurrent_streams = 14
max_slots_per_worker = 15
keepalive_interval_s = 16
keepalive_timeout_s = 17
key_retention_s = 18
key_retention_max = 19
max_list = 21

[[pools]]
name = "default"

[[pools]]
name = "llm"
min = 0
max = 200
autoscale = false
scaler = { kind = "webhook", url = "https://scaler.internal/hook", token_env = "SCALER_TOKEN" }
lease_ttl_s = 120
max_pending = 500
overflow = "shed_oldest"
retry = { max_attempts = 5, initial_backoff_s = 0.5, multiplier = 3, max_backoff_s = 90, jitter = false }
default_duration_s = 20
reservable_fraction = 0.25
await_unknown_dependencies_s = 60
target_utilization = 0.9
drain_time_s = 45
cooldown_s = 0
cost_per_worker_second = 0.002
max_slots_per_worker = 8
fair_share = true
tenant_weights = { research = 1, "prod team" = 2.5 }

[[resources]]
kind = "semaphore"
name = "gpu_mem"
permits = 8
shard = "gpu"

[[resources]]
kind = "token_bucket"
name = "partner_api"
rate = 2.5
burst = 10
shard = "cpu"

[outputs]
cache_entries = 100
cache_bytes = 1048576
info_entries = 200

[[shards]]
name = "cpu"
number = 1
pools = ["default"]
endpoint = "https://cronoq-cpu.internal:7070"
members = ["https://cpu-0.internal:7070", "https://cpu-1.internal:7070"]

[[shards]]
name = "gpu"
number = 2
pools = ["llm"]
endpoint = "https://cronoq-gpu.internal:7070"

[router]
grpc_addr = "0.0.0.0:8070"
http_addr = "0.0.0.0:8071"
"""

FULL_WITHOUT_SHARD = FULL.replace('shard = "cpu"\ninsecure_peer_http', "insecure_peer_http")

SECTIONS: tuple[type[Any], ...] = (
    ServerSection,
    TlsSection,
    PeerTlsSection,
    GrpcWebSection,
    TokenSection,
    CertSection,
    MemoryStoreSection,
    SqliteStoreSection,
    PostgresStoreSection,
    Limits,
    PoolSection,
    RetrySection,
    ExternalScaler,
    WebhookScaler,
    SemaphoreResource,
    TokenBucketResource,
    OutputsSection,
    ShardSection,
    RouterSection,
)


SYNTAXES: list[Syntax] = ["toml", "yaml"]


def in_syntax(toml_text: str, syntax: Syntax) -> str:
    """The document of ``toml_text`` written in ``syntax``: for YAML, as PyYAML writes it (block style)."""
    if syntax == "toml":
        return toml_text
    return yaml.safe_dump(tomllib.loads(toml_text), sort_keys=False, allow_unicode=True)


def problems(
    text: str, env: Mapping[str, str] | None = None, syntax: Syntax = "toml", **overrides: Any
) -> list[Problem]:
    with pytest.raises(ConfigError) as caught:
        parse_config(text, env=ENV if env is None else env, syntax=syntax, **overrides)
    return list(caught.value.problems)


def the_problem(
    text: str, path: str, env: Mapping[str, str] | None = None, syntax: Syntax = "toml"
) -> Problem:
    """The one problem reported at ``path`` (fails listing all problems otherwise)."""
    found = problems(text, env, syntax)
    at = [p for p in found if p.path == path]
    assert len(at) == 1, [str(p) for p in found]
    return at[0]


def problem_at(text: str, path: str, env: Mapping[str, str] | None = None) -> str:
    """The message of the one problem reported at ``path``."""
    return the_problem(text, path, env).message


def pool(body: str) -> str:
    return f'[[pools]]\nname = "p"\n{body}\n'


# --------------------------------------------------------------------------------------- good files


def test_no_file_is_one_default_pool_on_loopback_without_auth() -> None:
    config = validate_config(default_config(), env={})
    assert config == Config()
    assert [p.name for p in config.pools] == ["default"]
    assert config == parse_config("", env={})
    assert isinstance(config.store, MemoryStoreSection)
    assert config.server.grpc_addr == "127.0.0.1:7070"
    assert config.server.http_addr == "127.0.0.1:7071"
    assert config.server.shutdown_grace_s == 10
    assert not config.auth_enabled
    assert config.own_shard() is None
    assert config.store.keep_finished_s == 604800


def test_default_pool_matches_the_reference_engine_defaults() -> None:
    engine = Config().pools[0].to_engine(Limits())
    assert engine == PoolConfig(
        name="default",
        max=10,
        min=1,
        lease_ttl=30.0,
        max_pending=Limits().max_pending_per_pool,
        overflow=Overflow.WAIT,
        retry=RetryRule(max_attempts=3, initial_backoff=1.0, multiplier=2.0, max_backoff=60.0, jitter=True),
        default_duration=1.0,
        max_slots_per_worker=Limits().max_slots_per_worker,
        cost_per_worker_second=0.0,
        autoscale=AutoscaleRule(),  # autoscale = true: the engine's autoscaler defaults
        unknown_dependency=UnknownDependency.REJECT,
        await_timeout=None,
        reservable_fraction=0.5,
        fair_share=False,
        tenant_weights={},
    )
    assert Config().pools[0].reservable_fraction == 0.5


def test_autoscale_settings_and_unsharded_resources_reach_the_engine() -> None:
    config = parse_config(
        "[[pools]]\nname = 'p'\ntarget_utilization = 0.5\ndrain_time_s = 10\ncooldown_s = 5\n"
        "cost_per_worker_second = 0.25\n"
        "scaler = { kind = 'webhook', url = 'http://127.0.0.1:9/hook' }\n"  # plain http: loopback only
        "[[resources]]\nkind = 'semaphore'\nname = 'gpu'\npermits = 2\n"
        "[[resources]]\nkind = 'token_bucket'\nname = 'api'\nrate = 4\nburst = 2\n",
        env={},
    )
    engine = config.engine_pools()[0]
    assert engine.autoscale == AutoscaleRule(target_utilization=0.5, drain_time=10, cooldown=5)
    assert engine.cost_per_worker_second == 0.25
    assert config.engine_resources(None) == [Semaphore("gpu", 2), TokenBucket("api", 4, 2)]


def test_limits_has_exactly_the_21_reference_keys_with_documented_defaults() -> None:
    names = [f.name for f in fields(Limits)]
    assert names == [
        "max_tasks_per_batch",
        "max_pending_total",
        "max_pending_per_pool",
        "max_message_bytes",
        "max_http_body_bytes",
        "max_key_len",
        "max_kind_len",
        "max_tags",
        "max_tag_len",
        "max_deps",
        "max_resources",
        "max_wait_s",
        "request_timeout_s",
        "max_concurrent_requests",
        "max_concurrent_streams",
        "max_slots_per_worker",
        "keepalive_interval_s",
        "keepalive_timeout_s",
        "key_retention_s",
        "key_retention_max",
        "max_list",
    ]
    assert Limits().keepalive_interval_s == 20
    assert Limits().to_engine() == EngineLimits(max_pending_total=1_000_000, key_retention=86_400.0)


def test_example_file_passes_validation() -> None:
    names = ["CLIENT", "WORKER", "METRICS", "ADMIN", "SCALER"]
    env = {f"CRONOQ_{n}_TOKEN": f"{n.lower()}-token-0123456789abcdef" for n in names}
    config = load_config(EXAMPLE, env=env)
    assert [t.resolved_token for t in config.auth.tokens] == [
        env[t.token_env or ""] for t in config.auth.tokens
    ]
    assert isinstance(config.store, SqliteStoreSection)
    llm = config.pool("llm")
    assert llm is not None and isinstance(llm.scaler, WebhookScaler)
    assert llm.scaler.resolved_token == env["CRONOQ_SCALER_TOKEN"]
    assert not config.server.insecure_no_auth


def test_example_file_needs_its_token_variables() -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(EXAMPLE, env={})
    assert {p.path for p in caught.value.problems} == {
        "auth.tokens[0].token_env",
        "auth.tokens[1].token_env",
        "auth.tokens[2].token_env",
        "auth.tokens[3].token_env",
        "pools[1].scaler.token_env",
    }


def test_full_file_reads_every_table() -> None:
    config = parse_config(FULL, env=ENV)
    server = config.server
    assert (server.grpc_addr, server.http_addr, server.metrics_addr) == (
        "0.0.0.0:7070",
        "[::]:7071",
        "127.0.0.1:9090",
    )
    assert server.tls == TlsSection("/tls/server.crt", "/tls/server.key", "/tls/clients-ca.crt")
    assert server.peer_tls == PeerTlsSection("/tls/peers-ca.crt", "/tls/peer.crt", "/tls/peer.key")
    assert server.grpc_web is not None and len(server.grpc_web.allowed_origins) == 3
    assert server.shutdown_grace_s == 5.5 and server.insecure_peer_http
    assert (server.http_max_connections, server.http_header_timeout_s) == (300, 4.5)
    assert (server.http_idle_timeout_s, server.grpc_max_streams_per_connection) == (20, 250)

    admin, worker = config.auth.tokens
    assert (admin.role, admin.resolved_token) == (Role.ADMIN, LITERAL_TOKEN)
    assert (worker.role, worker.resolved_token, worker.pools, worker.tenant) == (
        Role.WORKER,
        WORKER_TOKEN,
        ("default",),
        "acme",
    )
    entries = config.auth.token_entries()
    assert entries[1].labels == {"gpu": "a100", "region": "eu"}
    assert entries[1].pools == frozenset({"default"})
    assert entries[0].labels is None and entries[0].pools is None
    assert config.auth.certs[0].dns_name == "worker-1.internal"
    assert config.auth.certs[0].label_map() == {"gpu": "h100"}

    store = config.store
    assert isinstance(store, PostgresStoreSection)
    assert store.resolved_url == ENV["PG_URL"]
    assert store.schema_for("gpu") == "cronoq_gpu"
    assert store.keep_finished_s == 86400
    built = make_store(config)
    assert isinstance(built, PostgresStore)
    assert built._keepalives == Keepalives(idle_s=7, interval_s=2, count=3, user_timeout_s=4.5)

    assert [getattr(config.limits, f.name) for f in fields(Limits)] == [
        10, 20, 30, 65536, 131072, 40, 50, 6, 70, 8, 9, 11.5, 12, 13, 14, 15, 16, 17, 18, 19, 21,
    ]  # fmt: skip

    llm = config.pool("llm")
    assert llm is not None
    # Read as shard cpu's file, and llm is gpu's: its webhook's secret is left for gpu's servers.
    assert llm.scaler == WebhookScaler("https://scaler.internal/hook", "SCALER_TOKEN")
    assert llm.overflow is Overflow.SHED_OLDEST
    assert dict(llm.tenant_weights) == {"research": 1.0, "prod team": 2.5}
    assert (llm.autoscale, llm.fair_share, llm.await_unknown_dependencies_s) == (False, True, 60)
    assert (llm.reservable_fraction, llm.target_utilization, llm.drain_time_s, llm.cooldown_s) == (
        0.25,
        0.9,
        45,
        0,
    )
    engine = llm.to_engine(config.limits)
    assert engine.retry == RetryRule(5, 0.5, 3.0, 90.0, False)
    assert (engine.max_pending, engine.max_slots_per_worker, engine.lease_ttl) == (500, 8, 120.0)
    assert (engine.min, engine.max, engine.default_duration, engine.cost_per_worker_second) == (
        0,
        200,
        20,
        0.002,
    )
    # Every pool key the engine honours reaches it.
    assert engine.autoscale is None  # autoscale = false
    assert (engine.unknown_dependency, engine.await_timeout) == (UnknownDependency.AWAIT, 60)
    assert (engine.reservable_fraction, engine.fair_share) == (0.25, True)
    assert dict(engine.tenant_weights) == {"research": 1.0, "prod team": 2.5}
    default = config.engine_pools()[0]
    assert (default.max_pending, default.max_slots_per_worker) == (30, 15)  # from [limits]
    assert default.unknown_dependency is UnknownDependency.REJECT and default.await_timeout is None

    assert config.resources == (
        SemaphoreResource("gpu_mem", 8, "gpu"),
        TokenBucketResource("partner_api", 2.5, 10, "cpu"),
    )
    # A server schedules only its own shard's resources.
    assert config.engine_resources("cpu") == [TokenBucket("partner_api", 2.5, 10)]
    assert config.engine_resources("gpu") == [Semaphore("gpu_mem", 8)]
    assert config.outputs == OutputsSection(100, 1048576, 200)
    own = config.own_shard()
    assert own is not None and own.name == "cpu" and own.number == 1
    assert own.members == ("https://cpu-0.internal:7070", "https://cpu-1.internal:7070")
    gpu = config.shard_for_pool("llm")
    assert gpu is not None and gpu.name == "gpu"
    assert config.router == RouterSection("0.0.0.0:8070", "0.0.0.0:8071")


def test_a_pools_wait_time_objectives_reach_its_autoscaler() -> None:
    config = parse_config(pool("slo = { normal = 5, critical = 0.5 }"), env={})
    section = config.pool("p")
    assert section is not None
    autoscale = section.to_engine(config.limits).autoscale
    assert autoscale is not None and dict(autoscale.slo) == {Priority.NORMAL: 5.0, Priority.CRITICAL: 0.5}


def test_pool_lookup() -> None:
    config = Config()
    assert config.pool("default") is config.pools[0]
    assert config.pool("nope") is None
    assert config.shard_for_pool("default") is None


def test_overrides_are_applied_before_validation() -> None:
    open_bind = '[server]\ngrpc_addr = "0.0.0.0:7070"\n'
    assert any("insecure_no_auth" in p.message for p in problems(open_bind, env={}))
    config = parse_config(open_bind, env={}, insecure_no_auth=True)
    assert config.server.insecure_no_auth

    stepwise = validate_config(read_config(open_bind).with_overrides(None, insecure_no_auth=True), env={})
    assert stepwise == config

    sharded = FULL_WITHOUT_SHARD
    assert parse_config(sharded, env=ENV, shard="gpu").own_shard() == parse_config(FULL, env=ENV).shards[1]
    unknown = [p for p in problems(FULL, shard="tpu") if p.path == "server.shard"]
    assert len(unknown) == 1 and "'tpu'" in unknown[0].message and "cpu, gpu" in unknown[0].message


def test_override_flag_only_turns_insecure_no_auth_on() -> None:
    config = read_config("[server]\ninsecure_no_auth = true\n")
    assert config.with_overrides(None, False).server.insecure_no_auth
    assert config.with_overrides("x").server.shard == "x"


def test_a_sharded_server_must_be_told_its_shard() -> None:
    config = parse_config(FULL_WITHOUT_SHARD, env=ENV)  # fine for the router
    with pytest.raises(ConfigError) as caught:
        config.own_shard()
    assert caught.value.problems[0].path == "server.shard"
    assert "--shard" in caught.value.problems[0].message


SHARDED_WEBHOOK = """
[[pools]]
name = "a1"
scaler = { kind = "webhook", url = "https://scaler.internal/hook", token_env = "HOOK_TOKEN" }
[[pools]]
name = "b1"
[[shards]]
name = "a"
number = 1
endpoint = "http://a.internal:7070"
pools = ["a1"]
[[shards]]
name = "b"
number = 2
endpoint = "http://b.internal:7070"
pools = ["b1"]
"""


def test_a_webhook_secret_is_needed_only_where_the_webhook_is_sent() -> None:
    """Only servers of the shard owning the pool post its webhook: the router and the other shards run
    without the secret. Checked without a shard (one file for every shard), the file needs it."""
    elsewhere: list[dict[str, Any]] = [{"shard": "b"}, {"router": True}]
    for reader in elsewhere:
        scaler = parse_config(SHARDED_WEBHOOK, env={}, **reader).pools[0].scaler
        assert scaler == WebhookScaler("https://scaler.internal/hook", "HOOK_TOKEN"), reader
    missing = ["pools[0].scaler.token_env: environment variable HOOK_TOKEN is not set"]
    assert [str(p) for p in problems(SHARDED_WEBHOOK, env={}, shard="a")] == missing
    assert [str(p) for p in problems(SHARDED_WEBHOOK, env={})] == missing
    sent = parse_config(SHARDED_WEBHOOK, env={"HOOK_TOKEN": "hook-secret"}, shard="a").pools[0].scaler
    assert isinstance(sent, WebhookScaler) and sent.resolved_token == "hook-secret"
    # The URL is the file's own mistake: every reader reports it.
    plain = SHARDED_WEBHOOK.replace("https://scaler.internal", "http://scaler.internal")
    for reader in elsewhere:
        assert [p.path for p in problems(plain, env={}, **reader)] == ["pools[0].scaler.url"], reader


def test_file_checks_name_the_key_and_stay_out_of_parsing(tmp_path: Path) -> None:
    """Parsing never opens the files a config names (so fake paths parse); what ``--check`` and startup
    add does, and names the key of each file that cannot be used."""
    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    text = (
        f'[server]\nshard = "a"\n'
        f'[server.tls]\ncert_path = "{garbage}"\nkey_path = "{garbage}"\n'
        f'[server.peer_tls]\nca_path = "{tmp_path / "missing-ca.pem"}"\n'
        f'[store]\nkind = "sqlite"\npath = "{tmp_path / "missing" / "state.db"}"\n'
        '[[pools]]\nname = "a1"\n'
        '[[shards]]\nname = "a"\nnumber = 1\nendpoint = "https://a.internal:7070"\npools = ["a1"]\n'
    )
    config = parse_config(text, env={})
    tls, peer, store = file_problems(config)
    assert tls.startswith("server.tls.cert_path/key_path: not a usable certificate and key")
    assert peer.startswith(f"server.peer_tls.ca_path: cannot read {tmp_path / 'missing-ca.pem'}")
    assert store.startswith(f"store.path: directory {tmp_path / 'missing'} does not exist")
    assert file_problems(config, router=True) == [tls, peer]  # the router has no store
    (tmp_path / "missing").mkdir()
    assert file_problems(config, router=True) == file_problems(config)


def test_sharded_postgres_defaults_to_a_schema_per_shard() -> None:
    text = FULL.replace('schema = "cronoq_{shard}"\n', "")
    store = parse_config(text, env=ENV).store
    assert isinstance(store, PostgresStoreSection)
    assert store.schema_for("cpu") == "cronoq_cpu"
    unsharded = parse_config('[store]\nkind = "postgres"\n', env={"DATABASE_URL": "postgres://x"}).store
    assert isinstance(unsharded, PostgresStoreSection) and unsharded.schema_for(None) == "public"
    assert unsharded.resolved_url == "postgres://x"


def sqlite_at(path: str, shards: str = "abc") -> str:
    """A SQLite store at ``path`` for shards named by the letters of ``shards``, a pool each."""
    return f'[store]\nkind = "sqlite"\npath = "{path}"\n' + "".join(
        f'[[pools]]\nname = "{n}1"\n[[shards]]\nname = "{n}"\nnumber = {i}\nendpoint = "http://{n}:7070"\n'
        f'pools = ["{n}1"]\n'
        for i, n in enumerate(shards, 1)
    )


def test_a_sqlite_path_takes_the_shard_name() -> None:
    """As the Postgres schema does: one file for the whole cluster, a database per shard."""
    text = sqlite_at("/var/lib/cronoq/{shard}.db")
    for reader in ({}, {"shard": "b"}, {"router": True}):
        store = parse_config(text, env={}, **reader).store
        assert isinstance(store, SqliteStoreSection), reader
        assert [store.path_for(s) for s in "abc"] == [f"/var/lib/cronoq/{s}.db" for s in "abc"]
    unsharded = parse_config('[store]\nkind = "sqlite"\npath = "state.db"\n', env={}).store
    assert isinstance(unsharded, SqliteStoreSection) and unsharded.path_for(None) == "state.db"


def test_shards_on_one_sqlite_file_are_refused_naming_them() -> None:
    """Servers on one file are one leader group: every shard's server but the first would stand by
    forever. Every server refuses the file (whichever shard it serves), and --check of the whole file;
    a file spelled two ways is one file. The router keeps no store."""
    shared = (
        "store.path: shards 'a', 'b' and 'c' would share the SQLite file '/var/lib/cronoq/state.db', "
        "where only one server leads: put {shard} in the path to give each shard its own file "
        '(e.g. path = "/var/lib/cronoq/{shard}.db")'
    )
    for path in ("/var/lib/cronoq/state.db", "/var/lib/cronoq/{shard}/../state.db"):
        for shard in (None, "a", "c"):
            assert [str(p) for p in problems(sqlite_at(path), env={}, shard=shard)] == [shared], (path, shard)
        parse_config(sqlite_at(path), env={}, router=True)
    assert [p.message for p in problems(sqlite_at("state.db", "ab"), env={})] == [
        "shards 'a' and 'b' would share the SQLite file 'state.db', where only one server leads: put "
        '{shard} in the path to give each shard its own file (e.g. path = "/var/lib/cronoq/{shard}.db")'
    ]


def test_the_sqlite_directory_checked_is_the_shards_own(tmp_path: Path) -> None:
    """A server needs its own shard's directory; --check of the whole file every shard's."""
    text = sqlite_at(f"{tmp_path}/{{shard}}/state.db", "ab")
    (tmp_path / "a").mkdir()
    assert file_problems(parse_config(text, env={}, shard="a")) == []
    for shard in ("b", None):
        (problem,) = file_problems(parse_config(text, env={}, shard=shard))
        assert problem.startswith(f"store.path: directory {tmp_path / 'b'} does not exist"), shard


def test_load_config_reports_unreadable_files(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as caught:
        load_config(tmp_path / "missing.toml", env={})
    assert "cannot read" in str(caught.value)
    bom = tmp_path / "bom.toml"
    bom.write_bytes('\ufeff[[pools]]\nname = "a"\n'.encode())
    assert load_config(bom, env={}).pools[0].name == "a"


def test_config_error_is_a_cronoq_error_listing_every_problem() -> None:
    with pytest.raises(CronoqError) as caught:
        parse_config("[limits]\nmax_list = 0\nmax_deps = -1\n", source="c.toml", env={})
    assert isinstance(caught.value, ConfigError)
    text = str(caught.value)
    assert text.startswith("invalid configuration in c.toml:")
    assert "limits.max_deps: must be at least 0" in text and "limits.max_list: must be at least 1" in text


def test_max_key_len_goes_no_higher_than_a_key_can_take_in_bytes() -> None:
    """A key takes at most MAX_KEY_BYTES bytes of UTF-8 (the stores index it): more characters could
    never be used, so a configuration asking for them is refused at startup, not at the first submit."""
    assert parse_config(f"[limits]\nmax_key_len = {MAX_KEY_BYTES}\n", env={}).limits.max_key_len == 2048
    with pytest.raises(ConfigError) as caught:
        parse_config(f"[limits]\nmax_key_len = {MAX_KEY_BYTES + 1}\n", env={})
    assert "limits.max_key_len: must be at least 1 and at most 2048 (got 2049)" in str(caught.value)


@pytest.mark.parametrize(
    ("syntax", "text", "message"),
    [
        (
            "toml",
            "[server\n",
            "not valid TOML: Expected ']' at the end of a table declaration (at line 1, column 8)",
        ),
        (
            "yaml",
            "server:\n  grpc_addr: 'x\n",
            "not valid YAML: while scanning a quoted scalar, found unexpected end of stream (at line 3, column 1)",
        ),
        (
            "yaml",
            "server:\n\tgrpc_addr: x\n",
            "not valid YAML: while scanning for the next token, found character '\\t' that cannot start any token (at line 2, column 1)",
        ),
        ("yaml", "pools: *p\n", "not valid YAML: found undefined alias 'p' (at line 1, column 8)"),
        (
            "yaml",
            "a: 1\n---\nb: 2\n",
            "not valid YAML: expected a single document in the stream, but found another document (at line 2, column 1)",
        ),
        (
            "yaml",
            "a: \x00\n",
            "not valid YAML: unacceptable character #x0000: special characters are not allowed (at character 4)",
        ),
        (
            "yaml",
            "x: " + "[" * 2000 + "]" * 2000,
            f"not valid YAML: nested more than {MAX_DEPTH} levels deep",
        ),
    ],
)
def test_syntax_errors_are_config_errors_saying_where(syntax: Syntax, text: str, message: str) -> None:
    assert [str(p) for p in problems(text, env={}, syntax=syntax)] == [message]


def test_read_config_checks_types_but_not_ranges() -> None:
    assert read_config(pool("lease_ttl_s = -1")).pools[0].lease_ttl_s == -1
    with pytest.raises(ConfigError):
        read_config(pool('lease_ttl_s = "x"'))


# ---------------------------------------------------------------------------------------- bad files

YEAR = 31_536_000
LONG = "x" * 65

BAD: list[tuple[str, str, str]] = [
    # unknown keys and wrong types
    ("[limits]\nmax_wait_sx = 1", "limits.max_wait_sx", "unknown key (did you mean max_wait_s?)"),
    ("[bogus]\na = 1", "bogus", "unknown key"),
    ("[server.tls]\ncert_path = 'a'\nkey_path = 'b'\nclient_ca = 'c'", "server.tls.client_ca", "unknown key"),
    ("[store]\nkind = 'sqlite'\npath = 'a'\nurl = 'b'", "store.url", 'unknown key for kind = "sqlite"'),
    (pool("scaler = { kind = 'external', url = 'http://a' }"), "pools[0].scaler.url", "unknown key"),
    ("[limits]\nmax_list = true", "limits.max_list", "expected an integer (got boolean)"),
    ("[limits]\nmax_list = 10.0", "limits.max_list", "expected an integer (got float)"),
    ("[limits]\nmax_wait_s = true", "limits.max_wait_s", "expected a number (got boolean)"),
    ("[server]\nshutdown_grace_s = '10'", "server.shutdown_grace_s", "expected a number (got string)"),
    ("[server]\ninsecure_no_auth = 1", "server.insecure_no_auth", "expected true or false (got integer)"),
    ("[server]\ngrpc_addr = 7070", "server.grpc_addr", "expected a string (got integer)"),
    ("[server]\ntls = 'on'", "server.tls", "expected a table (got string)"),
    ("[server]\ngrpc_web = true", "server.grpc_web", "expected a table (got boolean)"),
    ("[server.grpc_web]\nallowed_origins = 'x'", "server.grpc_web.allowed_origins", "expected an array"),
    ("[pools]\nname = 'a'", "pools", "expected an array of tables (got table)"),
    ("pools = ['a']", "pools[0]", "expected a table (got string)"),
    ("pools = []", "pools", "at least one [[pools]] entry"),
    ("[[pools]]\nmin = 1", "pools[0].name", "required"),
    (pool("tenant_weights = 3"), "pools[0].tenant_weights", "expected a table"),
    (pool("tenant_weights = { a = 'heavy' }"), "pools[0].tenant_weights.a", "expected a number"),
    # ranges, non-finite numbers, durations
    (pool("lease_ttl_s = -1"), "pools[0].lease_ttl_s", "must be > 0 and at most 31536000 (got -1)"),
    (pool("lease_ttl_s = 0"), "pools[0].lease_ttl_s", "must be > 0"),
    (pool(f"lease_ttl_s = {YEAR + 1}"), "pools[0].lease_ttl_s", f"at most {YEAR} (got {YEAR + 1})"),
    (pool("default_duration_s = nan"), "pools[0].default_duration_s", "must be a finite number"),
    (pool("drain_time_s = inf"), "pools[0].drain_time_s", "must be a finite number"),
    (pool("cooldown_s = -0.5"), "pools[0].cooldown_s", "at least 0"),
    (pool("await_unknown_dependencies_s = 0"), "pools[0].await_unknown_dependencies_s", "> 0"),
    ("[store]\nkind = 'memory'\nkeep_finished_s = 3.2e7", "store.keep_finished_s", "(got 32000000)"),
    ("[store]\nkind = 'sqlite'\npath = 'a'\nkeep_finished_s = 4e7", "store.keep_finished_s", "at most"),
    ("[server]\nshutdown_grace_s = -1", "server.shutdown_grace_s", "at least 0"),
    ("[store]\nkind = 'postgres'\nkeepalives_idle_s = 0", "store.keepalives_idle_s", "at least 1"),
    ("[store]\nkind = 'postgres'\nkeepalives_count = 128", "store.keepalives_count", "at most 127"),
    ("[store]\nkind = 'postgres'\ntcp_user_timeout_s = -1", "store.tcp_user_timeout_s", "at least 0"),
    ("[server]\nhttp_max_connections = 0", "server.http_max_connections", "at least 1 and at most 1000000"),
    ("[server]\nhttp_header_timeout_s = 0", "server.http_header_timeout_s", "> 0 and at most 31536000"),
    ("[server]\nhttp_idle_timeout_s = -5", "server.http_idle_timeout_s", "> 0"),
    ("[server]\nhttp_idle_timeout_s = '30'", "server.http_idle_timeout_s", "expected a number (got string)"),
    ("[server]\ngrpc_max_streams_per_connection = 0", "server.grpc_max_streams_per_connection", "at least 1"),
    ("[limits]\nmax_tasks_per_batch = 0", "limits.max_tasks_per_batch", "at least 1 and at most 100000"),
    ("[limits]\nmax_message_bytes = 10", "limits.max_message_bytes", "at least 4096"),
    ("[limits]\nkeepalive_interval_s = 0", "limits.keepalive_interval_s", "> 0"),
    ("[limits]\nmax_concurrent_streams = 4294967296", "limits.max_concurrent_streams", "at most 4294967295"),
    ("[limits]\nmax_pending_total = 99999999999999999999999", "limits.max_pending_total", "at most"),
    ("[limits]\nmax_wait_s = 1e400", "limits.max_wait_s", "finite"),
    (pool("min = -1"), "pools[0].min", "at least 0"),
    (pool("max = 0"), "pools[0].max", "at least 1"),
    (pool("min = 5\nmax = 4"), "pools[0].min", "must not exceed max (5 > 4)"),
    (pool("max_pending = 0"), "pools[0].max_pending", "at least 1"),
    (pool("max_slots_per_worker = 0"), "pools[0].max_slots_per_worker", "at least 1"),
    (pool("reservable_fraction = 1.5"), "pools[0].reservable_fraction", "at most 1"),
    (pool("target_utilization = 0"), "pools[0].target_utilization", "> 0"),
    (pool("cost_per_worker_second = -1"), "pools[0].cost_per_worker_second", "at least 0"),
    (pool("tenant_weights = { acme = 0 }"), "pools[0].tenant_weights.acme", "> 0"),
    (pool("tenant_weights = { acme = -2 }"), "pools[0].tenant_weights.acme", "> 0"),
    (pool("tenant_weights = { 'a b' = inf }"), 'pools[0].tenant_weights."a b"', "finite"),
    (pool("slo = { urgent = 1 }"), "pools[0].slo.urgent", "not a priority class (one of critical, high"),
    (pool("slo = { normal = 0 }"), "pools[0].slo.normal", "> 0"),
    (pool("retry = { max_attempts = 0 }"), "pools[0].retry.max_attempts", "at least 1"),
    (pool("retry = { multiplier = 0.5 }"), "pools[0].retry.multiplier", "at least 1"),
    (pool("retry = { max_backoff_s = -1 }"), "pools[0].retry.max_backoff_s", "at least 0"),
    (pool("retry = { tries = 3 }"), "pools[0].retry.tries", "unknown key"),
    ("[outputs]\ncache_bytes = -1", "outputs.cache_bytes", "at least 0"),
    # enumerations name the allowed values
    (
        pool("overflow = 'drop'"),
        "pools[0].overflow",
        "one of wait, reject, shed_lowest, shed_oldest (got 'drop')",
    ),
    (pool("overflow = 1"), "pools[0].overflow", "one of wait, reject"),
    (
        "[[auth.tokens]]\ntoken = 'a-token-of-24-characters'\nrole = 'root'",
        "auth.tokens[0].role",
        "client, worker",
    ),
    ("[[auth.tokens]]\ntoken = 'a-token-of-24-characters'", "auth.tokens[0].role", "required"),
    ("[store]\nkind = 'mysql'", "store.kind", "one of memory, sqlite, postgres (got 'mysql')"),
    ("[store]\npath = 'a'", "store.kind", "required: one of memory, sqlite, postgres"),
    ("[[resources]]\nkind = 'mutex'\nname = 'r'", "resources[0].kind", "one of semaphore, token_bucket"),
    ("[[resources]]\nname = 'r'\npermits = 1", "resources[0].kind", "required"),
    (pool("scaler = { kind = 'keda' }"), "pools[0].scaler.kind", "one of external, webhook"),
    (pool("scaler = 'webhook'"), "pools[0].scaler", "expected a table"),
    # names, addresses, URLs
    ("[[pools]]\nname = 'bad name'", "pools[0].name", "1 to 64 characters"),
    ("[[pools]]\nname = ''", "pools[0].name", "1 to 64 characters"),
    (f"[[pools]]\nname = '{LONG}'", "pools[0].name", "1 to 64 characters"),
    ("[server]\ngrpc_addr = 'x'", "server.grpc_addr", "expected host:port (got 'x')"),
    ("[server]\nhttp_addr = '127.0.0.1:99999'", "server.http_addr", "expected host:port"),
    ("[server]\nhttp_addr = ':7071'", "server.http_addr", "expected host:port"),
    ("[server]\nhttp_addr = '::1:7071'", "server.http_addr", "brackets"),
    ("[server]\nmetrics_addr = '[nothost]:1'", "server.metrics_addr", "expected host:port"),
    ("[router]\ngrpc_addr = 'localhost'", "router.grpc_addr", "expected host:port"),
    ("[server]\nhttp_addr = '127.0.0.1:7070'", "server.http_addr", "duplicate listener address"),
    (
        "[router]\ngrpc_addr = '127.0.0.1:8070'\nhttp_addr = '127.0.0.1:8070'",
        "router.http_addr",
        "duplicate listener address '127.0.0.1:8070' (also at router.grpc_addr)",
    ),
    (pool("scaler = { kind = 'webhook', url = 'ftp://a/b' }"), "pools[0].scaler.url", "http:// or https://"),
    (pool("scaler = { kind = 'webhook', url = 'http://[::1' }"), "pools[0].scaler.url", "http://"),
    (pool("scaler = { kind = 'webhook' }"), "pools[0].scaler.url", "required"),
    (
        pool("scaler = { kind = 'webhook', url = 'http://scaler.internal/hook' }"),
        "pools[0].scaler.url",
        "plain http to 'scaler.internal' would send the desired capacity (and the token) in the clear",
    ),
    (
        pool("scaler = { kind = 'webhook', url = 'https://a', token_env = 'NOPE' }"),
        "pools[0].scaler.token_env",
        "environment variable NOPE is not set",
    ),
    (
        "[server.grpc_web]\nallowed_origins = ['https://a.com/path']",
        "server.grpc_web.allowed_origins[0]",
        "origin",
    ),
    ("[store]\nkind = 'sqlite'", "store.path", "required"),
    ("[store]\nkind = 'sqlite'\npath = ''", "store.path", "must not be empty"),
    ("[server.tls]\ncert_path = 'a'", "server.tls.key_path", "required"),
    ("[server.peer_tls]\ncert_path = 'a'", "server.peer_tls", "cert_path and key_path go together"),
    ("[server.peer_tls]\nca_path = 'ca.pem'", "server.peer_tls", "no [[shards]] endpoint or member"),
    # auth
    ("[[auth.tokens]]\ntoken = 'short'\nrole = 'client'", "auth.tokens[0].token", "at least 16 characters"),
    (
        "[[auth.tokens]]\ntoken = ' a-token-of-24-characters'\nrole = 'client'",
        "auth.tokens[0].token",
        "whitespace",
    ),
    ("[[auth.tokens]]\nrole = 'client'", "auth.tokens[0]", "exactly one of token and token_env"),
    (
        "[[auth.tokens]]\ntoken = 'a-token-of-24-characters'\ntoken_env = 'WORKER_TOKEN'\nrole = 'client'",
        "auth.tokens[0]",
        "exactly one of token and token_env",
    ),
    (
        "[[auth.tokens]]\ntoken_env = 'UNSET_VAR'\nrole = 'client'",
        "auth.tokens[0].token_env",
        "UNSET_VAR is not set",
    ),
    ("[[auth.tokens]]\ntoken_env = 'EMPTY'\nrole = 'client'", "auth.tokens[0].token_env", "EMPTY is empty"),
    ("[[auth.tokens]]\ntoken_env = 'SHORT'\nrole = 'client'", "auth.tokens[0].token_env", "at least 16"),
    (
        "[[auth.tokens]]\ntoken_env = '1BAD'\nrole = 'client'",
        "auth.tokens[0].token_env",
        "environment variable name",
    ),
    (
        "[[auth.tokens]]\ntoken_env = 'WORKER_TOKEN'\nrole = 'client'\npools = ['a b']",
        "auth.tokens[0].pools[0]",
        "1 to 64",
    ),
    (
        "[[auth.tokens]]\ntoken_env = 'WORKER_TOKEN'\nrole = 'worker'\nlabels = ['gpu']",
        "auth.tokens[0].labels[0]",
        "expected name=value (got 'gpu')",
    ),
    (
        "[[auth.tokens]]\ntoken_env = 'WORKER_TOKEN'\nrole = 'worker'\nlabels = ['a=1', 'a=2']",
        "auth.tokens[0].labels[1]",
        "duplicate label 'a'",
    ),
    (
        "[[auth.tokens]]\ntoken_env = 'WORKER_TOKEN'\nrole = 'worker'\ntenant = ''",
        "auth.tokens[0].tenant",
        "empty",
    ),
    (
        "[[auth.tokens]]\ntoken_env = 'WORKER_TOKEN'\nrole = 'client'\n[[auth.tokens]]\n"
        "token_env = 'WORKER_TOKEN'\nrole = 'admin'",
        "auth.tokens[1].token_env",
        "duplicate token",
    ),
    ("[[auth.certs]]\ndns_name = 'w.internal'\nrole = 'worker'", "auth.certs", "server.tls.client_ca_path"),
    ("[[auth.certs]]\ndns_name = 'not a name'\nrole = 'worker'", "auth.certs[0].dns_name", "DNS name"),
    (
        "[server.tls]\ncert_path = 'c.pem'\nkey_path = 'k.pem'\nclient_ca_path = 'ca.pem'\n"
        "[[auth.certs]]\ndns_name = 'w.internal'\nrole = 'metrics'\n"
        "[[auth.certs]]\ndns_name = 'W.Internal'\nrole = 'admin'",
        "auth.certs[1].dns_name",
        "duplicate dns_name 'w.internal' (also at auth.certs[0].dns_name)",
    ),
    (
        "[[auth.tokens]]\ntoken_env = 'WORKER_TOKEN'\nrole = 'client'\npools = ['default', 'nope']",
        "auth.tokens[0].pools[1]",
        "no [[pools]] entry is named 'nope'",
    ),
    (
        "[server.tls]\ncert_path = 'c.pem'\nkey_path = 'k.pem'\nclient_ca_path = 'ca.pem'\n"
        "[[auth.certs]]\ndns_name = 'w.internal'\nrole = 'worker'\npools = ['nope']",
        "auth.certs[0].pools[0]",
        "no [[pools]] entry is named 'nope'",
    ),
    # listener safety
    ("[server]\ngrpc_addr = '0.0.0.0:7070'", "server.grpc_addr", "insecure_no_auth"),
    ("[server]\nhttp_addr = '[::]:7071'", "server.http_addr", "no credentials are configured"),
    ("[server]\nmetrics_addr = '10.0.0.1:9090'", "server.metrics_addr", "not a loopback address"),
    ("[server]\ngrpc_addr = 'cronoq.internal:7070'", "server.grpc_addr", "insecure_no_auth"),
    ("[router]\nhttp_addr = '0.0.0.0:8071'", "router.http_addr", "insecure_no_auth"),
    # store
    ("[store]\nkind = 'postgres'", "store.url_env", "environment variable DATABASE_URL is not set"),
    ("[store]\nkind = 'postgres'\nurl_env = 'NOPE'", "store.url_env", "NOPE is not set"),
    ("[store]\nkind = 'postgres'\nurl = 'postgres://a'\nurl_env = 'PG_URL'", "store.url", "not both"),
    (
        "[store]\nkind = 'postgres'\nurl_env = 'PG_URL'\nschema = 'my-schema'",
        "store.schema",
        "letters, digits",
    ),
    ("[store]\nkind = 'postgres'\nurl_env = 'PG_URL'\nschema = 'a_{shard}'", "store.schema", "no [[shards]]"),
    (f"[store]\nkind = 'postgres'\nurl_env = 'PG_URL'\nschema = '{'s' * 64}'", "store.schema", "at most 63"),
    ("[store]\nkind = 'sqlite'\npath = '/d/{shard}.db'", "store.path", "uses {shard} but no [[shards]]"),
    # shards and resources
    ("[server]\nshard = 'cpu'", "server.shard", "no [[shards]] are configured"),
    ("[router]\nmembers = ['s:1']", "router.members[0]", "http:// or https://"),
    ("[router]\nendpoint = 'ftp://s:1'", "router.endpoint", "http:// or https://"),
    (
        "[router]\nmembers = ['http://x:1']\n[[pools]]\nname = 'a'\n[[shards]]\nname = 's'\nnumber = 1\n"
        "endpoint = 'http://s:1'\npools = ['a']",
        "router.members",
        "only for a cluster without [[shards]]",
    ),
    (
        "[[pools]]\nname = 'a'\n[[shards]]\nname = 's'\nnumber = 1\nendpoint = 'http://s:1'\npools = ['b']",
        "shards[0].pools[0]",
        "no [[pools]] entry is named 'b'",
    ),
    (
        "[[pools]]\nname = 'a'\n[[pools]]\nname = 'b'\n[[shards]]\nname = 's'\nnumber = 1\n"
        "endpoint = 'http://s:1'\npools = ['a']",
        "pools[1].name",
        "in no [[shards]] entry",
    ),
    (
        "[[pools]]\nname = 'a'\n[[shards]]\nname = 's'\nnumber = 1\nendpoint = 'http://s:1'\npools = ['a']\n"
        "[[shards]]\nname = 't'\nnumber = 2\nendpoint = 'http://t:1'\npools = ['a']",
        "shards[1].pools[0]",
        "already assigned at shards[0].pools[0]",
    ),
    (
        "[[pools]]\nname = 'a'\n[[shards]]\nname = 's'\nnumber = 1\nendpoint = 'http://s:1'\npools = ['a']\n"
        "[[shards]]\nname = 's'\nnumber = 2\nendpoint = 'http://t:1'",
        "shards[1].name",
        "duplicate shard name 's'",
    ),
    (
        "[[pools]]\nname = 'a'\n[[shards]]\nname = 's'\nnumber = 1\nendpoint = 'http://s:1'\npools = ['a']\n"
        "[[shards]]\nname = 't'\nnumber = 1\nendpoint = 'http://t:1'",
        "shards[1].number",
        "duplicate shard number 1",
    ),
    (
        "[[shards]]\nname = 's'\nnumber = 256\nendpoint = 'http://s:1'\npools = ['default']",
        "shards[0].number",
        "at most 255",
    ),
    (
        "[[shards]]\nname = 's'\nnumber = -1\nendpoint = 'http://s:1'\npools = ['default']",
        "shards[0].number",
        "at least 0",
    ),
    (
        "[[shards]]\nname = 's'\nnumber = 1\nendpoint = 'grpc://s:1'\npools = ['default']",
        "shards[0].endpoint",
        "http",
    ),
    (
        "[[shards]]\nname = 's'\nnumber = 1\nendpoint = 'http://s:1'\npools = ['default']\nmembers = ['s:1']",
        "shards[0].members[0]",
        "http",
    ),
    (
        "[server]\nshard = 't'\n"
        "[[shards]]\nname = 's'\nnumber = 1\nendpoint = 'http://s:1'\npools = ['default']",
        "server.shard",
        "no [[shards]] entry is named 't' (known: s)",
    ),
    ("[[resources]]\nkind = 'semaphore'\nname = 'r'\npermits = 0", "resources[0].permits", "at least 1"),
    ("[[resources]]\nkind = 'semaphore'\nname = 'r'", "resources[0].permits", "required"),
    (
        "[[resources]]\nkind = 'semaphore'\nname = 'r'\npermits = 1.5",
        "resources[0].permits",
        "expected an integer",
    ),
    ("[[resources]]\nkind = 'token_bucket'\nname = 'r'\nrate = 0\nburst = 1", "resources[0].rate", "> 0"),
    (
        "[[resources]]\nkind = 'token_bucket'\nname = 'r'\nrate = 1\nburst = 0.5",
        "resources[0].burst",
        "at least 1",
    ),
    (
        "[[resources]]\nkind = 'token_bucket'\nname = 'r'\nrate = 1\nburst = 1\npermits = 1",
        "resources[0].permits",
        'unknown key for kind = "token_bucket"',
    ),
    (
        "[[resources]]\nkind = 'semaphore'\nname = 'r'\npermits = 1\n[[resources]]\nkind = 'semaphore'\n"
        "name = 'r'\npermits = 2",
        "resources[1].name",
        "duplicate resource name 'r'",
    ),
    (
        "[[resources]]\nkind = 'semaphore'\nname = 'r'\npermits = 1\nshard = 'x'",
        "resources[0].shard",
        "no [[shards]]",
    ),
    (
        "[[resources]]\nkind = 'semaphore'\nname = 'r'\npermits = 1\n[[shards]]\nname = 's'\nnumber = 1\n"
        "endpoint = 'http://s:1'\npools = ['default']",
        "resources[0].shard",
        "required with [[shards]]",
    ),
    (
        "[[pools]]\nname = 'a'\n[[pools]]\nname = 'a'",
        "pools[1].name",
        "duplicate pool name 'a' (also at pools[0].name)",
    ),
]

BAD_ENV = {**ENV, "EMPTY": "", "SHORT": "too-short"}


@pytest.mark.parametrize("syntax", SYNTAXES)
@pytest.mark.parametrize(
    ("text", "path", "message"), BAD, ids=[f"{i}:{case[1]}" for i, case in enumerate(BAD)]
)
def test_bad_config_names_the_offending_key(text: str, path: str, message: str, syntax: Syntax) -> None:
    """The same message for the same mistake in either syntax; in YAML, with the line of the key (or of
    the nearest enclosing key the file has), which TOML's parser does not tell."""
    found = the_problem(in_syntax(text, syntax), path, BAD_ENV, syntax)
    assert message in found.message
    assert (found.line is not None) == (syntax == "yaml"), found


# Mistakes only YAML can make, each with the line it names: YAML's own types where the model wants
# another (on/yes/no are booleans, dates, hex and exponent numbers, null), keys that are not strings or
# are given twice, tags, and aliases.
YAML_BAD: list[tuple[str, str, str, int]] = [
    ("pools:\n- name: on\n", "pools[0].name", "expected a string (got boolean)", 2),
    ("pools:\n- name: a\n- name: yes\n", "pools[1].name", "expected a string (got boolean)", 3),
    ("pools:\n- name: 2024-01-01\n", "pools[0].name", "expected a string (got date)", 2),
    ("pools:\n- name: 2024-01-01 10:00:00\n", "pools[0].name", "expected a string (got datetime)", 2),
    ("pools:\n- name: 0x1F\n", "pools[0].name", "expected a string (got integer)", 2),
    ("pools:\n- name: 1e3\n", "pools[0].name", "expected a string (got float)", 2),
    ("server:\n  shard: 12\n", "server.shard", "expected a string (got integer)", 2),
    ("server:\n  grpc_addr:\n", "server.grpc_addr", "expected a string (got null)", 2),
    ("server: ~\n", "server", "expected a table (got null)", 1),
    ("pools:\n", "pools", "expected an array of tables (got null)", 1),
    ("server:\n  insecure_no_auth: 'true'\n", "server.insecure_no_auth", "expected true or false (got string)", 2),
    ("limits:\n  max_list: '10'\n", "limits.max_list", "expected an integer (got string)", 2),
    ("pools:\n- name: a\n  overflow: no\n", "pools[0].overflow", "must be one of wait, reject, shed_lowest, shed_oldest (got false)", 3),
    ("server:\n  on: 1\n", "server.on", "keys must be strings (got boolean): quote it", 2),
    ("1: x\n", "1", "keys must be strings (got integer): quote it", 1),
    ("limits:\n  max_list: 1\n  max_deps: 2\n  max_list: 3\n", "limits.max_list", "duplicate key (also on line 2)", 4),
    ("pools:\n- name: !!binary aGk=\n", "pools[0].name", "the YAML tag !!binary is not supported", 2),
    ("pools: !!set {a}\n", "pools", "the YAML tag !!set is not supported", 1),
    ("pools:\n- name: !local x\n", "pools[0].name", "the YAML tag !local is not supported", 2),
    ("pools: !!str [a]\n", "pools", "the YAML tag !!str does not fit a sequence", 1),
    ("pools:\n- name: 2024-02-30\n", "pools[0].name", "not a valid timestamp: day is out of range for month", 2),
    ("pools: &p\n- name: a\n  retry: *p\n", "pools[0].retry", "an alias (*name) of a mapping or sequence that contains it", 3),
    ("pools:\n- &a\n  name: a\n  retry:\n    <<: *a\n", "pools[0].retry", "<< merges a mapping that contains it", 4),
    ("pools:\n- name: a\n  retry:\n    <<: [1]\n", "pools[0].retry", "<< merges mappings only (got integer)", 3),
    # Later checks name lines too: a rule about two keys gives the line of the key it names, a key left
    # out the line of its entry.
    ("pools:\n- name: a\n  min: 20\n  max: 10\n", "pools[0].min", "must not exceed max (20 > 10)", 3),
    ("limits: {}\npools:\n- min: 2\n", "pools[0].name", "required", 3),
    ("store:\n  kind: postgres\n", "store.url_env", "environment variable DATABASE_URL is not set", 1),
]  # fmt: skip


@pytest.mark.parametrize(
    ("text", "path", "message", "line"), YAML_BAD, ids=[f"{i}:{case[1]}" for i, case in enumerate(YAML_BAD)]
)
def test_yaml_mistakes_name_the_key_and_its_line(text: str, path: str, message: str, line: int) -> None:
    found = the_problem(text, path, BAD_ENV, "yaml")
    assert message in found.message and found.line == line, found
    assert str(found).startswith(f"{path} (line {line}): ")


def test_yaml_tags_never_build_python_objects(tmp_path: Path) -> None:
    """The safe loader builds plain values only; a tag naming a Python callable is a problem, not a call."""
    target = tmp_path / "made-by-yaml"
    text = f"pools:\n- name: !!python/object/apply:os.mkdir ['{target}']\n"
    found = the_problem(text, "pools[0].name", {}, "yaml")
    assert "the YAML tag !!python/object/apply:os.mkdir is not supported" in found.message
    assert not target.exists()


def test_yaml_nesting_and_aliases_are_bounded() -> None:
    """A document nested past MAX_DEPTH, or whose aliases or merge keys expand past MAX_VALUES values
    (the "billion laughs"), is refused instead of exhausting the stack or the memory."""
    deep = problems("x: " + "[" * 40 + "]" * 40, env={}, syntax="yaml")
    assert [(p.path, p.message) for p in deep if p.path != "x"] == [
        ("x" + "[0]" * (MAX_DEPTH - 1), f"nested more than {MAX_DEPTH} levels deep")
    ]
    names = [f"k{i}" for i in range(MAX_DEPTH + 2)]
    chain = "k0: &k0 {a: 1}\n" + "".join(
        f"{name}: &{name} {{<<: *{previous}}}\n" for previous, name in itertools.pairwise(names)
    )
    assert f"<< merges mappings nested more than {MAX_DEPTH} levels deep" in {
        p.message for p in problems(chain, env={}, syntax="yaml")
    }
    too_many = [f"more than {MAX_VALUES} values: a YAML alias (*name) repeats its anchor's values each time"]
    for laughs in (
        "a: &a [x, x, x, x, x, x, x, x, x, x]\n"
        + "".join(
            f"{name}: &{name} [{', '.join([f'*{previous}'] * 10)}]\n"
            for previous, name in zip("abcdefg", "bcdefgh", strict=True)
        ),
        "a: &a {w: 1, x: 2, y: 3, z: 4}\n"
        + "".join(
            f"{name}: &{name} {{<<: [{', '.join([f'*{previous}'] * 10)}]}}\n"
            for previous, name in zip("abcdefg", "bcdefgh", strict=True)
        ),
    ):
        assert [str(p) for p in problems(laughs, env={}, syntax="yaml")] == too_many


def test_the_top_of_a_yaml_file_is_a_mapping_or_nothing() -> None:
    assert [str(p) for p in problems("- a\n- b\n", env={}, syntax="yaml")] == [
        "expected a mapping of keys at the top of the file (got array)"
    ]
    assert [str(p) for p in problems("just text\n", env={}, syntax="yaml")] == [
        "expected a mapping of keys at the top of the file (got string)"
    ]
    for empty in ("", "# comments only\n", "---\n", "~\n"):  # as an empty TOML file: every default
        assert (
            parse_config(empty, syntax="yaml", env={})
            == parse_config("", env={})
            == validate_config(default_config(), env={})
        )


def test_a_yaml_file_reads_as_the_same_toml_file() -> None:
    assert parse_config(in_syntax(FULL, "yaml"), env=ENV, syntax="yaml") == parse_config(FULL, env=ENV)
    assert read_config(in_syntax(FULL, "yaml"), syntax="yaml") == read_config(FULL)


def test_idiomatic_yaml_reads_as_its_toml() -> None:
    """Flow and block style, comments, quoting, YAML 1.2 exponents, anchors and merge keys (an entry's
    own keys win over merged ones, and an earlier merged mapping over a later one)."""
    yaml_text = """
# cronoq.yaml
server:
  grpc_addr: 127.0.0.1:7070      # host:port needs no quotes
  shutdown_grace_s: 1.5e1
pools:
  - name: &first cpu
    max: 4
    retry: &retry {max_attempts: 5, multiplier: 3}
    tenant_weights: {"on": 2, research: 1e0}
  - name: 'on'
    lease_ttl_s: 3.2e2
    retry:
      <<: [*retry, {max_attempts: 9, jitter: false}]
      max_backoff_s: 7
auth:
  tokens:
    - {token_env: T, role: worker, pools: [*first]}
"""
    toml_text = """
[server]
grpc_addr = "127.0.0.1:7070"
shutdown_grace_s = 15.0
[[pools]]
name = "cpu"
max = 4
retry = { max_attempts = 5, multiplier = 3 }
tenant_weights = { on = 2, research = 1.0 }
[[pools]]
name = "on"
lease_ttl_s = 320.0
retry = { max_attempts = 5, multiplier = 3, jitter = false, max_backoff_s = 7 }
[[auth.tokens]]
token_env = "T"
role = "worker"
pools = ["cpu"]
"""
    env = {"T": "worker-token-0123456789"}
    assert parse_config(yaml_text, syntax="yaml", env=env) == parse_config(toml_text, env=env)


def test_the_file_extension_chooses_the_syntax(tmp_path: Path) -> None:
    toml_text = '[[pools]]\nname = "a"\nmax = 3\n'
    yaml_text = "pools:\n- name: a\n  max: 3\n"
    expected = parse_config(toml_text, env={})
    for name, text in [
        ("c.toml", toml_text),
        ("c.yaml", yaml_text),
        ("c.yml", yaml_text),
        ("C.YAML", yaml_text),
    ]:
        (tmp_path / name).write_text(text)
        assert load_config(tmp_path / name, env={}) == expected, name
    (tmp_path / "bom.yaml").write_bytes(("\ufeff" + yaml_text).encode())
    assert load_config(tmp_path / "bom.yaml", env={}) == expected
    (tmp_path / "swapped.toml").write_text(yaml_text)  # the extension decides, not the content
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_config(tmp_path / "swapped.toml", env={})


@pytest.mark.parametrize("name", ["cronoq.conf", "cronoq.json", "cronoq", "cronoq.toml.bak"])
def test_an_unknown_extension_is_refused_naming_the_accepted_ones(tmp_path: Path, name: str) -> None:
    path = tmp_path / name
    path.write_text('[[pools]]\nname = "a"\n')
    with pytest.raises(ConfigError) as caught:
        load_config(path, env={})
    assert str(caught.value) == (
        f"invalid configuration in {path}:\n  cannot tell the syntax from the file name: expected it to end in .toml (TOML), .yaml or .yml (YAML)"
    )


def test_parse_config_reads_toml_unless_told_otherwise() -> None:
    text = "pools:\n- name: a\n"
    with pytest.raises(ConfigError, match="not valid TOML"):
        parse_config(text, env={})
    assert parse_config(text, syntax="yaml", env={}).pools[0].name == "a"
    with pytest.raises(ValueError, match="unknown configuration syntax 'json'"):
        parse_config("{}", syntax="json", env={})  # type: ignore[arg-type]


def test_the_brief_examples_are_reported_verbatim() -> None:
    text = "[server]\ngrpc_addr = 'x'\n[limits]\nmax_wait_sx = 1\n" + pool("") + pool("lease_ttl_s = -1")
    rendered = [str(p) for p in problems(text.replace('"p"', '"q"', 1))]
    assert "pools[1].lease_ttl_s: must be > 0 and at most 31536000 (got -1)" in rendered
    assert "limits.max_wait_sx: unknown key (did you mean max_wait_s?)" in rendered
    assert "server.grpc_addr: expected host:port (got 'x')" in rendered


def test_every_problem_is_reported_at_once_sorted_by_key() -> None:
    text = (
        "[limits]\nmax_list = true\nmax_deps = -1\n"  # a type and a range problem together
        "[[pools]]\nname = 'a'\nlease_ttl_s = 0\n"
        "[[pools]]\nname = 'a'\noverflow = 'x'\n"
        "[[pools]]\nname = 'c'\nmin = 3\nmax = 2\n"
        "[store]\nkind = 'postgres'\n"
    )
    assert [p.path for p in problems(text, env={})] == [
        "limits.max_deps",
        "limits.max_list",
        "pools[0].lease_ttl_s",
        "pools[1].name",
        "pools[1].overflow",
        "pools[2].min",
        "store.url_env",
    ]


def test_a_bad_key_produces_no_derived_complaints() -> None:
    assert [p.path for p in problems(pool("min = 20\nmax = 'x'"))] == ["pools[0].max"]
    assert [p.path for p in problems("[[resources]]\nkind = 'mutex'\nname = ''")] == ["resources[0].kind"]
    sharded = "[[shards]]\nname = 's'\nnumber = 1\nendpoint = 'http://s:1'\npools = ['default']\n"
    assert [p.path for p in problems(sharded + "[[pools]]\nname = 7\n")] == ["pools[0].name"]


def test_a_config_built_in_code_is_range_checked_too() -> None:
    bad = Config(pools=(PoolSection("p", lease_ttl_s=-1),))
    with pytest.raises(ConfigError) as caught:
        validate_config(bad, env={})
    assert [p.path for p in caught.value.problems] == ["pools[0].lease_ttl_s"]


# ------------------------------------------------------------------------------------------- secrets


def test_secrets_never_appear_in_repr() -> None:
    config = parse_config(FULL, env=ENV)
    text = repr(config) + str(config)
    for secret in (LITERAL_TOKEN, WORKER_TOKEN, ENV["PG_URL"], ENV["SCALER_TOKEN"]):
        assert secret not in text
    literal = parse_config('[store]\nkind = "postgres"\nurl = "postgres://u:hunter2@db/x"\n', env={})
    assert "hunter2" not in repr(literal)
    assert "WORKER_TOKEN" in text  # the variable's name is not secret and helps debugging


def test_secrets_never_appear_in_errors() -> None:
    secret = "sekrit"
    texts = [
        f"[[auth.tokens]]\ntoken = '{secret}'\nrole = 'client'",  # too short
        f"[[auth.tokens]]\ntoken = '{secret}-but-long-enough'\nrole = 'nobody'",
        f"[[auth.tokens]]\ntoken = '{secret}-but-long-enough'\nrole = 'client'\n"
        f"[[auth.tokens]]\ntoken = '{secret}-but-long-enough'\nrole = 'admin'",  # duplicate
        f"[[auth.tokens]]\ntoken = ' {secret}-but-long-enough'\nrole = 'client'",  # whitespace
        "[[auth.tokens]]\ntoken_env = 'SHORT'\nrole = 'client'\n"
        "[[auth.tokens]]\ntoken_env = 'DUP'\nrole = 'admin'\n"
        "[[auth.tokens]]\ntoken_env = 'DUP'\nrole = 'client'",
        "[[auth.tokens]]\ntoken = 12345678901234567890\nrole = 'client'",
        f"[store]\nkind = 'postgres'\nurl = '{secret}'\nurl_env = 'X'",
        "[store]\nkind = 'postgres'\nurl = ''",
    ]
    env = {"SHORT": secret, "DUP": f"{secret}-from-the-environment"}
    for text in texts:
        with pytest.raises(ConfigError) as caught:
            parse_config(text, env=env)
        message = str(caught.value)
        assert secret not in message and "12345678901234567890" not in message, message


# ------------------------------------------------------------------------------------------------ docs


def test_docs_describe_every_key() -> None:
    docs = DOCS.read_text(encoding="utf-8")
    for table in fields(Config):
        assert f"[{table.name}]" in docs or f"[[{table.name}]]" in docs, f"[{table.name}] is not documented"
    for section in SECTIONS:
        for spec in fields(section):
            if not spec.metadata.get(RESOLVED_KEY):
                assert f"`{spec.name}`" in docs, f"{section.__name__}.{spec.name} is not documented"


def test_the_documented_yaml_example_is_its_toml_example() -> None:
    """docs/configuration.md shows one configuration in YAML and then in TOML: they read the same."""
    section = DOCS.read_text(encoding="utf-8").split("\n## TOML or YAML\n", 1)[1].split("\n## ", 1)[0]
    yaml_text, toml_text = (
        section.split(f"```{syntax}\n", 1)[1].split("```", 1)[0] for syntax in ("yaml", "toml")
    )
    env = {"CRONOQ_CLIENT_TOKEN": LITERAL_TOKEN, "CRONOQ_WORKER_TOKEN": WORKER_TOKEN}
    config = parse_config(yaml_text, syntax="yaml", env=env)
    assert config == parse_config(toml_text, env=env)
    assert [pool.retry.max_attempts for pool in config.pools] == [5, 2]


# -------------------------------------------------------------------------------------- random input

KEYS = sorted({f.name for section in SECTIONS for f in fields(section)} | {"kind", "tokens", "certs", "auth"})
WORDS = [
    "default", "127.0.0.1:7070", "0.0.0.0:1", "[::1]:0", "http://h:1", "https://h", "wait", "client", "admin",
    "memory", "sqlite", "postgres", "webhook", "external", "semaphore", "token_bucket", "{shard}", "a=b",
    "ENV_A", "a-token-of-24-characters",
]  # fmt: skip

scalars = st.one_of(
    st.booleans(),
    st.integers(min_value=-(10**400), max_value=10**400),  # beyond float range
    st.integers(min_value=-2, max_value=300),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
    st.sampled_from(WORDS),
)
values = st.recursive(
    scalars,
    lambda inner: (
        st.lists(inner, max_size=4)
        | st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=6), inner, max_size=5)
    ),
    max_leaves=25,
)
documents = st.dictionaries(st.sampled_from(KEYS) | st.text(max_size=6), values, max_size=6)


def toml_value(value: object) -> str:
    """Inline TOML for a generated value (enough of TOML for these tests; tomllib checks the rest)."""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and not math.isfinite(value):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, int | float):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{toml_key(k)} = {toml_value(v)}" for k, v in value.items()) + "}"
    return json.dumps(value, ensure_ascii=False)


def toml_key(key: str) -> str:
    return json.dumps(key, ensure_ascii=False)


def to_toml(document: Mapping[str, object]) -> str:
    return "\n".join(f"{toml_key(k)} = {toml_value(v)}" for k, v in document.items())


def written(document: Mapping[str, object], syntax: Syntax) -> str:
    return to_toml(document) if syntax == "toml" else yaml.safe_dump(dict(document), allow_unicode=True)


@pytest.mark.parametrize("syntax", SYNTAXES)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(documents)
def test_random_documents_raise_only_config_errors(syntax: Syntax, document: dict[str, object]) -> None:
    try:
        config = parse_config(
            written(document, syntax), syntax=syntax, env={"ENV_A": "a-token-of-24-characters"}
        )
    except ConfigError as exc:
        assert exc.problems and str(exc)
    else:
        assert config.pools


def _leaf_paths(value: object, path: tuple[str | int, ...] = ()) -> list[tuple[str | int, ...]]:
    if isinstance(value, dict):
        return [path] + [p for k, v in value.items() for p in _leaf_paths(v, (*path, k))]
    if isinstance(value, list):
        return [path] + [p for i, v in enumerate(value) for p in _leaf_paths(v, (*path, i))]
    return [path]


FULL_DOCUMENT = tomllib.loads(FULL)
FULL_PATHS = [p for p in _leaf_paths(FULL_DOCUMENT) if p]


@pytest.mark.parametrize("syntax", SYNTAXES)
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(FULL_PATHS), values | st.none())
def test_changing_one_value_of_a_full_file_raises_only_config_errors(
    syntax: Syntax, path: tuple[str | int, ...], replacement: object
) -> None:
    document = copy.deepcopy(FULL_DOCUMENT)
    parent: Any = document
    for step in path[:-1]:
        parent = parent[step]
    if replacement is None:
        del parent[path[-1]]  # a missing key or array entry
    else:
        parent[path[-1]] = replacement
    try:
        parse_config(written(document, syntax), syntax=syntax, env=ENV)
    except ConfigError as exc:
        assert exc.problems and all(p.path or "TOML" in p.message for p in exc.problems)


# Pieces of YAML syntax, strung together at random: mostly not YAML, sometimes odd YAML.
YAML_PIECES = [
    *"\n\t :-,[]{}?&*!|>'\"%@`#~.<=", "- ", ": ", "\n  ", "\n- ", "<<: ", "&a ", "*a", "!!str ", "!!binary ",
    "!!python/name:os.getcwd ", "!x ", "---\n", "...\n", "pools", "name", "server", "retry", "kind", "on", "1e3",
    "0x1F", "1:30", "2024-02-30", "null", ".inf", "'q'", '"\\x00"', "\ufeff", "\x85", "\u2028",
]  # fmt: skip


@settings(max_examples=500, deadline=None)
@given(st.lists(st.sampled_from(YAML_PIECES), max_size=40).map("".join) | st.text(max_size=60))
def test_random_yaml_text_raises_only_config_errors(text: str) -> None:
    try:
        parse_config(text, syntax="yaml", env={})
    except ConfigError as exc:
        assert exc.problems and str(exc)
