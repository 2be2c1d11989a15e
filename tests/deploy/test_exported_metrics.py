"""The metric tables of docs/operations.md against what a real server and router export (``exported``):
the same families with the same labels, so that moving ``/metrics`` onto prometheus-client (or any later
change) cannot rename a sample or a label that the docs, the dashboards, the alerts or a user's own
queries read, and a new family cannot ship undocumented."""

from __future__ import annotations

import re
from typing import cast

from kube_operator.inventory import Inventory
from kube_operator.kube import KubeApi
from kube_operator.metrics import Stats, families

from .conftest import REPO

OPERATIONS = REPO / "docs" / "operations.md"
# A table row: `name`[, `name` ...] | type | labels | meaning
ROW = re.compile(r"^\| ((?:`(?:cronoq|process|python)_\w+`(?:, )?)+) \|[^|]+\|([^|]*)\|", re.MULTILINE)
# Documented families the ``exported`` cluster has no sample of: it has no [[resources]], and its one
# shard forwards nothing to another.
CONDITIONAL = {
    "cronoq_resource_capacity",
    "cronoq_resource_available",
    "cronoq_resource_waiting",
    "cronoq_shard_forwarded_total",
    "cronoq_shard_retries_total",
    "cronoq_shard_forward_duration_seconds",
}


def documented() -> dict[str, set[str]]:
    """Family -> label names, from every metric table of docs/operations.md (a label column's
    parenthesised values, as in ``quantile (0.5, 0.9, 0.99)``, left out)."""
    families: dict[str, set[str]] = {}
    for names, labels in ROW.findall(OPERATIONS.read_text()):
        label_names = {name.strip(" `") for name in re.sub(r"\([^)]*\)", "", labels).split(",")} - {""}
        for name in re.findall(r"`(\w+)`", names):
            families[name] = label_names
    return families


def operator_families() -> dict[str, set[str]]:
    """The operator's own families (``kube_operator.metrics``) with the labels of their samples, built
    with a sample in every labelled one."""
    stats = Stats()
    stats.decided("Scaled")
    inventory = Inventory(cast(KubeApi, None), ())  # families() reads only its counts
    exported: dict[str, set[str]] = {}
    for built in families(stats, inventory, lambda: True):
        for sample in built.samples:
            exported.setdefault(sample.name, set()).update(sample.labels)
    return exported


def test_every_exported_family_is_documented_with_its_labels(exported: dict[str, set[str]]) -> None:
    docs = documented()
    operator = operator_families()
    assert {name: exported[name] for name in exported} == {name: docs.get(name) for name in exported}
    assert {name: operator[name] for name in operator} == {name: docs.get(name) for name in operator}
    assert set(docs) - set(exported) - set(operator) == CONDITIONAL


def test_the_docs_are_read_as_expected() -> None:
    """The check above is not vacuous: both tables (the server's and the router's) and the rows that
    name several families are read, with their labels."""
    docs = documented()
    assert docs["cronoq_pool_wait_seconds"] == {"pool", "quantile"}
    assert docs["cronoq_router_forwarded_total"] == {"shard", "method", "outcome"}
    assert docs["cronoq_streams_open"] == docs["cronoq_submitted_total"] == set()
    assert docs["cronoq_resource_waiting"] == {"resource", "kind"}
    assert docs["cronoq_build_info"] == {"version", "engine", "store"}
    assert docs["python_gc_collections_total"] == {"generation"}
    assert docs["cronoq_pool_dispatch_wait_seconds"] == {"pool", "priority"}  # a histogram: one family
    assert docs["cronoq_operator_watch_restarts_total"] == {"cause"}
    assert len(docs) == 69
