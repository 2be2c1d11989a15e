"""Failover time on Postgres: a leader killed with SIGKILL until its standby answers ``/readyz`` 200.

Two real servers share one schema; each round kills the serving leader, times the standby's takeover
(Postgres ends the dead leader's session as its socket closes and grants the lock to the waiting
standby, which bumps the epoch and recovers), then starts the killed one again as the new standby. The
standby's ``/readyz`` is asked every 0.05 s, so a takeover shows as 0.05 s or so (or under 0.01 s, when the
first probe comes after it): that is the floor of this measure, not of the takeover.

``python -m bench.failover --rounds 10`` runs only this part (``python -m bench --stores postgres``
runs it after the Postgres drain).
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

from tests.integration.serverproc import leader_and_standby
from tests.postgres import running_postgres

CONFIG = """
[store]
kind = "postgres"
schema = "cronoq_failover_bench"

[[pools]]
name = "default"
"""


def run(postgres_url: str, rounds: int) -> list[float]:
    """Seconds from SIGKILL of the leader to the standby serving, once per round."""
    times: list[float] = []
    with (
        tempfile.TemporaryDirectory() as tmp,
        leader_and_standby(Path(tmp), CONFIG, {"DATABASE_URL": postgres_url}) as (leader, standby),
    ):
        for _ in range(rounds):
            leader.kill()
            began = time.perf_counter()
            standby.wait_probe("/readyz", 200, timeout=30)
            times.append(time.perf_counter() - began)
            leader.start(ready=False)
            leader, standby = standby, leader
    return times


def report(postgres_url: str, rounds: int) -> None:
    """Run ``rounds`` failovers and print their median and spread."""
    times = sorted(run(postgres_url, rounds))
    print(
        f"failover on Postgres (leader killed with SIGKILL -> standby ready), {len(times)} rounds: "
        f"median {statistics.median(times):.2f} s, min {times[0]:.2f} s, max {times[-1]:.2f} s"
        "   target median <= 0.2 s\n"
        f"  each: {', '.join(f'{t:.3f}' for t in times)}",
        flush=True,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=10, help="leaders killed (default: %(default)s)")
    args = parser.parse_args()
    with running_postgres() as server:
        report(server.url, args.rounds)


if __name__ == "__main__":
    main()
