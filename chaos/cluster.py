"""The cluster a chaos run hits: ``make cluster``'s topology, with the changes a run needs.

It is built with ``deploy/cluster.py``'s functions from ``compose/compose.yaml`` and
``compose/cronoq.toml`` (so a server, shard or worker added there is in the chaos run too), with
these differences, and only these:

- each shard's servers reach Postgres through a link proxy of their own (:mod:`chaos.proxy`);
- the workers are :mod:`chaos.worker` (the example worker's settings, plus a history file);
- the pools' ``lease_ttl_s`` is 5 s (Compose's 30 and 120 s would make a paused worker's task wait
  minutes) and their retries back off 0.2 to 1 s;
- Postgres is a :class:`tests.postgres.LocalPostgres`, which a fault restarts on its port;
- beside it, where the machine can mount a tmpfs (root), one more cluster: a server on the SQLite store
  in a 32 MiB tmpfs, the ``fill-disk`` fault's target, with its own pool ``disk`` and worker. A
  single server, so that its faults (a full disk, a crash, a pause) are the SQLite store's alone;
  standby takeover on SQLite is covered by ``tests/integration/test_sqlite_store.py``.

Every process can also run from another source tree (``source``: a directory holding a ``cronoq``
package, put first on ``PYTHONPATH``), which is how a deliberately broken build is run
(:mod:`chaos.broken`).
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import sqlite3
import subprocess
import sys
import time
import tomllib
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from deploy.cluster import (
    CLUSTER_FILE,
    GRPC_PORT,
    HTTP_PORT,
    START_TIMEOUT,
    Cluster,
    allocate,
    is_worker,
    local_processes,
    router_service,
    servers_by_shard,
    start_in_order,
    stop_in_order,
    tokens_by_role,
    wait_for_leaders,
)
from tests.deploy.compose_image import REPO, Image
from tests.deploy.compose_model import Project
from tests.deploy.compose_run import LocalProcess, stop_all
from tests.integration.helpers import toml_table
from tests.ports import free_ports
from tests.postgres import LocalPostgres, local_postgres, server_programs

from .proxy import Proxies

LEASE_TTL_S = 5.0
MAX_ATTEMPTS = 4
POOL_SETTINGS = (
    f"lease_ttl_s = {LEASE_TTL_S:g}\n"
    f"retry = {{ max_attempts = {MAX_ATTEMPTS}, initial_backoff_s = 0.2, multiplier = 2.0, max_backoff_s = 1.0 }}"
)
DISK_SHARD, DISK_POOL, DISK_WORKER, DISK_SERVER = "disk", "disk", "worker-disk", "cronoq-disk"
DISK_SHARD_NUMBER = 9  # above any shard of compose/cronoq.toml: its task ids never meet theirs
TMPFS_SIZE = "32m"


def chaos_settings(source: Path, text: str) -> str:
    """compose/cronoq.toml as the run reads it: every pool's lease TTL and retries replaced."""
    if source != CLUSTER_FILE:
        return text
    edited, count = re.subn(r"(?m)^lease_ttl_s = [\d.]+$", POOL_SETTINGS, text)
    pools = len(tomllib.loads(text)["pools"])
    if count != pools:
        raise RuntimeError(
            f"{source}: found lease_ttl_s in {count} of its {pools} pools; chaos needs it in each"
        )
    return edited


