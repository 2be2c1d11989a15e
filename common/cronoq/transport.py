"""Plumbing both servers (shard and router) and the SDK share to move errors across gRPC.

A server raises an :class:`~cronoq.errors.ApiError`; :func:`grpc_status` gives the status code to send.
The SDK does the reverse (``cronoq.client._connect.api_error``).
"""

from __future__ import annotations

import grpc

from cronoq.errors import ApiError

_STATUS_BY_CODE: dict[str, grpc.StatusCode] = {s.name.lower(): s for s in grpc.StatusCode}

# Metadata of shard-to-shard calls and of refusals naming the shard that serves a call (SPEC §9).
FORWARDED_KEY = "cronoq-forwarded"
SHARD_KEY = "cronoq-shard"
SHARD_ENDPOINT_KEY = "cronoq-shard-endpoint"
# Trailing metadata of Submit(wait)/Wait answers that carry an output: its content type, which the wire
# TaskResult has no field for, so that a forwarding server's HTTP gateway can render it.
OUTPUT_TYPE_KEY = "cronoq-output-content-type"


def grpc_status(err: ApiError) -> grpc.StatusCode:
    return _STATUS_BY_CODE.get(err.code, grpc.StatusCode.UNKNOWN)


def bearer(metadata: object) -> str | None:
    """The ``authorization`` value from gRPC invocation metadata (a sequence of key/value pairs)."""
    return metadata_value(metadata, "authorization")


def forwarded(metadata: object) -> bool:
    """Whether a call came from another shard (or a router) forwarding it."""
    return metadata_value(metadata, FORWARDED_KEY) is not None


def metadata_value(metadata: object, wanted: str) -> str | None:
    if metadata is None:
        return None
    for key, value in metadata:  # type: ignore[attr-defined]
        if key == wanted:
            return value if isinstance(value, str) else bytes(value).decode("latin-1")
    return None
