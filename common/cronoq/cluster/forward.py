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
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from time import perf_counter
from typing import Any, Protocol
from urllib.parse import urlsplit

import grpc
from google.protobuf.message import Message
from prometheus_client.metrics_core import Metric

from cronoq.auth import Principal
from cronoq.config.model import GRPC_STREAMS_PER_CONNECTION
from cronoq.errors import ApiError, DeadlineExceeded, Unavailable
from cronoq.histogram import Histogram, histogram_family, labelled_histograms, observe
from cronoq.hosts import is_loopback_name
from cronoq.prometheus import family, labelled
from cronoq.tracecontext import incoming
from cronoq.transport import (
    FORWARDED_KEY,
    OUTPUT_TYPE_KEY,
    UNAVAILABLE_SHARDS_KEY,
    Endpoint,
    Req,
    Resp,
    Rpc,
    api_error,
    metadata_value,
    never_received,
    open_channel,
    unadmitted,
)
from cronoq.v1 import cronoq_pb2 as pb
from cronoq.v1 import cronoq_pb2_grpc as pbg

from .shards import Shard, ShardMap, WrongShard

Metadata = tuple[tuple[str, str], ...]


def _error(err: grpc.aio.AioRpcError, shard: Shard, url: str) -> ApiError:
    """The peer's answer as our error, keeping a redirect's metadata; an unreachable peer says which,
    and a TLS handshake that failed points at ``[server.peer_tls]``."""
    error = api_error(err)
    metadata = error.metadata  # the peer's cronoq-* metadata: a redirect's, or that it never received it
    details = err.details() or ""
    if isinstance(error, Unavailable) and not details:
        error = Unavailable(f"shard '{shard.name}' is unavailable")
    elif isinstance(error, Unavailable) and "handshake" in details.lower():
        error = Unavailable(
            f"shard '{shard.name}': the TLS handshake with {url} failed; check server.peer_tls (ca_path "
            f"must verify the shard's certificate, cert_path/key_path be accepted by it): {details}"
        )
    error.metadata = metadata
    return error


# gRPC's reconnect backoff grows to two minutes by default; a shard member that was down and comes back as
# the new leader must be reachable again within seconds of its taking over, as forwarded calls are retried for
# about two seconds (RETRY_DELAYS_S).
# A forwarded answer is as large as the shard's own limits.max_message_bytes lets it be, and this
# process's limit bounds what it passes on: grpc's default of 4 MiB on receiving refused every larger
# output (Submit with wait, Wait) forwarded from a cluster configured above it.
PEER_CHANNEL_OPTIONS = (
    ("grpc.initial_reconnect_backoff_ms", 100),
    ("grpc.max_reconnect_backoff_ms", 500),
    ("grpc.max_receive_message_length", -1),
    ("grpc.use_local_subchannel_pool", 1),
)

# Retried after UNAVAILABLE (the leader moved, or is between leaders) when a retry cannot run a call
# twice: the call changes nothing, names its tasks by key, or provably never reached a leader.
RETRY_DELAYS_S = (0.1, 0.25, 0.5, 1.0)
# A fan-out part (one shard's answer to a listing, a key lookup) must give up well before the caller's
# own deadline (both default to limits.request_timeout_s): a shard that hangs is then named in
# unavailable_shards instead of the whole call running out of time with it.
FANOUT_SHARE = 0.75
RETRIES = 3  # how many of them a router or a sharded server uses
_READ_ONLY = frozenset({"Get", "Wait", "ListTasks", "Snapshot", "ListWorkers", "ListRecurring", "Cancel"})


def retry_safe(method: str, request: Message, received: bool) -> bool:
    """Whether a call that failed UNAVAILABLE may be sent again without running twice: one that was
    never ``received`` always, else only one that changes nothing or names every task it adds by key."""
    if not received or method in _READ_ONLY:
        return True
    if isinstance(request, pb.SubmitRequest):
        return bool(request.task.key)
    if isinstance(request, pb.SubmitBatchRequest):
        return all(task.key for task in request.tasks)
    return False


class LeaderSearch(Protocol):
    """Where each shard's leader is, as :class:`~cronoq.cluster.discovery.LeaderFinder` finds it."""

    def endpoint(self, shard: Shard) -> str:
        """The URL to send ``shard``'s calls to now."""
        ...

    def suspect(self, shard: Shard, url: str) -> None:
        """A call to ``url`` failed UNAVAILABLE (or was given up): look again."""
        ...

    def silent(self, shard: Shard, url: str) -> bool:
        """Whether ``url`` answers nothing now (a call sent there would hang)."""
        ...

    def on_silence(self, shard: Shard, url: str, give_up: Callable[[], None]) -> Callable[[], None]:
        """Call ``give_up`` if ``url`` is found silent until the returned function is called."""
        ...


