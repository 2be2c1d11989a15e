"""A Postgres server for the test suite, registered for every test by ``tests/conftest.py``.

``postgres_url`` (session scope) is ``DATABASE_URL`` when that is set, so CI can point the suite at a
managed server. Otherwise one throwaway server is started per test session: ``initdb`` into a temporary
directory (``--no-sync``: the data directory is created without fsync because it is thrown away, which
saves about a second), then ``pg_ctl start`` on a free loopback TCP port, with its unix socket inside
the same directory and ``fsync=on`` (benchmarks measure durable commits). The superuser ``cronoq`` has a
random password and every connection uses SCRAM authentication, so tests also exercise real
authentication failures. At the end the server is stopped (``pg_ctl stop -m fast``) and the directory
removed.

Postgres refuses to run as root. When the suite runs as root, ``initdb`` and ``pg_ctl`` are started as
an unprivileged user (``postgres`` when the machine has one, else ``nobody``) through util-linux's
``setpriv``, and the temporary directory is handed to that user; it is created under the system
temporary directory (``/tmp``), which that user can traverse. Not through :class:`subprocess.Popen`'s
``user``/``group`` arguments: with them Python must ``fork()`` rather than ``vfork()``, and a forked copy
of a test process whose gRPC threads are running runs gRPC's fork handlers before it execs, which
crashed ``initdb`` (SIGSEGV, "epoll_wait error: Bad file descriptor") once in a full run.

``pg_schema`` gives each test its own schema name and drops it afterwards (CASCADE), together with any
schema whose name starts with it, so a test that needs two schemas appends a suffix to the one it got.
Without server binaries or ``DATABASE_URL`` the tests that use these fixtures are skipped.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import secrets
import shlex
import shutil
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import psycopg
import pytest
from psycopg import sql

USER = "cronoq"
START_TIMEOUT = 30.0


@dataclass(frozen=True, slots=True)
class PostgresServer:
    """A server the tests can use. ``local`` is True when this process started it, so its backends are
    processes this process may signal (e.g. SIGSTOP one to simulate a hung session)."""

    url: str
    local: bool


def _binary(name: str) -> str | None:
    """``name`` from PATH, else from the newest Debian-style ``/usr/lib/postgresql/*/bin``."""
    found = shutil.which(name)
    if found:
        return found
    candidates = sorted(glob.glob(f"/usr/lib/postgresql/*/bin/{name}"), key=lambda p: int(p.split("/")[4]))
    return candidates[-1] if candidates else None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _unprivileged() -> pwd.struct_passwd | None:
    """The account to run Postgres as when this process is root (None: run as ourselves)."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise RuntimeError("running as root and neither a 'postgres' nor a 'nobody' account exists")


class LocalPostgres:
    """One initdb'd data directory and the server running on it (the chaos suite restarts it:
    :meth:`stop_server`, :meth:`start_again`)."""

    def __init__(self, initdb: str, pg_ctl: str) -> None:
        self.initdb = initdb
        self.pg_ctl = pg_ctl
        self.account = _unprivileged()
        self.root = Path(tempfile.mkdtemp(prefix="cronoq-pg-"))
        self.data = self.root / "data"
        self.sockets = self.root / "sock"
        self.log = self.root / "server.log"
        self.password = secrets.token_hex(16)
        self.port = 0

    def _run(self, *args: str) -> None:
        """Run a Postgres tool as the account that owns the cluster; raise with its output on failure."""
        if self.account is not None:
            uid, gid = self.account.pw_uid, self.account.pw_gid
            args = ("setpriv", f"--reuid={uid}", f"--regid={gid}", "--clear-groups", "--", *args)
        env = {k: v for k, v in os.environ.items() if not k.startswith("PG")}
        done = subprocess.run(
            args, cwd=self.root, env=env, capture_output=True, text=True, timeout=START_TIMEOUT + 10
        )
        if done.returncode != 0:
            raise RuntimeError(
                f"{Path(args[0]).name} failed ({done.returncode}): {done.stderr or done.stdout}"
            )

    def init(self) -> None:
        self.sockets.mkdir()
        pwfile = self.root / "pw"
        pwfile.write_text(self.password + "\n")
        if self.account is not None:
            for path in (self.root, self.sockets, pwfile):
                os.chown(path, self.account.pw_uid, self.account.pw_gid)
        self._run(
            self.initdb,
            "--no-sync",
            "--no-instructions",
            "--auth=scram-sha-256",
            f"--pwfile={pwfile}",
            f"--username={USER}",
            "--encoding=UTF8",
            "--locale=C",
            f"--pgdata={self.data}",
        )
        pwfile.unlink()

    def start(self) -> None:
        """Start on a free port; a port taken between choosing and binding it is retried."""
        for attempt in range(3):
            self.port = _free_port()
            try:
                self._pg_ctl_start()
            except RuntimeError:
                log = self.log.read_text(errors="replace") if self.log.exists() else ""
                if attempt < 2 and "could not bind" in log:
                    continue
                raise RuntimeError(f"postgres did not start; server log:\n{log[-4000:]}") from None
            self._wait_until_ready()
            return

    def _pg_ctl_start(self) -> None:
        options = " ".join(
            [
                f"-p {self.port}",
                "-c listen_addresses=127.0.0.1",
                f"-c unix_socket_directories={shlex.quote(str(self.sockets))}",
                "-c fsync=on",
                "-c max_connections=200",
            ]
        )
        self._run(
            self.pg_ctl, "start", "--wait", f"--timeout={int(START_TIMEOUT)}",
            f"--pgdata={self.data}", f"--log={self.log}", f"--options={options}",
        )  # fmt: skip

    def stop_server(self, mode: str) -> None:
        """``pg_ctl stop`` in ``mode``: ``fast`` (a clean shutdown) or ``immediate`` (a crash: recovery
        replays the WAL at the next start). The data stays, for :meth:`start_again`."""
        self._run(self.pg_ctl, "stop", "--wait", f"--mode={mode}", f"--pgdata={self.data}")

    def start_again(self) -> None:
        """Start a stopped server on the port it had (clients reconnect to the same address)."""
        self._pg_ctl_start()
        self._wait_until_ready()

    @property
    def url(self) -> str:
        return f"postgresql://{USER}:{self.password}@127.0.0.1:{self.port}/postgres"

    def _wait_until_ready(self) -> None:
        """pg_ctl --wait returns once the postmaster reports ready; confirm with a real login."""
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                with psycopg.connect(self.url, connect_timeout=2):
                    return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.05)

    def stop(self) -> None:
        with contextlib.suppress(RuntimeError, subprocess.TimeoutExpired):
            if (self.data / "postmaster.pid").exists():
                self._run(self.pg_ctl, "stop", "--wait", "--mode=fast", f"--pgdata={self.data}")
        shutil.rmtree(self.root, ignore_errors=True)


def server_programs() -> tuple[str, str]:
    """``initdb`` and ``pg_ctl``; LookupError, saying where they were looked for and how to install
    them, when either is missing."""
    initdb, pg_ctl = _binary("initdb"), _binary("pg_ctl")
    if initdb is None or pg_ctl is None:
        raise LookupError(
            "the Postgres server programs (initdb, pg_ctl) are neither on PATH nor in "
            "/usr/lib/postgresql/*/bin: install them (Debian, Ubuntu: apt-get install postgresql)"
        )
    return initdb, pg_ctl


@contextlib.contextmanager
def local_postgres(initdb: str, pg_ctl: str) -> Iterator[LocalPostgres]:
    """A server on a new data directory for the duration of the block; stopped and its directory
    removed afterwards."""
    cluster = LocalPostgres(initdb, pg_ctl)
    try:
        cluster.init()
        cluster.start()
        yield cluster
    finally:
        cluster.stop()


@contextlib.contextmanager
def throwaway_postgres(initdb: str, pg_ctl: str) -> Iterator[str]:
    """:func:`local_postgres`'s URL. Also what ``make cluster`` runs (``deploy/cluster.py``)."""
    with local_postgres(initdb, pg_ctl) as cluster:
        yield cluster.url


