"""Checks of the text in requests, made alike wherever a request is first read (a shard's request logic,
the router's), so that a caller gets the same refusal whichever it reached."""

from __future__ import annotations

from cronoq.config.model import MAX_KEY_BYTES
from cronoq.errors import InvalidArgument
from cronoq.limit_hits import exceeded

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


def check_key(field: str, value: str, max_len: int) -> str:
    """A task key, dependency key or schedule name: :func:`check_text` against ``limits.max_key_len``,
    and at most :data:`~cronoq.config.model.MAX_KEY_BYTES` bytes of UTF-8 (the stores index keys)."""
    check_text(field, value, max_len, "max_key_len")
    if len(value) * 4 > MAX_KEY_BYTES:  # (else it fits whatever its characters)
        size = len(value.encode("utf-8", "surrogatepass"))
        if size > MAX_KEY_BYTES:
            raise InvalidArgument(
                f"{field}: {size:,} bytes in UTF-8; a key takes at most {MAX_KEY_BYTES:,} (the stores index it)"
            )
    return value
