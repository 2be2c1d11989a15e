"""Plumbing both servers (shard and router) and the SDK share to move errors across gRPC.

A server raises an :class:`~cronoq.errors.ApiError`; :func:`grpc_status` gives the status code to send.
The SDK does the reverse (``cronoq.client._connect.api_error``).
"""

from __future__ import annotations

import grpc

from cronoq.errors import ApiError

_STATUS_BY_CODE: dict[str, grpc.StatusCode] = {s.name.lower(): s for s in grpc.StatusCode}


def grpc_status(err: ApiError) -> grpc.StatusCode:
    return _STATUS_BY_CODE.get(err.code, grpc.StatusCode.UNKNOWN)


def bearer(metadata: object) -> str | None:
    """The ``authorization`` value from gRPC invocation metadata (a sequence of key/value pairs)."""
    if metadata is None:
        return None
    for key, value in metadata:  # type: ignore[attr-defined]
        if key == "authorization":
            return value if isinstance(value, str) else bytes(value).decode("latin-1")
    return None
