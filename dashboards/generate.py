"""Writes the cronoq Grafana dashboards: ``python dashboards/generate.py``.

The JSON files are what Grafana loads, in two places with the same content: this folder (the Compose
cluster provisions it; any Grafana can import them) and ``charts/cronoq/files/dashboards`` (the Helm
chart's dashboard ConfigMaps: Helm reads no file outside the chart). They are generated so that both
dashboards ask the same questions the same way: the overview over the whole cluster, the shard view
narrowed by its ``shard``, ``instance`` and ``pool`` variables. Edit this file, run it, and commit
what it wrote; ``tests/deploy/test_dashboards.py`` fails when the files and this generator disagree,
and when a query names a metric a real server or router does not export; and
``tests/integration/test_monitoring.py`` asks a real Prometheus every query of every panel.

Every query reads the servers' and the router's own ``/metrics`` as Prometheus scrapes them, with no
relabelling: a server's shard is the ``shard`` label of its ``cronoq_leader``, and only the leader of a
shard exports pool metrics, so summing over a shard's instances counts each pool once. Every query
also selects by the ``namespace`` and ``job`` variables (both "All" by default), so that two installs
scraped by one Prometheus can be told apart: Kubernetes scrapes carry a ``namespace`` label, and each
install's servers and router have jobs of their own.
"""

from __future__ import annotations

import json
import sys
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
WIDTH = 24  # Grafana's grid is 24 columns wide
RATE = "[$__rate_interval]"
# Every query's own install: the namespace and job variables' series only.
SCOPE = 'namespace=~"$namespace", job=~"$job"'
# Where the files go: this folder, and the chart's copy for its dashboard ConfigMaps.
FOLDERS = (HERE, HERE.parent / "charts" / "cronoq" / "files" / "dashboards")


@dataclass(frozen=True, slots=True)
class Query:
    """One PromQL expression of a panel and the legend of the series it returns."""

    expr: str
    legend: str


@dataclass(frozen=True, slots=True)
class Panel:
    """A panel before layout: its kind (``timeseries`` or ``stat``), what it shows and how wide it is."""

    kind: str
    title: str
    description: str
    queries: tuple[Query, ...]
    unit: str = "short"
    width: int = 12
    stacked: bool = False
    options: tuple[tuple[str, Any], ...] = ()  # stat panels: extra options and value mappings


def metric(name: str, selector: str) -> str:
    """``name{selector}``, or the bare name when there is nothing to select."""
    return f"{name}{{{selector}}}" if selector else name


def selector(*matchers: str) -> str:
    return ", ".join(m for m in matchers if m)


def series(title: str, description: str, *queries: Query, unit: str = "short", **kw: Any) -> Panel:
    return Panel("timeseries", title, description, queries, unit, **kw)


# --- the panels both dashboards show, over the pools and instances ``pools``/``instances`` select -----


def capacity(pools: str) -> list[Panel]:
    return [
        series(
            "Desired vs capacity vs busy slots",
            "Desired: the slots the autoscaler asks for (cronoq_pool_desired_workers, what KEDA or the "
            "operator read). Capacity: slots of connected workers. Busy: slots running an attempt. "
            "Held: slots kept free for upcoming fixed starts.",
            *(
                Query(f"sum by (pool) ({metric(name, pools)})", f"{{{{pool}}}} {what}")
                for name, what in (
                    ("cronoq_pool_desired_workers", "desired"),
                    ("cronoq_pool_capacity", "capacity"),
                    ("cronoq_pool_busy", "busy"),
                    ("cronoq_pool_held", "held"),
                )
            ),
        ),
        series(
            "Workers connected",
            "Worker streams per pool (one per worker process, however many slots it has).",
            Query(f"sum by (pool) ({metric('cronoq_pool_workers_connected', pools)})", "{{pool}}"),
            width=6,
        ),
        series(
            "Utilization",
            "Busy slot-seconds over capacity slot-seconds in the last 60 s.",
            Query(f"max by (pool) ({metric('cronoq_pool_utilization', pools)})", "{{pool}}"),
            unit="percentunit",
            width=6,
        ),
    ]


def queue(pools: str) -> list[Panel]:
    return [
        series(
            "Pending by priority",
            "Tasks not yet running, per pool and priority class: ready ones, and those waiting for "
            "their fixed start, their dependencies or a retry's backoff.",
            Query(
                f"sum by (pool, priority) ({metric('cronoq_pool_pending', pools)})", "{{pool}} {{priority}}"
            ),
            stacked=True,
            width=9,
        ),
        series(
            "Ready to run",
            "Tasks that could run now and wait for a slot (or a resource). Ready tasks with no worker "
            "connected for 5 minutes fire CronoqWorkWithoutWorkers.",
            Query(f"sum by (pool) ({metric('cronoq_pool_ready', pools)})", "{{pool}}"),
            width=6,
        ),
        series(
            "Wait quantiles (ready to dispatch)",
            "How long ready tasks waited for a slot over the last 60 s: 0.5, 0.9 and 0.99 quantiles. "
            "A 0.99 quantile above 60 s for 10 minutes fires CronoqPoolWaitHigh.",
            Query(
                f"max by (pool, quantile) ({metric('cronoq_pool_wait_seconds', pools)})",
                "{{pool}} q{{quantile}}",
            ),
            unit="s",
            width=9,
        ),
    ]


