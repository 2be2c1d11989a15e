"""The build: which engine modules setup.py compiles with mypyc, how CRONOQ_COMPILE is read, the
guard against testing a compiled engine older than its sources, and the generated wire modules and
stubs being what ``make proto`` makes."""

from __future__ import annotations

import importlib
import importlib.util
import os
import subprocess
import sys
from importlib.machinery import EXTENSION_SUFFIXES
from pathlib import Path
from types import ModuleType

import pytest

import cronoq.engine
from tests.conftest import stale_engine_modules

REPO = Path(__file__).resolve().parents[2]
GENERATED = ("cronoq_pb2.py", "cronoq_pb2_grpc.py", "cronoq_pb2.pyi", "cronoq_pb2_grpc.pyi")


@pytest.fixture(scope="module")
def setup_py() -> ModuleType:
    """setup.py as a module (its ``setup()`` call runs only as a script, as the build backend runs it)."""
    spec = importlib.util.spec_from_file_location("cronoq_setup", REPO / "setup.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(("value", "choice"), [("", "auto"), (" Auto ", "auto"), ("0", "0"), ("1", "1")])
def test_compile_choice(setup_py: ModuleType, value: str, choice: str) -> None:
    assert setup_py.compile_choice({"CRONOQ_COMPILE": value}) == choice
    assert setup_py.compile_choice({}) == "auto"


def test_an_unknown_compile_choice_stops_the_build_naming_the_variable(setup_py: ModuleType) -> None:
    with pytest.raises(SystemExit, match=r"CRONOQ_COMPILE='yes': expected one of auto, 0, 1"):
        setup_py.compile_choice({"CRONOQ_COMPILE": "yes"})


def test_nothing_is_compiled_when_asked_not_to(setup_py: ModuleType) -> None:
    assert setup_py.engine_extensions({"CRONOQ_COMPILE": "0"}) == []


def test_every_engine_module_but_two_is_compiled_in_this_install(setup_py: ModuleType) -> None:
    """What setup.py lists is what runs compiled here; ``readonly`` and the package ``__init__`` stay
    interpreted (see setup.py for why)."""
    listed = {Path(p).stem for p in setup_py.engine_sources(REPO)}
    on_disk = {p.stem for p in (REPO / "common" / "cronoq" / "engine").glob("*.py")}
    assert on_disk - listed == {"__init__", "readonly"} and {"engine", "lanes", "model"} <= listed
    if os.environ.get("CRONOQ_COMPILE", "").strip() == "0":
        pytest.skip("installed interpreted (CRONOQ_COMPILE=0)")
    for name in sorted(on_disk):
        module = importlib.import_module("cronoq.engine" if name == "__init__" else f"cronoq.engine.{name}")
        assert (module.__file__ or "").endswith(tuple(EXTENSION_SUFFIXES)) == (name in listed), name
    assert cronoq.engine.compiled()


def test_a_compiled_module_older_than_its_source_is_reported(tmp_path: Path) -> None:
    suffix = EXTENSION_SUFFIXES[0]
    for name in ("lanes", "model"):
        (tmp_path / f"{name}{suffix}").write_bytes(b"")
        (tmp_path / f"{name}.py").write_text("")
        os.utime(tmp_path / f"{name}.py", (2_000_000, 2_000_000))
    (tmp_path / "readonly.py").write_text("")  # interpreted: nothing to be stale against
    os.utime(tmp_path / f"lanes{suffix}", (1_000_000, 1_000_000))  # built before its source changed
    os.utime(tmp_path / f"model{suffix}", (3_000_000, 3_000_000))  # built after
    assert stale_engine_modules(tmp_path) == ["lanes.py"]
    assert stale_engine_modules() == [], "this checkout's compiled engine is older than its sources"


def test_the_committed_wire_modules_and_stubs_are_what_make_proto_makes(tmp_path: Path) -> None:
    """``make proto``'s command, writing to a scratch folder: the committed modules and their .pyi stubs
    are its output to the byte. mypy checks our use of every message against the stubs, so stubs left
    behind by a change to cronoq.proto would have it check against a contract that is no longer so."""
    tools = Path(sys.executable).parent  # the virtualenv's bin/, where the mypy-protobuf plugins are
    subprocess.run(
        [
            sys.executable,
            "-m",
            "grpc_tools.protoc",
            "-Iproto",
            f"--python_out={tmp_path}",
            f"--grpc_python_out={tmp_path}",
            f"--plugin=protoc-gen-mypy={tools / 'protoc-gen-mypy'}",
            f"--mypy_out={tmp_path}",
            f"--plugin=protoc-gen-mypy_grpc={tools / 'protoc-gen-mypy_grpc'}",
            f"--mypy_grpc_out={tmp_path}",
            "proto/cronoq/v1/cronoq.proto",
        ],
        cwd=REPO,
        check=True,
        capture_output=True,
    )
    for name in GENERATED:
        made = (tmp_path / "cronoq" / "v1" / name).read_bytes()
        assert (REPO / "proto" / "cronoq" / "v1" / name).read_bytes() == made, f"{name}: run make proto"
