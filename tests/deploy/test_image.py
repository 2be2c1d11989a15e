"""The container image (``Dockerfile``, ``.dockerignore``, ``deploy/image/cronoq.toml``), without a
Docker engine: linted, checked against the shared contract and the project's metadata, its build
context rebuilt and turned into the wheel the image installs, its entrypoint run here with the
image's configuration and environment (:mod:`.compose_run`), and its database client's certificate
checks run against a TLS listener."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import ssl
import struct
import subprocess
import sys
import threading
import time
import tomllib
import urllib.error
import urllib.request
import zipfile
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import pytest

from shard.store.base import StoreError
from shard.store.postgres import PostgresStore
from tests.pki import issue, new_ca

from .compose_image import REPO, VENV_BIN, DockerIgnore, Image, local_program, stage_context
from .compose_run import Container, LocalProcess, Loopback

PYPROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())
SCRIPTS: dict[str, str] = PYPROJECT["project"]["scripts"]
TOKENS = {
    name: f"image-test-{name.lower()}-0123456789"
    for name in ("CRONOQ_CLIENT_TOKEN", "CRONOQ_WORKER_TOKEN", "CRONOQ_METRICS_TOKEN", "CRONOQ_ADMIN_TOKEN")
}


@pytest.fixture(scope="module")
def image() -> Image:
    return Image.read()


@pytest.fixture(scope="module")
def wheel(image: Image, tmp_path_factory: pytest.TempPathFactory) -> zipfile.ZipFile:
    """The wheel the build stage makes, built here from exactly what its COPY instructions take from the
    build context (so a file ``.dockerignore`` drops, or a folder no COPY names, is missing from it)."""
    root = tmp_path_factory.mktemp("build-stage")
    build = image.stage("build")
    stage_context(image, build, root)
    (run,) = (i.args for i in build.all("RUN") if "pip wheel" in i.args)
    assert str(build.workdir()) in run.split(), "the build stage builds its WORKDIR into a wheel"
    out = root / "wheels"
    # With the engine left interpreted (CRONOQ_COMPILE=0): compiling it again would add most of a minute
    # to the suite and prove nothing more than test_the_image_ships_the_compiled_engine does.
    done = subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps", "--no-build-isolation",
         "--wheel-dir", str(out), str(root / build.workdir().relative_to("/"))],
        capture_output=True, text=True, timeout=120, env={**os.environ, **build.env, "CRONOQ_COMPILE": "0"},
    )  # fmt: skip
    assert done.returncode == 0, f"no wheel from what the build stage copies:\n{done.stdout}{done.stderr}"
    (found,) = out.glob("cronoq-*.whl")
    return zipfile.ZipFile(found)


def test_hadolint_passes_with_only_justified_ignores(hadolint: Path, tmp_path: Path) -> None:
    """No finding at any level (style included), with no configuration of ours that could hide one;
    each inline ignore is explained by the comment right above it."""
    config = tmp_path / "hadolint.yaml"
    config.write_text("failure-threshold: style\n")
    done = subprocess.run(
        [str(hadolint), "--config", str(config), "--no-color", str(REPO / "Dockerfile")],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    lines = (REPO / "Dockerfile").read_text().splitlines()
    for number, line in enumerate(lines):
        if line.startswith("# hadolint ignore="):
            above = lines[number - 1]
            assert above.startswith("# ") and "hadolint" not in above, f"line {number + 1} is not explained"


def test_hadolint_finds_what_it_should(hadolint: Path, tmp_path: Path) -> None:
    """The check above is not vacuous: the same Dockerfile without its ignore pragmas is flagged."""
    stripped = tmp_path / "Dockerfile"
    stripped.write_text(
        "".join(
            line
            for line in (REPO / "Dockerfile").read_text().splitlines(keepends=True)
            if "hadolint" not in line
        )
    )
    done = subprocess.run(
        [str(hadolint), "--no-color", str(stripped)], capture_output=True, text=True, timeout=60
    )
    assert done.returncode != 0 and "DL3008" in done.stdout


def test_image_follows_the_shared_contract(image: Image) -> None:
    build, final = image.stages[0], image.final
    # The same Debian release in both stages: the venv's interpreter is the runtime's /usr/bin/python3.
    assert build.base == "debian:13-slim" and build.name == "build"
    assert "python3-venv" in " ".join(i.args for i in build.all("RUN"))
    assert final.base == "gcr.io/distroless/python3-debian13:nonroot"
    assert image.user == "65532:65532"
    assert image.exposed == [7070, 7071]
    assert image.volumes == ["/var/lib/cronoq"]
    assert image.env == {
        "CRONOQ_CONFIG": "/etc/cronoq/cronoq.toml",
        "PYTHONDONTWRITEBYTECODE": "1",
        "PYTHONUNBUFFERED": "1",
        # The public roots distroless ships, for sslrootcert=system (psycopg's own OpenSSL looks elsewhere).
        "SSL_CERT_FILE": "/etc/ssl/certs/ca-certificates.crt",
    }
    # The venv and the volume's mount point come from the build stage, the latter owned by the user.
    from_build = {c.sources: c for c in final.copies() if c.source_stage == "build"}
    assert from_build[("/opt/cronoq",)].destination == "/opt/cronoq"
    assert from_build[("/rootfs/var/lib/cronoq",)].destination == image.volumes[0]
    assert from_build[("/rootfs/var/lib/cronoq",)].chown == image.user


def test_the_image_ships_the_compiled_engine(image: Image, tmp_path: Path) -> None:
    """The build stage has a C compiler and the headers mypyc needs, insists on compiling
    (CRONOQ_COMPILE=1: no quiet fall-back to the slower sources) before it builds the wheel, and its
    context holds the build hook and every engine source byte for byte, the ones this checkout's own
    install compiled (tests/unit/test_build.py); a checkout's compiled modules stay out of it."""
    build = image.stage("build")
    assert build.env["CRONOQ_COMPILE"] == "1"
    body = [i.keyword for i in build.body]
    assert body.index("ENV") < next(n for n, i in enumerate(build.body) if "pip wheel" in i.args)
    packages = " ".join(i.args for i in build.all("RUN") if "apt-get install" in i.args).split()
    assert {"gcc", "libc6-dev", "python3-dev"} <= set(packages)
    stage_context(image, build, tmp_path)
    src = tmp_path / build.workdir().relative_to("/")
    assert (src / "setup.py").read_bytes() == (REPO / "setup.py").read_bytes()
    engine = Path("common") / "cronoq" / "engine"
    sources = sorted(p.name for p in (REPO / engine).glob("*.py"))
    assert sorted(p.name for p in (src / engine).iterdir()) == sources, "only the engine's sources"
    for name in sources:
        assert (src / engine / name).read_bytes() == (REPO / engine / name).read_bytes()


