"""One ``cronoq-server`` process: listeners, leadership, the engine of each term it leads, shutdown.

The listeners open at once; the process then stands by (UNAVAILABLE, ``/readyz`` 503) until the store
makes it leader. With the memory store that is immediate. Taking over rebuilds an engine from what the
store recovered and serves it; losing leadership (fenced, lock session gone, lease taken) drops that
engine, tells workers ``Shutdown{not_leader}`` so they reconnect to the new leader, and stands by
again. Shutdown as docs/operations.md (Shutdown) says: stop admitting work, give running attempts ``shutdown_grace_s``, commit
what is pending, tell workers to reconnect, step down cleanly (a standby takes over at once), drain
listeners for at most 5 s.

A standby does not keep clients: it closes every connection about a second after accepting it, so
that clients (balancers, the SDK) connect again and reach the leader. On HTTP every standby answer says
``Connection: close`` and idle connections are closed by a sweep. gRPC fixes connection limits when a
server is created (grpcio has no way to change a running server's channel arguments), so the gRPC
listener is one ``grpc.aio`` server while leading and another (with a one-second ``max_connection_age``)
while standing by, swapped on the same port when the role changes; the leader's connections live as
long as clients like. The swap begins the old server's stop, which closes its listener at once, binds
the new server then (the port is closed for about a millisecond), and leaves the old server's calls
its grace to be answered by the code running them. Calls the old server's gRPC core holds but had not
yet handed to this process end CANCELLED, which gRPC core does to them whatever the grace
(grpc/grpc#41785); nothing of them ran, and the SDK and forwarders read CANCELLED as such
(``cronoq.transport.never_received``).
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import random
import signal
import time
from collections.abc import Iterator
from typing import Any

import grpc
from aiohttp import hdrs, web
from aiohttp.web_protocol import RequestHandler
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection
from prometheus_client.metrics_core import Metric

from cronoq import telemetry
from cronoq.api.grpc_api import AdminServicer, TasksServicer
from cronoq.api.http_api import build_metrics_app
from cronoq.api.http_listener import HttpBounds, HttpListeners, Listener, waiting_for_request
from cronoq.api.limits import RequestLimits
from cronoq.auth import Authenticator, Principal
from cronoq.cluster.discovery import LeaderFinder, forwarding
from cronoq.cluster.forward import Peers, forwarded_families
from cronoq.cluster.shards import ShardMap
from cronoq.config import Config
from cronoq.config.model import WebhookScaler
from cronoq.engine import Engine, compiled
from cronoq.errors import Unavailable
from cronoq.limit_hits import LimitHits
from cronoq.logs import get_logger
from cronoq.process import open_file_limit, running_loop_name
from cronoq.prometheus import Exposition
from cronoq.serving import api_app, bind_grpc, grpc_server, grpc_services, listen_grpc, set_health
from cronoq.tls import ServerTls, load_server_tls
from cronoq.v1 import cronoq_pb2_grpc as pbg

from . import metrics
from .convert import SpecLimits
from .grpc_api import BatchedWorkersServicer, WorkersServicer
from .outputs import OutputCache
from .runtime import CommitFailures, Runtime
from .scaler import WebhookScalers
from .service import ShardService
from .store import Leadership, StoreError, StoreUnavailable
from .store.factory import make_store
from .workers import WorkerStream

DRAIN_S = 5.0
STEP_DOWN_DRAIN_S = 1.0  # how long a deposed leader waits for workers to read their Shutdown
PRUNE_EVERY_S = 60.0
# After losing leadership, wait this long before competing for it again, so that a healthy standby
# (polling every 0.5 s) takes over rather than the instance that just failed.
REACQUIRE_AFTER_S = 2.0
# A store that could not be reached at start is tried again after this long, doubling up to the most.
STORE_RETRY_FIRST_S = 0.5
STORE_RETRY_MAX_S = 5.0
# A standby closes connections about this long after accepting them (gRPC: max_connection_age, which
# gRPC jitters by 10 %; HTTP: a sweep every STANDBY_SWEEP_S), so clients go back to their balancer.
STANDBY_CONNECTION_S = 1.0
STANDBY_SWEEP_S = 0.2
# Calls still running on a connection a standby closes get this long to finish (standby answers are
# immediate; this bounds a health Watch).
STANDBY_CLOSE_GRACE_S = 0.5
# How long the calls on a leader's gRPC server that stepping down replaces may take to finish (its
# workers were told to reconnect already); a standby's server gives its calls STANDBY_CLOSE_GRACE_S.
SWAP_GRACE_S = 1.0
# Binding the port for the new server is retried this often, this far apart, until the old one's
# listener has closed.
REBIND_TRIES = 200
REBIND_EVERY_S = 0.005
log = get_logger("cronoq.server")


class ShardServer:
    """Builds and runs one server from a validated :class:`Config`."""

    def __init__(self, config: Config) -> None:
        self.config = config
        limits = config.limits
        self.shards = ShardMap.from_config(config, config.server.shard)
        all_pools = [p.to_engine(limits) for p in config.pools]
        # With [[shards]] this process schedules only its own shard's pools; the others are known (to
        # validate and route calls) but scheduled elsewhere.
        self.engine_pools = [p for p in all_pools if self.shards.is_local(self.shards.by_pool(p.name))]
        self.engine_resources = config.engine_resources(config.server.shard)
        local = {p.name for p in self.engine_pools}
        self.scalers = WebhookScalers(
            {
                p.name: p.scaler
                for p in config.pools
                if isinstance(p.scaler, WebhookScaler) and p.name in local
            }
        )
        # Sharded: calls for other shards go to their leaders, found among their members as a router
        # finds them (a shard's endpoint may be a Service that hands a call to a standby).
        self.finder: LeaderFinder | None = None
        self.peers: Peers | None = None
        if self.shards.sharded:
            self.finder, self.peers = forwarding(self.shards, config)
        # Finished tasks stay known for lookups for keep_finished_s, at most [outputs] info_entries of
        # them (the memory store has nothing behind the engine; a durable store is asked beyond). Keys
        # dedup within those bounds, so that a pruned task is gone everywhere (its key no longer
        # dedups, Get says NOT_FOUND).
        engine_limits = limits.to_engine()
        keep, records = config.store.keep_finished_s, config.outputs.info_entries
        self.engine_limits = dataclasses.replace(
            engine_limits,
            key_retention=min(engine_limits.key_retention, keep),
            key_retention_max=min(engine_limits.key_retention_max, records),
            record_retention=keep,
            record_max=records,
        )
        self.store = make_store(config)
        self.outputs = OutputCache(config.outputs.cache_entries, config.outputs.cache_bytes)
        self.runtime: Runtime | None = None
        self.commit_failures = CommitFailures()  # across terms, for the standby's page too
        self.leadership: Leadership | None = None
        self.auth = Authenticator(config.auth.token_entries(), config.auth.cert_entries())
        self.spec_limits = SpecLimits(
            max_key_len=limits.max_key_len,
            max_kind_len=limits.max_kind_len,
            max_tags=limits.max_tags,
            max_tag_len=limits.max_tag_len,
            max_deps=limits.max_deps,
            max_resources=limits.max_resources,
            max_message_bytes=limits.max_message_bytes,
        )
        # One count of [limits] hits for the process (cronoq_limit_hits_total), and the server-wide
        # gates both listeners share.
        self.limit_hits = LimitHits()
        self.request_limits = RequestLimits(limits, self.limit_hits)
        self.tracing = telemetry.start(config.telemetry, "cronoq-server")
        self.service = ShardService(
            all_pools,
            self.auth,
            spec_limits=self.spec_limits,
            max_tasks_per_batch=limits.max_tasks_per_batch,
            max_wait_s=limits.max_wait_s,
            request_timeout_s=limits.request_timeout_s,
            max_list=limits.max_list,
            shards=self.shards,
            peers=self.peers,
            limit_hits=self.limit_hits,
            tracing=self.tracing,
        )
        self.connected = self.service.connected
        self.workers = WorkersServicer(self.service, self._make_stream)
        self.health = health.aio.HealthServicer()
        self.grpc_server: grpc.aio.Server | None = None
        self._grpc_leading = False  # which kind of gRPC server listens now (see _use_grpc)
        self._grpc_lock = asyncio.Lock()  # a role change swaps the server; shutdown stops it
        self._retiring: set[asyncio.Task[None]] = set()  # replaced gRPC servers still in their grace
        self._tls: ServerTls | None = None
        listeners = 1 if config.server.metrics_addr is None else 2
        self.http = HttpListeners(HttpBounds.from_config(config.server, listeners, open_file_limit()))
        self.exposition = Exposition(self.metric_families, store=config.store.KIND)
        self.http_listener: Listener | None = None  # the API's (server.http_addr)
        self.grpc_port = 0
        self._sweeper: asyncio.Task[None] | None = None
        self._stopped = asyncio.Event()
        self._stopping = False
        self._serving = asyncio.Event()  # set while leading
        self._leader_task: asyncio.Task[None] | None = None
        self.ended = asyncio.Event()  # set on a fatal failure (or a signal): time to shut down
        self.failure: str | None = None  # why the server ended on its own, for the exit status
        self._pruner: asyncio.Task[None] | None = None

    def _make_stream(self, context: Any, caller: Principal, batched: bool) -> WorkerStream:
        limits = self.config.limits
        return WorkerStream(
            self.service.runtime,
            context,
            caller,
            spec_limits=self.spec_limits,
            max_message_bytes=limits.max_message_bytes,
            connected=self.connected,
            shards=self.shards,
            locate=self.peers.url if self.peers is not None else None,
            limit_hits=self.limit_hits,
            batched=batched,
        )

    def metric_families(self) -> Iterator[Metric]:
        """The server's families for /metrics: the engine's and the runtime's figures while leading
        (``cronoq_leader 0`` alone on a standby), then the process-wide ones."""
        runtime = self.runtime
        shard = self.config.server.shard or ""
        if runtime is None:
            yield metrics.leader(shard, False)
        else:
            yield from metrics.families(
                runtime.engine.snapshot(runtime.clock()),
                runtime.outcomes,
                shard=shard,
                watch_streams=runtime.watch_count,
                waits=runtime.engine.dispatch_waits(),
                store=self.config.store.KIND,
                commits=runtime.commit_stats if runtime.store is not None else None,
            )
        yield from self.request_limits.families()
        yield from self.limit_hits.families()
        yield from self.http.families()
        if self.store.durable:
            yield metrics.commit_failures(self.commit_failures)
        if self.peers is not None:  # sharded: calls for other shards' pools go to their leaders
            yield from forwarded_families(self.peers, "cronoq_shard_")

    async def start(self) -> None:
        """Open the store, listen, and begin leading (memory: before returning) or standing by. A store
        that cannot be reached yet (Postgres down or restarting) is waited for as a standby waits for
        leadership; one that cannot be used (a bad URL, a newer schema) stops the start."""
        unreachable: StoreUnavailable | None = None
        try:
            await self.store.open()
        except StoreUnavailable as err:
            unreachable = err
        except StoreError as err:
            await self.store.close()
            raise OSError(f"store: {err}") from err
        try:
            await self._listen_all()
        except BaseException:
            await self.store.close()
            raise
        if self.finder is not None:
            await self.finder.start()
        self._leader_task = asyncio.get_running_loop().create_task(self._lead_forever(unreachable))
        if not self.store.durable:
            await self._serving.wait()
        else:
            log.info("standing_by", store=self.config.store.KIND)

    async def _lead_forever(self, unreachable: StoreUnavailable | None = None) -> None:
        """Stand by until leading, lead until leadership is lost, and again, until shutdown.

        A failure nothing here can recover from (an unreadable or damaged store, a bug) ends the process
        through :attr:`ended` with :attr:`failure` set: a server that can neither lead nor stand by must
        not stay up looking healthy (``/healthz`` 200) while holding, or never taking, leadership."""
        try:
            if unreachable is not None:
                await self._open_store(unreachable)
            await self._lead_loop()
        except Exception as err:
            self.failure = f"leadership failed: {type(err).__name__}: {err}"
            log.error("leadership_failed", error=self.failure)
            self.ended.set()

    async def _open_store(self, failure: StoreUnavailable) -> None:
        """Open a store that could not be reached at start, trying again after 0.5 s, then after twice
        as long each time up to STORE_RETRY_MAX_S. Each new reason is logged once, as is the end."""
        log.warning("store_unreachable", error=str(failure), store=self.config.store.KIND)
        said, delay = str(failure), STORE_RETRY_FIRST_S
        while True:
            await asyncio.sleep(delay)
            try:
                await self.store.open()
            except StoreUnavailable as err:
                if str(err) != said:
                    said = str(err)
                    log.warning("store_unreachable", error=said, store=self.config.store.KIND)
                delay = min(2 * delay, STORE_RETRY_MAX_S)
                continue
            log.info("store_reachable", store=self.config.store.KIND)
            return

    async def _lead_loop(self) -> None:
        while not self._stopping:
            leadership = await self.store.acquire()
            if self._stopping:
                break
            self.leadership = leadership
            try:
                await self._take_over(leadership)
            except (StoreError, Unavailable) as err:
                leadership.lose(f"taking over failed: {err}")
            await leadership.lost.wait()
            if self._stopping:
                break
            await self._step_down(leadership.reason)
            await self._use_grpc(leading=False)
            await asyncio.sleep(REACQUIRE_AFTER_S)

    async def _take_over(self, leadership: Leadership) -> None:
        """Rebuild the engine (tasks and recurring schedules) from the store and serve it."""
        now = time.time()
        recovered = await self.store.recover(now - self.engine_limits.key_retention)
        engine = Engine(
            self.engine_pools,
            limits=self.engine_limits,
            rng=random.Random(),
            first_id=self.shards.first_id(leadership.epoch, recovered.max_id),
            resources=self.engine_resources,
        )
        engine.restore(recovered.tasks, now, recovered.schedules, recovered.totals)
        runtime = Runtime(
            engine,
            self.outputs,
            store=self.store,
            on_store_failure=leadership.lose,
            on_scale=self.scalers.desired,
            first_worker_id=self.shards.first_worker_id(),
            commit_failures=self.commit_failures,
            tracing=self.tracing,
        )
        runtime.max_id = recovered.max_id
        runtime.start_committer()
        runtime.flush()
        await runtime.sync()  # what restore changed (lost attempts) is durable before anyone sees it
        if leadership.lost.is_set():
            await runtime.abandon()
            return
        await self._use_grpc(leading=True)
        self.runtime = runtime
        self.service.serve(runtime)
        await set_health(self.health, health_pb2.HealthCheckResponse.SERVING, self.config)
        for pool in engine.snapshot(runtime.clock()).pools:  # a new leader states every target once
            if pool.name in self.scalers.pools:
                self.scalers.desired(pool.name, pool.desired)
        if self.store.durable:
            self._pruner = asyncio.get_running_loop().create_task(self._prune_forever())
            log.info(
                "leading",
                epoch=leadership.epoch,
                recovered=len(recovered.tasks),
                schedules=len(recovered.schedules),
            )
        self._serving.set()

    async def _step_down(self, reason: str) -> None:
        """Leadership was lost: stop serving at once, tell workers to go to the new leader."""
        runtime = self.runtime
        log.warning("stepped_down", reason=reason)
        self.service.serve(None)
        self.runtime = None
        self._serving.clear()
        await set_health(self.health, health_pb2.HealthCheckResponse.NOT_SERVING, self.config)
        if self._pruner is not None:
            self._pruner.cancel()
            self._pruner = None
        if runtime is None:
            return
        runtime.stop_accepting()
        runtime.cancel_timer()
        await runtime.abandon()
        if self.tracing is not None:
            self.tracing.abandon("this server is no longer the leader")
        message = "this server is no longer the leader; retry against the new leader"
        runtime.wake_waiters_unavailable(message)
        runtime.close_watchers(Unavailable(message))
        streams = list(self.workers.streams)
        for stream in streams:
            stream.send_shutdown("not the leader", not_leader=True)
        await asyncio.gather(*(s.finish_writes(STEP_DOWN_DRAIN_S) for s in streams))

    async def _prune_forever(self) -> None:
        """Delete finished tasks older than ``keep_finished_s`` (leader only)."""
        keep = self.config.store.keep_finished_s
        while True:
            try:
                pruned = await self.store.prune(time.time() - keep)
                if pruned:
                    log.info("pruned", tasks=pruned)
            except StoreError as err:
                log.warning("prune_failed", error=str(err))
            await asyncio.sleep(PRUNE_EVERY_S)

    def _new_grpc_server(self, leading: bool) -> grpc.aio.Server:
        """A gRPC server with every service, configured for leading or for standing by (not bound)."""
        # A standby's GOAWAYs a second after accepting, busy or not: the client's next call connects again.
        standby = (
            ("grpc.max_connection_age_ms", int(STANDBY_CONNECTION_S * 1000)),
            ("grpc.max_connection_age_grace_ms", int(STANDBY_CLOSE_GRACE_S * 1000)),
            ("grpc.max_connection_idle_ms", int(STANDBY_CONNECTION_S * 1000)),
        )
        server = grpc_server(self.config, self.request_limits, () if leading else standby)
        pbg.add_TasksServicer_to_server(TasksServicer(self.service), server)
        pbg.add_WorkersServicer_to_server(self.workers, server)
        if self.config.server.worker_batches:
            pbg.add_BatchedWorkersServicer_to_server(BatchedWorkersServicer(self.workers), server)
        pbg.add_AdminServicer_to_server(AdminServicer(self.service), server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        reflection.enable_server_reflection(
            [
                *(f"cronoq.v1.{s}" for s in grpc_services(self.config)),
                "grpc.health.v1.Health",
                reflection.SERVICE_NAME,
            ],
            server,
        )
        return server

    async def _use_grpc(self, leading: bool) -> None:
        """Serve gRPC with a server configured for this role: swap servers on the same port when the
        role changed. Shielded, so that shutdown (which cancels the leadership loop) never finds a half
        swapped listener; it waits for the swap on the lock instead."""
        if self._grpc_leading != leading:
            await asyncio.shield(self._swap_grpc(leading))

    async def _swap_grpc(self, leading: bool) -> None:
        async with self._grpc_lock:
            old = self.grpc_server
            if self._stopping or old is None or self._grpc_leading == leading:
                return
            new = self._new_grpc_server(leading)
            # The old server's calls are answered by the code running them within its grace (a
            # standby's at once), rather than cancelled by gRPC; its listener closes as its stop
            # begins, so the new server listens meanwhile and the port stays closed for a moment only.
            grace = SWAP_GRACE_S if self._grpc_leading else STANDBY_CLOSE_GRACE_S
            retiring = asyncio.get_running_loop().create_task(old.stop(grace))
            self._retiring.add(retiring)
            retiring.add_done_callback(self._retiring.discard)
            host = _split(self.config.server.grpc_addr)[0]
            addr = f"[{host}]:{self.grpc_port}" if ":" in host else f"{host}:{self.grpc_port}"
            await asyncio.sleep(0)  # the old server's stop closes its listener before it first waits
            for _ in range(REBIND_TRIES):
                if bind_grpc(new, addr, self._tls) == self.grpc_port:
                    break
                await asyncio.sleep(REBIND_EVERY_S)
            else:
                # Another process took the port in the moment it was free: without a gRPC listener this
                # process is of no use, so it shuts down (and its supervisor starts it again).
                log.error("grpc_rebind_failed", grpc_addr=addr)
                os.kill(os.getpid(), signal.SIGTERM)
                return
            await new.start()
            self.grpc_server = new
            self._grpc_leading = leading
            log.debug("grpc_listener", leading=leading)

    async def _listen_all(self) -> None:
        cfg = self.config
        tls = self._tls = load_server_tls(cfg.server.tls) if cfg.server.tls is not None else None
        # The memory store leads at once: start with the leader's server rather than swap at once.
        leading = not self.store.durable
        server = self._new_grpc_server(leading)
        self.grpc_port = listen_grpc(server, "server.grpc_addr", cfg.server.grpc_addr, tls)
        await server.start()
        self.grpc_server = server
        self._grpc_leading = leading
        await set_health(self.health, health_pb2.HealthCheckResponse.NOT_SERVING, self.config)

        app = api_app(self.service, cfg, cfg.server.http_addr, tls, self.exposition, self.request_limits)
        app.on_response_prepare.append(self._close_unless_serving)
        ssl_context = tls.ssl_context if tls is not None else None
        try:
            self.http_listener = await self.http.open(
                "server.http_addr", cfg.server.http_addr, app, ssl_context
            )
            if cfg.server.metrics_addr is not None:
                await self.http.open(
                    "server.metrics_addr",
                    cfg.server.metrics_addr,
                    build_metrics_app(self.service, self.exposition),
                    ssl_context,
                )
        except OSError:
            await server.stop(None)
            await self.http.close()
            raise
        self._sweeper = asyncio.get_running_loop().create_task(self._sweep_standby_connections())
        log.info(
            "serving",
            grpc_addr=cfg.server.grpc_addr,
            http_addr=cfg.server.http_addr,
            pools=[p.name for p in self.engine_pools],
            auth=self.auth.enabled,
            event_loop=running_loop_name(),
            engine="compiled" if compiled() else "interpreted",
        )

    async def _close_unless_serving(self, request: web.Request, response: web.StreamResponse) -> None:
        """A standby's (or a stopping server's) HTTP answers close their connection, probes included."""
        if not self.service.ready:
            response.force_close()
            # aiohttp has written its Connection header into the response by now (this hook runs
            # after it); the answer must still tell the client.
            response.headers[hdrs.CONNECTION] = "close"

    async def _sweep_standby_connections(self) -> None:
        """While not serving, close each idle HTTP API connection about a second after it was accepted
        (or after this server stopped serving). A connection busy with a request is left to its answer,
        which closes it (:meth:`_close_unless_serving`)."""
        loop = asyncio.get_running_loop()
        seen: dict[RequestHandler, float] = {}  # connection -> when first seen while not serving
        while True:
            await asyncio.sleep(STANDBY_SWEEP_S)
            listener = self.http_listener
            if self.service.ready or listener is None:
                seen.clear()
                continue
            now = loop.time()
            seen = {conn: seen.get(conn, now) for conn in listener.connections}
            for conn, since in seen.items():
                if now - since >= STANDBY_CONNECTION_S and waiting_for_request(conn):
                    conn.force_close()

    async def shutdown(self, reason: str = "server shutting down") -> None:
        """Stop admitting, let running attempts finish within the grace, commit, tell workers, step down,
        close listeners."""
        if self._stopping:
            await self._stopped.wait()
            return
        self._stopping = True
        runtime = self.runtime
        await set_health(self.health, health_pb2.HealthCheckResponse.NOT_SERVING, self.config)
        if runtime is not None:
            runtime.stop_accepting()
            runtime.stop_dispatching()
            grace = self.config.server.shutdown_grace_s
            log.info("shutting_down", reason=reason, running=runtime.busy(), grace_s=grace)
            await runtime.wait_idle(grace)
            await runtime.stop_committer()  # outcomes reported during the grace are kept
            runtime.wake_waiters_unavailable()
            runtime.close_watchers(Unavailable("server is shutting down"))
            streams = list(self.workers.streams)
            for stream in streams:
                stream.send_shutdown(reason, not_leader=False)
            await asyncio.gather(*(s.finish_writes(DRAIN_S) for s in streams))
            runtime.cancel_timer()
        else:
            log.info("shutting_down", reason=reason, standby=True)
        if self._pruner is not None:
            self._pruner.cancel()
        if self._leader_task is not None:
            self._leader_task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._leader_task
        try:
            await self.store.release()
        except StoreError as err:
            log.warning("release_failed", error=str(err))
        await self.store.close()
        await self.scalers.close()
        async with self._grpc_lock:
            if self.grpc_server is not None:
                await self.grpc_server.stop(DRAIN_S)
            await asyncio.gather(*self._retiring)  # servers a role change replaced, in their grace
        if self._sweeper is not None:
            self._sweeper.cancel()
        await self.http.close()
        # Last: calls forwarded to other shards that are still running finish while the listeners
        # drain; closing their channels first would cut them short.
        if self.finder is not None:
            await self.finder.close()
        if self.peers is not None:
            await self.peers.close()
        if self.tracing is not None:  # exports the spans still batched (bounded by the exporter's timeout)
            await asyncio.to_thread(self.tracing.shutdown)
        log.info("stopped", left_running=runtime.busy() if runtime is not None else 0)
        self._stopped.set()


def _split(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host.strip("[]"), int(port)
