"""Checks of the text in requests, made alike wherever a request is first read (a shard's request logic,
the router's), so that a caller gets the same refusal whichever it reached."""

from __future__ import annotations

from cronoq.errors import InvalidArgument
from cronoq.limits import exceeded

MAX_POOL_LEN = 64  # characters in a pool name on the wire (a task's pool, a worker's registration)


def check_text(field: str, value: str, max_len: int, limit: str | None = None) -> str:
    """``value`` unless it holds NUL or is longer than ``max_len``; ``limit`` names the ``[limits]`` key
    that sets ``max_len``, if one does (the error then names it and counts as its hit)."""
    if "\x00" in value:
        raise InvalidArgument(f"{field}: must not contain NUL characters")
    if len(value) > max_len:
        if limit is None:
            raise InvalidArgument(f"{field}: longer than {max_len} characters ({len(value)})")
        raise exceeded(
            limit,
            InvalidArgument(f"{field}: longer than {max_len} characters ({len(value)}); limits.{limit}"),
        )
    return value
