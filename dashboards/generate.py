"""Writes the cronoq Grafana dashboards in this folder: ``python dashboards/generate.py``.

The JSON files are what Grafana loads (the Compose cluster provisions this folder; any Grafana can
import them), and they are generated so that both dashboards ask the same questions the same way:
the overview over the whole cluster, the shard view narrowed by its ``shard``, ``instance`` and
``pool`` variables. Edit this file, run it, and commit both; ``tests/deploy/test_dashboards.py`` fails
when the files and this generator disagree, and when a query names a metric a real server does not
export.

Every query reads the servers' own ``/metrics`` as Prometheus scrapes them, with no relabelling: a
server's shard is the ``shard`` label of its ``cronoq_leader``, and only the leader of a shard exports
pool metrics, so summing over a shard's instances counts each pool once.
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
            "Tasks not yet running, per pool and priority class.",
            Query(
                f"sum by (pool, priority) ({metric('cronoq_pool_pending', pools)})", "{{pool}} {{priority}}"
            ),
            stacked=True,
        ),
        series(
            "Wait quantiles (ready to dispatch)",
            "How long ready tasks waited for a slot over the last 60 s: 0.5, 0.9 and 0.99 quantiles. "
            "Alert when 0.99 exceeds your objective.",
            Query(
                f"max by (pool, quantile) ({metric('cronoq_pool_wait_seconds', pools)})",
                "{{pool}} q{{quantile}}",
            ),
            unit="s",
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
            "Tasks that used up their attempts, per pool. Alert when this rises.",
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
            "Group commits per second, and the task rows they wrote.",
            Query(
                f"sum by (instance) (rate({metric('cronoq_store_commits_total', instances)}{RATE}))",
                "{{instance}} commits",
            ),
            Query(
                f"sum by (instance) (rate({metric('cronoq_store_committed_tasks_total', instances)}{RATE}))",
                "{{instance}} task rows",
            ),
            unit="ops",
        ),
    ]


def leaders(title: str, description: str, expr: str, legend: str, mapping: dict[str, Any]) -> Panel:
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
                    "1 when a server leads the shard, 0 when none does (its pools are not served).",
                    "sum by (shard) (cronoq_leader)",
                    "{{shard}}",
                    {
                        "0": {"text": "no leader", "color": "red", "index": 0},
                        "1": {"text": "leader", "color": "green", "index": 1},
                    },
                )
            ],
        ),
        ("Capacity", capacity("")),
        ("Queue", queue("")),
        ("Outcomes", outcomes("", "")),
        ("Store", store("")),
    ]
    return dashboard(
        "cronoq-overview",
        "cronoq / overview",
        "Every pool of every shard of the cluster.",
        [datasource_variable()],
        rows,
    )


def shard() -> dict[str, Any]:
    instances = 'instance=~"$instance"'
    pools = selector(instances, 'pool=~"$pool"')
    rows: list[tuple[str, list[Panel]]] = [
        (
            "Leadership",
            [
                leaders(
                    "Leader",
                    "Which of the shard's servers leads it (1) and which stand by (0).",
                    metric("cronoq_leader", 'shard="$shard", instance=~"$instance"'),
                    "{{instance}}",
                    {
                        "0": {"text": "standby", "color": "blue", "index": 0},
                        "1": {"text": "leader", "color": "green", "index": 1},
                    },
                )
            ],
        ),
        ("Capacity", capacity(pools)),
        ("Queue", queue(pools)),
        ("Outcomes", outcomes(pools, instances)),
        ("Store", store(instances)),
    ]
    variables = [
        datasource_variable(),
        query_variable("shard", "Shard", "label_values(cronoq_leader, shard)"),
        query_variable(
            "instance", "Instance", 'label_values(cronoq_leader{shard="$shard"}, instance)', multi=True
        ),
        query_variable(
            "pool", "Pool", 'label_values(cronoq_pool_capacity{instance=~"$instance"}, pool)', multi=True
        ),
    ]
    return dashboard(
        "cronoq-shard",
        "cronoq / shard",
        "One shard: its leader and standbys, and the pools it owns.",
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


def query_variable(name: str, label: str, query: str, *, multi: bool = False) -> dict[str, Any]:
    """A variable listing label values; ``multi`` ones default to All."""
    return {
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
    for name in DASHBOARDS:
        (HERE / name).write_text(render(name))
        print(f"wrote {HERE / name}", file=sys.stderr)


if __name__ == "__main__":
    main()
