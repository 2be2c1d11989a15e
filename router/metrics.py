"""The router's ``/metrics``: where it sends each shard's calls and what became of them.

A router keeps no scheduling state (the shards report that); it reports its own view: the leader it
found for each shard, the calls it forwarded and their outcomes, retries, fan-out answers that had to
name unreachable shards, and workers it sent to their shard.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.metrics_core import Metric

from cronoq.cluster.discovery import LeaderFinder
from cronoq.cluster.forward import Peers, forwarded_families
from cronoq.cluster.shards import ShardMap
from cronoq.prometheus import Sample, family, labelled

from .service import RouterService


def families(
    shards: ShardMap, finder: LeaderFinder, peers: Peers, service: RouterService
) -> Iterator[Metric]:
    leaders: list[Sample] = []
    for shard in sorted(shards, key=lambda s: s.name):
        # A shard without members is reached at its endpoint, which the router does not check.
        url = finder.leader(shard) if finder.tracks(shard) else shard.endpoint
        leaders.append(({"shard": shard.name, "endpoint": url or ""}, 1.0 if url else 0.0))
    yield family(
        "cronoq_router_shard_leader",
        "gauge",
        "1 while the router knows where the shard's leader serves (label endpoint), 0 while it knows none.",
        leaders,
    )
    yield family(
        "cronoq_router_leader_changes_total",
        "counter",
        "Changes of the leader the router found for a shard with members (to none included).",
        [({"shard": name}, float(n)) for name, n in sorted(finder.changes.items())],
    )
    yield from forwarded_families(peers, "cronoq_router_")
    yield family(
        "cronoq_router_fanout_partial_total",
        "counter",
        "Fan-out answers that named unreachable shards in unavailable_shards (Watch: streams opened without them).",
        [({"method": method}, float(n)) for method, n in sorted(service.partial.items())],
    )
    yield family(
        "cronoq_router_fanout_unavailable_total",
        "counter",
        "Times a shard was named in a fan-out answer's unavailable_shards.",
        labelled(service.unavailable, ("shard", "method")),
    )
    yield family(
        "cronoq_router_worker_redirects_total",
        "counter",
        "Worker streams sent to the leader of their pool's shard.",
        labelled(service.redirects, ("shard", "pool")),
    )
