"""Arrays of a composite type in Postgres's binary wire format, encoded here rather than by psycopg.

The commit statement takes a batch as one array of rows of a composite type (``unnest`` turns it back
into rows). Two choices make that cheap:

- One array of rows, not one array per column: Postgres unnests each array of a multi-array ``unnest``
  into a store of its own, and checks each one's element type, so the 33 arrays of a task row cost it
  about 90 µs more CPU per commit than one array of the same rows (measured for one row and for eight).
- Encoded here: psycopg adapts a Python list element by element in Python, choosing a dumper per list
  from its elements, which cost the server about 3 µs per array even of one element. Here each field's
  type is known in advance, so each field is one ``struct`` call over a whole column (two for text
  and bytes), and psycopg passes the bytes through untouched (:class:`Encoded`).

The parameter is sent without a type (OID 0): the statement's cast (``%(x)b::schema.type[]``) gives it
one, and Postgres reads the bytes with that type's binary input, which checks the array's element
type and every field's type against the ones named in the bytes. A value that does not fit its field
(an integer past 64 bits, a string that is not valid Unicode) raises ``ValueError`` here instead.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Sequence
from itertools import chain, repeat
from typing import Any, Final

from psycopg import adapt, pq

# ndim, has-NULLs flag, element type OID, then per dimension its length and lower bound (1).
_HEADER: Final = struct.Struct(">iiiii")
_EMPTY: Final = struct.Struct(">iii")  # an empty array has no dimension
_LENGTH: Final = struct.Struct(">i")
_FIELD: Final = struct.Struct(">Ii")  # a record's field: its type OID, then its length (-1: NULL)

# The element types the stores' schemas use, by SQL name: OID, and the struct code of a fixed-size one.
TYPES: Final[dict[str, tuple[int, str | None]]] = {
    "BOOLEAN": (16, "?"),
    "BYTEA": (17, None),
    "BIGINT": (20, "q"),
    "SMALLINT": (21, "h"),
    "INTEGER": (23, "i"),
    "TEXT": (25, None),
    "DOUBLE PRECISION": (701, "d"),
}


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


# A column's values -> each value as a record field (its type, length and bytes).
_Fields = Callable[[Sequence[Any]], list[bytes]]


def _fixed(sql_type: str, oid: int, code: str) -> _Fields:
    item = struct.Struct(">Ii" + code)
    size = item.size - _FIELD.size
    null = _FIELD.pack(oid, -1)

    def fields(values: Sequence[Any]) -> list[bytes]:
        try:
            if None in values:
                return [null if v is None else item.pack(oid, size, v) for v in values]
            return list(map(item.pack, repeat(oid), repeat(size), values))
        except struct.error as err:
            raise ValueError(f"a value does not fit {sql_type}: {err}") from None

    return fields


def _variable(oid: int, text: bool) -> _Fields:
    null = _FIELD.pack(oid, -1)

    def fields(values: Sequence[Any]) -> list[bytes]:
        try:
            data = [v if v is None else v.encode() if text else bytes(v) for v in values]
        except UnicodeEncodeError as err:
            raise ValueError(f"a string is not valid Unicode: {err}") from None
        return [null if b is None else _FIELD.pack(oid, len(b)) + b for b in data]

    return fields


def _field_encoder(sql_type: str) -> _Fields:
    oid, code = TYPES[sql_type]
    return _variable(oid, sql_type == "TEXT") if code is None else _fixed(sql_type, oid, code)


class RecordArrays:
    """Encodes sequences of rows as arrays of a composite type whose fields have ``types`` (SQL names
    from :data:`TYPES`, in the type's order). The type's OID is the database's, so it is given at each
    call (see the store's ``open``)."""

    __slots__ = ("_count", "_fields")

    def __init__(self, types: Sequence[str]) -> None:
        self._count = _LENGTH.pack(len(types))
        self._fields = tuple(map(_field_encoder, types))

    def encode(self, type_oid: int, rows: Sequence[Sequence[Any]]) -> Encoded:
        """``rows`` (each with a value per field, None for NULL) as one array parameter."""
        if not rows:
            return Encoded(_EMPTY.pack(0, 0, type_oid))
        columns = [
            fields(values) for fields, values in zip(self._fields, zip(*rows, strict=True), strict=True)
        ]
        records = list(map(b"".join, zip(repeat(self._count), *columns)))
        body = b"".join(chain.from_iterable(zip(map(_LENGTH.pack, map(len, records)), records, strict=True)))
        return Encoded(_HEADER.pack(1, 0, type_oid, len(rows), 1) + body)
