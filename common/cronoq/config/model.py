"""The configuration as typed, immutable data: one dataclass per TOML table.

These classes are also the schema. A field's name is its TOML key, its annotation the TOML type the
reader accepts, its default the documented default, and its metadata the rule validation applies (see
:mod:`cronoq.config.rules`). Tables with a ``kind`` key (store, scaler, resources) are unions of one
class per kind, so code that uses them can ``match`` on the class and never meets a key that does not
belong to its kind.

Secrets (tokens, the database URL) are resolved from the environment by validation into fields marked
``repr=False``, so logging a config never prints one (``dataclasses.asdict`` still includes them).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import ClassVar

from cronoq.auth import CertEntry, Role, TokenEntry
from cronoq.engine.model import (
    AutoscaleRule,
    EngineLimits,
    Overflow,
    PoolConfig,
    Priority,
    ResourceConfig,
    RetryRule,
    Semaphore,
    TokenBucket,
    UnknownDependency,
)

from .problems import ConfigError, Problem
from .rules import (
    ADDRESS,
    BILLION,
    DNS_NAME,
    DURATION,
    DURATION_OR_ZERO,
    ENV_NAME,
    FRACTION,
    HTTP_URL,
    LABEL,
    NAME,
    NOT_EMPTY,
    ORIGIN,
    RESOLVED,
    SCHEMA,
    SECRET_NOT_EMPTY,
    SHARD_PLACEHOLDER,
    TOKEN,
    U32_MAX,
    above,
    between,
    is_loopback,
)

DEFAULT_POOL = "default"
DEFAULT_URL_ENV = "DATABASE_URL"
DEFAULT_SCHEMA = "public"
DEFAULT_SHARDED_SCHEMA = "cronoq_" + SHARD_PLACEHOLDER
KEEP_FINISHED_S = 7 * 86_400.0
MIB = 1 << 20
# UTF-8 bytes a task key or a schedule's name may take, whatever ``max_key_len`` allows: the stores
# index keys, and Postgres refuses an index entry over about 2,700 bytes. A commit holding one failed
# on every retry, stalling every commit behind it. 2,048 leaves room for an occurrence's
# "@<UTC start>" suffix. ``max_key_len`` (characters) goes no higher, since it could not be used.
MAX_KEY_BYTES = 2_048
# Calls one gRPC connection may have open at once unless server.grpc_max_streams_per_connection says:
# enough for any one client, few enough that an HTTP/2 rapid reset is refused in the transport. Routers
# and shards forwarding more calls than that to a shard open more connections (cronoq.cluster.forward.Peers).
GRPC_STREAMS_PER_CONNECTION = 1_000

# -------------------------------------------------------------------------------------------- server


@dataclass(frozen=True, slots=True)
class TlsSection:
    """``[server.tls]``: TLS on both listeners; with ``client_ca_path`` clients must present a cert."""

    cert_path: str = field(metadata=NOT_EMPTY)
    key_path: str = field(metadata=NOT_EMPTY)
    client_ca_path: str | None = field(default=None, metadata=NOT_EMPTY)


@dataclass(frozen=True, slots=True)
class PeerTlsSection:
    """``[server.peer_tls]``: how this server verifies (and identifies itself to) other shards."""

    ca_path: str | None = field(default=None, metadata=NOT_EMPTY)  # None: the system trust store
    cert_path: str | None = field(default=None, metadata=NOT_EMPTY)
    key_path: str | None = field(default=None, metadata=NOT_EMPTY)


@dataclass(frozen=True, slots=True)
class GrpcWebSection:
    """``[server.grpc_web]``: present turns gRPC-Web on; browsers from these origins may call it."""

    allowed_origins: tuple[str, ...] = field(default=(), metadata=ORIGIN)


@dataclass(frozen=True, slots=True)
class ServerSection:
    """``[server]``: listeners, TLS and the identity of this process in a sharded cluster. The router
    applies the listener keys (TLS, the ``http_*`` and ``grpc_*`` bounds) to its own listeners."""

    grpc_addr: str = field(default="127.0.0.1:7070", metadata=ADDRESS)
    http_addr: str = field(default="127.0.0.1:7071", metadata=ADDRESS)
    metrics_addr: str | None = field(default=None, metadata=ADDRESS)
    tls: TlsSection | None = None
    insecure_no_auth: bool = False
    shutdown_grace_s: float = field(default=10.0, metadata=DURATION_OR_ZERO)
    shard: str | None = field(default=None, metadata=NAME)
    peer_tls: PeerTlsSection | None = None
    insecure_peer_http: bool = False
    grpc_web: GrpcWebSection | None = None
    http_max_connections: int = field(default=1_000, metadata=between(1, 1_000_000))
    http_header_timeout_s: float = field(default=10.0, metadata=DURATION)
    http_idle_timeout_s: float = field(default=75.0, metadata=DURATION)
    grpc_max_streams_per_connection: int = field(
        default=GRPC_STREAMS_PER_CONNECTION, metadata=between(1, 2**31 - 1)
    )
    worker_batches: bool = True


# ---------------------------------------------------------------------------------------------- auth


@dataclass(frozen=True, slots=True)
class TokenSection:
    """One ``[[auth.tokens]]`` entry; validation puts the token itself (literal or from the environment)
    into ``resolved_token``."""

    role: Role
    token: str | None = field(default=None, repr=False, metadata=TOKEN)
    token_env: str | None = field(default=None, metadata=ENV_NAME)
    pools: tuple[str, ...] | None = field(default=None, metadata=NAME)  # None: every pool
    labels: tuple[str, ...] | None = field(default=None, metadata=LABEL)  # "name=value"; None: any
    tenant: str | None = field(default=None, metadata=NOT_EMPTY)
    resolved_token: str = field(default="", repr=False, metadata=RESOLVED)

    def label_map(self) -> dict[str, str] | None:
        return _label_map(self.labels)


@dataclass(frozen=True, slots=True)
class CertSection:
    """One ``[[auth.certs]]`` entry: the role of a client certificate whose DNS SAN is ``dns_name``."""

    dns_name: str = field(metadata=DNS_NAME)
    role: Role
    pools: tuple[str, ...] | None = field(default=None, metadata=NAME)
    labels: tuple[str, ...] | None = field(default=None, metadata=LABEL)
    tenant: str | None = field(default=None, metadata=NOT_EMPTY)

    def label_map(self) -> dict[str, str] | None:
        return _label_map(self.labels)


@dataclass(frozen=True, slots=True)
class AuthSection:
    """``[auth]``: no entries at all means authentication is off (allowed on loopback only)."""

    tokens: tuple[TokenSection, ...] = ()
    certs: tuple[CertSection, ...] = ()

    def token_entries(self) -> list[TokenEntry]:
        """The tokens in the form :class:`cronoq.auth.Authenticator` takes (needs a validated config)."""
        return [
            TokenEntry(
                token=t.resolved_token,
                role=t.role,
                pools=None if t.pools is None else frozenset(t.pools),
                labels=t.label_map(),
                tenant=t.tenant,
                name=f"auth.tokens[{i}]",
            )
            for i, t in enumerate(self.tokens)
        ]

    def cert_entries(self) -> list[CertEntry]:
        """The client-certificate identities, for :class:`cronoq.auth.Authenticator`."""
        return _cert_entries(self.certs)


def _cert_entries(certs: tuple[CertSection, ...]) -> list[CertEntry]:
    return [
        CertEntry(
            dns_name=c.dns_name,
            role=c.role,
            pools=None if c.pools is None else frozenset(c.pools),
            labels=c.label_map(),
            tenant=c.tenant,
            name=f"auth.certs[{i}]",
        )
        for i, c in enumerate(certs)
    ]


def _label_map(labels: tuple[str, ...] | None) -> dict[str, str] | None:
    """``("gpu=a100", ...)`` as ``{"gpu": "a100"}``; None (any label allowed) stays None."""
    if labels is None:
        return None
    return dict(label.partition("=")[::2] for label in labels)


# --------------------------------------------------------------------------------------------- store


@dataclass(frozen=True, slots=True)
class MemoryStoreSection:
    """``kind = "memory"``: state lives in the process and is lost on restart; no standbys."""

    KIND: ClassVar[str] = "memory"
    keep_finished_s: float = field(default=KEEP_FINISHED_S, metadata=DURATION)


@dataclass(frozen=True, slots=True)
class SqliteStoreSection:
    """``kind = "sqlite"``: a file on a local disk; a second process on it is a standby. Every process on
    one file is one leader group, so with ``[[shards]]`` the path takes ``{shard}``, as the Postgres
    schema does, to give each shard a file of its own."""

    KIND: ClassVar[str] = "sqlite"
    path: str = field(metadata=NOT_EMPTY)
    keep_finished_s: float = field(default=KEEP_FINISHED_S, metadata=DURATION)

    def path_for(self, shard: str | None) -> str:
        """The database file a server of ``shard`` (None: unsharded) opens."""
        return self.path.replace(SHARD_PLACEHOLDER, shard or "")


@dataclass(frozen=True, slots=True)
class PostgresStoreSection:
    """``kind = "postgres"``: high availability across hosts; every schema is one leader group."""

    KIND: ClassVar[str] = "postgres"
    url: str | None = field(default=None, repr=False, metadata=SECRET_NOT_EMPTY)
    url_env: str | None = field(default=None, metadata=ENV_NAME)  # None: DATABASE_URL unless url is set
    schema: str | None = field(default=None, metadata=SCHEMA)  # None: public, or cronoq_{shard} if sharded
    keep_finished_s: float = field(default=KEEP_FINISHED_S, metadata=DURATION)
    # TCP keepalives of the store's connections (both ends of the leader lock session): they bound how
    # long the lock outlives a leader whose machine vanished. Linux's limits on each setting.
    keepalives_idle_s: int = field(default=5, metadata=between(1, 32_767))
    keepalives_interval_s: int = field(default=1, metadata=between(1, 32_767))
    keepalives_count: int = field(default=5, metadata=between(1, 127))
    tcp_user_timeout_s: float = field(default=10.0, metadata=between(0, 86_400))
    resolved_url: str = field(default="", repr=False, metadata=RESOLVED)

    def schema_for(self, shard: str | None) -> str:
        """The schema a server of ``shard`` (None: unsharded) keeps its tables in."""
        template = self.schema
        if template is None:
            template = DEFAULT_SCHEMA if shard is None else DEFAULT_SHARDED_SCHEMA
        return template.replace(SHARD_PLACEHOLDER, shard or "")


StoreSection = MemoryStoreSection | SqliteStoreSection | PostgresStoreSection

# -------------------------------------------------------------------------------------------- limits


@dataclass(frozen=True, slots=True)
class Limits:
    """``[limits]``: every bound on what one caller can make the server hold or do.

    The defaults are meant for a shared deployment: large enough that normal use never meets them,
    small enough that one misbehaving producer or worker cannot exhaust the server's memory.
    """

    max_tasks_per_batch: int = field(default=1_000, metadata=between(1, 100_000))
    max_pending_total: int = field(default=1_000_000, metadata=between(1, BILLION))
    max_pending_per_pool: int = field(default=100_000, metadata=between(1, BILLION))
    max_message_bytes: int = field(default=4 * MIB, metadata=between(4_096, 2**31 - 1))
    max_http_body_bytes: int = field(default=8 * MIB, metadata=between(4_096, 2**31 - 1))
    max_key_len: int = field(default=256, metadata=between(1, MAX_KEY_BYTES))
    max_kind_len: int = field(default=128, metadata=between(1, 65_536))
    max_tags: int = field(default=32, metadata=between(0, 10_000))
    max_tag_len: int = field(default=256, metadata=between(1, 65_536))
    max_deps: int = field(default=100, metadata=between(0, 100_000))
    max_resources: int = field(default=8, metadata=between(0, 1_000))
    max_wait_s: float = field(default=300.0, metadata=DURATION)
    request_timeout_s: float = field(default=30.0, metadata=DURATION)
    max_concurrent_requests: int = field(default=10_000, metadata=between(1, 10_000_000))
    max_concurrent_streams: int = field(default=1_000, metadata=between(1, U32_MAX))
    max_slots_per_worker: int = field(default=1_000, metadata=between(1, U32_MAX))
    keepalive_interval_s: float = field(default=20.0, metadata=DURATION)
    keepalive_timeout_s: float = field(default=20.0, metadata=DURATION)
    key_retention_s: float = field(default=86_400.0, metadata=DURATION_OR_ZERO)
    key_retention_max: int = field(default=100_000, metadata=between(0, BILLION))
    max_list: int = field(default=1_000, metadata=between(1, 1_000_000))

    def to_engine(self) -> EngineLimits:
        return EngineLimits(
            max_pending_total=self.max_pending_total,
            key_retention=self.key_retention_s,
            key_retention_max=self.key_retention_max,
        )


# --------------------------------------------------------------------------------------------- pools


@dataclass(frozen=True, slots=True)
class ExternalScaler:
    """``kind = "external"``: something outside (KEDA, the operator) reads the desired-workers metric."""

    KIND: ClassVar[str] = "external"


@dataclass(frozen=True, slots=True)
class WebhookScaler:
    """``kind = "webhook"``: the server POSTs ``{"pool", "desired"}`` to ``url`` when the target changes."""

    KIND: ClassVar[str] = "webhook"
    url: str = field(metadata=HTTP_URL)
    token_env: str | None = field(default=None, metadata=ENV_NAME)
    resolved_token: str = field(default="", repr=False, metadata=RESOLVED)  # sent as Bearer unless ""


Scaler = ExternalScaler | WebhookScaler


@dataclass(frozen=True, slots=True)
class RetrySection:
    """A pool's default retry policy (tasks may bring their own)."""

    max_attempts: int = field(default=3, metadata=between(1, 1_000_000))
    initial_backoff_s: float = field(default=1.0, metadata=DURATION_OR_ZERO)
    multiplier: float = field(default=2.0, metadata=between(1, 1_000))
    max_backoff_s: float = field(default=60.0, metadata=DURATION_OR_ZERO)
    jitter: bool = True

    def to_engine(self) -> RetryRule:
        return RetryRule(
            max_attempts=self.max_attempts,
            initial_backoff=self.initial_backoff_s,
            multiplier=self.multiplier,
            max_backoff=self.max_backoff_s,
            jitter=self.jitter,
        )


