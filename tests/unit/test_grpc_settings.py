"""grpc is loaded with cronoq's core settings by every entry point (server, router, operator, SDK, CLI),
the variables do not leak to child processes, a user's own ``GRPC_EXPERIMENTS`` and ``GRPC_VERBOSITY``
win, and the installed grpcio knows the experiments named (a grpcio upgrade that drops one fails here,
not silently in production)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from cronoq.grpc_settings import CLI_VERBOSITY, EXPERIMENTS, SERVER_VERBOSITY

# Prints GRPC_EXPERIMENTS (or the variable named by {variable}) as grpc's import sees it, then as the
# process has it afterwards; {then} runs after the import of {module}.
SPY = """
import os, sys
class Spy:
    def find_spec(self, name, path=None, target=None):
        if name == "grpc":
            print("at import:", os.environ.get("{variable}"))
        return None
sys.meta_path.insert(0, Spy())
import {module}
{then}
print("after:", os.environ.get("{variable}"))
"""


def spy(module: str, variable: str = "GRPC_EXPERIMENTS", then: str = "") -> str:
    return SPY.format(module=module, variable=variable, then=then)


def run(code: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if k not in ("GRPC_EXPERIMENTS", "GRPC_VERBOSITY")}
    return subprocess.run(
        [sys.executable, "-c", code], env={**base, **env}, capture_output=True, text=True, timeout=60
    )


@pytest.mark.parametrize(
    "module", ["cronoq.shard.main", "cronoq.router.main", "cronoq.operator.main", "cronoq.client"]
)
def test_each_entry_point_loads_grpc_with_the_settings_and_does_not_leak_them(module: str) -> None:
    out = run(spy(module), {})
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == [f"at import: {EXPERIMENTS}", "after: None"]


# The CLI loads grpc when it runs (this command line fails: nothing listens on port 1, and it gives up
# at once), not when it is imported.
CLI_RUN = "import cronoq.cli as cli; cli.main(['--retry-for', '0', '-t', '127.0.0.1:1', 'get', '1'])"


@pytest.mark.parametrize(
    ("module", "then", "verbosity"),
    [
        ("cronoq.shard.main", "", SERVER_VERBOSITY),
        ("cronoq.router.main", "", SERVER_VERBOSITY),
        ("cronoq.operator.main", "", SERVER_VERBOSITY),
        ("cronoq.cli", CLI_RUN, CLI_VERBOSITY),
        ("cronoq.client", "", None),  # inside someone else's program: grpc's default
    ],
)
def test_each_program_sets_grpc_cores_verbosity_for_its_output(
    module: str, then: str, verbosity: str | None
) -> None:
    """Core's own lines bypass the JSON log stream of a server and the one-line errors of the CLI."""
    out = run(spy(module, "GRPC_VERBOSITY", then), {})
    assert out.stdout.splitlines() == [f"at import: {verbosity}", "after: None"], out.stderr


def test_a_users_own_setting_wins() -> None:
    out = run(spy("cronoq.client"), {"GRPC_EXPERIMENTS": ""})
    assert out.stdout.splitlines() == ["at import: ", "after: "]
    out = run(spy("cronoq.shard.main", "GRPC_VERBOSITY"), {"GRPC_VERBOSITY": "DEBUG"})
    assert out.stdout.splitlines() == ["at import: DEBUG", "after: DEBUG"]


def test_the_installed_grpc_knows_the_experiments() -> None:
    out = run("import grpc", {"GRPC_EXPERIMENTS": EXPERIMENTS})
    assert out.returncode == 0 and "Unknown experiment" not in out.stderr, out.stderr
    # The check above can fail: a name grpc does not know is reported on stderr.
    assert "Unknown experiment" in run("import grpc", {"GRPC_EXPERIMENTS": "-no_such_experiment"}).stderr
