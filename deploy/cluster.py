"""``make cluster``: the Compose development cluster (``compose/``) on this machine, without Docker.

There is one description of the cluster, ``compose/compose.yaml`` with ``compose/cronoq.toml``, and this
reads it: which services run, each server's shard, the router, the workers and their replicas, the
tokens of ``compose/.env``, what Prometheus scrapes. Each cronoq service runs as a local process the way
the Compose tests run it (``tests/deploy/compose_run.py``: the image's programs are this checkout's,
the container's files the repository's, every ``host:port`` of the Compose network a loopback port),
``tests/deploy/test_compose.py`` starts the cluster with the functions below, and
``tests/integration/test_monitoring.py`` runs it whole (:func:`running`). So a shard, member, pool or
worker added to ``compose/`` is in ``make cluster`` too, with nothing else to edit; a service of an
image this module does not know how to run is refused by name rather than left out. Like ``bench/``,
this builds on the test suite's fixtures instead of keeping a copy of them.

What differs from ``docker compose up``, and why:

- Postgres is a throwaway server (``initdb`` into a temporary directory, as the test suite's), not the
  ``postgres`` image, and every server's ``DATABASE_URL`` is its address;
- Prometheus is the ``prometheus`` program of this machine (Debian's package), with the Compose
  configuration rewritten to the loopback addresses; without the program it is skipped, said so;
- Grafana is not run (there is no local Grafana to run): its dashboards are ``dashboards/*.json``;
- the router and Prometheus listen where Compose publishes them (127.0.0.1:7070, 7071 and 9090) unless
  a port is taken or ``--free-ports`` is given, everything else on free loopback ports;
- Ctrl-C (or SIGTERM) stops it all in the reverse of the start order: Prometheus, the workers (so that
  they finish before what they talk to goes), the router, the servers, then Postgres, each given its
  grace period; the processes run in their own process groups so that the terminal's SIGINT reaches
  only this one, which stops them in that order. Their logs and data are in
  one temporary directory, removed on exit.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import re
import shlex
import shutil
import signal
import socket
import sys
import tempfile
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from pathlib import Path, PurePosixPath
from types import FrameType
from typing import Any

import yaml

from tests.deploy.compose_image import Image
from tests.deploy.compose_model import COMPOSE_DIR, Project, Service
from tests.deploy.compose_run import Container, LocalProcess, Loopback, stop_all
from tests.ports import free_ports
from tests.postgres import server_programs, throwaway_postgres

CLUSTER_FILE = COMPOSE_DIR / "cronoq.toml"
GRPC_PORT, HTTP_PORT = 7070, 7071  # the image's two ports (its EXPOSE): gRPC, then HTTP
PROMETHEUS = "prometheus"  # the Prometheus service of compose.yaml
PROMETHEUS_PORT = 9090  # where Prometheus listens in its container (its default)
PROMETHEUS_PROGRAMS = ("prometheus", "/usr/bin/prometheus")
# The images of compose.yaml this module runs, and how: cronoq's as processes of this checkout;
# Postgres, Prometheus and Grafana as said in the module's docstring.
CRONOQ_IMAGE = "cronoq"
KNOWN_IMAGES = re.compile(r"(postgres|prom/prometheus|grafana/grafana(-oss)?):[\w.-]+")
START_TIMEOUT = 60.0


class ClusterError(Exception):
    """Why the cluster cannot start; said in one paragraph, without a traceback."""


# ------------------------------------------------------------------------------------------- services


def cronoq_services(project: Project) -> dict[str, Service]:
    """The services that run the cronoq image (servers, the router, workers); every other service must
    be one of :data:`KNOWN_IMAGES`, so none is silently left out."""
    found: dict[str, Service] = {}
    for name, service in project.services.items():
        if service.image == CRONOQ_IMAGE:
            found[name] = service
        elif not KNOWN_IMAGES.fullmatch(service.image or ""):
            raise ClusterError(
                f"compose.yaml: service {name} runs image {service.image!r}, which make cluster does not "
                "know how to run on this machine (deploy/cluster.py)"
            )
    return found


def servers_by_shard(project: Project) -> dict[str, list[str]]:
    """The cronoq servers (each told its shard by CRONOQ_SHARD), by shard."""
    found: dict[str, list[str]] = {}
    for name, service in cronoq_services(project).items():
        if "CRONOQ_SHARD" in service.environment:
            found.setdefault(service.environment["CRONOQ_SHARD"], []).append(name)
    return found


def is_worker(service: Service) -> bool:
    return "CRONOQ_POOL" in service.environment


def replicas(service: Service) -> int:
    return int(service.spec.get("deploy", {}).get("replicas", 1))


def start_order(services: dict[str, Service]) -> list[list[str]]:
    """Compose's start order: each wave once everything it depends on has started (and, where asked,
    is healthy); dependencies outside ``services`` (Postgres) are ready before any of them starts."""
    waves: list[list[str]] = []
    started: set[str] = set()
    while len(started) < len(services):
        wave = [
            name
            for name, s in services.items()
            if name not in started and all(d in started or d not in services for d in s.depends_on)
        ]
        if not wave:
            raise ClusterError(f"compose.yaml: a dependency cycle among {sorted(set(services) - started)}")
        waves.append(wave)
        started |= set(wave)
    return waves


# ------------------------------------------------------------------------------------------ addresses


def published_ports(project: Project) -> dict[tuple[str, int], int]:
    """``ports:`` of every service: (service, container port) -> the host port Compose publishes."""
    found: dict[tuple[str, int], int] = {}
    for name, service in project.services.items():
        for entry in service.spec.get("ports", []):
            *_, host, container = str(entry).split(":")
            found[(name, int(container.partition("/")[0]))] = int(host)
    return found


def _can_bind(port: int) -> bool:
    with socket.socket() as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the servers bind
        try:
            probe.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def allocate(project: Project, image: Image, *, published: bool) -> tuple[Loopback, list[str]]:
    """A loopback port for each port of each cronoq service and Prometheus, and the Compose network's
    aliases (each reaches the first service that carries it); with ``published``, the ports Compose
    publishes stay what they are where they are free. Also says which published ports were taken."""
    services = cronoq_services(project)
    aliases = {alias: name for name, s in reversed(services.items()) for alias in s.aliases}
    keys = [(name, port) for name in services for port in image.exposed]
    keys.append((PROMETHEUS, PROMETHEUS_PORT))
    wanted = published_ports(project) if published else {}
    notes: list[str] = []
    fixed: dict[tuple[str, int], int] = {}
    for key in keys:
        port = wanted.get(key)
        if port is not None and _can_bind(port):
            fixed[key] = port
        elif port is not None:
            notes.append(f"127.0.0.1:{port} (published for {key[0]}) is taken: a free port instead")
    free = iter(free_ports(len(keys) - len(fixed)))
    return Loopback({key: fixed.get(key) or next(free) for key in keys}, aliases), notes


def _up(url: str) -> bool:
    """Whether GET ``url`` answers 200 (False while nothing listens)."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status) == 200
    except (OSError, urllib.error.URLError):
        return False