PRIORITY_NAMES = tuple(p.name.lower() for p in Priority)  # the keys of a pool's ``slo``


@dataclass(frozen=True, slots=True)
class PoolSection:
    """One ``[[pools]]`` entry: a queue and the workers that serve it."""

    name: str = field(metadata=NAME)
    min: int = field(default=1, metadata=between(0, 1_000_000))
    max: int = field(default=10, metadata=between(1, 1_000_000))
    autoscale: bool = True
    scaler: Scaler = field(default_factory=ExternalScaler)
    lease_ttl_s: float = field(default=30.0, metadata=DURATION)
    max_pending: int | None = field(default=None, metadata=between(1, BILLION))  # None: limits'
    overflow: Overflow = Overflow.WAIT
    retry: RetrySection = field(default_factory=RetrySection)
    default_duration_s: float = field(default=1.0, metadata=DURATION)
    reservable_fraction: float = field(default=0.5, metadata=FRACTION)
    await_unknown_dependencies_s: float | None = field(default=None, metadata=DURATION)  # None: reject
    target_utilization: float = field(default=0.75, metadata=above(0, 1))
    drain_time_s: float = field(default=30.0, metadata=DURATION)
    cooldown_s: float = field(default=30.0, metadata=DURATION_OR_ZERO)
    cost_per_worker_second: float = field(default=0.0, metadata=between(0, BILLION))
    max_slots_per_worker: int | None = field(default=None, metadata=between(1, U32_MAX))  # None: limits'
    fair_share: bool = False
    tenant_weights: Mapping[str, float] = field(default_factory=dict, metadata=above(0, 1_000_000))
    slo: Mapping[str, float] = field(default_factory=dict, metadata=DURATION)  # class name -> seconds

    def to_engine(self, limits: Limits) -> PoolConfig:
        """The engine's view; unset per-pool bounds fall back to ``[limits]``, which also caps them.

        ``autoscale = true`` gives the pool an autoscaler from ``target_utilization``, ``drain_time_s``,
        ``cooldown_s`` and the wait-time objectives ``slo`` (the rest at the engine's defaults); without
        it the desired capacity is the connected capacity. ``cost_per_worker_second`` prices the snapshot's ``cost``, autoscaled or not. ``await_unknown_dependencies_s`` unset rejects
        a dependency on an unknown key, set waits that long for a task with that key to arrive.
        """
        slots = limits.max_slots_per_worker
        if self.max_slots_per_worker is not None:
            slots = min(slots, self.max_slots_per_worker)
        autoscale = (
            AutoscaleRule(
                target_utilization=self.target_utilization,
                drain_time=self.drain_time_s,
                cooldown=self.cooldown_s,
                slo={Priority[name.upper()]: seconds for name, seconds in self.slo.items()},
            )
            if self.autoscale
            else None
        )
        awaits = self.await_unknown_dependencies_s
        return PoolConfig(
            name=self.name,
            max=self.max,
            min=self.min,
            lease_ttl=self.lease_ttl_s,
            max_pending=limits.max_pending_per_pool if self.max_pending is None else self.max_pending,
            overflow=self.overflow,
            retry=self.retry.to_engine(),
            default_duration=self.default_duration_s,
            max_slots_per_worker=slots,
            cost_per_worker_second=self.cost_per_worker_second,
            autoscale=autoscale,
            unknown_dependency=UnknownDependency.REJECT if awaits is None else UnknownDependency.AWAIT,
            await_timeout=awaits,
            reservable_fraction=self.reservable_fraction,
            fair_share=self.fair_share,
            tenant_weights=dict(self.tenant_weights),
        )


