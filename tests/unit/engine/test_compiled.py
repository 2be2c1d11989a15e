"""The engine under test is the mypyc-compiled build (``setup.py``), and it decides exactly as its
Python sources do; its objects copy and pickle like plain dataclasses."""

from __future__ import annotations

import copy
import dataclasses
import os
import pickle
import shutil
import subprocess
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path

import pytest

import cronoq
import cronoq.engine
from cronoq.engine import (
    AutoscaleRule,
    DepEdge,
    DepOn,
    Dispatch,
    MissPolicy,
    Priority,
    ResourceStats,
    RetryRule,
    Semaphore,
    Status,
    Submitted,
    Task,
    TaskSpec,
    TokenBucket,
)
from cronoq.engine.cron import CronSchedule

from . import trace

REPO = Path(__file__).resolve().parents[3]
compiled_only = pytest.mark.skipif(
    not cronoq.engine.compiled(), reason="the engine was installed interpreted"
)


def test_the_engine_is_compiled_unless_the_build_was_told_not_to() -> None:
    """``make test`` installs with the default CRONOQ_COMPILE=auto, which compiles wherever a C compiler
    is (as on CI): a build that quietly fell back to the sources would halve the engine's speed, so the
    suite insists on the compiled engine unless it runs with CRONOQ_COMPILE=0."""
    wanted = os.environ.get("CRONOQ_COMPILE", "auto").strip().lower() != "0"
    assert cronoq.engine.compiled() == wanted, (
        "the installed engine is "
        + ("interpreted" if wanted else "compiled")
        + f" (CRONOQ_COMPILE={os.environ.get('CRONOQ_COMPILE', 'auto')}); reinstall: make .venv/.installed"
    )


def _interpreted_package(into: Path) -> Path:
    """A copy of the ``cronoq`` package without any extension module: importing it runs the sources."""
    source = Path(cronoq.__file__).parent
    shutil.copytree(
        source,
        into / "cronoq",
        ignore=shutil.ignore_patterns("__pycache__", *(f"*{s}" for s in EXTENSION_SUFFIXES)),
    )
    return into


@compiled_only
@pytest.mark.parametrize("seed", [1, 2, 3])
def test_compiled_and_interpreted_engines_take_the_same_actions(seed: int, tmp_path: Path) -> None:
    """The same seeded workload over every feature (fair share, labels, deadlines, resources, deps,
    fixed starts, a recurring schedule, retries with jitter, nacks, cancels, sheds, worker churn) gives
    the same trace of actions, answers and final snapshot on both builds."""
    steps = 3000
    compiled_trace = trace.run(seed, steps)
    interpreted = subprocess.run(
        [sys.executable, "-m", "tests.unit.engine.trace", str(seed), str(steps)],
        cwd=REPO,
        env={**os.environ, "PYTHONPATH": f"{_interpreted_package(tmp_path)}{os.pathsep}{REPO}"},
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    lines = interpreted.stdout.splitlines()
    assert "compiled=False" in lines[0] and len(compiled_trace) > steps
    for number, (ours, theirs) in enumerate(zip(compiled_trace, lines[1:], strict=True)):
        assert ours == theirs, f"line {number}: compiled {ours!r} != interpreted {theirs!r}"


def test_the_trace_runs_on_the_build_it_says() -> None:
    """The interpreted side of the comparison above names its build, so it cannot quietly compare the
    compiled engine with itself."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.unit.engine.trace", "1", "10"],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=True,
    )  # fmt: skip
    assert done.stdout.splitlines()[0] == f"compiled={cronoq.engine.compiled()}"


RETRY = RetryRule(max_attempts=4, initial_backoff=0.5, multiplier=3.0, max_backoff=9.0, jitter=False)
FROZEN = [
    RETRY,
    DepEdge("build", DepOn.FAILURE),
    Semaphore("gpu", 2),
    TokenBucket("api", rate=5.0, burst=2.0),
    AutoscaleRule(target_utilization=0.6, slo={Priority.HIGH: 5.0}),
    ResourceStats("gpu", "semaphore", 2, 1.0, 0),
    CronSchedule.parse("*/5 * * * *", "Europe/Paris"),
]


def _hot_objects() -> list[object]:
    """One of each class with a hand-written __init__ (see model.py), every field set away from its
    default."""
    spec = TaskSpec(
        "p", {"x": 1}, "application/json", "render", Priority.HIGH, "k", 5.0, 2.0, 3.0, RETRY,
        {"t": "1"}, {"gpu": "a100"}, "acme", 4.0, 0.5, MissPolicy.SKIP, (DepEdge("a"),), {"db": 1},
    )  # fmt: skip
    task = Task(7, spec, 3, Status.RUNNING, 1.0, 2, 5, 1.5, 2.5, 3.5, "boom", 11, 12)
    return [spec, task, Submitted(7, True), Dispatch(12, 11, task, 2, 30.0)]


@pytest.mark.parametrize("value", FROZEN + _hot_objects(), ids=lambda value: type(value).__name__)
def test_values_copy_and_pickle(value: object) -> None:
    """Compiled, a frozen dataclass would restore a copy through its frozen __setattr__, and a class
    with a hand-written __init__ would run it from __new__ without arguments: both raise (model.Rebuilt)."""
    for twin in (copy.copy(value), copy.deepcopy(value), pickle.loads(pickle.dumps(value))):
        assert twin == value and type(twin) is type(value)
        assert repr(twin) == repr(value)


@pytest.mark.parametrize("value", _hot_objects(), ids=lambda value: type(value).__name__)
def test_hand_written_inits_take_every_field_in_order(value: object) -> None:
    """A field added to one of these classes without its __init__ parameter (or out of order) fails
    here: positionally in field order, and by keyword (dataclasses.replace passes every field)."""
    names = [f.name for f in dataclasses.fields(value)]  # type: ignore[arg-type]
    assert type(value)(*[getattr(value, name) for name in names]) == value
    assert dataclasses.replace(value) == value  # type: ignore[type-var]


@pytest.mark.parametrize("value", _hot_objects(), ids=lambda value: type(value).__name__)
def test_hand_written_inits_keep_the_declared_defaults(value: object) -> None:
    """Built from its fields without a default only, each object has every other field at the default
    its declaration names."""
    cls = type(value)
    fields = dataclasses.fields(value)  # type: ignore[arg-type]
    missing = dataclasses.MISSING
    required = [f for f in fields if f.default is missing and f.default_factory is missing]
    assert list(fields[: len(required)]) == required, "fields without a default come first"
    made = cls(*(getattr(value, f.name) for f in required))
    for f in fields[len(required) :]:
        factory = f.default_factory
        default = factory() if callable(factory) else f.default
        assert getattr(made, f.name) == default, f.name
    if isinstance(made, TaskSpec):  # a fresh dict each, never a shared one
        assert made.tags is not TaskSpec("p").tags and made.labels is not TaskSpec("p").labels
