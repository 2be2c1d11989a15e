"""``cronoq-operator``: sets worker Deployments' replicas from their pools' desired capacity
(``CronoqWorkerScaler`` resources; ``docs/operator.md``)."""

from __future__ import annotations

import argparse
import asyncio
import os
import secrets
import socket
import ssl
import sys
from collections.abc import Mapping
from pathlib import Path
from urllib.parse import urlsplit

from cronoq.config import ConfigError, EnvVariable
from cronoq.logs import configure, get_logger
from cronoq.process import choose_event_loop, serve_until_signalled
from cronoq.serving import command_line, refuse, secret_notes

from .config import OperatorConfig, check_token_file, load_operator_config
from .kube import SERVICE_ACCOUNT, KubeApi, KubeTarget, in_cluster

log = get_logger("cronoq.operator")

CONFIG_ENV = "CRONOQ_OPERATOR_CONFIG"
# How long a stopping operator lets a round in progress finish before cancelling it.
STOP_GRACE_S = 5.0


def parser() -> argparse.ArgumentParser:
    p = command_line(
        "cronoq-operator",
        "Run the cronoq operator: for each CronoqWorkerScaler, read its pool's desired capacity from a "
        "configured cronoq server and set its Deployment's replicas to match.",
        "the operator's configuration file (TOML: .toml, or YAML: .yaml, .yml): its servers and their tokens",
        CONFIG_ENV,
    )
    p.add_argument(
        "--kube-api",
        metavar="URL",
        help="the Kubernetes API server (default: the cluster the pod runs in, from its service account)",
    )
    p.add_argument(
        "--kube-token-file",
        metavar="PATH",
        help="with --kube-api: a file holding the bearer token, read again for every request "
        "(default: no token, as behind kubectl proxy)",
    )
    p.add_argument(
        "--kube-ca",
        metavar="PATH",
        help="with --kube-api: the CA certificate that signed the API server's certificate "
        "(default: the system's CAs)",
    )
    return p


def kube_target(args: argparse.Namespace, env: Mapping[str, str]) -> KubeTarget:
    """The API server from the flags, or the pod's own; ValueError saying what is wrong."""
    if args.kube_api is None:
        if args.kube_token_file or args.kube_ca:
            raise ValueError("--kube-token-file and --kube-ca go with --kube-api")
        target = in_cluster(env)
        ca_source = f"{target.ca_file} (the service account's CA)"
    else:
        target = _explicit_target(args.kube_api, args.kube_token_file, args.kube_ca)
        ca_source = "--kube-ca"
    if target.ca_file is not None:
        try:
            ssl.create_default_context(cafile=str(target.ca_file))
        except (OSError, ssl.SSLError) as err:
            raise ValueError(
                f"{ca_source}: not a readable PEM CA certificate: {target.ca_file} ({err})"
            ) from None
    return target


def _explicit_target(url: str, token_file: str | None, ca_file: str | None) -> KubeTarget:
    try:
        parts = urlsplit(url)
        valid = parts.scheme in ("http", "https") and bool(parts.hostname) and parts.username is None
        parts.port  # noqa: B018 - raises ValueError for a port that is not a number in range
    except ValueError:
        valid = False
    if not valid:
        raise ValueError(f"--kube-api: expected an http:// or https:// URL (got {url!r})")
    if token_file is not None and (wrong := check_token_file(token_file)):
        raise ValueError(f"--kube-token-file: {wrong}")
    return KubeTarget(url, Path(token_file) if token_file else None, Path(ca_file) if ca_file else None)


def lease_namespace(config: OperatorConfig, env: Mapping[str, str], account: Path = SERVICE_ACCOUNT) -> str:
    """Where the leader-election Lease lives: ``lease_namespace``, else the operator's own namespace
    (``POD_NAMESPACE``, which the chart sets, or the service account's); ValueError outside a pod."""
    if config.lease_namespace:
        return config.lease_namespace
    if env.get("POD_NAMESPACE"):
        return env["POD_NAMESPACE"]
    try:
        return (account / "namespace").read_text(encoding="utf-8").strip()
    except OSError:
        raise ValueError(
            "lease_namespace: not set, and not running in a pod (no POD_NAMESPACE, no service-account "
            "namespace): set it to the namespace of the leader-election Lease"
        ) from None


