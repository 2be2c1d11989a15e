"""Calls to other shards: forwarding a caller's request to the shard that owns it, and fan-outs.

A forwarded call carries the caller's own ``authorization`` and the ``cronoq-forwarded`` marker; the
target authenticates it again, and never forwards it on (no loops). Forwarding is refused, with the
owning shard's name and endpoint in the error's metadata so that the caller can go there itself, when
the call was already forwarded, or when it would send the caller's token in the clear to another host
(a plain ``http://`` endpoint that is not loopback, unless ``server.insecure_peer_http``).
"""

from __future__ import annotations

import asyncio
from collections import Counter
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any
from urllib.parse import urlsplit

import grpc

from cronoq.auth import Principal
from cronoq.client._connect import Endpoint, api_error, open_channel
from cronoq.errors import ApiError, FailedPrecondition, Unavailable
from cronoq.hosts import is_loopback_name
from cronoq.prometheus import Writer, labelled
from cronoq.shards import Shard, ShardMap
from cronoq.transport import (
    FORWARDED_KEY,
    OUTPUT_TYPE_KEY,
    SHARD_ENDPOINT_KEY,
    SHARD_KEY,
    metadata_value,
)
from cronoq.v1 import cronoq_pb2_grpc as pbg


class WrongShard(FailedPrecondition):
    """The call belongs to another shard and this server will not forward it: go there instead."""

    def __init__(self, shard: Shard, why: str, url: str | None = None) -> None:
        url = url or shard.endpoint
        super().__init__(f"{why}; shard '{shard.name}' serves it at {url}")
        self.metadata = ((SHARD_KEY, shard.name), (SHARD_ENDPOINT_KEY, url))


def _error(err: grpc.aio.AioRpcError, shard: Shard, url: str) -> ApiError:
    """The peer's answer as our error, keeping a redirect's metadata; an unreachable peer says which,
    and a TLS handshake that failed points at ``[server.peer_tls]``."""
    error = api_error(err)
    details = err.details() or ""
    if isinstance(error, Unavailable) and not details:
        error = Unavailable(f"shard '{shard.name}' is unavailable")
    elif isinstance(error, Unavailable) and "handshake" in details.lower():
        error = Unavailable(
            f"shard '{shard.name}': the TLS handshake with {url} failed; check server.peer_tls (ca_path "
            f"must verify the shard's certificate, cert_path/key_path be accepted by it): {details}"
        )
    keep = tuple(
        (key, value if isinstance(value, str) else bytes(value).decode())
        for key, value in (err.trailing_metadata() or ())
        if key in (SHARD_KEY, SHARD_ENDPOINT_KEY)
    )
    if keep:
        error.metadata = keep
    return error


# gRPC's reconnect backoff grows to two minutes by default; a shard member that was down and comes back as
# the new leader must be reachable again within the 2 s in which traffic has to recover (SPEC §9).
PEER_CHANNEL_OPTIONS = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 500),
)

# Retried after UNAVAILABLE (the leader moved, or is between leaders) when a retry cannot run a call
# twice: the call changes nothing, names its tasks by key, or provably never reached a leader.
RETRY_DELAYS_S = (0.1, 0.25, 0.5, 1.0)
_READ_ONLY = frozenset({"Get", "Wait", "ListTasks", "Snapshot", "ListWorkers", "ListRecurring", "Cancel"})
_NOT_RECEIVED = ("standby", "failed to connect", "connection refused", "shutting down")


def retry_safe(method: str, request: Any, err: ApiError) -> bool:
    """Whether a call that failed with ``err`` (UNAVAILABLE) may be sent again without running twice."""
    if method in _READ_ONLY:
        return True
    if method == "Submit" and request.task.key:
        return True
    if method == "SubmitBatch" and all(task.key for task in request.tasks):
        return True
    message = err.message.lower()
    return any(sign in message for sign in _NOT_RECEIVED)


