"""One ``cronoq-server`` process: the engine, its runtime, gRPC and HTTP listeners, and shutdown.

With the memory store the process leads from the start. Shutdown follows SPEC §2: stop admitting work,
give running attempts ``shutdown_grace_s``, tell workers to reconnect (``Shutdown``), drain listeners for
at most 5 s.
"""

from __future__ import annotations

import asyncio
import random
import ssl
from typing import Any

import grpc
from aiohttp import web
from grpc_health.v1 import health, health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection

from cronoq.auth import Authenticator, Principal
from cronoq.config import Config
from cronoq.engine import Engine
from cronoq.errors import Unavailable
from cronoq.logs import get_logger
from cronoq.v1 import cronoq_pb2_grpc as pbg

from . import metrics
from .convert import SpecLimits
from .grpc_api import AdminServicer, TasksServicer, WorkersServicer
from .http_api import build_http_app, build_metrics_app
from .outputs import OutputCache
from .runtime import Runtime
from .service import Service
from .tls import load_server_tls
from .workers import WorkerStream

DRAIN_S = 5.0
GRPC_SERVICES = ("", "cronoq.v1.Tasks", "cronoq.v1.Workers", "cronoq.v1.Admin")
log = get_logger("cronoq.server")


class ShardServer:
    """Builds and runs one server from a validated :class:`Config`."""

    def __init__(self, config: Config) -> None:
        self.config = config
        limits = config.limits
        engine = Engine(
            [p.to_engine(limits) for p in config.pools], limits=limits.to_engine(), rng=random.Random()
        )
        self.runtime = Runtime(engine, OutputCache(config.outputs.cache_entries, config.outputs.cache_bytes))
        self.auth = Authenticator(config.auth.token_entries())
        self.spec_limits = SpecLimits(
            max_key_len=limits.max_key_len,
            max_kind_len=limits.max_kind_len,
            max_tags=limits.max_tags,
            max_tag_len=limits.max_tag_len,
        )
        self.service = Service(
            self.runtime,
            self.auth,
            spec_limits=self.spec_limits,
            max_tasks_per_batch=limits.max_tasks_per_batch,
            max_wait_s=limits.max_wait_s,
            request_timeout_s=limits.request_timeout_s,
            max_list=limits.max_list,
        )
        self.connected: dict[int, tuple[str, int]] = {}
        self.workers = WorkersServicer(self.service, self._make_stream)
        self.health = health.aio.HealthServicer()
        self.grpc_server: grpc.aio.Server | None = None
        self.http_runner: web.AppRunner | None = None
        self.metrics_runner: web.AppRunner | None = None
        self.grpc_port = 0
        self._stopped = asyncio.Event()

    def _make_stream(self, context: Any, caller: Principal) -> WorkerStream:
        limits = self.config.limits
        return WorkerStream(
            self.runtime,
            context,
            caller,
            spec_limits=self.spec_limits,
            max_message_bytes=limits.max_message_bytes,
            connected=self.connected,
        )

    async def _listen(
        self, key: str, addr: str, app: web.Application, ssl_context: ssl.SSLContext | None
    ) -> web.AppRunner:
        """Serve ``app`` on ``addr``; a failure names the config key."""
        runner = web.AppRunner(app, access_log=None, shutdown_timeout=DRAIN_S)
        await runner.setup()
        host, port = _split(addr)
        try:
            await web.TCPSite(runner, host, port, ssl_context=ssl_context).start()
        except OSError as err:
            await runner.cleanup()
            raise OSError(f"{key}: cannot listen on {addr} ({err.strerror})") from err
        return runner

    def render_metrics(self) -> str:
        runtime = self.runtime
        return metrics.render(
            runtime.engine.snapshot(runtime.clock()),
            runtime.outcomes,
            shard=self.config.server.shard or "",
            watch_streams=runtime.watch_count,
        )

    async def start(self) -> None:
        cfg = self.config
        limits = cfg.limits
        server = grpc.aio.server(
            options=[
                ("grpc.max_receive_message_length", limits.max_message_bytes),
                ("grpc.max_send_message_length", limits.max_message_bytes),
                ("grpc.max_concurrent_streams", limits.max_concurrent_streams),
                ("grpc.keepalive_time_ms", int(limits.keepalive_interval_s * 1000)),
                ("grpc.keepalive_timeout_ms", int(limits.keepalive_timeout_s * 1000)),
                ("grpc.keepalive_permit_without_calls", 1),
                ("grpc.http2.min_ping_interval_without_data_ms", 5000),
                ("grpc.so_reuseport", 0),
            ],
            maximum_concurrent_rpcs=limits.max_concurrent_requests,
        )
        pbg.add_TasksServicer_to_server(TasksServicer(self.service), server)
        pbg.add_WorkersServicer_to_server(self.workers, server)
        pbg.add_AdminServicer_to_server(AdminServicer(self.service, self.connected), server)
        health_pb2_grpc.add_HealthServicer_to_server(self.health, server)
        reflection.enable_server_reflection(
            [
                *(f"cronoq.v1.{s}" for s in ("Tasks", "Workers", "Admin")),
                "grpc.health.v1.Health",
                reflection.SERVICE_NAME,
            ],
            server,
        )
        tls = load_server_tls(cfg.server.tls) if cfg.server.tls is not None else None
        try:
            if tls is None:
                self.grpc_port = server.add_insecure_port(cfg.server.grpc_addr)
            else:
                self.grpc_port = server.add_secure_port(cfg.server.grpc_addr, tls.grpc_credentials)
        except RuntimeError:  # grpc's way of saying the bind failed
            self.grpc_port = 0
        if self.grpc_port == 0:
            raise OSError(
                f"server.grpc_addr: cannot listen on {cfg.server.grpc_addr} (in use, or not an address here)"
            )
        await server.start()
        self.grpc_server = server
        for name in GRPC_SERVICES:
            await self.health.set(name, health_pb2.HealthCheckResponse.SERVING)

        app = build_http_app(
            self.service,
            max_body_bytes=limits.max_http_body_bytes,
            loopback_only_guard=not self.auth.enabled,
            workers_connected=lambda: self.connected,
            metrics=self.render_metrics,
            require_client_cert=tls is not None and tls.client_certs_required,
        )
        ssl_context = tls.ssl_context if tls is not None else None
        try:
            self.http_runner = await self._listen("server.http_addr", cfg.server.http_addr, app, ssl_context)
            if cfg.server.metrics_addr is not None:
                self.metrics_runner = await self._listen(
                    "server.metrics_addr",
                    cfg.server.metrics_addr,
                    build_metrics_app(self.service, self.render_metrics),
                    ssl_context,
                )
        except OSError:
            await server.stop(None)
            if self.http_runner is not None:
                await self.http_runner.cleanup()
            raise
        log.info(
            "serving",
            grpc_addr=cfg.server.grpc_addr,
            http_addr=cfg.server.http_addr,
            pools=self.runtime.engine.pool_names,
            auth=self.auth.enabled,
        )

    async def shutdown(self, reason: str = "server shutting down") -> None:
        """Stop admitting, let running attempts finish within the grace, tell workers, close listeners."""
        runtime = self.runtime
        if not runtime.accepting:
            await self._stopped.wait()
            return
        runtime.accepting = False
        for name in GRPC_SERVICES:
            await self.health.set(name, health_pb2.HealthCheckResponse.NOT_SERVING)
        grace = self.config.server.shutdown_grace_s
        log.info("shutting_down", reason=reason, running=runtime.busy(), grace_s=grace)
        await runtime.wait_idle(grace)
        runtime.wake_waiters_unavailable()
        runtime.close_watchers(Unavailable("server is shutting down"))
        streams = list(self.workers.streams)
        for stream in streams:
            stream.send_shutdown(reason, not_leader=False)
        await asyncio.gather(*(s.finish_writes(DRAIN_S) for s in streams))
        runtime.cancel_timer()
        if self.grpc_server is not None:
            await self.grpc_server.stop(DRAIN_S)
        for runner in (self.http_runner, self.metrics_runner):
            if runner is not None:
                await runner.cleanup()
        log.info("stopped", left_running=runtime.busy())
        self._stopped.set()


def _split(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    return host.strip("[]"), int(port)
