"""The static shard map of a cluster (``[[shards]]``): which shard owns a pool, and a task id.

Every process of a cluster reads the same map, so any of them (a shard server or a router) can tell
where a call belongs without asking anyone: by the pool it names, or by the shard number carried in
the top 8 bits of a task id (docs/operations.md, Sharding), which worker ids carry too.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from dataclasses import dataclass

from cronoq.config import Config
from cronoq.errors import FailedPrecondition
from cronoq.transport import SHARD_ENDPOINT_KEY, SHARD_ENDPOINTS_KEY, SHARD_KEY

SHARD_SHIFT = 56  # task ids: shard number in bits 56-63 ...
EPOCH_SHIFT = 48  # ... and the leader epoch below it (the whole top 16 bits when unsharded)
# What a router calls the one leader group of a cluster without [[shards]] (metrics, errors, answers).
UNSHARDED = "main"


@dataclass(frozen=True, slots=True)
class Shard:
    """One leader group: its name, the number in its task ids, its gRPC endpoint (an http(s) URL) and
    the members a router or another shard's server may probe to find its leader."""

    name: str
    number: int
    endpoint: str
    pools: frozenset[str]
    members: tuple[str, ...] = ()

    @property
    def urls(self) -> tuple[str, ...]:
        """Every URL the map gives it (``endpoint``, then ``members``, without repeats): where a worker
        sent to this shard may be sent, whichever member leads."""
        return tuple(dict.fromkeys((self.endpoint, *self.members)))


class ShardMap:
    """Who owns what. ``local`` is the shard this process serves (None for a router, or when the
    cluster is not sharded, in which case every lookup answers None: everything is local)."""

    __slots__ = ("_by_name", "_by_number", "_by_pool", "_whole", "local")

    def __init__(
        self, shards: Iterable[Shard], local: str | None = None, *, whole: Shard | None = None
    ) -> None:
        self._by_name = {s.name: s for s in shards}
        self._by_number = {s.number: s for s in self._by_name.values()}
        self._by_pool = {pool: s for s in self._by_name.values() for pool in s.pools}
        self._whole = whole  # the one group that holds every task id (see for_router)
        self.local = self._by_name[local] if local is not None and self._by_name else None

    @classmethod
    def from_config(cls, config: Config, local: str | None = None) -> ShardMap:
        shards = (
            Shard(s.name, s.number, s.endpoint, frozenset(s.pools), tuple(s.members)) for s in config.shards
        )
        return cls(shards, local)

    @classmethod
    def for_router(cls, config: Config) -> ShardMap:
        """The map a router routes by: the ``[[shards]]`` or, for a cluster without them, its one leader
        group (``[router] members``), named :data:`UNSHARDED`, owning every pool and every task id
        (an unsharded leader puts its epoch, not a shard number, in an id's top bits)."""
        if config.shards:
            return cls.from_config(config)
        members = config.router.members
        endpoint = config.router.endpoint or members[0]
        whole = Shard(UNSHARDED, 0, endpoint, frozenset(p.name for p in config.pools), tuple(members))
        return cls([whole], whole=whole)

    @property
    def sharded(self) -> bool:
        return bool(self._by_name)

    def __iter__(self) -> Iterator[Shard]:
        return iter(self._by_name.values())

    def __len__(self) -> int:
        return len(self._by_name)

    def get(self, name: str) -> Shard | None:
        return self._by_name.get(name)

    def by_pool(self, pool: str) -> Shard | None:
        return self._by_pool.get(pool)

    def by_id(self, task_id: int) -> Shard | None:
        return self._whole or self._by_number.get(task_id >> SHARD_SHIFT)

    def is_local(self, shard: Shard | None) -> bool:
        """Whether ``shard`` (as returned by a lookup) is served by this process."""
        return shard is None or shard is self.local

    def first_id(self, epoch: int, max_id: int) -> int:
        """The first task id a leader of ``epoch`` issues: above every id issued before (``max_id``),
        in the local shard's range when sharded (8 bits of epoch below the 8 bits of shard number;
        a counter that outgrows its epoch carries into the epoch bits, never the shard bits)."""
        if self.local is None:
            base = epoch << EPOCH_SHIFT
        else:
            base = (self.local.number << SHARD_SHIFT) | ((epoch & 0xFF) << EPOCH_SHIFT)
        return max(base + 1, max_id + 1)

    def first_worker_id(self) -> int:
        """The first worker id a leader gives out: with the local shard's number in the top 8 bits when
        sharded, as task ids carry it, so that workers of different shards listed together (a fan-out
        of ListWorkers) never share an id, and each id names its shard. A worker id is only ever shown
        (``Registered.worker_id``, ``WorkerInfo.id``): no message sends it back."""
        return 1 if self.local is None else (self.local.number << SHARD_SHIFT) + 1


class WrongShard(FailedPrecondition):
    """The call belongs to another shard and this server will not forward it: go there instead.

    The metadata name the shard, the URL to go to (``url``, default its ``endpoint``) and every URL the
    map gives the shard, which SDK workers check redirects against (``SHARD_ENDPOINTS_KEY``)."""

    def __init__(self, shard: Shard, why: str, url: str | None = None) -> None:
        url = url or shard.endpoint
        super().__init__(f"{why}; shard '{shard.name}' serves it at {url}")
        self.metadata = (
            (SHARD_KEY, shard.name),
            (SHARD_ENDPOINT_KEY, url),
            (SHARD_ENDPOINTS_KEY, ",".join(shard.urls)),
        )
