"""The shard map: ownership by pool and by the shard number in task ids, and where ids start."""

from __future__ import annotations

from pathlib import Path

from cronoq.cluster.shards import SHARD_SHIFT, UNSHARDED, Shard, ShardMap
from cronoq.config import load_config, parse_config

A = Shard("a", 1, "http://127.0.0.1:7070", frozenset({"a1", "a2"}))
B = Shard("b", 2, "https://b.internal:7070", frozenset({"b1"}))


def test_lookups_by_pool_and_by_id() -> None:
    shards = ShardMap([A, B], local="a")
    assert shards.sharded and shards.local is A and len(shards) == 2
    assert shards.by_pool("b1") is B and shards.by_pool("nope") is None
    assert shards.by_id((2 << SHARD_SHIFT) | 5) is B and shards.by_id((9 << SHARD_SHIFT) | 5) is None
    assert shards.is_local(A) and not shards.is_local(B)
    assert shards.is_local(None)  # an unknown pool is answered (refused) here, not forwarded


def test_an_unsharded_map_owns_everything() -> None:
    shards = ShardMap([])
    assert not shards.sharded and shards.local is None and shards.by_pool("any") is None
    assert shards.first_id(0, 0) == 1  # no durable store: ids start at 1
    assert shards.first_id(1, 0) == (1 << 48) + 1  # the first leader of a store
    assert shards.first_id(1, (1 << 48) + 41) == (1 << 48) + 42  # never below what was issued


def test_sharded_ids_keep_the_shard_number_in_the_top_8_bits() -> None:
    shards = ShardMap([A, B], local="b")
    first = shards.first_id(3, 0)
    assert first >> SHARD_SHIFT == 2 and (first >> 48) & 0xFF == 3
    wrapped = shards.first_id(256 + 3, first + 99)  # the epoch wrapped: the high-water mark wins
    assert wrapped == first + 100 and wrapped >> SHARD_SHIFT == 2


def test_from_config(tmp_path: Path) -> None:
    path = tmp_path / "c.toml"
    path.write_text(
        '[[pools]]\nname = "a1"\n[[pools]]\nname = "b1"\n'
        '[[shards]]\nname = "a"\nnumber = 1\nendpoint = "http://127.0.0.1:1"\npools = ["a1"]\n'
        '[[shards]]\nname = "b"\nnumber = 2\nendpoint = "http://127.0.0.1:2"\npools = ["b1"]\n'
    )
    config = load_config(path, shard="b")
    shards = ShardMap.from_config(config, config.server.shard)
    assert shards.local is not None and shards.local.name == "b" and shards.by_pool("a1") is not None


def test_a_routers_map_of_a_cluster_without_shards_is_its_one_leader_group() -> None:
    config = parse_config(
        '[router]\nmembers = ["http://s-0:7070", "http://s-1:7070"]\n[[pools]]\nname = "a"\n[[pools]]\nname = "b"\n',
        env={},
    )
    shards = ShardMap.for_router(config)
    (whole,) = shards
    assert whole == Shard(
        UNSHARDED, 0, "http://s-0:7070", frozenset({"a", "b"}), ("http://s-0:7070", "http://s-1:7070")
    )
    assert shards.local is None and shards.by_pool("a") is whole and shards.by_pool("c") is None
    # An unsharded leader's ids carry its epoch in the top bits, not a shard number: all are its.
    assert shards.by_id((3 << 48) | 7) is whole and shards.by_id((0x2A05 << 48) | 1) is whole
    given = parse_config('[router]\nmembers = ["http://s-0:7070"]\nendpoint = "http://s:7070"\n', env={})
    assert next(iter(ShardMap.for_router(given))).endpoint == "http://s:7070"
    assert ShardMap.from_config(config).sharded is False  # the servers of that cluster: all local
