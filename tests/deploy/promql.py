"""What the dashboards' and the alerts' PromQL names, checked against what a real server and router
export (the ``exported`` fixture): a metric renamed in the code, or misspelt in a query, breaks the
panel or the alert that reads it, and so does a label the metric does not have."""

from __future__ import annotations

import re

SELECTOR = re.compile(r"\b(cronoq_\w+)\s*\{([^}]*)\}")
MATCHER = re.compile(r"(\w+)\s*(?:=~|!~|!=|=)")
METRIC = re.compile(r"\bcronoq_\w+\b")
GROUPING = re.compile(r"\b(?:by|on)\s*\(([^)]*)\)")
# Added by Prometheus to every series it scrapes (namespace: by its Kubernetes discovery).
SCRAPE_LABELS = frozenset({"instance", "job", "namespace"})


def unknown_names(query: str, exported: dict[str, set[str]]) -> list[str]:
    """What ``query`` names that no server or router exports: metrics; labels it selects a metric by;
    labels it groups or matches by (``by``, ``on``) that none of its metrics has."""
    metrics = METRIC.findall(query)
    problems = [f"no metric {m}" for m in metrics if m not in exported]
    for metric, matchers in SELECTOR.findall(query):
        known = exported.get(metric, set()) | SCRAPE_LABELS
        problems += [
            f"{metric} has no label {label}" for label in MATCHER.findall(matchers) if label not in known
        ]
    carried = SCRAPE_LABELS.union(*(exported.get(m, set()) for m in metrics))
    for grouping in GROUPING.findall(query):
        labels = [label.strip() for label in grouping.split(",") if label.strip()]
        problems += [f"no metric of it has label {label}" for label in labels if label not in carried]
    return problems
