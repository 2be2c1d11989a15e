"""Where node or npm is missing, or too old, the TypeScript SDK's tests are skipped with a reason the
summary shows, rather than failing (``tests/typescript.py``)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests import typescript


def test_without_node_or_npm_the_tests_skip_saying_why(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shutil, "which", lambda name: None if name == "npm" else "/usr/bin/node")
    reason = typescript.missing_toolchain()
    assert reason == "node and npm are not installed: the TypeScript SDK's tests need Node.js 20 or later"
    with pytest.raises(pytest.skip.Exception, match="node and npm are not installed"):
        typescript.sdk_dist()


def test_a_node_older_than_20_is_named(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    old = tmp_path / "node"
    old.write_text("#!/bin/sh\necho v18.19.1\n")
    old.chmod(0o755)
    monkeypatch.setattr(shutil, "which", lambda name: str(old))
    assert (
        typescript.missing_toolchain()
        == "node v18.19.1 is installed: the TypeScript SDK needs Node.js 20 or later"
    )