@dataclass(slots=True)
class Disk:
    """The SQLite server's tmpfs, or why there is none."""

    mount: Path | None
    why_not: str = ""
    filler: Path | None = None
    reader: sqlite3.Connection | None = None

    def fill(self, leave: int) -> None:
        """Fill the file system but for ``leave`` bytes, with the store's WAL emptied first (a checkpoint
        that truncates it, as ``sqlite3`` run by an operator may do) and a reader holding a snapshot, as
        an online backup (``sqlite3 .backup``) does, so that the WAL cannot start over: the server's next
        commits must grow it. Otherwise a WAL that once grew is written over in place, and a full disk
        refuses nothing (so it was in a 10-minute run before this). Blocks up to 5 s on SQLite's locks."""
        assert self.mount is not None
        self.reader = sqlite3.connect(
            self.mount / "disk.db", timeout=5, isolation_level=None, check_same_thread=False
        )
        with contextlib.suppress(sqlite3.OperationalError):  # busy: the WAL stays as long as it is
            self.reader.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
        self.reader.execute("BEGIN")
        self.reader.execute("SELECT count(*) FROM cronoq_tasks").fetchone()
        self.filler = self.mount / "filler"
        stats = os.statvfs(self.mount)
        size = max(stats.f_bavail * stats.f_frsize - leave, 0)
        descriptor = os.open(self.filler, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            with contextlib.suppress(OSError):  # full already: nothing more to take
                os.posix_fallocate(descriptor, 0, size)
        finally:
            os.close(descriptor)

    def free(self) -> None:
        if self.filler is not None:
            self.filler.unlink(missing_ok=True)
        if self.reader is not None:
            self.reader.close()
            self.reader = None


@dataclass(slots=True)
class ChaosCluster:
    """The running processes by name, what each is, and the means to hurt them."""

    base: Cluster
    postgres: LocalPostgres
    proxies: Proxies
    disk: Disk
    processes: dict[str, LocalProcess]
    shard_of_server: dict[str, str]
    pool_of_worker: dict[str, str]
    shard_of_pool: dict[str, str]
    router: str
    tokens: dict[str, str]
    history_dir: Path
    addresses: dict[str, tuple[str, str]]  # each server's and the router's gRPC and HTTP host:port
    shard_numbers: dict[str, int]

    def grpc(self, server: str) -> str:
        return self.addresses[server][0]

    def http(self, server: str) -> str:
        return self.addresses[server][1]

    def pid(self, name: str) -> int | None:
        proc = self.processes[name].proc
        return None if proc is None else proc.pid

    def kill(self, name: str) -> None:
        """SIGKILL, and wait for the process to be gone (as a crash: nothing is flushed)."""
        proc = self.processes[name].proc
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait(10)

    def signal(self, name: str, sig: signal.Signals) -> None:
        proc = self.processes[name].proc
        if proc is not None and proc.poll() is None:
            proc.send_signal(sig)

    def start(self, name: str) -> None:
        self.processes[name].start()

    def exited(self, name: str) -> int | None:
        proc = self.processes[name].proc
        return None if proc is None else proc.poll()

    def resume_all(self) -> None:
        """SIGCONT to every process: a stopped one would sleep through its SIGTERM."""
        for name in self.processes:
            self.signal(name, signal.SIGCONT)


@contextlib.contextmanager
def running(directory: Path, seed: int, source: Path | None = None) -> Iterator[ChaosCluster]:
    """The cluster, started with every shard led, for the block; then stopped (workers first) and the
    tmpfs unmounted."""
    project = Project.load()
    image = Image.read()
    loopback, _ = allocate(project, image, published=False)
    shards = servers_by_shard(project)
    history_dir = directory / "history"
    history_dir.mkdir(parents=True)
    try:
        programs = server_programs()
    except LookupError as err:
        raise RuntimeError(f"cannot start Postgres: {err}") from None
    with local_postgres(*programs) as postgres, tmpfs(directory / "disk") as disk:
        proxies = Proxies(("127.0.0.1", postgres.port), [*shards, DISK_SHARD], seed)
        try:
            processes = local_processes(
                project, image, loopback, directory, postgres.url, edit=chaos_settings
            )
            base = Cluster(project, loopback, processes, None, postgres.url, directory)
            tokens = tokens_by_role(base)
            shard_of_server = {server: shard for shard, members in shards.items() for server in members}
            pool_of_worker: dict[str, str] = {}
            for service, group in processes.items():
                for process in group:
                    if process.name in shard_of_server:
                        port = proxies.port(shard_of_server[process.name])
                        process.env["DATABASE_URL"] = re.sub(r":\d+/", f":{port}/", postgres.url, count=1)
                    elif is_worker(project.services[service]):
                        pool_of_worker[process.name] = process.env["CRONOQ_POOL"]
                        _make_chaos_worker(process, history_dir)
                    _run_from(process, source)
            config = tomllib.loads(chaos_settings(CLUSTER_FILE, CLUSTER_FILE.read_text()))
            shard_of_pool = {pool: entry["name"] for entry in config["shards"] for pool in entry["pools"]}
            shard_numbers = {entry["name"]: int(entry["number"]) for entry in config["shards"]}
            by_name = {p.name: p for group in processes.values() for p in group}
            router = router_service(project)
            addresses = {
                name: (base.address(name, GRPC_PORT), base.address(name, HTTP_PORT))
                for name in [*shard_of_server, router]
            }
            extra, disk_ports = _sqlite_cluster(directory, disk, tokens, history_dir, source)
            if extra:
                addresses[DISK_SERVER] = disk_ports
                shard_of_server[DISK_SERVER] = DISK_SHARD
                pool_of_worker[DISK_WORKER] = DISK_POOL
                shard_of_pool[DISK_POOL] = DISK_SHARD
                shard_numbers[DISK_SHARD] = DISK_SHARD_NUMBER
                by_name.update({p.name: p for p in extra})
            cluster = ChaosCluster(
                base, postgres, proxies, disk, by_name, shard_of_server, pool_of_worker, shard_of_pool,
                router, tokens, history_dir, addresses, shard_numbers,
            )  # fmt: skip
            try:
                start_in_order(project, processes)
                wait_for_leaders(project, processes, loopback)
                for process in extra:
                    process.start()
                if extra:
                    _wait_leading(extra[0], cluster.http(DISK_SERVER))
                yield cluster
            finally:
                cluster.resume_all()
                disk.free()
                for link in proxies.links:
                    proxies.heal(link)
                stop_all([p for p in extra if p.name == DISK_WORKER])
                stop_in_order(project, processes)
                stop_all(extra)
        finally:
            proxies.close()


def _wait_leading(process: LocalProcess, http: str) -> None:
    deadline = time.monotonic() + START_TIMEOUT
    while True:
        with (
            contextlib.suppress(OSError),
            urllib.request.urlopen(f"http://{http}/readyz", timeout=2) as answer,
        ):
            if answer.status == 200:
                return
        assert process.proc is not None and process.proc.poll() is None, (
            f"{process.name} exited:\n{process.logs()}"
        )
        assert time.monotonic() < deadline, (
            f"{process.name} does not lead after {START_TIMEOUT} s:\n{process.logs()}"
        )
        time.sleep(0.05)


def _make_chaos_worker(process: LocalProcess, history_dir: Path) -> None:
    """The example worker's process, running :mod:`chaos.worker` instead, its records to a file of its
    own (appended to across restarts)."""
    process.argv = [sys.executable, "-m", "chaos.worker"]
    process.env["CHAOS_HISTORY"] = str(history_dir / f"{process.name}.jsonl")


def _run_from(process: LocalProcess, source: Path | None) -> None:
    """``source`` first on the path (the cronoq package it holds shadows the installed one), then this
    checkout (for :mod:`chaos` itself). Every process also writes its log unbuffered, so that a killed
    one loses no line, and the Python stack of every thread when it crashes (``faulthandler``, on
    SIGSEGV, SIGABRT, SIGBUS, SIGILL and SIGFPE): a crash must say where it happened."""
    process.env["PYTHONPATH"] = os.pathsep.join([*([str(source)] if source else []), str(REPO)])
    process.env["PYTHONUNBUFFERED"] = "1"
    process.env["PYTHONFAULTHANDLER"] = "1"


@contextlib.contextmanager
def tmpfs(path: Path) -> Iterator[Disk]:
    """A tmpfs of :data:`TMPFS_SIZE` mounted at ``path`` for the block, or a Disk saying why not."""
    if os.geteuid() != 0:
        yield Disk(None, "not run: mounting a tmpfs needs root")
        return
    path.mkdir(parents=True, exist_ok=True)
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={TMPFS_SIZE},mode=0700", "tmpfs", str(path)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        yield Disk(None, f"not run: mount -t tmpfs failed: {(done.stderr or done.stdout).strip()}")
        return
    try:
        yield Disk(path)
    finally:
        subprocess.run(["umount", "--lazy", str(path)], check=False, capture_output=True)


def _sqlite_cluster(
    directory: Path, disk: Disk, tokens: dict[str, str], history_dir: Path, source: Path | None
) -> tuple[list[LocalProcess], tuple[str, str]]:
    """The SQLite server on the tmpfs and its worker (not started) and the server's addresses; none
    without a tmpfs."""
    mount = disk.mount
    if mount is None:
        return [], ("", "")
    grpc_port, http_port = free_ports(2)
    scratch = directory / DISK_SERVER
    scratch.mkdir()
    compose = tomllib.loads(CLUSTER_FILE.read_text())
    env_of_role = {entry["role"]: entry["token_env"] for entry in compose["auth"]["tokens"]}
    config = scratch / "cronoq.toml"
    config.write_text(
        toml_table(
            "server",
            grpc_addr=f"127.0.0.1:{grpc_port}",
            http_addr=f"127.0.0.1:{http_port}",
            shutdown_grace_s=5,
        )
        + "".join(
            toml_table("[auth.tokens]", token_env=name, role=role) for role, name in env_of_role.items()
        )
        + toml_table("store", kind="sqlite", path=str(mount / "disk.db"))
        + toml_table("[pools]", name=DISK_POOL, max=16)
        + POOL_SETTINGS
        + "\n\n"
        + toml_table(
            "[shards]",
            name=DISK_SHARD,
            number=DISK_SHARD_NUMBER,
            pools=[DISK_POOL],
            endpoint=f"http://127.0.0.1:{grpc_port}",
        )
    )
    secrets = {name: tokens[role] for role, name in env_of_role.items()}
    program = str(Path(sys.executable).parent / "cronoq-server")
    server = LocalProcess(
        DISK_SERVER,
        [program, "--config", str(config)],
        {**os.environ, **secrets, "CRONOQ_SHARD": DISK_SHARD},
        scratch,
        scratch / "output.log",
        None,
        {},
    )
    worker_dir = directory / DISK_WORKER
    worker_dir.mkdir()
    worker = LocalProcess(
        DISK_WORKER,
        [],
        {
            **os.environ,
            "CRONOQ_TARGET": f"127.0.0.1:{grpc_port}",
            "CRONOQ_TOKEN": tokens["worker"],
            "CRONOQ_POOL": DISK_POOL,
            "CRONOQ_SLOTS": "4",
            "CRONOQ_WORKER_NAME": DISK_WORKER,
        },
        worker_dir,
        worker_dir / "output.log",
        None,
        {},
    )
    _make_chaos_worker(worker, history_dir)
    for process in (server, worker):
        _run_from(process, source)
    return [server, worker], (f"127.0.0.1:{grpc_port}", f"127.0.0.1:{http_port}")
