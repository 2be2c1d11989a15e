"""DESIGN's one-way dependencies: ``common`` (package ``cronoq``) imports neither the shard server nor
the router, and the router does not import the shard server; they share only ``common``. Inside it, the
cluster (``cronoq.cluster``) and the SDK (``cronoq.client``) do not import each other, nor the API
transports (``cronoq.api``): what both need of gRPC is in ``cronoq.transport``."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
FORBIDDEN = {
    "common": ("shard", "cronoq.shard", "router", "cronoq.router"),
    "router": ("shard", "cronoq.shard"),
    "common/cronoq/cluster": ("cronoq.client", "cronoq.api", "cronoq.engine", "cronoq.library"),
    "common/cronoq/client": ("cronoq.cluster", "cronoq.api", "cronoq.engine", "cronoq.library"),
}


def imported_modules(path: Path) -> set[str]:
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
    return names


@pytest.mark.parametrize("folder", sorted(FORBIDDEN))
def test_dependencies_run_one_way(folder: str) -> None:
    files = [p for p in (ROOT / folder).rglob("*.py") if "v1" not in p.parts]
    if folder == "common":
        assert files, "common/ must hold the cronoq package"
    offenders = {
        f"{path.relative_to(ROOT)} imports {name}"
        for path in files
        for name in imported_modules(path)
        if any(name == bad or name.startswith(bad + ".") for bad in FORBIDDEN[folder])
    }
    assert not offenders, sorted(offenders)
