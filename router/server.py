"""One ``cronoq-router`` process: the public gRPC and HTTP API over the forwarding layer.

The transports are the shard server's own (:mod:`cronoq.api`), over :class:`.service.RouterService`.
Workers are never forwarded: a Work stream is read up to its ``register`` and refused with the owning
shard's endpoint, which SDK workers follow.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from prometheus_client.metrics_core import Metric

from cronoq import telemetry
from cronoq.api.grpc_api import (
    AdminServicer,
    Ctx,
    TasksServicer,
    authorize_worker,
    call,
    frame_messages,
    registration,
)
from cronoq.api.http_listener import HttpBounds, HttpListeners
from cronoq.api.limits import RequestLimits
from cronoq.auth import Authenticator
from cronoq.cluster.discovery import forwarding
from cronoq.cluster.shards import ShardMap, WrongShard
from cronoq.config import Config
from cronoq.errors import NotFound, PermissionDenied, shown
from cronoq.logs import get_logger
from cronoq.process import open_file_limit, running_loop_name
from cronoq.prometheus import Exposition
from cronoq.serving import api_app, grpc_server, listen_grpc, set_health
from cronoq.tls import load_server_tls
from cronoq.v1 import cronoq_pb2_grpc as pbg

from . import metrics
from .service import RouterService

DRAIN_S = 5.0
log = get_logger("cronoq.router")


class RedirectWorkers(pbg.WorkersServicer):
    """Work streams are refused with the endpoint of the shard that serves their pool."""

    def __init__(self, service: RouterService) -> None:
        self.service = service

    # grpc.aio also serves a stream-stream method as a coroutine that reads and writes through the context,
    # which the generated servicer does not describe (it returns an iterator of ServerMessages).
    async def Work(self, request_iterator: object, context: Ctx) -> None:  # type: ignore[override]
        await self.refuse(context, batched=False)

    async def refuse(self, context: Ctx, *, batched: bool) -> None:
        """Refuse one Work call of either service (``batched``: BatchedWorkers.Work)."""

        async def run() -> None:
            caller = await authorize_worker(self.service, context)
            frame = await context.read()
            if frame is grpc.aio.EOF:  # closed before registering: nothing to refuse (as at a shard)
                return
            pool = registration(frame_messages(frame, batched)[0]).pool
            shard = self.service.shards.by_pool(pool)
            if shard is None:
                raise NotFound(f"register.pool: unknown pool {shown(pool)}")
            if not caller.may_use_pool(pool):
                raise PermissionDenied(f"register.pool: this credential may not serve pool {shown(pool)}")
            # The shard's leader as last seen, so that workers need not go through a balancer that may
            # hand them to a standby; after a failover they come back here and are sent on again.
            self.service.redirects[(shard.name, pool)] += 1
            raise WrongShard(
                shard,
                "register.pool: workers connect to their shard, not to the router",
                self.service.peers.url(shard),
            )

        await call(context, run)


class RedirectBatchedWorkers(pbg.BatchedWorkersServicer):
    """``BatchedWorkers.Work`` streams, refused as ``Workers.Work`` ones are."""

    def __init__(self, workers: RedirectWorkers) -> None:
        self.workers = workers

    async def Work(self, request_iterator: object, context: Ctx) -> None:  # type: ignore[override]
        await self.workers.refuse(context, batched=True)


class RouterServer:
    def __init__(self, config: Config) -> None:
        self.config = config
        limits = config.limits
        shards = ShardMap.for_router(config)
        # Shards are reached as shards reach each other: at their leaders, over https:// with
        # [server.peer_tls].
        self.finder, self.peers = forwarding(shards, config)
        self.auth = Authenticator(config.auth.token_entries(), config.auth.cert_entries())
        self.service = RouterService(
            [p.name for p in config.pools],
            self.auth,
            shards,
            self.peers,
            max_tasks_per_batch=limits.max_tasks_per_batch,
            max_wait_s=limits.max_wait_s,
            max_list=limits.max_list,
            max_message_bytes=limits.max_message_bytes,
            tracing=telemetry.start(config.telemetry, "cronoq-router"),
        )
        # The server-wide [limits] gates both listeners share; hits counted with the service's.
        self.request_limits = RequestLimits(limits, self.service.limit_hits)
        self.grpc_server: Any = None
        self.health = health.aio.HealthServicer()
        self.http = HttpListeners(HttpBounds.from_config(config.server, 1, open_file_limit()))
        # A router keeps no scheduling state: its build info says store="none".
        self.exposition = Exposition(self.metric_families, store="none")

    def metric_families(self) -> Iterator[Metric]:
        """The router's families for /metrics: its view of the shards, then its gates and listeners."""
        yield from metrics.families(self.service.shards, self.finder, self.peers, self.service)
        yield from self.request_limits.families()
        yield from self.service.limit_hits.families()
        yield from self.http.families()

    async def start(self) -> None:
        cfg = self.config
        await self.finder.start()
        server = grpc_server(cfg, self.request_limits)
        pbg.add_TasksServicer_to_server(TasksServicer(self.service), server)
        pbg.add_AdminServicer_to_server(AdminServicer(self.service), server)
        workers = RedirectWorkers(self.service)
        pbg.add_WorkersServicer_to_server(workers, server)
        if cfg.server.worker_batches:
            pbg.add_BatchedWorkersServicer_to_server(RedirectBatchedWorkers(workers), server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        tls = load_server_tls(cfg.server.tls) if cfg.server.tls is not None else None
        listen_grpc(server, "router.grpc_addr", cfg.router.grpc_addr, tls)
        await server.start()
        self.grpc_server = server
        # SERVING for each service it serves, as a leading server says: a checker asking about the one
        # it uses (cronoq.v1.Tasks, say) would otherwise be told NOT_FOUND.
        await set_health(self.health, health_pb2.HealthCheckResponse.SERVING, self.config)
        app = api_app(self.service, cfg, cfg.router.http_addr, tls, self.exposition, self.request_limits)
        try:
            await self.http.open(
                "router.http_addr", cfg.router.http_addr, app, tls.ssl_context if tls is not None else None
            )
        except OSError:
            await server.stop(None)
            raise
        log.info(
            "routing",
            grpc_addr=cfg.router.grpc_addr,
            http_addr=cfg.router.http_addr,
            shards=[s.name for s in self.service.shards],
            event_loop=running_loop_name(),
        )

    async def shutdown(self) -> None:
        await set_health(
            self.health, health_pb2.HealthCheckResponse.NOT_SERVING, self.config
        )  # balancers: go elsewhere
        if self.grpc_server is not None:
            await self.grpc_server.stop(DRAIN_S)
        await self.http.close()
        await asyncio.gather(self.finder.close(), self.peers.close())
        if self.service.tracing is not None:  # exports the spans still batched
            await asyncio.to_thread(self.service.tracing.shutdown)
        log.info("stopped")