@dataclass(slots=True, eq=False)
class _Watchdog:
    """Gives up a call in flight at a member its shard's leader search found silent (a paused or hung
    process keeps the connection open and never answers): the call is cancelled, and :attr:`fired` tells
    the caller that this, not its own cancellation, ended it."""

    call: Any  # a grpc.aio call
    fired: bool = False

    def __call__(self) -> None:
        self.fired = True
        self.call.cancel()

    def ended_it(self) -> bool:
        """Whether a CancelledError just raised by the call is this watchdog's doing (and not the
        cancellation of the task awaiting it, which must go on)."""
        task = asyncio.current_task()
        return self.fired and (task is None or not task.cancelling())


def _silent(shard: Shard, url: str, in_flight: bool) -> Unavailable:
    """The error of a call to a member that answers nothing: given up in flight (it may have run), or not
    sent at all (marked not received)."""
    why = f"shard '{shard.name}': its member at {url} answers nothing (its health check went unanswered)"
    if in_flight:
        return Unavailable(
            f"{why}; the call was given up in flight (one that changes something may have run)"
        )
    return unadmitted(f"{why} and no other member serves yet; nothing was sent, retry")


@dataclass(slots=True)
class _Failed:
    """How one attempt of a forwarded call failed, and whether the shard may have received it."""

    error: ApiError
    received: bool


