"""``python -m chaos`` (``make chaos``): one chaos run against ``make cluster``'s topology.

``--seconds`` (``CHAOS_SECONDS``, default 600) and ``--seed`` (``CHAOS_SEED``, default: a random one,
printed) set the run; the exit status is 0 when the checker found no violation, 1 when it did, 2 when
the run could not start.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import tempfile
from pathlib import Path

from .harness import Options, run
from .schedule import KINDS


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m chaos",
        description="Run make cluster's topology under seeded faults, record a history, check it, report.",
    )
    p.add_argument(
        "--seconds", type=float, default=_env_float("CHAOS_SECONDS", 600.0), help="run length (CHAOS_SECONDS)"
    )
    p.add_argument(
        "--seed", type=int, default=_env_seed(), help="the schedule's seed (CHAOS_SEED; default random)"
    )
    p.add_argument(
        "--faults", default="", help=f"comma-separated kinds to inject (default all: {', '.join(KINDS)})"
    )
    p.add_argument("--rate", type=float, default=13.0, help="submissions per second through the router")
    p.add_argument("--disk-rate", type=float, default=3.0, help="submissions per second to the SQLite server")
    p.add_argument("--mean-gap", type=float, default=4.0, help="mean seconds between faults")
    p.add_argument(
        "--out",
        type=Path,
        default=None,
        help="where the history and report go (default: a new temporary directory)",
    )
    p.add_argument(
        "--keep-logs", action="store_true", help="keep every process's log (kept anyway on violations)"
    )
    return p


def _env_float(name: str, default: float) -> float:
    value = os.environ.get(name, "").strip()
    try:
        return float(value) if value else default
    except ValueError:
        raise SystemExit(f"chaos: {name} must be a number of seconds, not {value!r}") from None


def _env_seed() -> int:
    value = os.environ.get("CHAOS_SEED", "").strip()
    if not value:
        return random.SystemRandom().randrange(1, 2**31)
    try:
        return int(value)
    except ValueError:
        raise SystemExit(f"chaos: CHAOS_SEED must be an integer, not {value!r}") from None


def options_from(args: argparse.Namespace) -> Options:
    kinds = frozenset(k.strip() for k in args.faults.split(",") if k.strip()) or None
    unknown = sorted(set(kinds or ()) - set(KINDS))
    if unknown:
        raise SystemExit(f"chaos: --faults: unknown kind {', '.join(unknown)} (known: {', '.join(KINDS)})")
    if args.seconds <= 0:
        raise SystemExit("chaos: --seconds (CHAOS_SECONDS) must be above 0")
    out = args.out or Path(tempfile.mkdtemp(prefix="cronoq-chaos-"))
    return Options(
        seconds=args.seconds,
        seed=args.seed,
        out=out,
        kinds=kinds,
        rate=args.rate,
        disk_rate=args.disk_rate,
        mean_gap=args.mean_gap,
        keep_logs=args.keep_logs,
    )


def main(argv: list[str] | None = None) -> int:
    options = options_from(parser().parse_args(argv))
    try:
        return run(options)
    except (AssertionError, RuntimeError) as err:  # a process that would not start, or no Postgres
        print(f"chaos: cannot run: {err}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
