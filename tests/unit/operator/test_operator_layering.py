"""DESIGN's one-way dependencies for the operator: ``kube_operator`` (package ``cronoq.operator``) builds on
``common`` only, never on the shard server or the router, and names its own modules relatively (an
absolute ``kube_operator.x`` import would load a second copy of the module in an installed operator)."""

from __future__ import annotations

from pathlib import Path

from tests.unit.test_layering import imported_modules

PACKAGE = Path(__file__).resolve().parents[3] / "kube_operator"


def test_the_operator_imports_only_common_and_itself_relatively() -> None:
    files = sorted(PACKAGE.rglob("*.py"))
    assert files
    offenders = {
        f"{path.name} imports {name}"
        for path in files
        for name in imported_modules(path)
        if name.split(".")[0] in ("shard", "router", "kube_operator")
        or name.startswith(("cronoq.shard", "cronoq.router", "cronoq.operator"))
    }
    assert not offenders, sorted(offenders)
