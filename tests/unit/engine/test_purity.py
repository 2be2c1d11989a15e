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


# Cron needs calendar arithmetic in a time zone, so cron.py may import datetime, but never ask it for
# the current time.
ALLOWED = {"cron.py": {"datetime"}}
CLOCK_READS = {"now", "utcnow", "today", "time", "monotonic", "perf_counter"}


def test_engine_modules_import_nothing_that_does_io() -> None:
    package = Path(cronoq.engine.__file__).parent
    modules = sorted(package.glob("*.py"))
    assert len(modules) > 5
    for module in modules:
        forbidden = FORBIDDEN - ALLOWED.get(module.name, set())
        assert not imported_roots(module) & forbidden, module.name


def test_no_engine_module_reads_a_clock() -> None:
    package = Path(cronoq.engine.__file__).parent
    for module in sorted(package.glob("*.py")):
        for node in ast.walk(ast.parse(module.read_text())):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
                assert node.func.attr not in CLOCK_READS, f"{module.name}:{node.lineno}"