# ----------------------------------------------------------------------------------------- resources


@dataclass(frozen=True, slots=True)
class SemaphoreResource:
    """``kind = "semaphore"``: at most ``permits`` units held by running tasks at once."""

    KIND: ClassVar[str] = "semaphore"
    name: str = field(metadata=NAME)
    permits: int = field(metadata=between(1, BILLION))
    shard: str | None = field(default=None, metadata=NAME)


@dataclass(frozen=True, slots=True)
class TokenBucketResource:
    """``kind = "token_bucket"``: ``rate`` units per second, up to ``burst`` saved up."""

    KIND: ClassVar[str] = "token_bucket"
    name: str = field(metadata=NAME)
    rate: float = field(metadata=above(0, BILLION))
    burst: float = field(metadata=between(1, BILLION))
    shard: str | None = field(default=None, metadata=NAME)


Resource = SemaphoreResource | TokenBucketResource


def resource_to_engine(resource: Resource) -> ResourceConfig:
    if isinstance(resource, SemaphoreResource):
        return Semaphore(resource.name, resource.permits)
    return TokenBucket(resource.name, resource.rate, resource.burst)


# ----------------------------------------------------------------------------- outputs, shards, router


@dataclass(frozen=True, slots=True)
class OutputsSection:
    """``[outputs]``: what the leader keeps in memory to answer Get and Wait after a task finished."""

    cache_entries: int = field(default=10_000, metadata=between(0, BILLION))
    cache_bytes: int = field(default=64 * MIB, metadata=between(0, 1 << 40))
    info_entries: int = field(default=100_000, metadata=between(0, BILLION))