def outcomes(pools: str, instances: str) -> list[Panel]:
    def total(name: str) -> str:
        return f"sum(rate({metric(name, instances)}{RATE}))"

    return [
        series(
            "Task outcomes",
            "Tasks ending per second, by pool and outcome (succeeded, failed, dead_lettered, cancelled, "
            "skipped, missed, shed).",
            Query(
                f"sum by (pool, outcome) (rate({metric('cronoq_tasks_total', pools)}{RATE}))",
                "{{pool}} {{outcome}}",
            ),
            unit="ops",
            stacked=True,
        ),
        series(
            "Dead letters",
            "Tasks that used up their attempts, per pool. Any fires CronoqDeadLetters.",
            Query(
                f"sum by (pool) (increase({metric('cronoq_dead_letters_total', pools)}{RATE}))",
                "{{pool}}",
            ),
            width=6,
        ),
        series(
            "Retries, timeouts, lease expiries",
            "Attempts scheduled again after a failure, aborted by their timeout, and leases lost because "
            "a worker stopped heartbeating (a crashed or stalled worker), per second.",
            Query(total("cronoq_retries_total"), "retries"),
            Query(total("cronoq_timeouts_total"), "timeouts"),
            Query(total("cronoq_lease_expiries_total"), "lease expiries"),
            unit="ops",
            width=6,
        ),
    ]


def store(instances: str) -> list[Panel]:
    def per_instance(name: str, by: str = "instance") -> str:
        return f"sum by ({by}) (rate({metric(name, instances)}{RATE}))"

    return [
        series(
            "Store commit latency",
            "Group-commit latency of each leader's durable store (0.5, 0.9 and 0.99 quantiles of its "
            "most recent 4096 commits). Callers wait for the commit of what they changed.",
            Query(
                f"max by (instance, quantile) ({metric('cronoq_store_commit_seconds', instances)})",
                "{{instance}} q{{quantile}}",
            ),
            unit="s",
        ),
        series(
            "Store commits",
            "Group commits per second, the task rows they wrote, and commits that failed: retried, or "
            "fatal (the leader stepped down). Failures that go on for 5 minutes fire "
            "CronoqStoreCommitsFailing.",
            Query(per_instance("cronoq_store_commits_total"), "{{instance}} commits"),
            Query(per_instance("cronoq_store_committed_tasks_total"), "{{instance}} task rows"),
            Query(
                per_instance("cronoq_store_commit_failures_total", "instance, kind"),
                "{{instance}} failed ({{kind}})",
            ),
            unit="ops",
        ),
    ]


def router(scope: str, *, fan_outs: bool) -> list[Panel]:
    """The router's view of the shards: whether it finds each one's leader, what it forwarded and
    retried, fan-out answers that left shards out, and workers it sent to their shard. ``fan_outs``
    adds the fan-out answers by method, which name no shard."""

    def increase(name: str, by: str) -> str:
        return f"sum by ({by}) (increase({metric(name, scope)}{RATE}))"

    left_out = [Query(increase("cronoq_router_fanout_unavailable_total", "shard"), "{{shard}} left out")]
    if fan_outs:
        left_out.insert(0, Query(increase("cronoq_router_fanout_partial_total", "method"), "{{method}}"))
    return [
        leaders(
            "Shard leader, as the router finds it",
            "1 while every router replica knows where the shard's leader serves, 0 while one finds no "
            "member serving (for a minute: CronoqShardUnreachable).",
            f"min by (shard) ({metric('cronoq_router_shard_leader', scope)})",
            "{{shard}}",
            ("unreachable", "red"),
            ("reachable", "green"),
        ),
        series(
            "Calls forwarded",
            "Calls the router sent to each shard's leader per second, by outcome (ok, or the error's code).",
            Query(
                f"sum by (shard, outcome) (rate({metric('cronoq_router_forwarded_total', scope)}{RATE}))",
                "{{shard}} {{outcome}}",
            ),
            unit="ops",
            stacked=True,
        ),
        series(
            "Calls retried",
            "Forwarded calls sent again after UNAVAILABLE (a failover, a leader that went away), per second.",
            Query(
                f"sum by (shard, method) (rate({metric('cronoq_router_retries_total', scope)}{RATE}))",
                "{{shard}} {{method}}",
            ),
            unit="ops",
        ),
        series(
            "Leader changes",
            "Changes of the leader the router found for each shard (a failover counts once or twice: "
            "to none, then to the new leader).",
            Query(increase("cronoq_router_leader_changes_total", "shard"), "{{shard}}"),
            width=8,
        ),
        series(
            "Fan-out answers without a shard",
            "Listings, snapshots and watches answered without some shard, which could not be reached.",
            *left_out,
            width=8,
        ),
        series(
            "Workers redirected",
            "Worker streams the router sent to their pool's shard leader.",
            Query(increase("cronoq_router_worker_redirects_total", "shard, pool"), "{{shard}} {{pool}}"),
            width=8,
        ),
    ]