def test_byte_code_is_compiled_at_build_time(image: Image) -> None:
    """Nothing writes .pyc at run time (read-only root): the build compiles it, in a form that stays
    valid whatever the timestamps of the copied sources."""
    run = " ".join(i.args for i in image.stage("build").all("RUN"))
    assert "compileall" in run and "--invalidation-mode unchecked-hash" in run
    assert image.env["PYTHONDONTWRITEBYTECODE"] == "1"


def test_labels_match_the_project(image: Image) -> None:
    labels = image.labels
    assert labels["org.opencontainers.image.title"] == PYPROJECT["project"]["name"]
    assert labels["org.opencontainers.image.version"] == PYPROJECT["project"]["version"]
    assert labels["org.opencontainers.image.licenses"] == PYPROJECT["project"]["license"]
    assert labels["org.opencontainers.image.base.name"] == image.final.base
    assert labels["org.opencontainers.image.description"]


def test_programs_are_the_console_scripts(image: Image, wheel: zipfile.ZipFile) -> None:
    """The entrypoint is the cronoq-server console script, and the wheel the image installs declares
    exactly the project's console scripts, which the venv puts in /opt/cronoq/bin."""
    (entrypoint,) = image.entrypoint
    assert PurePosixPath(entrypoint) == VENV_BIN / "cronoq-server"
    assert set(SCRIPTS) == {"cronoq-server", "cronoq-router", "cronoq-operator", "cronoq"}
    (entry_points,) = (n for n in wheel.namelist() if n.endswith(".dist-info/entry_points.txt"))
    declared = wheel.read(entry_points).decode()
    for name, target in SCRIPTS.items():
        assert f"{name} = {target}" in declared
        local_program(str(VENV_BIN / name))  # and this checkout's venv has the same program


