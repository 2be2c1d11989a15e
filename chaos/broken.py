"""``python -m chaos.broken``: a chaos run against a build broken on purpose, which the checker must flag.

The product has no switch that breaks it. Instead a patch from ``chaos/patches`` is applied to a copy
of this checkout's sources (``common``, ``shard``, ``router``, ``proto``, compiled engine included) in a
temporary directory, laid out as the ``cronoq`` package, and every process of the run imports cronoq
from there (:mod:`chaos.cluster`'s ``source``). The patches:

- ``ack-before-commit``: ``Runtime.sync`` returns before the group commit instead of after it, so a
  submission is acknowledged before it is durable. A leader killed (``kill-leader``) while its commits
  are slow (``slow-link``) takes acknowledged tasks with it: the checker must report them ``lost``.

Exit status: 0 when the checker flagged the broken build (the demonstration worked), 1 when it found
nothing (the suite missed a broken build), 2 when the run could not start or the patch does not apply.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from tests.deploy.compose_image import REPO

from .harness import Options, run

PATCHES = Path(__file__).resolve().parent / "patches"
SOURCES = ("common", "shard", "router", "proto")
# Where each package of setup's package-dir lives in a copy (cronoq itself is common/cronoq).
SUBPACKAGES = {"shard": "../../shard", "router": "../../router", "v1": "../../proto/cronoq/v1"}


@dataclass(frozen=True, slots=True)
class Demonstration:
    """A patch, the faults that expose it (a seed whose schedule of them does), and the rules that
    must catch it."""

    patch: str
    faults: frozenset[str]
    seed: int
    seconds: float
    rules: frozenset[str]


# Seed 41's 45 s of kill-leader and slow-link (a fault every 3 s on average) kills a shard's leader five
# times while that shard's link to Postgres is slowed by 200 ms or more, each at least 1.5 s into the
# slowness: by then the broken leader has acknowledged many submissions its slow commits have not
# written (tests/unit/chaos_suite/test_schedule.py checks the schedule still does).
DEMONSTRATIONS = {
    "ack-before-commit": Demonstration(
        "ack-before-commit", frozenset({"kill-leader", "slow-link"}), 41, 45.0, frozenset({"lost"})
    ),
}
MEAN_GAP_S = 3.0


def patched_tree(patch: str, directory: Path) -> Path:
    """This checkout's sources with ``patch`` applied, under ``directory``; the directory to put on
    ``PYTHONPATH`` (it holds the ``cronoq`` package). ValueError when the patch no longer applies."""
    copy = directory / "src"
    for name in SOURCES:
        shutil.copytree(REPO / name, copy / name, ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    applied = subprocess.run(
        ["git", "apply", "--verbose", str(PATCHES / f"{patch}.patch")],
        cwd=copy,
        capture_output=True,
        text=True,
        check=False,
    )
    if applied.returncode != 0:
        raise ValueError(
            f"chaos/patches/{patch}.patch no longer applies to this checkout: update it\n{applied.stderr}"
        )
    package = copy / "common" / "cronoq"
    for name, target in SUBPACKAGES.items():
        (package / name).symlink_to(target, target_is_directory=True)
    return copy / "common"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m chaos.broken", description=__doc__.splitlines()[0])
    p.add_argument("--patch", choices=sorted(DEMONSTRATIONS), default="ack-before-commit")
    p.add_argument("--seconds", type=float, default=None, help="default: the demonstration's")
    p.add_argument("--seed", type=int, default=None, help="default: the demonstration's")
    p.add_argument("--out", type=Path, default=None)
    args = p.parse_args(argv)
    demo = DEMONSTRATIONS[args.patch]
    out = args.out or Path(tempfile.mkdtemp(prefix="cronoq-chaos-broken-"))
    with tempfile.TemporaryDirectory(prefix="cronoq-broken-") as scratch:
        try:
            source = patched_tree(demo.patch, Path(scratch))
        except ValueError as err:
            print(f"chaos.broken: {err}", file=sys.stderr)
            return 2
        options = Options(
            seconds=demo.seconds if args.seconds is None else args.seconds,
            seed=demo.seed if args.seed is None else args.seed,
            out=out,
            kinds=demo.faults,
            mean_gap=MEAN_GAP_S,
            source=source,
            label=f"a build broken on purpose (chaos/patches/{demo.patch}.patch)",
        )
        try:
            flagged = run(options) == 1
        except (AssertionError, RuntimeError) as err:
            print(f"chaos.broken: cannot run: {err}", file=sys.stderr)
            return 2
    found = json.loads((out / "report.json").read_text())["violations"]
    caught = [rule for rule in sorted(demo.rules) if found.get(rule)]
    if flagged and caught:
        print(f"chaos.broken: the checker caught the broken build ({', '.join(caught)}), as it must")
        return 0
    print(f"chaos.broken: the checker did not catch {demo.patch} (expected {', '.join(sorted(demo.rules))})")
    return 1


if __name__ == "__main__":
    sys.exit(main())