# ------------------------------------------------------------------------------------------ processes


def local_processes(
    project: Project,
    image: Image,
    loopback: Loopback,
    scratch: Path,
    database_url: str,
    *,
    edit: Callable[[Path, str], str] | None = None,
) -> dict[str, list[LocalProcess]]:
    """Every cronoq service's processes (one per replica), not started, each with its files, volumes
    and log under ``scratch/<process>``. ``DATABASE_URL`` is ``database_url``; a worker is named after
    its process (in a container it would be its host name, which here all processes share); ``edit``
    is :meth:`Container.local`'s."""
    found: dict[str, list[LocalProcess]] = {}
    for name, service in cronoq_services(project).items():
        container = Container.of_service(project, image, service)
        count = replicas(service)
        found[name] = []
        for number in range(1, count + 1):
            process = name if count == 1 else f"{name}-{number}"
            overrides = {"DATABASE_URL": database_url} if "DATABASE_URL" in service.environment else {}
            if is_worker(service) and "CRONOQ_WORKER_NAME" not in service.environment:
                overrides["CRONOQ_WORKER_NAME"] = process
            local = container.local(loopback, scratch / process, overrides=overrides, edit=edit)
            local.name = process
            found[name].append(local)
    return found


def start_in_order(project: Project, processes: dict[str, list[LocalProcess]]) -> None:
    """Start the services wave by wave (:func:`start_order`), waiting for each one's healthcheck, as
    Compose's ``depends_on: condition: service_healthy`` does."""
    services = {name: project.services[name] for name in processes}
    for wave in start_order(services):
        for name in wave:
            for process in processes[name]:
                process.start()
        for name in wave:
            for process in processes[name]:
                if process.healthcheck is not None:
                    process.wait_healthy(partial(_up, _probe_url(process)), timeout=START_TIMEOUT)