class Peers:
    """Channels to the other shards, opened on first use and kept (one per endpoint URL).

    ``search`` finds each shard's leader (:mod:`cronoq.cluster.discovery`; without it a shard's calls go to its
    configured endpoint): it gives the URL to use for a shard now, hears of calls there that failed
    UNAVAILABLE, and gives up calls in flight at a member that went silent, which fail UNAVAILABLE too
    (a member known silent is not sent any). ``retries`` bounds how often such a call is tried again
    (only when that cannot run it twice).
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
        search: LeaderSearch | None = None,
        retries: int = 0,
        credentials: Any = None,
        streams_per_connection: int = GRPC_STREAMS_PER_CONNECTION,
    ) -> None:
        self.shards = shards
        self.credentials = credentials
        self.insecure_peer_http = insecure_peer_http
        self.timeout = timeout
        self._search = search
        self.retries = min(retries, len(RETRY_DELAYS_S))
        # Calls one connection carries before another is opened: the shards' own limit per connection
        # (server.grpc_max_streams_per_connection), less a tenth, as grpc lets go of a stream a moment
        # after the call ended. Past the limit grpc would hold calls back until others end, and a
        # router's Watches hold theirs for as long as they last.
        self._room = max(1, streams_per_connection - streams_per_connection // 10)
        self._connections: dict[str, list[_Connection]] = {}  # endpoint URL -> its connections
        self.calls: Counter[tuple[str, str, str]] = Counter()
        # How long each forwarded call took, retries included, by (shard, method), answered or not.
        self.latency: dict[tuple[str, str], Histogram] = {}
        self.retried: Counter[tuple[str, str]] = Counter()

    def url(self, shard: Shard) -> str:
        return self._search.endpoint(shard) if self._search is not None else shard.endpoint

    def silent(self, shard: Shard, url: str) -> bool:
        return self._search is not None and self._search.silent(shard, url)

    def watchdog(self, shard: Shard, url: str, call: Any) -> tuple[_Watchdog, Callable[[], None]]:
        """A :class:`_Watchdog` for ``call`` to ``url``, and the function that stops it (when it ended)."""
        watchdog = _Watchdog(call)
        if self._search is None:
            return watchdog, unwatched
        return watchdog, self._search.on_silence(shard, url, watchdog)

    def check(self, shard: Shard, caller: Principal, url: str, last_hop: bool = False) -> None:
        """Refuse (WrongShard, naming ``url``: the shard's leader as found, where the caller may go
        itself) when this call may not be forwarded to ``shard`` at ``url``. A call that was forwarded
        here is not forwarded again, unless it is a ``last_hop``: one a shard makes on its own account
        while it serves a forwarded call (a key probe before a submission, the wait for a duplicate held
        elsewhere), which the target answers itself, since it comes marked forwarded."""
        if caller.forwarded and not last_hop:
            raise WrongShard(shard, "this call was forwarded here already and is not forwarded again", url)
        if caller.certificate:
            raise WrongShard(
                shard, "a caller known by its client certificate cannot be forwarded (it cannot travel)", url
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
                url,
            )

    def _connection(self, url: str) -> _Connection:
        """A connection to ``url`` with room for one more call, which the caller now counts as open
        (and uncounts when it ended): the first that has room, else a new one."""
        pool = self._connections.setdefault(url, [])
        connection = next((c for c in pool if c.open < self._room), None)
        if connection is None:
            channel = open_channel(Endpoint.parse(url, secure=False), self.credentials, PEER_CHANNEL_OPTIONS)
            connection = _Connection(channel, pbg.TasksStub(channel), pbg.AdminStub(channel))
            pool.append(connection)
        connection.open += 1
        return connection

    @staticmethod
    def _metadata(caller: Principal, extra: Metadata = ()) -> Metadata:
        """The forwarded call's metadata: the caller's credential, the forwarded marker, ``extra``, and
        the trace context of the call being served (a Submit's: the tasks it submits carry it)."""
        if caller.credential:
            return (("authorization", caller.credential), (FORWARDED_KEY, "1"), *extra, *incoming.get())
        return ((FORWARDED_KEY, "1"), *extra, *incoming.get())

    async def call(
        self,
        shard: Shard,
        rpc: Rpc[Req, Resp],
        request: Req,
        caller: Principal,
        *,
        wait: float = 0.0,
        budget: float | None = None,
        extra: Metadata = (),
        last_hop: bool = False,
    ) -> tuple[Resp, str | None]:
        """Forward one unary call; ``wait`` extends the deadline of calls that wait for a task;
        ``budget`` bounds the whole call, retries included (default: each attempt gets ``timeout``);
        ``extra`` is metadata sent besides the caller's credential and the forwarded marker;
        ``last_hop`` as in :meth:`check`. Returns the answer and the content type of the output it
        carries, if the owner said (the wire result has no field for it; HTTP needs it)."""
        deadline = None if budget is None else asyncio.get_running_loop().time() + budget
        started = perf_counter()
        try:
            answer = await self._call(shard, rpc, request, caller, wait, deadline, (extra, last_hop))
        except ApiError as err:
            self.calls[(shard.name, rpc.method, err.code)] += 1
            raise
        finally:
            observe(self.latency, (shard.name, rpc.method), perf_counter() - started)
        self.calls[(shard.name, rpc.method, "ok")] += 1
        return answer

    async def _call(
        self,
        shard: Shard,
        rpc: Rpc[Req, Resp],
        request: Req,
        caller: Principal,
        wait: float,
        deadline: float | None,
        how: tuple[Metadata, bool],
    ) -> tuple[Resp, str | None]:
        extra, last_hop = how
        method = rpc.method
        attempt = 0
        loop = asyncio.get_running_loop()
        while True:
            url = self.url(shard)
            self.check(shard, caller, url, last_hop)
            timeout = self.timeout + wait
            if deadline is not None:
                timeout = min(timeout, deadline - loop.time())
                if timeout <= 0:
                    raise DeadlineExceeded(f"shard '{shard.name}' did not answer in time")
            outcome = await self._attempt(
                shard, rpc, request, url, self._metadata(caller, extra), (timeout, wait)
            )
            if not isinstance(outcome, _Failed):
                return outcome
            if not isinstance(outcome.error, Unavailable):
                raise outcome.error
            safe = retry_safe(method, request, outcome.received)
            if not await self._again(shard, method, url, attempt, safe):
                raise outcome.error
            attempt += 1

    async def _attempt(
        self,
        shard: Shard,
        rpc: Rpc[Req, Resp],
        request: Req,
        url: str,
        metadata: Metadata,
        bounds: tuple[float, float],
    ) -> tuple[Resp, str | None] | _Failed:
        """Send the call to ``url`` once (within ``timeout``; ``wait`` when it waits for a task): its answer
        and output type, or how it failed. Not sent to a member known silent; given up when its member
        goes silent while it runs."""
        timeout, wait = bounds
        if self.silent(shard, url):
            return _Failed(_silent(shard, url, in_flight=False), received=False)
        loop = asyncio.get_running_loop()
        ends = loop.time() + timeout  # no later than gRPC's deadline for the call
        connection = self._connection(url)
        call = rpc.on(connection.tasks, connection.admin)(request, metadata=metadata, timeout=timeout)
        watchdog, unwatch = self.watchdog(shard, url, call)
        try:
            response: Resp = await call
            if not wait:  # only answers that waited for a task carry an output
                return response, None
            return response, metadata_value(await call.trailing_metadata(), OUTPUT_TYPE_KEY)
        except grpc.aio.AioRpcError as err:
            if err.code() == grpc.StatusCode.DEADLINE_EXCEEDED and loop.time() >= ends:
                # This attempt's own deadline, not an answer: gRPC says only "Deadline Exceeded". The
                # shard may be stuck: look for its leader again, as after UNAVAILABLE.
                if self._search is not None:
                    self._search.suspect(shard, url)
                late = DeadlineExceeded(f"shard '{shard.name}' at {url} did not answer within {timeout:g} s")
                return _Failed(late, received=True)
            return _Failed(_error(err, shard, url), received=not never_received(err))
        except asyncio.CancelledError:
            if not watchdog.ended_it():
                raise
            return _Failed(_silent(shard, url, in_flight=True), received=True)
        finally:
            unwatch()
            connection.open -= 1

    async def _again(self, shard: Shard, method: str, url: str, attempt: int, safe: bool) -> bool:
        """After a call to ``url`` failed UNAVAILABLE: tell the leader search (``suspect``, unless it knows
        ``url`` silent already: calls not sent there teach it nothing), then whether to send it again,
        after a pause: only when ``safe`` and fewer than ``retries`` retries were made."""
        if self._search is not None and not self._search.silent(shard, url):
            self._search.suspect(shard, url)
        if attempt >= self.retries or not safe:
            return False
        await asyncio.sleep(RETRY_DELAYS_S[attempt])
        self.retried[(shard.name, method)] += 1
        return True

    async def fan_out(
        self,
        shards: Sequence[Shard],
        rpc: Rpc[Req, Resp],
        requests: Sequence[Req],
        caller: Principal,
        *,
        extra: Metadata = (),
        last_hop: bool = False,
    ) -> list[Resp | ApiError]:
        """The same call on several shards at once (``extra`` and ``last_hop`` as in :meth:`call`): each
        answer, or the error it failed with, within a share of the forwarding timeout."""
        budget = FANOUT_SHARE * self.timeout

        async def one(shard: Shard, request: Req) -> Resp | ApiError:
            try:
                call = self.call(shard, rpc, request, caller, budget=budget, extra=extra, last_hop=last_hop)
                return (await call)[0]
            except ApiError as err:
                return err

        return list(await asyncio.gather(*(one(s, r) for s, r in zip(shards, requests, strict=True))))

    def watch(self, shard: Shard, request: pb.WatchRequest, caller: Principal) -> PeerStream:
        """A Watch call to ``shard``, started by :meth:`PeerStream.open`."""
        return PeerStream(self, shard, request, caller)

    async def close(self) -> None:
        channels = [c.channel for pool in self._connections.values() for c in pool]
        self._connections.clear()
        await asyncio.gather(*(channel.close() for channel in channels), return_exceptions=True)


@dataclass(slots=True, eq=False)
class _Connection:
    """One channel to a shard, with its stubs and the calls open on it now. Each channel has a connection
    of its own (``grpc.use_local_subchannel_pool`` in PEER_CHANNEL_OPTIONS: grpc otherwise shares one
    between channels of the same target and options)."""

    channel: Any  # a grpc.aio.Channel (grpc ships no type information)
    tasks: pbg.TasksStub
    admin: pbg.AdminStub
    open: int = 0


class PeerStream:
    """A Watch call (the API's only server-streaming call) forwarded to a shard; counted in
    ``Peers.calls`` when it ends.

    :meth:`open` returns once the shard said the stream is open: its Watch sends its initial metadata
    (``UNAVAILABLE_SHARDS_KEY``) as soon as it is subscribed, so a healthy shard with nothing to report
    is told from one that is stuck, and a refusal, which comes as a status alone, is raised from here.
    Then ``anext()`` gives its messages; :meth:`aclose` cancels the call. A stream whose member the leader
    search finds silent ends UNAVAILABLE, as one that failed: it would otherwise go quiet for as long as
    the member is paused, while a new leader's events go unseen.
    """

    def __init__(self, peers: Peers, shard: Shard, request: pb.WatchRequest, caller: Principal) -> None:
        self._peers = peers
        self._shard = shard
        self._request = request
        self._caller = caller
        self._call: Any = None  # the grpc.aio call, once started
        self._watchdog: _Watchdog | None = None  # on the call, while it counts on its connection
        self._unwatch: Callable[[], None] = unwatched
        self._connection: _Connection | None = None  # the connection it counts on while open
        self._url = ""
        self._ended = False

    async def open(self) -> None:
        """Start the call and wait, at most the forwarding timeout, for the shard to open it. UNAVAILABLE
        (a standby, a leader that just moved) is tried again like a read, at the leader found meanwhile."""
        peers, shard = self._peers, self._shard
        try:
            async with asyncio.timeout(peers.timeout):
                attempt = 0
                while (error := await self._start()) is not None:
                    if not isinstance(error, Unavailable):
                        raise error
                    if not await peers._again(shard, "Watch", self._url, attempt, True):
                        raise error
                    attempt += 1
        except TimeoutError:
            self._end("deadline_exceeded")
            raise DeadlineExceeded(
                f"shard '{shard.name}' did not open the Watch stream within {peers.timeout:g} s"
            ) from None
        except ApiError as err:
            self._end(err.code)
            raise
        except BaseException:  # cancelled: the caller went away while it opened
            self._end("cancelled")
            raise

    async def _start(self) -> ApiError | None:
        """Send the call to the shard's current URL: None once the shard opened it, else the error it
        ended with (naming the shard)."""
        peers, shard = self._peers, self._shard
        self._url = url = peers.url(shard)
        peers.check(shard, self._caller, url)
        self._let_go()
        if peers.silent(shard, url):
            return _silent(shard, url, in_flight=False)
        self._connection = connection = peers._connection(url)
        self._call = connection.tasks.Watch(self._request, metadata=peers._metadata(self._caller))
        self._watchdog, self._unwatch = peers.watchdog(shard, url, self._call)
        try:
            opened = await self._call.initial_metadata()
        except asyncio.CancelledError:
            if not self._watchdog.ended_it():
                raise
            return _silent(shard, url, in_flight=True)
        if metadata_value(opened, UNAVAILABLE_SHARDS_KEY) is not None:
            return None
        return await self._refusal()

    async def _refusal(self) -> ApiError:
        """The error of a call that ended without opening (its status, naming the shard)."""
        call = self._call
        if self._watchdog is not None and self._watchdog.fired:
            return _silent(self._shard, self._url, in_flight=True)
        code, details = await call.code(), await call.details()
        if code == grpc.StatusCode.OK:  # ended without a word: neither opened nor refused
            return Unavailable(f"shard '{self._shard.name}' ended the Watch stream without opening it")
        err = grpc.aio.AioRpcError(
            code, await call.initial_metadata(), await call.trailing_metadata(), details
        )
        return _error(err, self._shard, self._url)

    async def __anext__(self) -> pb.StatusEvent:
        try:
            message: pb.StatusEvent = await self._call.read()
        except grpc.aio.AioRpcError as err:
            error = _error(err, self._shard, self._url)
            self._end(error.code)
            raise error from None
        except asyncio.CancelledError:
            if self._watchdog is None or not self._watchdog.ended_it():
                raise
            error = _silent(self._shard, self._url, in_flight=True)
            self._end(error.code)
            raise error from None
        if message is grpc.aio.EOF:
            self._end("ok")
            raise StopAsyncIteration
        return message

    async def aclose(self) -> None:
        if self._call is not None:
            self._call.cancel()
        self._end("ok")

    def _end(self, outcome: str) -> None:
        if self._ended:
            return
        self._ended = True
        if self._call is not None and outcome != "ok":
            self._call.cancel()
        self._let_go()
        self._peers.calls[(self._shard.name, "Watch", outcome)] += 1

    def _let_go(self) -> None:
        """The call ended (or is being sent again): it no longer counts on its connection, nor is it
        watched."""
        self._unwatch()
        self._unwatch = unwatched
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.open -= 1


def unwatched() -> None:
    """Stops watching nothing: what :meth:`LeaderSearch.on_silence` returns for a URL it does not watch."""


def forwarded_families(peers: Peers, prefix: str) -> Iterator[Metric]:
    """The calls ``peers`` forwarded, as ``{prefix}forwarded_total`` and ``{prefix}retries_total``: a
    router's (``cronoq_router_``) and a sharded server's (``cronoq_shard_``) own view of its peers."""
    yield family(
        f"{prefix}forwarded_total",
        "counter",
        "Calls forwarded to a shard, by method and outcome (ok, or the error's code).",
        labelled(peers.calls, ("shard", "method", "outcome")),
    )
    yield histogram_family(
        f"{prefix}forward_duration_seconds",
        "Time a forwarded unary call took, retries included, by shard and method, answered or not.",
        ("shard", "method"),
        labelled_histograms(peers.latency, ("shard", "method")),
    )
    yield family(
        f"{prefix}retries_total",
        "counter",
        "Forwarded calls sent again after UNAVAILABLE (when that cannot run them twice).",
        labelled(peers.retried, ("shard", "method")),
    )