def identity(env: Mapping[str, str]) -> str:
    """This replica's name in the Lease: its pod's (``POD_NAME``, else the host name) and a random part,
    so that two operators on one host never share it."""
    return f"{env.get('POD_NAME') or socket.gethostname()}_{secrets.token_hex(4)}"


async def serve(config: OperatorConfig, target: KubeTarget, namespace: str) -> None:
    """Watch, elect and reconcile until SIGTERM or SIGINT; the round in progress then gets
    :data:`STOP_GRACE_S`, and a leader releases its Lease."""
    from aiohttp import web

    from .election import Elector
    from .inventory import Inventory
    from .metrics import Stats, make_app
    from .reconciler import Reconciler
    from .servers import Servers

    kube = KubeApi(target)
    servers = Servers(config, os.environ)
    inventory = Inventory(kube, config.namespaces)
    elector = Elector(kube, namespace, config.lease_name, identity(os.environ), config.lease_duration_s)
    stats = Stats()
    stop = asyncio.Event()
    loops: list[asyncio.Task[None]] = []
    host, _, port = config.http_addr.rpartition(":")
    runner = web.AppRunner(
        make_app(stats, inventory, lambda: elector.is_leader, loops), access_log=None, handle_signals=False
    )

    async def start() -> None:
        await runner.setup()
        await web.TCPSite(runner, host.strip("[]"), int(port)).start()
        reconciler = Reconciler(config, kube, servers, inventory, elector, stats)
        loops.append(asyncio.create_task(reconciler.run(stop), name="reconcile"))
        loops.append(asyncio.create_task(inventory.run(), name="watch"))
        loops.append(asyncio.create_task(elector.run(), name="election"))
        log.info(
            "operator_started",
            kube_api=target.url,
            servers=[entry.name for entry in config.servers],
            namespaces=list(config.namespaces) or "all",
            interval_s=config.interval_s,
            http_addr=config.http_addr,
            lease=f"{namespace}/{config.lease_name}",
            identity=elector.identity,
        )

    async def halt() -> None:
        stop.set()
        try:
            await asyncio.wait_for(loops[0], STOP_GRACE_S)
        except TimeoutError:
            log.warning("operator_round_cancelled", grace_s=STOP_GRACE_S)
        finally:
            for task in loops[1:]:
                task.cancel()
            await asyncio.gather(*loops[1:], return_exceptions=True)
            await elector.release()
            await runner.cleanup()
            await servers.close()
            await kube.close()
        log.info("operator_stopped")

    await serve_until_signalled(start, halt)


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    configure()
    if not args.config:
        print(
            f"cronoq-operator: --config (or {CONFIG_ENV}) is required: it names the servers", file=sys.stderr
        )
        return 1
    needed: list[EnvVariable] = []  # --check names the tokens' variables instead of needing them
    try:
        config = load_operator_config(args.config, needed=needed if args.check else None)
    except ConfigError as err:
        return refuse(f"cronoq-operator: invalid configuration {args.config}:", err.problems)
    if args.check:
        print(
            f"configuration ok: {len(config.servers)} server(s): {', '.join(e.name for e in config.servers)}"
        )
        for note in secret_notes("cronoq-operator", needed):
            print(f"note: {note}")
        return 0
    try:
        target = kube_target(args, os.environ)
        namespace = lease_namespace(config, os.environ)
        loop = choose_event_loop()
    except ValueError as err:
        print(f"cronoq-operator: {err}", file=sys.stderr)
        return 1
    try:
        loop.run(serve(config, target, namespace))
    except OSError as err:
        print(f"cronoq-operator: cannot listen on http_addr {config.http_addr}: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