def _probe_url(process: LocalProcess) -> str:
    """The URL the process's healthcheck asks, to poll cheaply before running the check itself."""
    assert process.healthcheck is not None
    found = re.search(r"http://[^'\"\s]+", " ".join(process.healthcheck))
    if found is None:
        raise ClusterError(f"{process.name}: its healthcheck asks no http:// URL: {process.healthcheck}")
    return found[0]


def _readyz(loopback: Loopback, server: str) -> str:
    return f"http://{loopback.address(server, HTTP_PORT)}/readyz"


def wait_for_leaders(
    project: Project,
    processes: dict[str, list[LocalProcess]],
    loopback: Loopback,
    timeout: float = START_TIMEOUT,
) -> None:
    """Until every shard has a leader (a server whose ``/readyz`` answers 200). A server is healthy as
    soon as it listens, leading or not, and a shard's first leader takes a moment to open its store:
    the commands printed afterwards must work at once."""
    deadline = time.monotonic() + timeout
    for shard, members in servers_by_shard(project).items():
        while not any(_up(_readyz(loopback, name)) for name in members):
            if time.monotonic() > deadline:
                logs = "".join(
                    f"\n----- {p.name} -----\n{p.logs()[-2000:]}" for m in members for p in processes[m]
                )
                raise ClusterError(
                    f"shard {shard}: none of {', '.join(members)} leads after {timeout:g} s:{logs}"
                )
            time.sleep(0.05)


def stop_in_order(project: Project, processes: dict[str, list[LocalProcess]]) -> None:
    """Stop the services in the reverse of their start order, each wave at once (SIGTERM, and SIGKILL
    after its grace), so that workers finish before the router and servers they talk to go."""
    services = {name: project.services[name] for name in processes}
    for wave in reversed(start_order(services)):
        stop_all(process for name in wave for process in processes[name])


# ----------------------------------------------------------------------------------------- Prometheus


def prometheus_program() -> str | None:
    for candidate in PROMETHEUS_PROGRAMS:
        found = shutil.which(candidate)
        if found:
            return found
    return None


