"""grpc is loaded with cronoq's core settings by every entry point (server, router, SDK), the variable
does not leak to child processes, a user's own ``GRPC_EXPERIMENTS`` wins, and the installed grpcio
knows the experiments named (a grpcio upgrade that drops one fails here, not silently in production)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from cronoq.grpc_settings import EXPERIMENTS

# Prints GRPC_EXPERIMENTS as grpc's import sees it, then as the process has it afterwards.
SPY = """
import os, sys
class Spy:
    def find_spec(self, name, path=None, target=None):
        if name == "grpc":
            print("at import:", os.environ.get("GRPC_EXPERIMENTS"))
        return None
sys.meta_path.insert(0, Spy())
import {module}
print("after:", os.environ.get("GRPC_EXPERIMENTS"))
"""


def run(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k != "GRPC_EXPERIMENTS"}
    return subprocess.run(
        [sys.executable, "-c", code], env={**base, **env}, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize("module", ["cronoq.shard.main", "cronoq.router.main", "cronoq.client"])
def test_each_entry_point_loads_grpc_with_the_settings_and_does_not_leak_them(module: str) -> None:
    out = run(SPY.format(module=module), {})
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [f"at import: {EXPERIMENTS}", "after: None"]


def test_a_users_own_setting_wins() -> None:
    out = run(SPY.format(module="cronoq.client"), {"GRPC_EXPERIMENTS": ""})
    assert out.stdout.splitlines() == ["at import: ", "after: "]


def test_the_installed_grpc_knows_the_experiments() -> None:
    out = run("import grpc", {"GRPC_EXPERIMENTS": EXPERIMENTS})
    assert out.returncode == 0 and "Unknown experiment" not in out.stderr, out.stderr
    # The check above can fail: a name grpc does not know is reported on stderr.
    assert "Unknown experiment" in run("import grpc", {"GRPC_EXPERIMENTS": "-no_such_experiment"}).stderr
