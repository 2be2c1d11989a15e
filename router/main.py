"""``cronoq-router``: the stateless front door of a sharded cluster (docs/operations.md, The router)."""

from __future__ import annotations

import argparse
import sys
from functools import partial

from cronoq import telemetry
from cronoq.config import Config, ConfigError, EnvVariable, load_config
from cronoq.logs import configure, get_logger
from cronoq.process import serve_until_signalled
from cronoq.serving import command_line, preflight, refuse, run, secret_notes

log = get_logger("cronoq.router")


def parser() -> argparse.ArgumentParser:
    return command_line(
        "cronoq-router",
        "Run a cronoq router: the same gRPC and HTTP API as a server, forwarding each call to the leader of "
        "the shard that owns it and fanning listings out to every shard. It keeps no state: run as many "
        "replicas as you like behind one address.",
        "the cluster's configuration file (TOML: .toml, or YAML: .yaml, .yml), with its [[shards]]; the "
        "router listens on [router] grpc_addr and http_addr",
        "CRONOQ_CONFIG",
    )


def problems(config: Config) -> list[str]:
    """What a valid configuration still lacks to run a router. (Its listeners' safety is validation's:
    a non-loopback ``[router]`` address needs credentials, tokens or mTLS certificates, as a server's.)"""
    if not config.shards and not config.router.members and config.router.endpoint is None:
        return [
            "shards: a router needs the [[shards]] it routes to or, in front of a cluster without "
            "shards, [router] members: the cluster's servers, among which it finds the leader"
        ]
    return []


async def serve(config: Config) -> None:
    from .server import RouterServer

    router = RouterServer(config)
    await serve_until_signalled(router.start, router.shutdown)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    configure()
    if not args.config:
        print(
            "cronoq-router: --config (or CRONOQ_CONFIG) is required: the router needs the shard map",
            file=sys.stderr,
        )
        return 1
    invalid = f"cronoq-router: invalid configuration {args.config}:"
    needed: list[EnvVariable] = []  # --check names the secrets' variables instead of needing them
    try:
        config = load_config(args.config, router=True, needed=needed if args.check else None)
    except ConfigError as err:
        return refuse(invalid, err.problems)
    serving = [] if args.check else telemetry.problems(config.telemetry)  # the extra is where it runs
    failed = preflight("cronoq-router", invalid, config, problems(config) + serving, router=True)
    if failed is not None:
        return failed
    if args.check:
        if config.shards:
            print(
                f"configuration ok: {len(config.shards)} shard(s): {', '.join(s.name for s in config.shards)}"
            )
        else:
            print(f"configuration ok: one unsharded cluster of {len(config.router.members)} member(s)")
        for note in secret_notes("cronoq-router", needed):
            print(f"note: {note}")
        return 0
    return run("cronoq-router", partial(serve, config))


if __name__ == "__main__":
    sys.exit(main())
