"""Run a container's process directly on this machine, as Docker would run it, on loopback.

A :class:`Container` is what a container runs, in the container's own terms: the program and
arguments (entrypoint and command), the environment (the image's ``ENV`` under the service's), the
files it sees at which paths (the image's ``COPY`` from the build context, Compose configs and bind
mounts), its writable volumes and its healthcheck. :meth:`Container.local` turns that into a local
process with the fewest changes that let it run here:

- the image's programs (``/opt/cronoq/bin/...``) are this checkout's (``.venv/bin/...``);
- container paths are the host files they come from, and volumes are fresh directories;
- every ``host:port`` of the Compose network (a service name or network alias, or the container's own
  ``0.0.0.0`` / ``127.0.0.1``) is a loopback port of its own (:class:`Loopback`);

both in arguments, environment values and the ``.toml`` configuration files the container reads.

Nothing else is changed; a test that must change more (the database URL) says so in ``overrides``.
"""

from __future__ import annotations

import contextlib
import re
import signal
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath

from tests.ports import free_ports

from .compose_image import REPO, VENV_BIN, DockerIgnore, Image, local_program
from .compose_model import Project, Service

SELF_HOSTS = ("0.0.0.0", "127.0.0.1", "localhost")
_HOST_PORT = re.compile(r"(?<![\w.-])(?P<host>[A-Za-z0-9][\w.-]*):(?P<port>\d+)\b")


@dataclass(slots=True)
class Loopback:
    """A loopback port for each (container, container port), and which container each network alias
    reaches (the first that carries it)."""

    ports: dict[tuple[str, int], int]
    aliases: dict[str, str] = field(default_factory=dict)

    @classmethod
    def allocate(
        cls,
        containers: Iterable[str],
        container_ports: Iterable[int],
        aliases: Mapping[str, str] | None = None,
    ) -> Loopback:
        ports = list(container_ports)
        keys = [(c, p) for c in containers for p in ports]
        return cls(dict(zip(keys, free_ports(len(keys)), strict=True)), dict(aliases or {}))

    def address(self, container: str, port: int) -> str:
        return f"127.0.0.1:{self.ports[(container, port)]}"

    def rewrite(self, text: str, container: str) -> str:
        """``text`` with each ``host:port`` of the network replaced by its loopback address, as seen from
        ``container`` (whose own addresses are its own ports)."""

        def one(match: re.Match[str]) -> str:
            host, port = match["host"], int(match["port"])
            host = container if host in SELF_HOSTS else self.aliases.get(host, host)
            return self.address(host, port) if (host, port) in self.ports else match[0]

        return _HOST_PORT.sub(one, text)