def leaders(
    title: str, description: str, expr: str, legend: str, zero: tuple[str, str], one: tuple[str, str]
) -> Panel:
    """A stat panel of a 0-or-1 gauge, each value shown as a (text, color)."""
    mapping = {
        str(value): {"text": text, "color": color, "index": value}
        for value, (text, color) in enumerate((zero, one))
    }
    return Panel(
        "stat",
        title,
        description,
        (Query(expr, legend),),
        width=WIDTH,
        options=(("mappings", [{"type": "value", "options": mapping}]),),
    )


# --- the two dashboards ----------------------------------------------------------------------------


def overview() -> dict[str, Any]:
    rows: list[tuple[str, list[Panel]]] = [
        (
            "Shards",
            [
                leaders(
                    "Leader per shard",
                    "1 when a server leads the shard, 0 when none does (its pools are not served; for a "
                    "minute: CronoqShardWithoutLeader).",
                    f"sum by (shard) ({metric('cronoq_leader', SCOPE)})",
                    "{{shard}}",
                    ("no leader", "red"),
                    ("leader", "green"),
                )
            ],
        ),
        ("Capacity", capacity(SCOPE)),
        ("Queue", queue(SCOPE)),
        ("Outcomes", outcomes(SCOPE, SCOPE)),
        ("Store", store(SCOPE)),
        ("Router", router(SCOPE, fan_outs=True)),
    ]
    return dashboard(
        "cronoq-overview",
        "cronoq / overview",
        "Every pool of every shard of the cluster, and the router in front of them.",
        scope_variables(),
        rows,
    )


def shard() -> dict[str, Any]:
    instances = selector(SCOPE, 'instance=~"$instance"')
    pools = selector(instances, 'pool=~"$pool"')
    rows: list[tuple[str, list[Panel]]] = [
        (
            "Leadership",
            [
                leaders(
                    "Leader",
                    "Which of the shard's servers leads it (1) and which stand by (0). A shard without "
                    "a standby for 10 minutes fires CronoqStandbyMissing.",
                    metric("cronoq_leader", selector(SCOPE, 'shard="$shard", instance=~"$instance"')),
                    "{{instance}}",
                    ("standby", "blue"),
                    ("leader", "green"),
                )
            ],
        ),
        ("Capacity", capacity(pools)),
        ("Queue", queue(pools)),
        ("Outcomes", outcomes(pools, instances)),
        ("Store", store(instances)),
        ("Router", router(selector(SCOPE, 'shard="$shard"'), fan_outs=False)),
    ]
    servers = selector(SCOPE, 'shard="$shard"')
    variables = [
        *scope_variables(),
        query_variable("shard", "Shard", f"label_values({metric('cronoq_leader', SCOPE)}, shard)"),
        query_variable(
            "instance", "Instance", f"label_values({metric('cronoq_leader', servers)}, instance)", multi=True
        ),
        query_variable(
            "pool", "Pool", f"label_values({metric('cronoq_pool_capacity', instances)}, pool)", multi=True
        ),
    ]
    return dashboard(
        "cronoq-shard",
        "cronoq / shard",
        "One shard: its leader and standbys, the pools it owns, and how the router reaches it.",
        variables,
        rows,
    )


# --- Grafana's JSON ------------------------------------------------------------------------------------


def datasource_variable() -> dict[str, Any]:
    return {
        "name": "datasource",
        "label": "Data source",
        "type": "datasource",
        "query": "prometheus",
        "current": {},
        "hide": 0,
        "refresh": 1,
        "regex": "",
        "options": [],
    }


def scope_variables() -> list[dict[str, Any]]:
    """The data source, and the install: its namespace (Kubernetes scrapes carry one) and the jobs of
    its servers and router. "All" matches series without the label too (Compose, ``make cluster``)."""
    install = 'namespace=~"$namespace"'
    return [
        datasource_variable(),
        query_variable("namespace", "Namespace", "label_values(cronoq_leader, namespace)", every=".*"),
        query_variable(
            "job",
            "Job",
            f'label_values({{__name__=~"cronoq_leader|cronoq_router_shard_leader", {install}}}, job)',
            every=".*",
        ),
    ]


