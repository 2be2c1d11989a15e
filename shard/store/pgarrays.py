"""One-dimensional Postgres arrays in the binary wire format, encoded here rather than by psycopg.

The commit statement takes a batch as one array per column. psycopg adapts a Python list element by
element in Python: it looks at the elements to choose a dumper, dumps each one, then builds the array,
about 3 µs per array even of one element and more per element, which made a one-task commit spend
0.3 ms of the server's CPU before anything reached Postgres. Here each column's SQL type is known in
advance, so an array is one ``struct`` call over its values (two for text and bytes), and psycopg
passes the bytes through untouched (:class:`Encoded`).

The parameter is sent without a type (OID 0): the statement's cast (``%(x)b::BIGINT[]``) gives it one,
and Postgres reads the bytes with that array type's binary input, which checks the element type named
in them. A value that does not fit its column (an integer past 64 bits, a string that is not valid
Unicode) raises ``ValueError`` here instead of an error from Postgres.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from itertools import repeat
from typing import Any, Final

from psycopg import adapt, pq

# ndim, has-NULLs flag, element type OID, then per dimension its length and lower bound (1).
_HEADER: Final = struct.Struct(">iiiii")
_EMPTY: Final = struct.Struct(">iii")  # an empty array has no dimension
_LENGTH: Final = struct.Struct(">i")
_NULL: Final = _LENGTH.pack(-1)  # a NULL element: length -1, no bytes


class Encoded(bytes):
    """A parameter already in Postgres's binary format, sent as it is."""

    __slots__ = ()


class _EncodedDumper(adapt.Dumper):
    format = pq.Format.BINARY  # oid stays 0: the statement's cast gives the parameter its type

    def dump(self, obj: Any) -> bytes:
        return bytes(obj)


def register(adapters: adapt.AdaptersMap) -> None:
    """Let a connection (``conn.adapters``) send :class:`Encoded` parameters."""
    adapters.register_dumper(Encoded, _EncodedDumper)


Encoder = Callable[[Sequence[Any]], Encoded]


def _array(oid: int, values: Sequence[Any], body: bytes, nulls: bool) -> Encoded:
    if not values:
        return Encoded(_EMPTY.pack(0, 0, oid))
    return Encoded(_HEADER.pack(1, nulls, oid, len(values), 1) + body)


def _fixed(oid: int, code: str) -> Encoder:
    """The encoder of a fixed-size type: each element is its length and its ``struct`` code's bytes."""
    item = struct.Struct(">i" + code)
    size = item.size - _LENGTH.size

    def encode(values: Sequence[Any]) -> Encoded:
        try:
            if None in values:
                body = b"".join(_NULL if v is None else item.pack(size, v) for v in values)
                return _array(oid, values, body, True)
            return _array(oid, values, b"".join(map(item.pack, repeat(size), values)), False)
        except struct.error as err:
            raise ValueError(f"a value does not fit {_NAMES[oid]}: {err}") from None

    return encode


def _variable(oid: int, to_bytes: Callable[[Any], bytes]) -> Encoder:
    """The encoder of a variable-size type: each element is its length, then its bytes."""

    def encode(values: Sequence[Any]) -> Encoded:
        try:
            data = [None if v is None else to_bytes(v) for v in values]
        except UnicodeEncodeError as err:
            raise ValueError(f"a string is not valid Unicode: {err}") from None
        body = b"".join(_NULL if b is None else _LENGTH.pack(len(b)) + b for b in data)
        return _array(oid, values, body, None in data)

    return encode


def _utf8(value: str) -> bytes:
    return value.encode("utf-8")


_NAMES: Final = {
    16: "BOOLEAN",
    17: "BYTEA",
    20: "BIGINT",
    21: "SMALLINT",
    23: "INTEGER",
    25: "TEXT",
    701: "DOUBLE PRECISION",
}
# By the SQL type names the stores' schemas use.
ENCODERS: Final[dict[str, Encoder]] = {
    "BOOLEAN": _fixed(16, "?"),
    "BIGINT": _fixed(20, "q"),
    "SMALLINT": _fixed(21, "h"),
    "INTEGER": _fixed(23, "i"),
    "DOUBLE PRECISION": _fixed(701, "d"),
    "TEXT": _variable(25, _utf8),
    "BYTEA": _variable(17, bytes),
}