def test_copy_sources_are_in_the_build_context(image: Image) -> None:
    """Every file COPY takes from the context exists and is not excluded; and the build stage copies
    every folder pyproject.toml maps to a package, and the README it names."""
    ignore = DockerIgnore.read()
    context_copies = [c for stage in image.stages for c in stage.copies() if c.source_stage is None]
    for copy in context_copies:
        for source in copy.sources:
            assert (REPO / source).exists(), f"COPY {source}: no such file"
            assert not ignore.excludes(source), f"COPY {source}: excluded by .dockerignore"
    copied = {s for c in image.stage("build").copies() for s in c.sources}
    package_dirs = set(PYPROJECT["tool"]["setuptools"]["package-dir"].values())
    for folder in package_dirs:
        assert folder.split("/")[0] in copied, f"{folder} (a package of pyproject.toml) is not copied"
    assert {"pyproject.toml", PYPROJECT["project"]["readme"]} <= copied


@pytest.mark.parametrize(
    "path",
    [
        ".git/HEAD",
        ".venv/bin/python",
        "common/cronoq/__pycache__/auth.cpython-311.pyc",
        "shard/store/x.pyc",
        ".mypy_cache/3.11/cache.db",
        ".ruff_cache/content",
        ".pytest_cache/v/cache",
        ".hypothesis/examples/x",
        "build/lib/cronoq/__init__.py",
        "dist/cronoq-0.1.0-py3-none-any.whl",
        "cronoq.egg-info/PKG-INFO",
        "compose/.env",
        "common/cronoq/engine/engine.cpython-311-x86_64-linux-gnu.so",
    ],
)
def test_dockerignore_keeps_out(path: str) -> None:
    assert DockerIgnore.read().excludes(path)


def test_wheel_holds_every_package(wheel: zipfile.ZipFile) -> None:
    """The image's wheel has every package with all its modules (none lost to .dockerignore), the
    data files the server reads (the embedded .proto), and what type checkers read: py.typed, and the
    stubs of the generated wire modules (the SDK's signatures name their messages)."""
    names = set(wheel.namelist())
    for package, folder in PYPROJECT["tool"]["setuptools"]["package-dir"].items():
        prefix = package.replace(".", "/")
        for module in (REPO / folder).glob("*.py"):
            assert f"{prefix}/{module.name}" in names, f"{module} is missing from the image's wheel"
    for package in PYPROJECT["tool"]["setuptools"]["packages"]:
        assert f"{package.replace('.', '/')}/__init__.py" in names
    assert {"cronoq/v1/cronoq.proto", "cronoq/py.typed"} <= names
    assert {"cronoq/v1/cronoq_pb2.pyi", "cronoq/v1/cronoq_pb2_grpc.pyi"} <= names


# --- the image's example configuration, run as the image runs it ------------------------------------


def docker_run(
    image: Image, tmp_path: Path, *args: str, env: dict[str, str], mount: bool = False
) -> LocalProcess:
    """``docker run [-e ...] [-v deploy/image/cronoq.toml:/c.toml:ro] cronoq args...`` on loopback."""
    container = Container.of_image(image, args, env)
    if mount:
        container.files[PurePosixPath("/c.toml")] = REPO / "deploy" / "image" / "cronoq.toml"
    return container.local(Loopback.allocate(["cronoq"], image.exposed), tmp_path)


def test_example_config_binds_every_interface_with_tokens_from_the_environment() -> None:
    """Reachable from outside its container, so its credentials are required, and none is in the file."""
    config = tomllib.loads((REPO / "deploy" / "image" / "cronoq.toml").read_text())
    assert config["server"]["grpc_addr"] == "0.0.0.0:7070"
    assert config["server"]["http_addr"] == "0.0.0.0:7071"
    assert [t["token_env"] for t in config["auth"]["tokens"]] == list(TOKENS)
    assert all("token" not in t for t in config["auth"]["tokens"])
    assert config["store"]["path"].startswith("/var/lib/cronoq/")  # the image's volume


def test_example_config_passes_check(image: Image, tmp_path: Path) -> None:
    """The seed's ``docker run --rm -v $PWD/cronoq.toml:/c.toml:ro cronoq --config /c.toml --check``,
    with the four tokens the example names."""
    done = docker_run(image, tmp_path, "--config", "/c.toml", "--check", env=TOKENS, mount=True).run()
    assert done.returncode == 0, done.stdout + done.stderr
    assert "configuration ok" in done.stdout


