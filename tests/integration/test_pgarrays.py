"""shard.store.pgarrays: arrays of rows the Postgres store encodes itself read back in Postgres as what
was encoded, for every field type the store uses, NULLs and empty arrays included; Postgres refuses
rows whose fields are not those of the statement's type; a value that does not fit is a ValueError
naming the problem, before anything is sent."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import psycopg
import pytest
from psycopg import sql
from psycopg.rows import TupleRow

from shard.store.pgarrays import TYPES, RecordArrays, register

VALUES: dict[str, list[Any]] = {
    "BOOLEAN": [True, False, None, True],
    "BIGINT": [0, -1, 2**63 - 1, -(2**63), None, 1_700_000_000_000_000_000],
    "SMALLINT": [0, 32767, -32768, None, 4],
    "INTEGER": [0, 2**31 - 1, -(2**31), None],
    "DOUBLE PRECISION": [0.5, -1e300, None, 3, float("inf")],  # an int where a float goes is one too
    "TEXT": ["", "plain", "ünïcødé ✓ 🎉", None, "x" * 10_000],
    "BYTEA": [b"", b"\x00\xff" * 3, None, bytearray(b"mutable"), b"y" * 100_000],
}
FIELDS = list(TYPES)  # a type with a field of each kind


@pytest.fixture
def conn(postgres_url: str, pg_schema: str) -> Iterator[psycopg.Connection[TupleRow]]:
    """A connection that sends encoded arrays, and in ``pg_schema`` the composite types ``every``
    (a field per type, f0, f1...) and ``pair`` (id BIGINT, name TEXT)."""
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        register(conn.adapters)
        schema = sql.Identifier(pg_schema)
        fields = ", ".join(f"f{i} {t}" for i, t in enumerate(FIELDS))
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(schema))
        conn.execute(sql.SQL("CREATE TYPE {}.every AS (" + fields + ")").format(schema))
        conn.execute(sql.SQL("CREATE TYPE {}.pair AS (id BIGINT, name TEXT)").format(schema))
        conn.execute(sql.SQL("SET search_path = {}").format(schema))
        yield conn


def oid(conn: psycopg.Connection[TupleRow], name: str) -> int:
    row = conn.execute("SELECT to_regtype(%s)::oid", (name,)).fetchone()
    assert row is not None
    return int(row[0])


def read_back(
    conn: psycopg.Connection[TupleRow], rows: list[tuple[Any, ...]], prepare: bool
) -> list[tuple[Any, ...]]:
    encoded = RecordArrays(FIELDS).encode(oid(conn, "every"), rows)
    found = conn.execute("SELECT * FROM unnest(%(a)b::every[])", {"a": encoded}, prepare=prepare).fetchall()
    assert conn.execute("SELECT cardinality(%(a)b::every[])", {"a": encoded}).fetchone() == (len(rows),)
    return found


@pytest.mark.parametrize("prepare", [False, True])
def test_rows_read_back_as_encoded(conn: psycopg.Connection[TupleRow], prepare: bool) -> None:
    # Row i takes the i-th value of each type's list (cycling), so NULLs fall in different fields.
    rows = [tuple(VALUES[t][(i + j) % len(VALUES[t])] for j, t in enumerate(FIELDS)) for i in range(7)]
    expected = [tuple(bytes(v) if isinstance(v, bytearray) else v for v in row) for row in rows]
    assert read_back(conn, rows, prepare) == expected
    assert read_back(conn, rows[:1], prepare) == expected[:1]
    assert read_back(conn, [(None,) * len(FIELDS)], prepare) == [(None,) * len(FIELDS)]
    assert read_back(conn, [], prepare) == []


def test_rows_that_are_not_of_the_type_are_refused_by_postgres(conn: psycopg.Connection[TupleRow]) -> None:
    pair = oid(conn, "pair")
    swapped = RecordArrays(["TEXT", "TEXT"]).encode(pair, [("1", "a")])
    with pytest.raises(psycopg.errors.DatatypeMismatch, match=r"instead of expected 20 \(bigint\)"):
        conn.execute("SELECT %(a)b::pair[]", {"a": swapped})
    longer = RecordArrays(["BIGINT", "TEXT", "TEXT"]).encode(pair, [(1, "a", "b")])
    with pytest.raises(psycopg.errors.DatatypeMismatch, match="wrong number of columns: 3, expected 2"):
        conn.execute("SELECT %(a)b::pair[]", {"a": longer})


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
    arrays = RecordArrays(["BIGINT", sql_type])
    for rows in ([(1, value)], [(1, None), (2, value)]):
        with pytest.raises(ValueError, match=message):
            arrays.encode(1, rows)
