"""What this server version cannot do yet, found in a configuration that asks for it.

The configuration layer accepts every key of the reference server so files stay portable, but a server
must never *silently* ignore a setting a user relies on: gRPC-Web that quietly did nothing would be
worse than a refusal. ``--check`` reports these and startup refuses them, each naming its key.
"""

from __future__ import annotations

from cronoq.config import Config


def unsupported(config: Config) -> list[str]:
    """One message per setting this version would otherwise ignore."""
    problems: list[str] = []
    server = config.server
    if server.grpc_web is not None:
        problems.append("server.grpc_web: not supported by this server version yet")
    return problems


def server_problems(config: Config) -> list[str]:
    """What a valid configuration still lacks to run a *server* (the router reads the same file)."""
    if config.shards and not config.server.shard:
        return [
            "server.shard: required with [[shards]]: name the shard this server serves "
            "(or pass --shard, or set CRONOQ_SHARD)"
        ]
    return []
