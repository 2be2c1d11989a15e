"""What a configuration must say for a *server* to run it, beyond what validation checks.

Validation accepts a sharded file without ``server.shard``, because the router, and ``--check`` of the
whole file, read it without one. Only a server about to serve must know which shard it is.
"""

from __future__ import annotations

from cronoq.config import Config


def server_problems(config: Config) -> list[str]:
    """What a valid configuration still lacks to run a *server* (the router reads the same file)."""
    if config.shards and not config.server.shard:
        return [
            "server.shard: required with [[shards]]: name the shard this server serves "
            "(or pass --shard, or set CRONOQ_SHARD)"
        ]
    return []
