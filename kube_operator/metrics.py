"""The operator's own ``/metrics``, ``/healthz`` and ``/readyz``, on ``http_addr``.

``/metrics`` is served by prometheus-client through :class:`cronoq.prometheus.Exposition` as the
server's and the router's are (process, platform and GC collectors, ``cronoq_build_info`` with
``store="none"``), with the operator's counts read at scrape time. It shows counts and the leader flag
only: no scaler, server, pool or namespace names, no tokens. ``/healthz`` (liveness) answers 200 while
the operator's loops (watch, election, reconciliation) run, 503 once one of them ended; ``/readyz``
(readiness) answers 200 once every watched namespace has been listed, leader or standby.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

from aiohttp import web
from prometheus_client.metrics_core import Metric

from cronoq.prometheus import Exposition, family, labelled

from .inventory import Inventory


@dataclass(slots=True)
class Stats:
    """What the reconciler counts: its decisions by status reason, the replicas it set, and the
    snapshot reads that failed."""

    decisions: dict[tuple[str], int] = field(default_factory=dict)
    scaled: int = 0
    read_errors: int = 0

    def decided(self, reason: str) -> None:
        self.decisions[(reason,)] = self.decisions.get((reason,), 0) + 1


def families(stats: Stats, inventory: Inventory, leading: Callable[[], bool]) -> Iterable[Metric]:
    yield family(
        "cronoq_operator_decisions_total",
        "counter",
        "Scaler reconciliations, by the reason of the status they left (Scaled, or why the Deployment was left alone).",
        labelled(stats.decisions, ("reason",)),
    )
    yield family(
        "cronoq_operator_replicas_set_total",
        "counter",
        "Deployment replicas changed through the scale subresource.",
        [({}, stats.scaled)],
    )
    yield family(
        "cronoq_operator_server_read_errors_total",
        "counter",
        "Snapshot reads of a cronoq server that failed (unreachable, refused, unreadable credentials).",
        [({}, stats.read_errors)],
    )
    yield family(
        "cronoq_operator_watch_restarts_total",
        "counter",
        "Watches of the scalers started again: closed by the API server, expired (410 Gone), or failed.",
        labelled({(cause,): count for cause, count in inventory.restarts.items()}, ("cause",)),
    )
    yield family(
        "cronoq_operator_scalers", "gauge", "Scalers the operator watches.", [({}, len(inventory.scalers()))]
    )
    yield family(
        "cronoq_operator_leader",
        "gauge",
        "1 while this replica holds the leader Lease and acts, 0 while it stands by.",
        [({}, 1.0 if leading() else 0.0)],
    )


def make_app(
    stats: Stats, inventory: Inventory, leading: Callable[[], bool], loops: Sequence[asyncio.Task[None]]
) -> web.Application:
    exposition = Exposition(lambda: families(stats, inventory, leading), store="none")

    async def metrics(request: web.Request) -> web.Response:
        body, content_type = await exposition.render(request.headers.get("Accept", ""))
        response = web.Response(body=body)
        response.headers["Content-Type"] = content_type
        return response

    async def healthz(request: web.Request) -> web.Response:
        ended = [task.get_name() for task in loops if task.done()]
        return (
            web.Response(status=503, text=f"stopped: {', '.join(ended)}\n")
            if ended
            else web.Response(text="ok\n")
        )

    async def readyz(request: web.Request) -> web.Response:
        return (
            web.Response(text="ok\n")
            if inventory.synced
            else web.Response(status=503, text="listing scalers\n")
        )

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/healthz", healthz)
    app.router.add_get("/readyz", readyz)
    return app