def query_variable(
    name: str, label: str, query: str, *, multi: bool = False, every: str | None = None
) -> dict[str, Any]:
    """A variable listing label values; ``multi`` ones, and those with ``every`` (the regex "All"
    stands for, instead of the values listed), default to All."""
    multi = multi or every is not None
    variable = {
        "name": name,
        "label": label,
        "type": "query",
        "datasource": DATASOURCE,
        "definition": query,
        "query": {"query": query, "refId": f"{name}-values"},
        "refresh": 2,  # on time range change, so new pools and instances appear
        "sort": 1,
        "multi": multi,
        "includeAll": multi,
        "current": {"text": "All", "value": "$__all"} if multi else {},
        "hide": 0,
        "options": [],
    }
    if every is not None:
        variable["allValue"] = every
    return variable


def panel_json(panel: Panel, panel_id: int, x: int, y: int) -> dict[str, Any]:
    targets = [
        {"refId": chr(ord("A") + i), "datasource": DATASOURCE, "expr": q.expr, "legendFormat": q.legend}
        for i, q in enumerate(panel.queries)
    ]
    body: dict[str, Any] = {
        "id": panel_id,
        "type": panel.kind,
        "title": panel.title,
        "description": panel.description,
        "datasource": DATASOURCE,
        "gridPos": {"h": 8 if panel.kind == "timeseries" else 4, "w": panel.width, "x": x, "y": y},
        "targets": targets,
    }
    defaults: dict[str, Any] = {"unit": panel.unit}
    if panel.kind == "timeseries":
        defaults["min"] = 0
        defaults["custom"] = {
            "drawStyle": "line",
            "fillOpacity": 20 if panel.stacked else 0,
            "stacking": {"mode": "normal" if panel.stacked else "none", "group": "A"},
        }
        body["options"] = {
            "legend": {"displayMode": "list", "placement": "bottom", "showLegend": True},
            "tooltip": {"mode": "multi", "sort": "desc"},
        }
    else:
        defaults.update(dict(panel.options))
        body["options"] = {
            "reduceOptions": {"calcs": ["lastNotNull"], "fields": "", "values": False},
            "colorMode": "background",
            "graphMode": "none",
            "textMode": "value_and_name",
            "orientation": "horizontal",
        }
    body["fieldConfig"] = {"defaults": defaults, "overrides": []}
    return body


def laid_out(rows: Sequence[tuple[str, Sequence[Panel]]]) -> list[dict[str, Any]]:
    """Row headers and their panels, left to right and wrapping at the grid's width, ids from 1."""
    out: list[dict[str, Any]] = []
    y = 0
    for title, panels in rows:
        out.append(
            {
                "id": len(out) + 1,
                "type": "row",
                "title": title,
                "collapsed": False,
                "gridPos": {"h": 1, "w": WIDTH, "x": 0, "y": y},
                "panels": [],
            }
        )
        y += 1
        x = height = 0
        for panel in panels:
            if x + panel.width > WIDTH:
                x, y, height = 0, y + height, 0
            body = panel_json(panel, len(out) + 1, x, y)
            out.append(body)
            x += panel.width
            height = max(height, body["gridPos"]["h"])
        y += height
    return out


def dashboard(
    uid: str,
    title: str,
    description: str,
    variables: list[dict[str, Any]],
    rows: Sequence[tuple[str, Sequence[Panel]]],
) -> dict[str, Any]:
    return {
        "uid": uid,
        "title": title,
        "description": description,
        "tags": ["cronoq"],
        "editable": True,
        "graphTooltip": 1,
        "refresh": "10s",
        "schemaVersion": 39,
        "version": 1,
        "time": {"from": "now-1h", "to": "now"},
        "timezone": "browser",
        "annotations": {"list": []},
        # Every cronoq dashboard links to the others, keeping the time range.
        "links": [
            {
                "type": "dashboards",
                "tags": ["cronoq"],
                "title": "cronoq",
                "asDropdown": True,
                "keepTime": True,
            }
        ],
        "templating": {"list": variables},
        "panels": laid_out(rows),
    }


DASHBOARDS = {"cronoq-overview.json": overview, "cronoq-shard.json": shard}


def render(name: str) -> str:
    """The text of dashboard file ``name``, as written."""
    return json.dumps(DASHBOARDS[name](), indent=2) + "\n"


def main() -> None:
    for folder in FOLDERS:
        folder.mkdir(parents=True, exist_ok=True)
        for name in DASHBOARDS:
            (folder / name).write_text(render(name))
            print(f"wrote {folder / name}", file=sys.stderr)


if __name__ == "__main__":
    main()
