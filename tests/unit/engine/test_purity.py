"""The engine stays sans-IO: no module of it imports anything that does I/O or reads a clock."""

from __future__ import annotations

import ast
from pathlib import Path

import cronoq.engine

FORBIDDEN = {
    "asyncio",
    "grpc",
    "aiohttp",
    "sqlite3",
    "psycopg",
    "time",
    "os",
    "socket",
    "threading",
    "datetime",
}


def imported_roots(path: Path) -> set[str]:
    roots: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            roots.update(alias.name.split(".")[0] for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            roots.add(node.module.split(".")[0])
    return roots


def test_engine_modules_import_nothing_that_does_io() -> None:
    package = Path(cronoq.engine.__file__).parent
    modules = sorted(package.glob("*.py"))
    assert len(modules) > 5
    for module in modules:
        assert not imported_roots(module) & FORBIDDEN, module.name
