"""How Python values become payloads and outputs on the wire, and how they are read back.

Producers and workers in other languages only see bytes and a content type, so the mapping is fixed and
small: bytes stay bytes, text is UTF-8, ``None`` is nothing at all and everything else is JSON.
"""

from __future__ import annotations

import json
from typing import Any

OCTET_STREAM = "application/octet-stream"
TEXT = "text/plain; charset=utf-8"
JSON = "application/json"


def encode(value: object, content_type: str | None = None) -> tuple[bytes, str]:
    """The bytes and content type for ``value``; an explicit ``content_type`` replaces the guessed one.

    JSON is compact and refuses NaN and infinities, which other languages' parsers reject: a value that
    cannot be encoded raises ``TypeError`` or ``ValueError`` here rather than on the far side.
    """
    if isinstance(value, bytes | bytearray | memoryview):
        data, guessed = bytes(value), OCTET_STREAM
    elif isinstance(value, str):
        data, guessed = value.encode(), TEXT
    elif value is None:
        data, guessed = b"", ""
    else:
        text = json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
        data, guessed = text.encode(), JSON
    return data, guessed if content_type is None else content_type


def decode_json(data: bytes | None) -> Any:
    """Parses JSON; empty or missing data reads as ``None``, the inverse of how ``None`` is encoded."""
    return json.loads(data) if data else None


def decode_text(data: bytes | None) -> str:
    """UTF-8 text; missing data reads as the empty string."""
    return data.decode() if data else ""
