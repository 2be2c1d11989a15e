"""Build hook: compile the scheduling engine with mypyc; everything else is in pyproject.toml.

The engine (``cronoq.engine``) is pure, typed Python, and every submission, dispatch and outcome runs
through it; compiled to C by mypyc from the same sources it makes about 2.5-3x as many decisions per
second (``python -m bench.engine_bench``). ``CRONOQ_COMPILE`` chooses: ``auto`` (the default) compiles on
CPython when a C compiler is there and installs the sources otherwise, ``1`` insists (the build fails
without one), ``0`` installs the sources only. ``cronoq.engine.compiled()`` tells which build runs.
"""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping
from pathlib import Path
from typing import cast

from setuptools import Extension, setup

ENGINE = Path("common") / "cronoq" / "engine"
# Interpreted on purpose: ``readonly`` (a compiled dict subclass cannot refuse mutation; see the
# module), and the package's ``__init__``, which only re-exports: the compiled modules' shared library
# lives in the package, and loading it from a compiled ``__init__`` would import the package again,
# endlessly.
INTERPRETED = frozenset({"__init__.py", "readonly.py"})
CHOICES = ("auto", "0", "1")


def compile_choice(env: Mapping[str, str]) -> str:
    """``CRONOQ_COMPILE`` as one of CHOICES (unset or empty: auto); anything else stops the build."""
    choice = env.get("CRONOQ_COMPILE", "").strip().lower() or "auto"
    if choice not in CHOICES:
        raise SystemExit(f"CRONOQ_COMPILE={env['CRONOQ_COMPILE']!r}: expected one of {', '.join(CHOICES)}")
    return choice


def engine_sources(root: Path = Path()) -> list[str]:
    """The engine modules mypyc compiles, as paths relative to ``root`` (the project)."""
    return sorted(str(p.relative_to(root)) for p in (root / ENGINE).glob("*.py") if p.name not in INTERPRETED)


def engine_extensions(env: Mapping[str, str]) -> list[Extension]:
    choice = compile_choice(env)
    if choice == "0":
        return []
    if platform.python_implementation() != "CPython":
        if choice == "1":
            raise SystemExit("CRONOQ_COMPILE=1: mypyc compiles for CPython only")
        return []
    from mypyc.build import mypycify  # a build requirement on CPython (pyproject.toml)

    # mypyc type-checks before it compiles, in the build's own environment, where cronoq's dependencies
    # (croniter, uvloop, grpc, ...) and their stubs are not installed: without our mypy configuration
    # (strict, for `make lint`) and with missing imports taken as Any, which only costs the calls into
    # them (already Python calls) nothing. `make lint` checks the same sources strictly.
    options = ["--config-file", os.devnull, "--ignore-missing-imports"]
    # mypycify makes setuptools Extensions (its annotation also admits the old distutils class).
    extensions = cast(
        "list[Extension]", mypycify([*options, *engine_sources()], group_name="cronoq.engine._compiled")
    )
    for extension in extensions:
        # auto: without a C compiler setuptools warns and the sources are installed instead.
        extension.optional = choice == "auto"
    return extensions


if __name__ == "__main__":
    setup(ext_modules=engine_extensions(os.environ))
