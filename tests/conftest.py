"""Fixtures shared by every test directory: a Postgres server (``postgres_url``) and a fresh schema per
test (``pg_schema``), see :mod:`tests.postgres`; ``promtool`` and ``prometheus_binary``, see
:mod:`tests.prometheus`."""

from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import pytest

pytest_plugins = ["tests.postgres", "tests.prometheus"]

ENGINE = Path(__file__).resolve().parent.parent / "common" / "cronoq" / "engine"


def pytest_sessionstart(session: pytest.Session) -> None:
    """Refuse to run against a compiled engine older than its sources. ``pip install -e .`` compiles the
    engine in place with mypyc (``setup.py``), and an extension module shadows the ``.py`` beside it: an
    edited engine would otherwise be tested as it was before the edit. ``make test`` rebuilds first."""
    stale = stale_engine_modules()
    if stale:
        pytest.exit(
            "the compiled engine is older than its sources ("
            + ", ".join(stale)
            + "): rebuild it with `make .venv/.installed` (or `make test`)",
            returncode=4,
        )


def stale_engine_modules(engine: Path = ENGINE) -> list[str]:
    """The engine modules whose compiled extension is older than the source beside it."""
    stale = []
    for source in sorted(engine.glob("*.py")):
        for suffix in EXTENSION_SUFFIXES:
            built = source.with_name(source.stem + suffix)
            if built.exists() and built.stat().st_mtime < source.stat().st_mtime:
                stale.append(source.name)
    return stale
