"""Plumbing both servers (shard and router) and the SDK share to move calls and errors across gRPC.

A server raises an :class:`~cronoq.errors.ApiError`; :func:`grpc_status` gives the status code to send,
and :func:`api_error` turns a received status back into the same class (the SDK's calls, and a server's
calls to other shards). :class:`Endpoint` and :func:`open_channel` are how both open channels; the
``cronoq-*`` metadata keys are named here once. :class:`Rpc` names a unary method with the messages it
takes and answers, which grpc's stubs do not type.
"""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence
from contextlib import suppress
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import grpc
from google.protobuf.message import Message

from cronoq.errors import ApiError, MessageTooLarge, Unavailable, error_for
from cronoq.v1 import cronoq_pb2 as pb
from cronoq.v1 import cronoq_pb2_grpc as pbg

ChannelOptions = Sequence[tuple[str, Any]]
Metadata = tuple[tuple[str, str], ...]
Req = TypeVar("Req", bound=Message)
Resp = TypeVar("Resp", bound=Message)

_STATUS_BY_CODE: dict[str, grpc.StatusCode] = {s.name.lower(): s for s in grpc.StatusCode}

# Metadata of shard-to-shard calls and of refusals naming the shard that serves a call (docs/operations.md, Sharding).
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
# errors of calls that gRPC itself ended before a server took them, too (:func:`never_received`).
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


@dataclass(frozen=True, slots=True)
class Rpc(Generic[Req, Resp]):
    """A unary method of the Tasks or Admin service: its stub (``service``, "tasks" or "admin") and its
    ``method``, typed by the messages it takes and answers. grpc ships no type information, so a call
    made through a stub is unchecked; the SDK's calls and a server's calls to other shards name one of
    these instead, and mypy checks their requests and answers as the method's own."""

    service: str
    method: str

    def on(self, tasks: pbg.TasksStub, admin: pbg.AdminStub) -> Any:
        """The method's multi-callable on a channel's Tasks or Admin stub (grpc's own, untyped)."""
        return getattr(tasks if self.service == "tasks" else admin, self.method)


SUBMIT: Rpc[pb.SubmitRequest, pb.SubmitResponse] = Rpc("tasks", "Submit")
SUBMIT_BATCH: Rpc[pb.SubmitBatchRequest, pb.SubmitBatchResponse] = Rpc("tasks", "SubmitBatch")
CANCEL: Rpc[pb.CancelRequest, pb.CancelResponse] = Rpc("tasks", "Cancel")
GET: Rpc[pb.GetRequest, pb.TaskInfo] = Rpc("tasks", "Get")
LIST_TASKS: Rpc[pb.ListTasksRequest, pb.ListTasksResponse] = Rpc("tasks", "ListTasks")
WAIT: Rpc[pb.WaitRequest, pb.TaskResult] = Rpc("tasks", "Wait")
SNAPSHOT: Rpc[pb.Empty, pb.SnapshotResponse] = Rpc("admin", "Snapshot")
LIST_WORKERS: Rpc[pb.Empty, pb.ListWorkersResponse] = Rpc("admin", "ListWorkers")
ADD_RECURRING: Rpc[pb.RecurringRequest, pb.Empty] = Rpc("admin", "AddRecurring")
REMOVE_RECURRING: Rpc[pb.RemoveRecurringRequest, pb.RemoveRecurringResponse] = Rpc("admin", "RemoveRecurring")
LIST_RECURRING: Rpc[pb.Empty, pb.ListRecurringResponse] = Rpc("admin", "ListRecurring")


# How long a Work call refused as it opens waits for the worker's first message (take_first_message).
REFUSAL_READ_S = 2.0


async def take_first_message(context: Any) -> None:
    """Before refusing a call the client streams into (Workers.Work) as it opens, take its first
    message, waiting at most REFUSAL_READ_S: a grpc.aio client whose first write is still in flight when
    the status arrives reports INTERNAL "Internal error from Core" instead of it, and a worker writes
    its Register as soon as the stream opens. ``context`` is the call's grpc.aio servicer context."""
    with suppress(Exception):  # whatever the client sent (or did not), the call is refused
        await asyncio.wait_for(context.read(), REFUSAL_READ_S)