@dataclass(frozen=True, slots=True)
class ShardSection:
    """One ``[[shards]]`` entry: a leader group owning some pools; ``number`` goes into task ids."""

    name: str = field(metadata=NAME)
    number: int = field(metadata=between(0, 255))
    endpoint: str = field(metadata=HTTP_URL)
    pools: tuple[str, ...] = field(default=(), metadata=NAME)
    members: tuple[str, ...] = field(
        default=(), metadata=HTTP_URL
    )  # for the leader search (router, other shards)


@dataclass(frozen=True, slots=True)
class RouterSection:
    """``[router]``: the router's listeners (servers accept the table and ignore it) and, for a cluster
    without ``[[shards]]``, where its one leader group is: a router in front of a leader and its standbys
    sends every call to the leader (found among ``members``), which a load balancer cannot."""

    grpc_addr: str = field(default="127.0.0.1:7070", metadata=ADDRESS)
    http_addr: str = field(default="127.0.0.1:7071", metadata=ADDRESS)
    # Unsharded only: the servers of the cluster, for the leader search ...
    members: tuple[str, ...] = field(default=(), metadata=HTTP_URL)
    # ... and its balanced address, used while no leader is known (default: the first member).
    endpoint: str | None = field(default=None, metadata=HTTP_URL)