@contextlib.contextmanager
def running_postgres() -> Iterator[PostgresServer]:
    """``DATABASE_URL`` if set, else a :func:`throwaway_postgres` for the duration of the block. Also
    used by ``bench/pg_commit.py``. Raises LookupError when neither is available."""
    external = os.environ.get("DATABASE_URL")
    if external:
        yield PostgresServer(external, local=False)
        return
    try:
        programs = server_programs()
    except LookupError as err:
        raise LookupError(f"no Postgres: DATABASE_URL is not set, and {err}") from None
    with throwaway_postgres(*programs) as url:
        yield PostgresServer(url, local=True)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    with contextlib.ExitStack() as stack:
        try:
            server = stack.enter_context(running_postgres())
        except LookupError as err:
            pytest.skip(str(err))
        yield server


@pytest.fixture(scope="session")
def postgres_url(postgres_server: PostgresServer) -> str:
    """A libpq URL of a server the tests may create schemas in."""
    return postgres_server.url


@pytest.fixture
def pg_schema(postgres_url: str) -> Iterator[str]:
    """A schema name no other test uses (not created: that is the store's job); afterwards it and every
    schema whose name starts with it are dropped."""
    name = f"cq_test_{uuid.uuid4().hex[:12]}"
    yield name
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("SET lock_timeout = '10s'")
        found = conn.execute(
            "SELECT nspname FROM pg_namespace WHERE starts_with(nspname, %s)", (name,)
        ).fetchall()
        for (schema,) in found:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(schema)))