def prometheus_process(
    project: Project,
    loopback: Loopback,
    scratch: Path,
    program: str,
    *,
    edit: Callable[[Path, str], str] | None = None,
) -> LocalProcess:
    """Compose's Prometheus as a local process: its configuration (the ``--config.file`` its entrypoint
    names) with every target a loopback address, every file it names (the metrics token's
    ``credentials_file``, ``rule_files``) the local file its container would see, and the metrics
    token written where the entrypoint writes it. ``edit`` changes the configuration and each rules
    file (given the repository's file and the text to write, it returns the text): the rules files are
    then copies under ``scratch``; without it Prometheus reads the repository's, as Compose mounts them
    (so that an edit there is picked up by a reload, ``kill -HUP``)."""
    service = project.services[PROMETHEUS]
    scratch.mkdir(parents=True, exist_ok=True)
    paths: dict[PurePosixPath, Path] = {}  # what the container sees where: a config, or a fresh volume
    for number, mount in enumerate(project.mounts(service)):
        if mount.source is None:
            (scratch / f"volume-{number}").mkdir()
        paths[mount.target] = mount.source or scratch / f"volume-{number}"
    entrypoint = " ".join(service.spec["entrypoint"])

    def flag(name: str) -> PurePosixPath:
        found = re.search(rf"--{re.escape(name)}=(\S+)", entrypoint)
        if found is None:
            raise ClusterError(f"compose.yaml: the {PROMETHEUS} entrypoint sets no --{name}")
        return PurePosixPath(found[1])

    def local(path: str, relative_to: PurePosixPath) -> str:
        target = relative_to / path  # an absolute path stays itself
        for mounted, host in sorted(paths.items(), key=lambda item: -len(str(item[0]))):
            if target == mounted or mounted in target.parents:
                return str(host / target.relative_to(mounted))
        raise ClusterError(f"{PROMETHEUS}: {path} is in none of its mounts in compose.yaml")

    config_path = flag("config.file")
    config_source = Path(local(str(config_path), PurePosixPath("/")))
    config: dict[str, Any] = yaml.safe_load(config_source.read_text())
    token = service.environment["CRONOQ_METRICS_TOKEN"]
    for job in config.get("scrape_configs", []):
        for group in job.get("static_configs", []):
            group["targets"] = [_target(loopback, target) for target in group["targets"]]
        credentials = job.get("authorization", {}).get("credentials_file")
        if credentials is not None:
            job["authorization"]["credentials_file"] = written = local(credentials, config_path.parent)
            _write_private(Path(written), token, scratch)
    if "rule_files" in config:
        rules = [Path(local(name, config_path.parent)) for name in config["rule_files"]]
        if edit is not None:
            for number, source in enumerate(rules):
                rules[number] = scratch / f"{number}-{source.name}"
                rules[number].write_text(edit(source, source.read_text()))
        config["rule_files"] = [str(path) for path in rules]
    rewritten = scratch / "prometheus.yml"
    text = yaml.safe_dump(config, sort_keys=False)
    rewritten.write_text(text if edit is None else edit(config_source, text))
    listen = loopback.address(PROMETHEUS, PROMETHEUS_PORT)
    argv = [
        program,
        f"--config.file={rewritten}",
        f"--storage.tsdb.path={local(str(flag('storage.tsdb.path')), PurePosixPath('/'))}",
        f"--web.listen-address={listen}",
    ]
    # Compose gives it no healthcheck; here one is what :meth:`LocalProcess.wait_healthy` waits for.
    ready = f"http://{listen}/-/ready"
    check = [sys.executable, "-c", f"import urllib.request; urllib.request.urlopen({ready!r}, timeout=2)"]
    return LocalProcess(PROMETHEUS, argv, {}, scratch, scratch / "output.log", check, {})


def _write_private(path: Path, text: str, scratch: Path) -> None:
    """Write a secret readable by its owner only from the start (the entrypoint's ``umask 077``), and
    only on a volume of this run: never over a file of the repository that a mount would show."""
    if not path.is_relative_to(scratch):
        raise ClusterError(
            f"{PROMETHEUS}: {path} is not on one of its volumes: the token is not written there"
        )
    descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(descriptor, "w") as file:
        file.write(text)


def _target(loopback: Loopback, target: str) -> str:
    """A scrape target of the Compose network as its loopback address; refused when it names no
    service this cluster runs (it would only ever be down)."""
    local = loopback.rewrite(target, PROMETHEUS)
    if local == target:
        raise ClusterError(f"{PROMETHEUS}: scrape target {target} is no cronoq service of compose.yaml")
    return local


# -------------------------------------------------------------------------------------------- cluster


@dataclass(slots=True)
class Cluster:
    """The running cluster: its processes by service, Prometheus (None when skipped), the addresses."""

    project: Project
    loopback: Loopback
    processes: dict[str, list[LocalProcess]]
    prometheus: LocalProcess | None
    database_url: str
    directory: Path

    def address(self, service: str, port: int) -> str:
        return self.loopback.address(service, port)

    def leads(self, server: str) -> bool:
        """Whether the server leads its shard now: its ``/readyz`` answers 200 (a standby's, 503)."""
        return _up(_readyz(self.loopback, server))

    def every_process(self) -> list[LocalProcess]:
        listed = [p for group in self.processes.values() for p in group]
        return listed if self.prometheus is None else [*listed, self.prometheus]