def test_example_config_names_every_missing_token(image: Image, tmp_path: Path) -> None:
    """It binds 0.0.0.0, so its credentials are required: ``--check`` without the variables (CI) passes
    and names each as a note; starting without one of them fails naming that one only."""
    done = docker_run(image, tmp_path / "none", "--check", env={}).run()
    assert done.returncode == 0, done.stdout + done.stderr
    for name in TOKENS:
        assert f"needs environment variable {name} at start (not set here" in done.stdout, done.stdout
    partial = {k: v for k, v in TOKENS.items() if k != "CRONOQ_METRICS_TOKEN"}
    done = docker_run(image, tmp_path / "one", env=partial).run()
    assert done.returncode == 1
    assert "CRONOQ_METRICS_TOKEN is not set" in done.stderr
    assert sum(f"{name} is not set" in done.stderr for name in TOKENS) == 1


def _http(url: str, body: dict[str, Any] | None = None, token: str | None = None) -> tuple[int, Any]:
    """The status and JSON answer of a GET (or a POST of ``body``); status 0 when nothing answers."""
    request = urllib.request.Request(url, data=None if body is None else json.dumps(body).encode())
    request.add_header("content-type", "application/json")
    if token is not None:
        request.add_header("authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=5) as response:
            text = response.read().decode()
            return response.status, json.loads(text) if text.startswith("{") else text
    except urllib.error.HTTPError as err:
        return err.code, None
    except OSError:  # nothing listens yet (URLError is an OSError)
        return 0, None


@pytest.fixture
def served(image: Image, tmp_path: Path) -> Iterator[tuple[LocalProcess, str]]:
    """``docker run -e CRONOQ_..._TOKEN ... cronoq``: the entrypoint with no arguments, so the image's
    CRONOQ_CONFIG (its example configuration) and its volume; yields the process and its HTTP URL."""
    loopback = Loopback.allocate(["cronoq"], image.exposed)
    process = Container.of_image(image, env=TOKENS).local(loopback, tmp_path)
    process.start()
    url = f"http://{loopback.address('cronoq', 7071)}"
    try:
        deadline = time.monotonic() + 30
        while _http(f"{url}/readyz")[0] != 200:
            assert process.proc is not None and process.proc.poll() is None, process.logs()
            assert time.monotonic() < deadline, f"not ready after 30 s:\n{process.logs()}"
            time.sleep(0.05)
        yield process, url
    finally:
        process.stop()


def test_image_serves_its_example_config(served: tuple[LocalProcess, str]) -> None:
    """Up, authenticating every call, durable in the volume: what `docker run` of the image gives."""
    process, url = served
    assert _http(f"{url}/healthz")[0] == 200
    task = {"pool": "default", "payload": {"hello": "image"}}
    assert _http(f"{url}/v1/tasks", task)[0] == 401
    assert _http(f"{url}/v1/tasks", task, token=TOKENS["CRONOQ_WORKER_TOKEN"])[0] == 403
    status, submitted = _http(f"{url}/v1/tasks", task, token=TOKENS["CRONOQ_CLIENT_TOKEN"])
    assert status == 200 and submitted["id"], submitted
    status, info = _http(f"{url}/v1/tasks/{submitted['id']}", token=TOKENS["CRONOQ_CLIENT_TOKEN"])
    assert status == 200 and info["pool"] == "default"
    assert _http(f"{url}/metrics", token=TOKENS["CRONOQ_METRICS_TOKEN"])[0] == 200
    # The SQLite state is in the image's volume, and nowhere else the process could have written.
    volume = process.paths["/var/lib/cronoq"]
    assert (volume / "state.db").exists()
    assert process.cwd == volume


# --- the database client's certificate checks -------------------------------------------------------
# The image's server reaches Postgres through psycopg-binary, whose own libpq and OpenSSL decide where a
# CA comes from: PGSSLROOTCERT (what the chart's store.postgres.caSecret sets), or with
# sslrootcert=system the default roots, which OpenSSL reads from SSL_CERT_FILE (what the image sets).

SSL_REQUEST, GSSENC_REQUEST = 80877103, 80877104  # the Postgres protocol's pre-startup request codes
REACHED = "cronoq-test-listener-reached-after-tls"


def _read_exactly(sock: socket.socket, size: int) -> bytes:
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise ConnectionError("the client hung up")
        data += chunk
    return data


class TlsDatabase:
    """A listener speaking just enough of the Postgres protocol for a client's TLS checks: it accepts
    the SSL request, completes the handshake with its certificate (which the client verifies), reads
    the startup message and refuses it with a FATAL error saying :data:`REACHED`. A client reporting
    that error got past every certificate check; one that failed a check hangs up before."""

    def __init__(self, cert: Path, key: Path) -> None:
        self._context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self._context.load_cert_chain(cert, key)
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.port: int = self._listener.getsockname()[1]
        self._thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> TlsDatabase:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(OSError):
            self._listener.shutdown(socket.SHUT_RDWR)  # wakes accept() in the thread (close alone does not)
        self._listener.close()
        self._thread.join(timeout=10)
        assert not self._thread.is_alive(), "the listener's thread did not end"

    def _serve(self) -> None:
        while True:
            try:
                conn, _ = self._listener.accept()
            except OSError:
                return
            with conn, contextlib.suppress(OSError):  # a client that fails a check hangs up mid-way
                conn.settimeout(10)
                self._answer(conn)

    def _answer(self, conn: socket.socket) -> None:
        _, code = struct.unpack("!ii", _read_exactly(conn, 8))
        if code == GSSENC_REQUEST:  # libpq tries GSS encryption first when it has Kerberos credentials
            conn.sendall(b"N")
            _, code = struct.unpack("!ii", _read_exactly(conn, 8))
        assert code == SSL_REQUEST, f"not an SSL request: {code}"
        conn.sendall(b"S")
        with self._context.wrap_socket(conn, server_side=True) as tls:
            (length,) = struct.unpack("!i", _read_exactly(tls, 4))
            _read_exactly(tls, length - 4)  # the startup message: user, database, ...
            fields = b"SFATAL\0VFATAL\0C28000\0M" + REACHED.encode() + b"\0\0"
            tls.sendall(b"E" + struct.pack("!i", len(fields) + 4) + fields)


@pytest.fixture(scope="module")
def database_pki(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """The database's CA, a certificate it issued for 127.0.0.1 (with its key), and an unrelated CA."""
    folder = tmp_path_factory.mktemp("database-pki")
    ca, ca_key = new_ca(folder / "ca.crt", folder / "ca.key", "cronoq test database CA")
    other, _ = new_ca(folder / "other.crt", folder / "other.key", "some other CA")
    cert, key = issue(folder, "db", "/CN=db", "IP:127.0.0.1", ca, ca_key)
    return {"ca": ca, "other-ca": other, "cert": cert, "key": key}


@pytest.mark.parametrize(
    ("options", "image_env", "ca", "outcome"),
    [
        pytest.param(
            "", True, None, "root certificate file {home}/.postgresql/root.crt does not exist", id="no-ca"
        ),
        pytest.param("", True, "ca", REACHED, id="PGSSLROOTCERT"),
        pytest.param("", True, "other-ca", "certificate verify failed", id="PGSSLROOTCERT-other-ca"),
        pytest.param("&sslrootcert=system", True, None, REACHED, id="system"),
        pytest.param(
            "&sslrootcert=system", False, None, "certificate verify failed", id="system-no-image-env"
        ),
    ],
)
async def test_postgres_store_verifies_the_database_with_the_ca_it_is_given(
    image: Image,
    database_pki: dict[str, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    options: str,
    image_env: bool,
    ca: str | None,
    outcome: str,
) -> None:
    """``sslmode=verify-full`` through the server's own Postgres store, in the image's environment (its
    ENV; SSL_CERT_FILE names a bundle of public roots there, here one holding the test CA). With no CA
    it stops at libpq's default root.crt under a home that has none (the pod's); PGSSLROOTCERT (the
    chart's caSecret) or sslrootcert=system get it past the certificate checks, to the listener's error.
    A wrong CA is refused, and so is sslrootcert=system without the image's ENV (psycopg's own OpenSSL
    has no roots here): the checks are real, and the image's SSL_CERT_FILE is what makes "system" work."""
    for name in [n for n in os.environ if n.startswith(("PG", "SSL_CERT_"))]:
        monkeypatch.delenv(name)
    monkeypatch.setenv("HOME", str(tmp_path))
    if image_env:
        for name, value in image.env.items():
            monkeypatch.setenv(name, str(database_pki["ca"]) if name == "SSL_CERT_FILE" else value)
    if ca is not None:
        monkeypatch.setenv("PGSSLROOTCERT", str(database_pki[ca]))
    with TlsDatabase(database_pki["cert"], database_pki["key"]) as database:
        url = f"postgresql://cronoq:secret@127.0.0.1:{database.port}/cronoq?sslmode=verify-full{options}"
        store = PostgresStore(url, session_timeout=2.0)
        with pytest.raises(StoreError) as refused:
            await store.open()
    assert outcome.format(home=tmp_path) in str(refused.value).replace('"', "")
