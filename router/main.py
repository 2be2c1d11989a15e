"""``cronoq-router``: the stateless front door of a sharded cluster (SPEC §2, §9)."""

from __future__ import annotations

import argparse
import os
import sys

from cronoq import __version__
from cronoq.config import Config, ConfigError, load_config
from cronoq.config.startup import preflight, refuse
from cronoq.logs import configure, get_logger
from cronoq.process import choose_event_loop, raise_open_file_limit, serve_until_signalled

log = get_logger("cronoq.router")


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="cronoq-router",
        description="Run a cronoq router: the same gRPC and HTTP API as a server, forwarding each call to "
        "the leader of the shard that owns it and fanning listings out to every shard. It keeps no state: "
        "run as many replicas as you like behind one address.",
    )
    p.add_argument("--version", action="version", version=f"cronoq-router {__version__}")
    p.add_argument(
        "-c",
        "--config",
        metavar="PATH",
        default=os.environ.get("CRONOQ_CONFIG"),
        help="the cluster's TOML configuration, with its [[shards]] (env CRONOQ_CONFIG); "
        "the router listens on [router] grpc_addr and http_addr",
    )
    p.add_argument(
        "--check",
        action="store_true",
        help="validate the configuration and the files it names, print every problem, exit 0 if valid "
        "and 1 if not",
    )
    return p


def problems(config: Config) -> list[str]:
    """What a valid configuration still lacks to run a router. (Its listeners' safety is validation's:
    a non-loopback ``[router]`` address needs credentials, tokens or mTLS certificates, as a server's.)"""
    if not config.shards:
        return ["shards: a router needs the [[shards]] it routes to"]
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
    try:
        config = load_config(args.config, router=True)
    except ConfigError as err:
        return refuse(invalid, err.problems)
    failed = preflight("cronoq-router", invalid, config, problems(config), router=True)
    if failed is not None:
        return failed
    if args.check:
        print(f"configuration ok: {len(config.shards)} shard(s): {', '.join(s.name for s in config.shards)}")
        return 0
    raise_open_file_limit()
    try:
        loop = choose_event_loop()
    except ValueError as err:
        return refuse("cronoq-router: cannot start:", [err])
    try:
        loop.run(serve(config))
    except OSError as err:
        print(f"cronoq-router: cannot start: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
