"""Plumbing both servers (shard and router) and the SDK share to move errors across gRPC.

A server raises an :class:`~cronoq.errors.ApiError`; :func:`grpc_status` gives the status code to send.
The SDK does the reverse (``cronoq.client._connect.api_error``).
"""

from __future__ import annotations

import asyncio
from contextlib import suppress
from typing import Any

import grpc

from cronoq.errors import ApiError, Unavailable

_STATUS_BY_CODE: dict[str, grpc.StatusCode] = {s.name.lower(): s for s in grpc.StatusCode}

# Metadata of shard-to-shard calls and of refusals naming the shard that serves a call (SPEC §9).
FORWARDED_KEY = "cronoq-forwarded"
SHARD_KEY = "cronoq-shard"
SHARD_ENDPOINT_KEY = "cronoq-shard-endpoint"
# With the two above: every URL the cluster's shard map gives that shard (its ``endpoint``, then its
# ``members``), comma-separated. An SDK worker follows a redirect only to a URL its configured target
# named this way, so a shard it was sent to cannot send it (and its token) anywhere else. The owning
# shard's URLs, not the whole map's: a worker serves one pool, and 256 shards' URLs would pass grpc's
# default limits on received metadata (8 KiB, then 16 KiB for certain), failing the refusal itself as
# RESOURCE_EXHAUSTED, which a worker retries forever.
SHARD_ENDPOINTS_KEY = "cronoq-shard-endpoints"
# Trailing metadata of Submit(wait)/Wait answers that carry an output: its content type, which the wire
# TaskResult has no field for, so that a forwarding server's HTTP gateway can render it.
OUTPUT_TYPE_KEY = "cronoq-output-content-type"
# Trailing metadata of an UNAVAILABLE refusal made before the call reached the engine (a standby, a server
# that stopped admitting): nothing of it ran, so a forwarder may send it to the new leader even when
# running it twice would not be safe (a keyless Submit). A message cannot say this: "server is shutting
# down" also ends the wait of a Submit(wait) that was committed before it waited. The SDK puts it on the
# errors of calls that gRPC itself ended before a server took them, too (``_connect.never_received``).
NOT_RECEIVED_KEY = "cronoq-not-received"
# Initial metadata of every Watch (and HTTP header of /v1/watch), sent as soon as the stream is subscribed
# on every shard it covers and before any event: the shards it could not reach, comma-separated ("" when
# none), which a StatusEvent stream has no ``unavailable_shards`` field for. Its presence is also how a
# forwarding server tells "open" from a shard whose Watch is quiet: a refusal comes as a status alone.
UNAVAILABLE_SHARDS_KEY = "cronoq-unavailable-shards"
# Invocation metadata of Get, Cancel and Wait (HTTP: the ``pool`` query parameter): the pool of the task
# named. A key names one task of a cluster only as long as no two shards hold it; naming the pool settles
# which (and sends the call straight to that pool's shard).
POOL_KEY = "cronoq-pool"
# Invocation metadata of a Get by key that one shard sends another before it admits a keyed submission:
# answered from what the target's engine holds (live tasks, and finished ones whose key still
# deduplicates), never from its store, and ALREADY_EXISTS when a task of a pool outside the caller's
# pools holds the key (a plain Get answers NOT_FOUND there, and the submission must be refused).
KEY_PROBE_KEY = "cronoq-key-probe"


# How long a Work call refused as it opens waits for the worker's first message (take_first_message).
REFUSAL_READ_S = 2.0


async def take_first_message(context: Any) -> None:
    """Before refusing a call the client streams into (Workers.Work) as it opens, take its first
    message, waiting at most REFUSAL_READ_S: a grpc.aio client whose first write is still in flight when
    the status arrives reports INTERNAL "Internal error from Core" instead of it, and a worker writes
    its Register as soon as the stream opens. ``context`` is the call's grpc.aio servicer context."""
    with suppress(Exception):  # whatever the client sent (or did not), the call is refused
        await asyncio.wait_for(context.read(), REFUSAL_READ_S)


def grpc_status(err: ApiError) -> grpc.StatusCode:
    return _STATUS_BY_CODE.get(err.code, grpc.StatusCode.UNKNOWN)


def unadmitted(message: str) -> Unavailable:
    """An UNAVAILABLE refusal of a call the engine never saw, marked with :data:`NOT_RECEIVED_KEY`. Only
    for refusals before admission: a failure after it must stay unmarked, or a forwarder runs it twice."""
    err = Unavailable(message)
    err.metadata = ((NOT_RECEIVED_KEY, "1"),)
    return err


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
