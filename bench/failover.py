"""Failover time on Postgres: a leader killed with SIGKILL until its standby answers ``/readyz`` 200.

Two real servers share one schema; each round kills the serving leader, times the standby's takeover
(lock released when Postgres notices the dead session, the standby's next 0.5 s poll, recovery), then
starts the killed one again as the new standby.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

from tests.integration.serverproc import leader_and_standby

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
