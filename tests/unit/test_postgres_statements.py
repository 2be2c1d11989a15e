"""The Postgres store's commit statements, without a database."""

from __future__ import annotations

import re
from dataclasses import replace

import pytest
from psycopg import _queries

from cronoq.engine.model import Status, Task, TaskSpec
from shard.store.base import Batch
from shard.store.postgres import _commit_params, _statements, _TypeOids
from shard.store.rows import LiveRows

QUERIES = _statements("cronoq_a_rather_long_shard_schema_name").commits


def task(task_id: int) -> Task:
    return Task(id=task_id, spec=TaskSpec(pool="default"), seq=task_id, status=Status.READY, created=1.0)


def batch_of(whole: bool, known: bool, other: bool) -> tuple[Batch, LiveRows]:
    """A batch with a task written whole, one updated by state, and an output of a task in neither."""
    live = LiveRows()
    live.reset([task(2)])
    tasks = [task(1)] * whole + [replace(task(2), status=Status.RUNNING)] * known
    return Batch(tasks, [(3, b"out", "text/plain")] * other, max_id=3), live


@pytest.mark.parametrize("shape", list(QUERIES))
def test_each_shape_has_a_statement_that_takes_exactly_its_parameters(
    shape: tuple[bool, bool, bool],
) -> None:
    batch, live = batch_of(*shape)
    work = _commit_params(batch, live, 1, 1, _TypeOids(1, 2))
    assert work.shape == shape
    assert set(re.findall(r"%\((\w+)\)", QUERIES[shape].as_string(None))) == set(work.params)
    assert work.schedules is None  # no schedule changed: no schedule statement to run


def test_every_commit_statement_stays_within_what_psycopg_caches_the_parsing_of() -> None:
    # Past 4,096 characters or 50 parameters psycopg parses a query again at every execution: 0.7 ms
    # of client CPU per commit, measured, a third of the store's cost per task.
    for query in QUERIES.values():
        text = query.as_string(None)
        assert len(text.encode()) <= _queries.MAX_CACHED_STATEMENT_LENGTH
        assert len(set(re.findall(r"%\((\w+)\)", text))) <= _queries.MAX_CACHED_STATEMENT_PARAMS
