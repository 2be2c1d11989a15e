"""``cronoq-server``: one member of one shard (with no ``[[shards]]``, the whole cluster)."""

from __future__ import annotations

import argparse
import os
import sys
from functools import partial
from importlib import resources

from cronoq import telemetry
from cronoq.config import Config, ConfigError, EnvVariable, default_config, load_config, validate_config
from cronoq.logs import configure, get_logger
from cronoq.process import serve_until_signalled
from cronoq.serving import command_line, notes, preflight, refuse, run, secret_notes, server_problems

log = get_logger("cronoq.server")


def proto_text() -> str:
    """The embedded cronoq.v1 contract, as shipped with the package."""
    return resources.files("cronoq.v1").joinpath("cronoq.proto").read_text(encoding="utf-8")


def parser() -> argparse.ArgumentParser:
    p = command_line(
        "cronoq-server",
        "Run a cronoq server: the scheduler, its gRPC API (Tasks, Workers, Admin, health) and the HTTP/JSON "
        "gateway. Without --config: one pool 'default', memory store, loopback only, no auth.",
        "configuration file: TOML (.toml) or YAML (.yaml, .yml), by its extension",
        "CRONOQ_CONFIG",
    )
    p.add_argument(
        "--print-proto",
        action="store_true",
        help="print the embedded cronoq.v1 .proto and exit (needs no configuration)",
    )
    p.add_argument(
        "--shard",
        metavar="NAME",
        # Empty counts as unset, as for CRONOQ_CONFIG: templates often export the variable blank.
        default=os.environ.get("CRONOQ_SHARD") or None,
        help="which [[shards]] entry this server serves (env CRONOQ_SHARD); "
        "--check without it checks the file for every shard",
    )
    p.add_argument(
        "--insecure-no-auth",
        action="store_true",
        help="allow serving a non-loopback address without credentials (trusted networks only)",
    )
    return p


def read_config(args: argparse.Namespace, needed: list[EnvVariable] | None = None) -> Config:
    """Read, apply the command-line overrides, then validate (so the overrides are checked too);
    ``needed`` as for :func:`load_config` (``--check``)."""
    if args.config:
        return load_config(
            args.config, shard=args.shard, insecure_no_auth=args.insecure_no_auth, needed=needed
        )
    return validate_config(default_config().with_overrides(args.shard, args.insecure_no_auth))


async def serve(config: Config) -> str | None:
    """Serve until signalled; why the server ended on its own, if it did (logged too)."""
    from .server import ShardServer

    server = ShardServer(config)
    try:
        await serve_until_signalled(server.start, server.shutdown, server.ended)
    except OSError as err:
        log.error("startup_failed", error=str(err))
        raise
    return server.failure


def _checked(config: Config) -> str:
    """What ``--check`` found good: the pools, and which shard's view (or every shard's) it checked."""
    pools = f"{len(config.pools)} pool(s): {', '.join(p.name for p in config.pools)}"
    if not config.shards:
        return f"configuration ok: {pools}"
    if config.server.shard is not None:
        return f"configuration ok for shard {config.server.shard}: {pools}"
    return f"configuration ok for every shard ({', '.join(s.name for s in config.shards)}): {pools}"


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    if args.print_proto:
        sys.stdout.write(proto_text())
        return 0
    configure()
    invalid = f"cronoq-server: invalid configuration{' ' + args.config if args.config else ''}:"
    # --check runs where the secrets often are not (CI): it names the variables instead of needing them.
    needed: list[EnvVariable] = []
    try:
        config = read_config(args, needed if args.check else None)
    except ConfigError as err:
        return refuse(invalid, err.problems)
    # One file serves every shard and CI checks it once: --check without a shard checks it for all of
    # them; only a server about to serve must know its shard.
    # The otel extra is the installation's that serves, not the file's: --check does not ask for it.
    serving = [] if args.check else server_problems(config) + telemetry.problems(config.telemetry)
    failed = preflight("cronoq-server", invalid, config, serving)
    if failed is not None:
        return failed
    if args.check:
        print(_checked(config))
        for note in notes(config) + secret_notes("cronoq-server", needed):
            print(f"note: {note}")
        return 0
    return run("cronoq-server", partial(serve, config))


if __name__ == "__main__":
    sys.exit(main())
