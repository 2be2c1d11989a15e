"""Which member of each shard leads it now, so that a router or a sharded server forwards straight to
the leader.

A shard's ``endpoint`` is usually a load-balanced Service address, and a balancer may hand a call to a
standby, which answers UNAVAILABLE. When the shard map names a shard's ``members``, the forwarder finds
the leader itself: a member's gRPC health service answers SERVING only while that process is the serving
leader, so asking every member every ``interval`` follows failovers without a restart. A forwarded call
that fails UNAVAILABLE need not wait for the next round: :meth:`LeaderFinder.suspect` stops using that
member at once and checks again now. :func:`forwarding` wires a finder into :class:`~cronoq.cluster.forward.Peers`
the same way for both kinds of process.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import partial
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cronoq.config import Config
from cronoq.logs import get_logger
from cronoq.tls import peer_credentials
from cronoq.transport import Endpoint, open_channel

from .forward import PEER_CHANNEL_OPTIONS, RETRIES, Peers, unwatched
from .shards import Shard, ShardMap

log = get_logger("cronoq.cluster.discovery")


SERVING = health_pb2.HealthCheckResponse.SERVING


@dataclass(slots=True)
class _Member:
    """One process of a shard, with its own kept-open channel, as last checked."""

    url: str
    channel: Any
    health: Any  # a HealthStub on ``channel``
    serving_since: float | None = None  # when the check that first found it serving (this time) began
    suspected_at: float | None = None  # a call to it failed then: checks begun earlier prove nothing
    silent: bool = False  # its latest check got no answer at all
    # What to tell when a check gets no answer: one callback per call in flight there (Peers' watchdogs).
    in_flight: set[Callable[[], None]] = field(default_factory=set)


def forwarding(shards: ShardMap, config: Config) -> tuple[LeaderFinder, Peers]:
    """The :class:`Peers` of a router or a sharded server, and the finder they send each shard's calls
    through (start and close both): calls go to the leader found among a shard's ``members`` and are
    retried (``RETRIES``) when they failed UNAVAILABLE and cannot run twice."""
    credentials = peer_credentials(config)  # [server.peer_tls], for https:// endpoints and members
    finder = LeaderFinder(shards, credentials=credentials)
    peers = Peers(
        shards,
        insecure_peer_http=config.server.insecure_peer_http,
        timeout=config.limits.request_timeout_s,
        search=finder,
        retries=RETRIES,
        credentials=credentials,
        streams_per_connection=config.server.grpc_max_streams_per_connection,
    )
    return finder, peers


class LeaderFinder:
    """Tracks the serving leader of every other shard that has ``members`` by polling their gRPC health.

    Shards without members are never polled: their ``endpoint`` is all there is to know; nor is the
    process's own shard (``shards.local``), whose calls it answers itself. Channels are
    plain or TLS by each member URL's scheme; ``credentials`` (``grpc.ssl_channel_credentials``, for a
    private CA or mTLS) are used for the ``https://`` ones.
    """

    def __init__(
        self, shards: ShardMap, *, interval: float = 0.5, timeout: float = 1.0, credentials: Any = None
    ) -> None:
        self._shards = {s.name: s for s in shards if s.members and not shards.is_local(s)}
        self._interval = interval
        self._timeout = timeout
        self._credentials = credentials
        self._members: dict[str, list[_Member]] = {}
        # shard name -> the member URL chosen, or None once a round found none serving (absent: not yet)
        self._leaders: dict[str, str | None] = {}
        self._found = {name: asyncio.Event() for name in self._shards}  # set while a leader is known
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self.changes: dict[str, int] = dict.fromkeys(self._shards, 0)  # leader changes seen, per shard

    def tracks(self, shard: Shard) -> bool:
        """Whether this finder looks for ``shard``'s leader (it has ``members``)."""
        return shard.name in self._shards

    def leader(self, shard: Shard) -> str | None:
        """The member of a tracked shard seen serving, None while none is (or before the first round)."""
        return self._leaders.get(shard.name)

    def endpoint(self, shard: Shard) -> str:
        """Where to send ``shard``'s calls now: its member last seen serving, else its ``endpoint``."""
        return self._leaders.get(shard.name) or shard.endpoint

    async def wait_leader(self, shard: Shard, timeout: float) -> str | None:
        """The URL of a member of ``shard`` known to serve, waiting up to ``timeout`` seconds for one
        (None if none turned up). A shard without members answers its ``endpoint`` at once: there is
        nothing to wait for."""
        found = self._found.get(shard.name)
        if found is None:
            return shard.endpoint
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):
                await found.wait()
        return self._leaders.get(shard.name)

    def suspect(self, shard: Shard, url: str) -> None:
        """A call forwarded to ``url`` failed UNAVAILABLE: do not send there again until a check begun
        after this says it serves, and check now rather than at the next round."""
        now = asyncio.get_running_loop().time()
        for member in self._members.get(shard.name, ()):
            if member.url == url and member.suspected_at is None:
                member.suspected_at = now
                if self._leaders.get(shard.name) == url:
                    log.info("shard_leader_suspected", shard=shard.name, endpoint=url)
                    self._settle(shard.name)
        self._wake.set()

    def silent(self, shard: Shard, url: str) -> bool:
        """Whether ``url``, a member of ``shard``, got no answer to its latest check: a call sent there
        now would only hang (a member that is down refuses it at once, but is no use either)."""
        member = self._member(shard, url)
        return member is not None and member.silent

    def on_silence(self, shard: Shard, url: str, give_up: Callable[[], None]) -> Callable[[], None]:
        """Call ``give_up`` (a call in flight at ``url``) if a check of that member gets no answer before
        the returned function is called (when the call ended). The check may have begun before the call
        was sent: the member then said nothing for as long as a check waits, which it never does while
        it runs. Nothing is watched at a URL that is not a member of a shard this finder tracks."""
        member = self._member(shard, url)
        if member is None:
            return unwatched
        member.in_flight.add(give_up)
        return partial(member.in_flight.discard, give_up)

    def _member(self, shard: Shard, url: str) -> _Member | None:
        return next((m for m in self._members.get(shard.name, ()) if m.url == url), None)

    async def start(self) -> None:
        """Open one channel per member (bound to the running loop) and start polling in the background."""
        for name, shard in self._shards.items():
            self._members[name] = [self._open(url) for url in shard.members]
        self._task = asyncio.get_running_loop().create_task(self._poll_forever())

    async def close(self) -> None:
        """Stop polling and close the channels."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.wait([self._task])  # not ``await task``: that would also swallow our own cancel
            self._task = None
        channels = [m.channel for members in self._members.values() for m in members]
        self._members.clear()
        await asyncio.gather(*(channel.close() for channel in channels))

    def _open(self, url: str) -> _Member:
        channel = open_channel(Endpoint.parse(url, secure=False), self._credentials, PEER_CHANNEL_OPTIONS)
        return _Member(url, channel, health_pb2_grpc.HealthStub(channel))

    async def _poll_forever(self) -> None:
        """A round checks every member at once; the next begins ``interval`` after it ends, or as soon as
        a member is suspected. A round lasts at most ``timeout``, so a new leader is seen within
        ``interval + timeout`` of turning SERVING, however many members are unreachable."""
        while True:
            self._wake.clear()
            await asyncio.gather(*(self._check(name) for name in self._members))
            # asyncio.timeout, not wait_for: on 3.11 wait_for swallows a cancel (close()) that arrives
            # together with a wake-up, and the loop would run on.
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self._interval):
                    await self._wake.wait()

    async def _check(self, name: str) -> None:
        """Ask every member of one shard, then choose its leader from all the answers together (so a
        handover seen half-way through a round is not reported as a shard without leader)."""
        members = self._members[name]
        answers = await asyncio.gather(*(self._serving(m) for m in members))
        for member, (began, serving) in zip(members, answers, strict=True):
            member.silent = serving is None
            if member.silent and member.in_flight:
                log.warning(
                    "shard_member_silent", shard=name, endpoint=member.url, calls=len(member.in_flight)
                )
                for give_up in list(member.in_flight):
                    give_up()
            if member.suspected_at is not None and began <= member.suspected_at:
                continue  # asked before the failure that made it suspect
            member.suspected_at = None
            if not serving:
                member.serving_since = None
            elif member.serving_since is None:
                member.serving_since = began
        self._settle(name)

    async def _serving(self, member: _Member) -> tuple[float, bool | None]:
        """When the check began and whether the member said SERVING; None when it did not answer within
        the timeout, or could not be reached (it is not the leader either way)."""
        began = asyncio.get_running_loop().time()
        request = health_pb2.HealthCheckRequest(service="")
        try:
            answer = await member.health.Check(request, timeout=self._timeout)
        except grpc.aio.AioRpcError:
            return began, None
        return began, answer.status == SERVING

    def _settle(self, name: str) -> None:
        """Choose the shard's leader from what its members last said, and log a change."""
        current = self._leaders.get(name)
        serving = [m for m in self._members[name] if m.serving_since is not None and m.suspected_at is None]
        # Two members serving is a brief overlap during a failover: the one that switched last is the new
        # leader (the old one is about to step down, and its commits are fenced anyway). A tie keeps the
        # current leader.
        newest = max(serving, key=lambda m: (m.serving_since or 0.0, m.url == current), default=None)
        leader = newest.url if newest is not None else None
        if leader is None:
            self._found[name].clear()
        else:
            self._found[name].set()
        if name in self._leaders and leader == current:
            return
        if name in self._leaders:  # the first round's choice is no change
            self.changes[name] += 1
        self._leaders[name] = leader
        if leader is None:
            log.warning("shard_no_leader", shard=name, members=[m.url for m in self._members[name]])
        else:
            log.info("shard_leader", shard=name, endpoint=leader, previous=current)
