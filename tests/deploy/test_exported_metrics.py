"""The metric tables of docs/operations.md against what a real server and router export (``exported``):
the same families with the same labels, so that moving ``/metrics`` onto prometheus-client (or any later
change) cannot rename a sample or a label that the docs, the dashboards, the alerts or a user's own
queries read, and a new family cannot ship undocumented."""

from __future__ import annotations

import re

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


def test_every_exported_family_is_documented_with_its_labels(exported: dict[str, set[str]]) -> None:
    docs = documented()
    assert {name: exported[name] for name in exported} == {name: docs.get(name) for name in exported}
    assert set(docs) - set(exported) == CONDITIONAL


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
    assert len(docs) == 63