@contextlib.contextmanager
def running(
    *,
    published: bool = True,
    prometheus: str | None = None,
    edit: Callable[[Path, str], str] | None = None,
) -> Iterator[tuple[Cluster, list[str]]]:
    """The whole cluster, started and healthy, for the block; then stopped in order and its directory
    removed. ``prometheus`` is the program to run (None: no Prometheus). Also yields notes for the
    user (ports that were taken). ``edit`` changes, for this run only, the configuration files it
    writes: the cronoq ``.toml`` files (:func:`local_processes`), Prometheus's configuration and its
    rules files (:func:`prometheus_process`); ``make cluster`` edits nothing, and
    ``tests/integration/test_monitoring.py`` shortens the scrape interval and the alerts' durations."""
    project = Project.load()
    image = Image.read()
    try:
        programs = server_programs()
    except LookupError as err:
        raise ClusterError(f"cannot start Postgres: {err}") from None
    loopback, notes = allocate(project, image, published=published)  # refuses what it cannot run
    directory = Path(tempfile.mkdtemp(prefix="cronoq-cluster-"))
    try:
        scraper = None
        if prometheus is not None:
            scraper = prometheus_process(project, loopback, directory / PROMETHEUS, prometheus, edit=edit)
        with throwaway_postgres(*programs) as database_url:
            processes = local_processes(project, image, loopback, directory, database_url, edit=edit)
            try:
                start_in_order(project, processes)
                wait_for_leaders(project, processes, loopback)
                if scraper is not None:  # last: its first scrape of each target finds it up
                    scraper.start()
                    scraper.wait_healthy(partial(_up, _probe_url(scraper)), timeout=START_TIMEOUT)
                yield Cluster(project, loopback, processes, scraper, database_url, directory), notes
            finally:  # in the reverse order
                if scraper is not None:
                    stop_all([scraper])
                stop_in_order(project, processes)
    finally:
        shutil.rmtree(directory, ignore_errors=True)


# ----------------------------------------------------------------------------------------- the banner


def router_service(project: Project) -> str:
    """The service that runs ``cronoq-router``: the front door."""
    return next(name for name, s in cronoq_services(project).items() if _is_router(s))


def tokens_by_role(cluster: Cluster) -> dict[str, str]:
    """Each role's token as the router reads it: cronoq.toml names the variable, compose.yaml (from
    compose/.env) sets it."""
    env = cluster.project.services[router_service(cluster.project)].environment
    config = tomllib.loads(CLUSTER_FILE.read_text())
    return {entry["role"]: env[entry["token_env"]] for entry in config["auth"]["tokens"]}


def _is_router(service: Service) -> bool:
    entrypoint = service.spec.get("entrypoint") or [""]
    return PurePosixPath(entrypoint[0]).name == "cronoq-router"


def banner(cluster: Cluster, notes: list[str], skipped: str | None) -> str:
    """Every address, then the commands to try, all through the router."""
    services = cronoq_services(cluster.project)
    router = router_service(cluster.project)
    grpc, http = cluster.address(router, GRPC_PORT), cluster.address(router, HTTP_PORT)
    lines = ["", "cronoq cluster (compose/compose.yaml on this machine) is up. Ctrl-C stops everything.", ""]
    (front,) = cluster.processes[router]
    lines.append(f"  {router:<18} gRPC {grpc:<17} HTTP http://{http:<17} {_pid(front)}, the front door")
    for shard, members in servers_by_shard(cluster.project).items():
        for name in members:
            (process,) = cluster.processes[name]
            role = "leads" if cluster.leads(name) else "stands by"
            lines.append(
                f"  {name:<18} gRPC {cluster.address(name, GRPC_PORT):<17} "
                f"HTTP http://{cluster.address(name, HTTP_PORT):<17} shard {shard}, {_pid(process)}, {role}"
            )
    for name, service in services.items():
        if is_worker(service):
            for process in cluster.processes[name]:
                pool = service.environment["CRONOQ_POOL"]
                lines.append(f"  {process.name:<18} pool {pool}, {_pid(process)}, through the router")
    if cluster.prometheus is not None:
        lines.append(f"  {PROMETHEUS:<18} http://{cluster.address(PROMETHEUS, PROMETHEUS_PORT)}")
    else:
        lines.append(f"  {PROMETHEUS:<18} skipped: {skipped}")
    lines.append(f"  {'postgres':<18} {_without_password(cluster.database_url)} (throwaway)")
    lines.append(
        f"  {'grafana':<18} not run here (docker compose runs it); the dashboards are dashboards/*.json"
    )
    lines += [f"  note: {note}" for note in notes]
    tokens = tokens_by_role(cluster)
    cli = os.path.relpath(Path(sys.executable).parent / "cronoq")
    pools = [pool["name"] for pool in tomllib.loads(CLUSTER_FILE.read_text())["pools"]]
    lines += [
        "",
        "With the cronoq CLI, through the router (development tokens, from compose/.env):",
        f"  export CRONOQ_TARGET={grpc} CRONOQ_TOKEN={tokens['client']}",
        *(
            "  " + shlex.join([cli, "submit", "--pool", pool, "--json", f'{{"hello": "{pool}"}}', "--wait"])
            for pool in pools
        ),
        f"  {shlex.join([cli, 'list'])}",
        f"  CRONOQ_TOKEN={tokens['metrics']} {shlex.join([cli, 'top'])}",
        "",
        "Over HTTP:",
        "  curl -s -X POST "
        + shlex.join(
            [
                f"http://{http}/v1/tasks",
                "-H",
                f"authorization: Bearer {tokens['client']}",
                "-H",
                "content-type: application/json",
                "-d",
                f'{{"pool": "{pools[0]}", "payload": {{"hello": "world"}}, "wait": true}}',
            ]
        ),
        "",
        f"Logs: {cluster.directory}/<process>/output.log (removed on exit)",
        "",
    ]
    return "\n".join(lines)


