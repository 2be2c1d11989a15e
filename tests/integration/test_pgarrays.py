"""shard.store.pgarrays: the arrays the Postgres store encodes itself read back in Postgres as what was
encoded, for every column type the store uses, NULLs and empty arrays included; a value that does not
fit is a ValueError naming the problem, before anything is sent."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg.rows import TupleRow

from shard.store.pgarrays import ENCODERS, register

VALUES: dict[str, list[Any]] = {
    "BOOLEAN": [True, False, None, True],
    "BIGINT": [0, -1, 2**63 - 1, -(2**63), None, 1_700_000_000_000_000_000],
    "SMALLINT": [0, 32767, -32768, None, 4],
    "INTEGER": [0, 2**31 - 1, -(2**31), None],
    "DOUBLE PRECISION": [0.5, -1e300, None, 3, float("inf")],  # an int where a float goes is one too
    "TEXT": ["", "plain", "ünïcødé ✓ 🎉", None, "x" * 10_000],
    "BYTEA": [b"", b"\x00\xff" * 3, None, bytearray(b"mutable"), b"y" * 100_000],
}


@pytest.fixture
def conn(postgres_url: str) -> Iterator[psycopg.Connection[TupleRow]]:
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        register(conn.adapters)
        yield conn


@pytest.mark.parametrize("sql_type", list(VALUES))
@pytest.mark.parametrize("prepare", [False, True])
def test_arrays_read_back_as_encoded(
    conn: psycopg.Connection[TupleRow], sql_type: str, prepare: bool
) -> None:
    values = VALUES[sql_type]
    encode = ENCODERS[sql_type]
    cases = [values, [v for v in values if v is not None], [values[0]], [None], []]
    for case in cases:
        row = conn.execute(
            f"SELECT %(a)b::{sql_type}[], cardinality(%(a)b::{sql_type}[])",
            {"a": encode(case)},
            prepare=prepare,
        ).fetchone()
        assert row is not None
        expected = [bytes(v) if isinstance(v, bytearray) else v for v in case]
        assert (row[0], row[1]) == (expected, len(case))


def test_arrays_unnest_together_into_rows(conn: psycopg.Connection[TupleRow]) -> None:
    """What the commit statement does with them: one array per column, zipped into rows."""
    rows = conn.execute(
        "SELECT * FROM unnest(%(id)b::BIGINT[], %(name)b::TEXT[], %(data)b::BYTEA[])",
        {
            "id": ENCODERS["BIGINT"]([1, 2]),
            "name": ENCODERS["TEXT"](["a", None]),
            "data": ENCODERS["BYTEA"]([None, b"z"]),
        },
    ).fetchall()
    assert rows == [(1, "a", None), (2, None, b"z")]


def test_an_array_of_another_element_type_is_refused_by_postgres(conn: psycopg.Connection[TupleRow]) -> None:
    with pytest.raises(psycopg.errors.DatatypeMismatch, match="element type"):
        conn.execute("SELECT %(a)b::INTEGER[]", {"a": ENCODERS["BIGINT"]([1])})


@pytest.mark.parametrize(
    ("sql_type", "value", "message"),
    [
        ("BIGINT", 2**63, "does not fit BIGINT"),
        ("SMALLINT", 40_000, "does not fit SMALLINT"),
        ("INTEGER", -(2**31) - 1, "does not fit INTEGER"),
        ("BIGINT", "1", "does not fit BIGINT"),
        ("TEXT", "lone \ud800 surrogate", "not valid Unicode"),
    ],
)
def test_a_value_that_does_not_fit_is_a_value_error(sql_type: str, value: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        ENCODERS[sql_type]([value])
    with pytest.raises(ValueError, match=message):
        ENCODERS[sql_type]([None, value])
