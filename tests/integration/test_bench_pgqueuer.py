"""bench.pgqueuer_drain, the pgqueuer side of ``make bench``'s comparison (issue #25), kept from rotting:
with a few jobs on the suite's Postgres, its drain and its latency run each run every job exactly once,
pgqueuer records them all as done (the bench checks its queue and log tables), and every figure the bench
prints comes out positive. No speed is asserted."""

from __future__ import annotations

from bench import local_port, pgqueuer_drain
from tests.postgres import PostgresServer

JOBS = 300
RATE = 50.0
SECONDS = 1.0


def test_the_drain_and_the_latency_run_run_every_job_once(
    postgres_server: PostgresServer, pg_schema: str
) -> None:
    port = local_port(postgres_server)
    plan = pgqueuer_drain.Plan(JOBS, RATE, SECONDS)
    drained, timed = pgqueuer_drain.run(postgres_server.url, plan, schema=pg_schema, database_port=port)
    for session, jobs in ((drained, JOBS), (timed, int(RATE * SECONDS))):
        assert len(set(session.enqueued)) == jobs
        assert sorted(session.ran) == sorted(session.enqueued), "a job ran twice, or never"
        assert session.enqueue_s > 0 and session.total_s > 0 and session.jobs_per_s > 0
        assert session.producer_s > 0 and session.workers_s > 0
    if port is not None:  # clock ticks: the drain's hundreds of Postgres statements take several
        assert drained.database_s > 0
    assert drained.latencies == []  # its jobs carry no payload
    assert len(timed.latencies) == len(timed.ran) and min(timed.latencies) > 0
    assert "CPU per job: producer" in drained.cpu_line()