def _pid(process: LocalProcess) -> str:
    """Which process it is, to ``kill`` (a failover): every server's command line is the same."""
    assert process.proc is not None
    return f"pid {process.proc.pid}"


def _without_password(url: str) -> str:
    return re.sub(r"(//[^:/@]+):[^@]*@", r"\1@", url)


# ---------------------------------------------------------------------------------------------- main


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="make cluster",
        description="Run compose/'s multi-shard development cluster on this machine, without Docker: "
        "Postgres, two shards of a leader and a standby, the router, a worker per pool and Prometheus. "
        "Ctrl-C stops everything.",
    )
    p.add_argument(
        "--free-ports",
        action="store_true",
        help="listen on free loopback ports only, not on those compose.yaml publishes (7070, 7071, 9090)",
    )
    p.add_argument("--no-prometheus", action="store_true", help="do not run Prometheus")
    return p


def _interrupted(signum: int, frame: FrameType | None) -> None:
    """Stop everything, once: a second Ctrl-C must not cut the stop short and leave processes behind."""
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    # Straight to the file descriptor: a print() here could interrupt one in progress, and fail.
    os.write(
        sys.stdout.fileno(),
        b"\nmake cluster: stopping everything, in the reverse of the start order\n",
    )
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    program = None if args.no_prometheus else prometheus_program()
    skipped = (
        "--no-prometheus"
        if args.no_prometheus
        else "no prometheus program on PATH or in /usr/bin (Debian, Ubuntu: apt-get install prometheus)"
    )
    previous = {sig: signal.signal(sig, _interrupted) for sig in (signal.SIGINT, signal.SIGTERM)}
    print("make cluster: starting Postgres, the servers, the router, the workers ...", flush=True)
    try:
        with running(published=not args.free_ports, prometheus=program) as (cluster, notes):
            print(banner(cluster, notes, skipped), flush=True)
            watch(cluster)
    except ClusterError as err:
        print(f"make cluster: {err}", file=sys.stderr)
        return 1
    except AssertionError as err:  # a process that exited or never became healthy, with its log
        print(f"make cluster: cannot start: {err}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    print("make cluster: stopped", flush=True)
    return 0


def watch(cluster: Cluster) -> None:
    """Until interrupted: say when a process ends on its own (the rest keeps running, as in Compose
    with a container that stopped, so a failover can be watched)."""
    reported: set[str] = set()
    while True:
        for process in cluster.every_process():
            code = None if process.proc is None else process.proc.poll()
            if code is not None and process.name not in reported:
                reported.add(process.name)
                print(
                    f"make cluster: {process.name} exited with status {code}; its log: {process.log}",
                    flush=True,
                )
        time.sleep(0.5)


if __name__ == "__main__":
    sys.exit(main())