def framed_size(message: Any) -> int:
    """What a message adds to a ``BatchedWorkers.Work`` frame (a ``WorkerBatch`` or ``ServerBatch``):
    its encoded size, plus its field tag (1 byte) and length (a varint of at most 5 bytes below 4 GiB).
    The server and the SDK both fill frames by it, so that a frame stays within the limit it is built
    for (docs/worker-protocol.md, rule 4)."""
    return int(message.ByteSize()) + 6


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


@dataclass(frozen=True, slots=True)
class Endpoint:
    """A gRPC address (``host:port``) and whether the channel to it uses TLS."""

    address: str
    secure: bool

    @classmethod
    def parse(cls, target: str, *, secure: bool) -> Endpoint:
        """Strips a scheme prefix; ``https://`` always means TLS, the others leave ``secure`` as given."""
        for prefix in ("https://", "http://", "grpc://"):
            if target.startswith(prefix):
                return cls(target[len(prefix) :].rstrip("/"), secure or prefix == "https://")
        return cls(target.rstrip("/"), secure)


def open_channel(endpoint: Endpoint, credentials: Any, options: ChannelOptions) -> Any:
    """A ``grpc.aio`` channel bound to the running event loop."""
    if endpoint.secure:
        creds = credentials if credentials is not None else grpc.ssl_channel_credentials()
        return grpc.aio.secure_channel(endpoint.address, creds, options=list(options))
    return grpc.aio.insecure_channel(endpoint.address, options=list(options))


# How gRPC itself (not a server) fails a call it never sent: the channel could not connect.
_NOT_CONNECTED = ("failed to connect", "connection refused")

# A message over a size limit, as grpc core words it (either side's core: "Received message larger than
# max (n vs. m)", "Sent message larger than max ...") or as a cronoq server refuses it (the limit's name).
_TOO_LARGE = re.compile(r"message larger than max|limits\.max_message_bytes")


def never_received(err: Any) -> bool:
    """Whether a failed call (an ``AioRpcError``) provably never reached the server's code, so that
    sending it again cannot run it twice, keyless Submit included:

    - the server refused it before admission and said so (trailing metadata ``NOT_RECEIVED_KEY``);
    - gRPC could not connect to send it (gRPC's own message begins with its words);
    - the server's gRPC core ended it CANCELLED. A cronoq server never ends a call so; gRPC core does,
      for the calls it holds but had not yet handed to the server's code when the server's listener
      closes (a standby taking over, a leader stepping down, a shutdown): grpc/grpc#41785. A call this
      client cancels ends in ``asyncio.CancelledError``, never in an ``AioRpcError``.

    Never judged by words a server wrote: "shutting down" also ends a committed Submit(wait)'s wait,
    and a store failure's message may quote "connection refused"."""
    code = err.code()
    if code == grpc.StatusCode.CANCELLED:
        return True
    if metadata_value(err.trailing_metadata(), NOT_RECEIVED_KEY) is not None:
        return True
    return code == grpc.StatusCode.UNAVAILABLE and (err.details() or "").lower().startswith(_NOT_CONNECTED)


def api_error(err: Any) -> ApiError:
    """The :class:`~cronoq.errors.ApiError` subclass for an ``AioRpcError``, by lower-case status name,
    carrying the call's ``cronoq-*`` trailing metadata in ``metadata`` (a shard redirect says in them where
    the pool is served). A call that never reached the server's code (:func:`never_received`) is
    ``Unavailable`` (retryable) and carries ``NOT_RECEIVED_KEY``, also when gRPC core, not the server,
    ended it (CANCELLED or a failed connection), so that callers and forwarders may send it again."""
    code: str = err.code().name.lower()
    details: str = err.details() or ""
    too_large = code == "resource_exhausted" and _TOO_LARGE.search(details) is not None
    if too_large:
        error: ApiError = MessageTooLarge(details)
    elif code == "cancelled":
        error = Unavailable(
            f"the server's listener closed before the server took the call (gRPC: {details or code}); "
            "nothing of it ran, retry"
        )
    else:
        error = error_for(code, details)
    metadata = tuple(
        (key, metadata_text(value))
        for key, value in err.trailing_metadata() or ()
        if key.startswith("cronoq-")
    )
    if never_received(err) and all(key != NOT_RECEIVED_KEY for key, _ in metadata):
        metadata += ((NOT_RECEIVED_KEY, "1"),)
    if metadata:
        error.metadata = metadata
    return error


def metadata_text(value: str | bytes) -> str:
    """A metadata value as text: grpc hands ``-bin`` keys' values over as bytes."""
    return value if isinstance(value, str) else bytes(value).decode(errors="replace")
