"""The Postgres store's commit statement, without a database."""

from __future__ import annotations

import re

from psycopg import _queries

from shard.store.base import Batch
from shard.store.postgres import _commit_params, _statements
from shard.store.rows import LiveRows


def test_the_commit_statement_stays_within_what_psycopg_caches_the_parsing_of() -> None:
    # Past 4,096 characters or 50 parameters psycopg parses a query again at every execution: 0.7 ms
    # of client CPU per commit, measured, a third of the store's cost per task.
    query = _statements("cronoq_a_rather_long_shard_schema_name").commit.as_string(None)
    params, schedules = _commit_params(Batch([], [], 0), LiveRows(), 1, 1)
    assert set(re.findall(r"%\((\w+)\)", query)) == set(params)
    assert len(query.encode()) <= _queries.MAX_CACHED_STATEMENT_LENGTH
    assert len(params) <= _queries.MAX_CACHED_STATEMENT_PARAMS
    assert schedules is None  # no schedule changed: no schedule statement to run
