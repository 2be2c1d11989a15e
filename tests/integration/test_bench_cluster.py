"""bench.sharding's Cluster, which the sharding and scale-out benchmarks start: a cluster that fails
to start leaves no process behind."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.sharding import Cluster, specs


def test_a_shard_that_fails_to_start_stops_those_started_before_it(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path, specs({"a": "a1", "b": "b1"}))
    cluster.shards["b"].config_path.write_text("[server\n")  # not TOML: b exits at once
    try:
        with pytest.raises(RuntimeError, match="exited"), cluster:
            pass
        first = cluster.shards["a"].proc
        assert first is not None
        assert first.poll() is not None, "shard a still runs after the cluster failed to start"
    finally:
        cluster.__exit__()