class Peers:
    """Channels to the other shards, opened on first use and kept (one per endpoint URL).

    ``resolve`` gives the URL to use for a shard now (the router's leader discovery; default: its
    configured endpoint); ``suspect(shard, url)`` hears of a call there that failed UNAVAILABLE, and
    ``retries`` bounds how often such a call is tried again (only when that cannot run it twice).
    ``credentials`` (from ``[server.peer_tls]``) are used for ``https://`` endpoints; without them the
    system trust store verifies peers and no client certificate is presented.

    ``calls`` counts every call by (shard, method, outcome), outcome ``ok`` or the error's code
    (``failed_precondition`` includes calls refused here rather than forwarded); ``retried`` counts the
    calls sent again after UNAVAILABLE by (shard, method). A router reports both on ``/metrics``.
    """

    def __init__(
        self,
        shards: ShardMap,
        *,
        insecure_peer_http: bool,
        timeout: float,
        resolve: Callable[[Shard], str] | None = None,
        suspect: Callable[[Shard, str], None] | None = None,
        retries: int = 0,
        credentials: Any = None,
    ) -> None:
        self.shards = shards
        self.credentials = credentials
        self.insecure_peer_http = insecure_peer_http
        self.timeout = timeout
        self._resolve = resolve
        self._suspect = suspect
        self.retries = min(retries, len(RETRY_DELAYS_S))
        self._stubs: dict[str, tuple[Any, Any, Any]] = {}  # endpoint URL -> (channel, Tasks, Admin)
        self.calls: Counter[tuple[str, str, str]] = Counter()
        self.retried: Counter[tuple[str, str]] = Counter()

    def url(self, shard: Shard) -> str:
        return self._resolve(shard) if self._resolve is not None else shard.endpoint

    def check(self, shard: Shard, caller: Principal, url: str) -> None:
        """Refuse (WrongShard) when this call may not be forwarded to ``shard`` at ``url``."""
        if caller.forwarded:
            raise WrongShard(shard, "this call was forwarded here already and is not forwarded again")
        if caller.certificate:
            raise WrongShard(
                shard, "a caller known by its client certificate cannot be forwarded (it cannot travel)"
            )
        parts = urlsplit(url)
        if (
            parts.scheme == "http"
            and not self.insecure_peer_http
            and not is_loopback_name(parts.hostname or "")
        ):
            raise WrongShard(
                shard,
                "forwarding would send the call (and its credential) over plain http to another host "
                "(server.insecure_peer_http allows it)",
            )

    def _stub(self, url: str) -> tuple[Any, Any, Any]:
        stubs = self._stubs.get(url)
        if stubs is None:
            channel = open_channel(Endpoint.parse(url, secure=False), self.credentials, PEER_CHANNEL_OPTIONS)
            stubs = self._stubs[url] = (channel, pbg.TasksStub(channel), pbg.AdminStub(channel))
        return stubs

    @staticmethod
    def _metadata(caller: Principal) -> tuple[tuple[str, str], ...]:
        if caller.credential:
            return (("authorization", caller.credential), (FORWARDED_KEY, "1"))
        return ((FORWARDED_KEY, "1"),)

    async def call(
        self, shard: Shard, service: str, method: str, request: Any, caller: Principal, *, wait: float = 0.0
    ) -> tuple[Any, str | None]:
        """Forward one unary call (``service`` "tasks" or "admin"); ``wait`` extends the deadline of
        calls that wait for a task. Returns the answer and the content type of the output it carries,
        if the owner said (the wire result has no field for it; HTTP needs it)."""
        try:
            answer = await self._call(shard, service, method, request, caller, wait)
        except ApiError as err:
            self.calls[(shard.name, method, err.code)] += 1
            raise
        self.calls[(shard.name, method, "ok")] += 1
        return answer

    async def _call(
        self, shard: Shard, service: str, method: str, request: Any, caller: Principal, wait: float
    ) -> tuple[Any, str | None]:
        attempt = 0
        while True:
            url = self.url(shard)
            self.check(shard, caller, url)
            _, tasks, admin = self._stub(url)
            call = getattr(tasks if service == "tasks" else admin, method)(
                request, metadata=self._metadata(caller), timeout=self.timeout + wait
            )
            try:
                response = await call
                if not wait:  # only answers that waited for a task carry an output
                    return response, None
                return response, metadata_value(await call.trailing_metadata(), OUTPUT_TYPE_KEY)
            except grpc.aio.AioRpcError as err:
                error = _error(err, shard, url)
            if not isinstance(error, Unavailable):
                raise error
            if self._suspect is not None:
                self._suspect(shard, url)
            if attempt >= self.retries or not retry_safe(method, request, error):
                raise error
            await asyncio.sleep(RETRY_DELAYS_S[attempt])
            attempt += 1
            self.retried[(shard.name, method)] += 1

    async def fan_out(
        self, shards: Sequence[Shard], service: str, method: str, requests: Sequence[Any], caller: Principal
    ) -> list[Any | ApiError]:
        """The same call on several shards at once: each answer, or the error it failed with."""

        async def one(shard: Shard, request: Any) -> Any:
            try:
                return (await self.call(shard, service, method, request, caller))[0]
            except ApiError as err:
                return err

        return list(await asyncio.gather(*(one(s, r) for s, r in zip(shards, requests, strict=True))))

    async def stream(self, shard: Shard, method: str, request: Any, caller: Principal) -> AsyncIterator[Any]:
        """Forward a server-streaming Tasks call (Watch); counted in ``calls`` when it ends."""
        outcome = "ok"
        try:
            url = self.url(shard)
            self.check(shard, caller, url)
            _, tasks, _ = self._stub(url)
            call = getattr(tasks, method)(request, metadata=self._metadata(caller))
            try:
                async for message in call:
                    yield message
            except grpc.aio.AioRpcError as err:
                raise _error(err, shard, url) from None
            finally:
                call.cancel()
        except ApiError as err:
            outcome = err.code
            raise
        finally:
            self.calls[(shard.name, method, outcome)] += 1

    async def close(self) -> None:
        channels = [stubs[0] for stubs in self._stubs.values()]
        self._stubs.clear()
        await asyncio.gather(*(channel.close() for channel in channels), return_exceptions=True)


def write_forwarding(w: Writer, peers: Peers, prefix: str) -> None:
    """The calls ``peers`` forwarded, as ``{prefix}forwarded_total`` and ``{prefix}retries_total``: a
    router's (``cronoq_router_``) and a sharded server's (``cronoq_shard_``) own view of its peers."""
    w.family(
        f"{prefix}forwarded_total",
        "counter",
        "Calls forwarded to a shard, by method and outcome (ok, or the error's code).",
        labelled(peers.calls, ("shard", "method", "outcome")),
    )
    w.family(
        f"{prefix}retries_total",
        "counter",
        "Forwarded calls sent again after UNAVAILABLE (when that cannot run them twice).",
        labelled(peers.retried, ("shard", "method")),
    )