@dataclass(slots=True)
class Container:
    """What one container runs, in the container's terms."""

    name: str
    argv: list[str]
    env: dict[str, str]
    files: dict[PurePosixPath, Path]  # container path: the host file or directory it is
    volumes: list[PurePosixPath]  # writable directories
    workdir: PurePosixPath
    healthcheck: list[str] | None = None

    @classmethod
    def of_image(
        cls, image: Image, args: Iterable[str] = (), env: Mapping[str, str] | None = None
    ) -> Container:
        """``docker run [-e ...] IMAGE args...``: the entrypoint, the image's files from the build
        context, its volumes."""
        context = DockerIgnore.read()
        files: dict[PurePosixPath, Path] = {}
        for copy in image.final.copies():
            if copy.source_stage is None:
                for source in copy.sources:
                    assert not context.excludes(source), f"COPY {source}: excluded from the build context"
                    files[copy.target(source)] = REPO / source
        return cls(
            "cronoq",
            [*image.entrypoint, *args],
            {**image.env, **(env or {})},
            files,
            [PurePosixPath(v) for v in image.volumes],
            image.workdir,
        )

    @classmethod
    def of_service(cls, project: Project, image: Image, service: Service) -> Container:
        """A Compose service of the image: its entrypoint (or the image's) and command, environment,
        configs, bind mounts and volumes on top of the image's."""
        base = cls.of_image(image)
        spec = service.spec
        entrypoint = spec.get("entrypoint", base.argv)
        files = dict(base.files)
        volumes = list(base.volumes)
        for mount in project.mounts(service):
            if mount.source is None:
                volumes.append(mount.target)
            else:
                files[mount.target] = mount.source
        return cls(
            service.name,
            [*([entrypoint] if isinstance(entrypoint, str) else entrypoint), *spec.get("command", [])],
            {**base.env, **service.environment},
            files,
            volumes,
            PurePosixPath(spec.get("working_dir", str(base.workdir))),
            service.healthcheck,
        )

    def local(
        self,
        loopback: Loopback,
        scratch: Path,
        *,
        overrides: Mapping[str, str] | None = None,
        edit: Callable[[Path, str], str] | None = None,
    ) -> LocalProcess:
        """The process to run here; ``scratch`` holds its rewritten files, volumes and log. ``edit``
        changes a configuration file further (given its original path and the rewritten text);
        ``overrides`` replaces environment variables."""
        scratch.mkdir(parents=True, exist_ok=True)
        paths: dict[PurePosixPath, Path] = {}
        for number, volume in enumerate(self.volumes):
            paths[volume] = scratch / f"volume-{number}"
            paths[volume].mkdir(exist_ok=True)
        configs: dict[Path, Path] = {}  # the configuration files, rewritten: copy -> original
        for number, (target, source) in enumerate(self.files.items()):
            if source.suffix == ".toml":
                paths[target] = scratch / f"{number}-{source.name}"
                configs[paths[target]] = source
            else:
                paths[target] = source
        for copy, source in configs.items():
            text = loopback.rewrite(source.read_text(), self.name)
            for target, local in paths.items():  # "/var/lib/cronoq/state.db" names a file in a volume
                text = text.replace(f'"{target}"', f'"{local}"').replace(f'"{target}/', f'"{local}/')
            copy.write_text(edit(source, text) if edit is not None else text)

        def translate(value: str) -> str:
            if PurePosixPath(value).parent == VENV_BIN:
                return local_program(value)
            for target, local in paths.items():
                if value == str(target) or value.startswith(f"{target}/"):
                    return str(local) + value[len(str(target)) :]
            return loopback.rewrite(value, self.name)

        env = {k: translate(v) for k, v in self.env.items()} | dict(overrides or {})
        check = self.healthcheck
        if check is not None:
            assert check[0] == "CMD", f"{self.name}: the image has no shell, so a healthcheck must be CMD"
            check = [translate(word) for word in check[1:]]
        return LocalProcess(
            self.name,
            [translate(word) for word in self.argv],
            env,
            Path(translate(str(self.workdir))) if self.workdir in paths else scratch,
            scratch / "output.log",
            check,
            {str(target): local for target, local in paths.items()},
        )


@dataclass(slots=True)
class LocalProcess:
    """A container's process on this machine; ``paths`` maps its container paths to local ones."""

    name: str
    argv: list[str]
    env: dict[str, str]
    cwd: Path
    log: Path
    healthcheck: list[str] | None
    paths: dict[str, Path]
    proc: subprocess.Popen[bytes] | None = None

    def run(self, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
        """Run to completion (``docker run --rm``), capturing its output."""
        return subprocess.run(
            self.argv, env=self.env, cwd=self.cwd, capture_output=True, text=True, timeout=timeout
        )

    def start(self) -> None:
        """Start in a process group of its own, as a container is: a terminal's Ctrl-C reaches whoever
        started it (``make cluster``), which stops it in its turn."""
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                self.argv,
                env=self.env,
                cwd=self.cwd,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def healthy(self) -> bool:
        """One run of the healthcheck, as ``docker`` runs it inside the container."""
        assert self.healthcheck is not None, f"{self.name} has no healthcheck"
        with contextlib.suppress(subprocess.TimeoutExpired):
            done = subprocess.run(
                self.healthcheck, env=self.env, cwd=self.cwd, capture_output=True, timeout=5
            )
            return done.returncode == 0
        return False

    def wait_healthy(self, up: Callable[[], bool], timeout: float = 30.0) -> None:
        """Wait until ``up()`` (a cheap in-process probe), then require the healthcheck to pass: running
        it in a loop would cost a Python start per try, which slows the very start it waits for."""
        deadline = time.monotonic() + timeout
        while not up():
            assert self.proc is not None and self.proc.poll() is None, f"{self.name} exited:\n{self.logs()}"
            assert time.monotonic() < deadline, f"{self.name} not up after {timeout} s:\n{self.logs()}"
            time.sleep(0.05)
        assert self.healthy(), f"{self.name}: its healthcheck fails:\n{self.logs()}"

    def logs(self) -> str:
        return self.log.read_text(errors="replace") if self.log.exists() else ""

    def stop(self) -> None:
        stop_all([self])


def stop_all(processes: Iterable[LocalProcess]) -> None:
    """``docker stop`` of each, at once: SIGTERM, then SIGKILL after a grace period."""
    running = [p.proc for p in processes if p.proc is not None and p.proc.poll() is None]
    for proc in running:
        proc.send_signal(signal.SIGTERM)
    for proc in running:
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