@dataclass(frozen=True, slots=True)
class TelemetrySection:
    """``[telemetry]``: OpenTelemetry traces, exported over OTLP/gRPC (the ``cronoq[otel]`` extra). Off
    unless ``enabled`` here or an ``OTEL_EXPORTER_OTLP_*ENDPOINT`` variable says where to send them
    (:mod:`cronoq.telemetry`); a key left unset here is the SDK's to read from its ``OTEL_*`` variables."""

    enabled: bool = False
    endpoint: str | None = field(default=None, metadata=HTTP_URL)  # None: OTEL_EXPORTER_OTLP_*ENDPOINT
    service_name: str | None = field(default=None, metadata=NOT_EMPTY)  # None: OTEL_SERVICE_NAME, program
    sample_ratio: float | None = field(default=None, metadata=FRACTION)  # None: OTEL_TRACES_SAMPLER


# -------------------------------------------------------------------------------------------- config


@dataclass(frozen=True, slots=True)
class Config:
    """A whole configuration file; ``Config()`` is the configuration without a file."""

    server: ServerSection = field(default_factory=ServerSection)
    auth: AuthSection = field(default_factory=AuthSection)
    store: StoreSection = field(default_factory=MemoryStoreSection)
    limits: Limits = field(default_factory=Limits)
    pools: tuple[PoolSection, ...] = (PoolSection(DEFAULT_POOL),)
    resources: tuple[Resource, ...] = ()
    outputs: OutputsSection = field(default_factory=OutputsSection)
    shards: tuple[ShardSection, ...] = ()
    router: RouterSection = field(default_factory=RouterSection)
    telemetry: TelemetrySection = field(default_factory=TelemetrySection)

    def with_overrides(self, shard: str | None = None, insecure_no_auth: bool = False) -> Config:
        """Apply ``--shard`` / ``--insecure-no-auth``; must happen before validation, which checks them.

        The flag can only turn ``insecure_no_auth`` on: leaving it out keeps what the file says.
        """
        server = self.server
        if shard is not None:
            server = replace(server, shard=shard)
        if insecure_no_auth:
            server = replace(server, insecure_no_auth=True)
        return replace(self, server=server)

    @property
    def auth_enabled(self) -> bool:
        return bool(self.auth.tokens or self.auth.certs)

    def host_guard(self, http_addr: str) -> bool:
        """Whether HTTP requests to the listener at ``http_addr`` must name this machine in their Host
        header (the DNS-rebinding guard): without credentials, on a loopback listener. A listener opened
        to the network with ``insecure_no_auth`` serves other names by design: there the guard would
        refuse every legitimate caller and protect nothing, as anyone who reaches it may call it."""
        return not self.auth_enabled and is_loopback(http_addr)

    def pool(self, name: str) -> PoolSection | None:
        return next((p for p in self.pools if p.name == name), None)

    def shard_for_pool(self, pool: str) -> ShardSection | None:
        """The shard owning ``pool``; None when unsharded (or the pool is unknown)."""
        return next((s for s in self.shards if pool in s.pools), None)

    def own_shard(self) -> ShardSection | None:
        """The ``[[shards]]`` entry this server serves; None when the cluster has no shards.

        Validation cannot insist on ``server.shard`` because the router reads the same file without
        one, so a server asks here and gets a :class:`ConfigError` when it was not told its shard.
        """
        if not self.shards:
            return None
        chosen = next((s for s in self.shards if s.name == self.server.shard), None)
        if chosen is None:
            message = "required when [[shards]] are configured: set it, or pass --shard / CRONOQ_SHARD"
            raise ConfigError([Problem("server.shard", message)])
        return chosen

    def engine_pools(self) -> list[PoolConfig]:
        return [p.to_engine(self.limits) for p in self.pools]

    def engine_resources(self, shard: str | None) -> list[ResourceConfig]:
        """The ``[[resources]]`` a server of ``shard`` schedules: all of them when unsharded, else
        those whose ``shard`` names it (validation makes every resource name one when sharded)."""
        return [
            resource_to_engine(r)
            for r in self.resources
            if not self.shards or r.shard is None or r.shard == shard
        ]


def default_config() -> Config:
    """What a server runs with when started without ``--config``: one pool ``default``, memory store,
    loopback listeners, no authentication."""
    return Config()
