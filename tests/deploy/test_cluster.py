"""``make cluster`` (``deploy/cluster.py``): the Compose development cluster run on this machine.

The launcher is run as a user runs it, as a program: its banner must name every process of the Compose
topology, and the CLI commands and the curl line it prints must work as printed, through the router;
Prometheus (when installed) must scrape every server and the router; Ctrl-C must stop every process it
started and remove what it wrote, and exit 0. The rest checks, without processes, how it reads
``compose/``: what it refuses to leave out, the ports Compose publishes, Prometheus's configuration.
"""

from __future__ import annotations

import contextlib
import json
import os
import queue
import re
import signal
import socket
import stat
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from deploy.cluster import (
    GRPC_PORT,
    HTTP_PORT,
    PROMETHEUS,
    PROMETHEUS_PORT,
    ClusterError,
    allocate,
    cronoq_services,
    main,
    prometheus_process,
    prometheus_program,
    published_ports,
    replicas,
)
from tests import postgres

from .compose_image import REPO, Image
from .compose_model import COMPOSE_DIR, Project, read_env_file
from .compose_run import LocalProcess

ENV = read_env_file()
START_TIMEOUT = 120.0  # a bound, not an expectation: the cluster is up in a few seconds
LAST_BANNER_LINE = re.compile(r"^Logs: (?P<directory>\S+)/<process>/output.log")


@pytest.fixture(scope="module")
def project() -> Project:
    return Project.load()


# --- the launcher, run ------------------------------------------------------------------------------


class Launcher:
    """``python -m deploy.cluster --free-ports`` in a process group of its own, as a terminal runs a
    command (so that a signal to the group is the terminal's Ctrl-C); its output read line by line."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "deploy.cluster", "--free-ports"],
            cwd=REPO,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )
        self.lines: queue.Queue[str | None] = queue.Queue()
        self.output: list[str] = []
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))
        self.lines.put(None)

    def banner(self) -> list[str]:
        """Every line up to the banner's last, once the cluster is up."""
        deadline = time.monotonic() + START_TIMEOUT
        while True:
            try:
                line = self.lines.get(timeout=max(deadline - time.monotonic(), 0.1))
            except queue.Empty:
                raise AssertionError(f"not up after {START_TIMEOUT:g} s") from None
            assert line is not None, "the launcher ended"
            self.output.append(line)
            if LAST_BANNER_LINE.match(line):
                return list(self.output)

    def interrupt(self) -> int:
        """Ctrl-C: SIGINT to the launcher's process group; its exit status, and the rest of its output."""
        os.killpg(self.proc.pid, signal.SIGINT)
        code = self.proc.wait(60)
        while (line := self.lines.get(timeout=10)) is not None:
            self.output.append(line)
        return code


@pytest.fixture
def launcher() -> Iterator[Launcher]:
    started = Launcher()
    try:
        yield started
    finally:
        if started.proc.poll() is None:  # the test failed before its Ctrl-C: the launcher stops it all
            with contextlib.suppress(subprocess.TimeoutExpired, queue.Empty):
                started.interrupt()
        print("----- the launcher's output -----\n" + "\n".join(started.output))


def children(pid: int) -> dict[int, str]:
    """The processes whose parent is ``pid``, with their command lines."""
    found: dict[int, str] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        with contextlib.suppress(OSError):
            if int((entry / "stat").read_text().rsplit(")", 1)[1].split()[1]) == pid:
                found[int(entry.name)] = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
    return found


def shell(line: str, exports: str) -> subprocess.CompletedProcess[str]:
    """A printed command line run as a user pastes it, after the printed ``export`` line."""
    return subprocess.run(
        ["bash", "-c", f"{exports}\n{line}"], cwd=REPO, capture_output=True, text=True, timeout=60
    )


def _refused(address: str) -> bool:
    host, _, port = address.rpartition(":")
    with socket.socket() as probe:
        return probe.connect_ex((host, int(port))) != 0


@pytest.mark.slow
def test_make_cluster_runs_compose_and_ctrl_c_stops_everything(launcher: Launcher, project: Project) -> None:
    banner = launcher.banner()
    text = "\n".join(banner)
    # Every process of the Compose topology, under its service's name (replicas numbered).
    named = {line.split()[0] for line in banner if line.startswith("  ") and not line.startswith("   ")}
    expected = set()
    for name, service in cronoq_services(project).items():
        count = replicas(service)
        expected |= {name} if count == 1 else {f"{name}-{n}" for n in range(1, count + 1)}
    assert expected | {"prometheus", "postgres", "grafana"} <= named, text
    assert {"worker-default-1", "worker-default-2", "cronoq-cpu-2", "cronoq-gpu-2"} <= expected
    for shard in ("cpu", "gpu"):  # a leader and a standby each
        states = sorted(line.rsplit(", ", 1)[1] for line in banner if f"shard {shard}, " in line)
        assert states == ["leads", "stands by"], text
    running = children(launcher.proc.pid)
    prometheus = prometheus_program()
    assert len(running) == len(expected) + (prometheus is not None), running
    # The pid of each cronoq process is printed (to kill a leader, say).
    assert {int(pid) for pid in re.findall(r" pid (\d+), ", text)} == {
        pid for pid, command in running.items() if "prometheus" not in command
    }
    # Each in a process group of its own, out of reach of the terminal's Ctrl-C: the launcher stops them.
    assert all(os.getpgid(pid) == pid for pid in running), running

    # The commands it prints, run as printed, go through the router to the workers of each pool.
    (exports,) = [line.strip() for line in banner if line.strip().startswith("export CRONOQ_TARGET=")]
    router_grpc = re.search(r"cronoq-router +gRPC (\S+)", text)
    assert router_grpc is not None and f"CRONOQ_TARGET={router_grpc[1]} " in exports
    assert f"CRONOQ_TOKEN={ENV['CRONOQ_CLIENT_TOKEN']}" in exports
    commands = [line.strip() for line in banner if re.match(r"^  (\S+=\S+ )?\S*cronoq ", line)]
    submits = [c for c in commands if " submit " in c]
    assert len(submits) == 2, commands
    for command in submits:
        done = shell(command, exports)
        assert done.returncode == 0, done.stderr
        result = json.loads(done.stdout)["result"]
        pool = command.split("--pool ")[1].split()[0]
        assert result["status"] == "succeeded" and result["output"]["pool"] == pool, result
        assert result["output"]["echo"] == {"hello": pool}  # echoed by compose/worker.py
    listed = shell(next(c for c in commands if c.endswith(" list")), exports)
    assert listed.returncode == 0 and len(json.loads(listed.stdout)["tasks"]) == 2, listed
    top = shell(next(c for c in commands if c.endswith(" top")) + " --once", exports)  # top redraws forever
    assert top.returncode == 0 and re.search(r"^llm ", top.stdout, re.MULTILINE), top
    (curl,) = [line.strip() for line in banner if line.strip().startswith("curl ")]
    router_http = re.search(r"cronoq-router .* HTTP http://(\S+)", text)
    assert router_http is not None and f"http://{router_http[1]}/v1/tasks" in curl
    posted = shell(curl, exports)
    assert posted.returncode == 0, posted.stderr
    assert json.loads(posted.stdout)["result"]["status"] == "succeeded", posted.stdout

    # Prometheus scrapes every server and the router (with the metrics token: up, not 401).
    http = set(re.findall(r"HTTP http://(\S+)", text))
    if prometheus is None:
        assert "prometheus         skipped: no prometheus program" in text
    else:
        address = re.search(r"prometheus +http://(\S+)", text)
        assert address is not None
        deadline = time.monotonic() + 30  # the first scrape of each comes within the 5 s interval
        while True:
            with urllib.request.urlopen(f"http://{address[1]}/api/v1/targets", timeout=5) as response:
                targets = json.load(response)["data"]["activeTargets"]
            health = {t["labels"]["instance"]: t["health"] for t in targets}
            if set(health) == http and set(health.values()) == {"up"}:
                break
            assert time.monotonic() < deadline, targets
            time.sleep(0.2)

    # Ctrl-C: everything it started is gone, and so is what it wrote.
    postgres = re.search(r"postgres +postgresql://\w+@(\S+?)/", text)
    assert postgres is not None
    directory = LAST_BANNER_LINE.match(banner[-1])
    assert directory is not None and Path(directory["directory"]).is_dir()
    assert launcher.interrupt() == 0, launcher.output
    assert launcher.output[-1] == "make cluster: stopped"
    assert [pid for pid in running if Path(f"/proc/{pid}").exists()] == []
    assert all(_refused(address) for address in [*http, postgres[1]])
    assert not Path(directory["directory"]).exists()


def test_without_postgres_it_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setattr(postgres, "_binary", lambda name: None)  # found neither on PATH nor in /usr/lib
    before = signal.getsignal(signal.SIGINT)
    assert main(["--free-ports", "--no-prometheus"]) == 1
    assert capsys.readouterr().err == (
        "make cluster: cannot start Postgres: the Postgres server programs (initdb, pg_ctl) are neither on "
        "PATH nor in /usr/lib/postgresql/*/bin: install them (Debian, Ubuntu: apt-get install postgresql)\n"
    )
    assert signal.getsignal(signal.SIGINT) is before  # its Ctrl-C handling ends with it


# --- how it reads compose/ ------------------------------------------------------------------------------


def test_a_service_it_cannot_run_is_refused_not_left_out(project: Project) -> None:
    document = {
        **project.document,
        "services": {**project.document["services"], "redis": {"image": "redis:7"}},
    }
    with pytest.raises(ClusterError, match="service redis runs image 'redis:7'"):
        cronoq_services(Project(document, project.directory))


def test_the_ports_compose_publishes_are_kept_unless_taken(project: Project) -> None:
    image = Image.read()
    published = published_ports(project)
    router = ("cronoq-router", GRPC_PORT)
    assert published[router] == 7070 and published[("cronoq-router", HTTP_PORT)] == 7071
    assert published[(PROMETHEUS, PROMETHEUS_PORT)] == 9090
    held: list[socket.socket] = []
    try:
        for port in {published[("cronoq-router", HTTP_PORT)], published[(PROMETHEUS, PROMETHEUS_PORT)]}:
            listener = socket.socket()
            listener.setsockopt(
                socket.SOL_SOCKET, socket.SO_REUSEADDR, 1
            )  # past a TIME_WAIT of its last user
            with contextlib.suppress(OSError):  # else another listener holds it: taken all the same
                listener.bind(("127.0.0.1", port))
                listener.listen()
            held.append(listener)
        loopback, notes = allocate(project, image, published=True)
        assert loopback.ports[("cronoq-router", HTTP_PORT)] != 7071
        assert loopback.ports[(PROMETHEUS, PROMETHEUS_PORT)] != 9090
        assert "127.0.0.1:7071 (published for cronoq-router) is taken: a free port instead" in notes
        free, none = allocate(project, image, published=False)
        assert none == [] and not set(free.ports.values()) & {7070, 7071, 9090}
        assert len(set(free.ports.values())) == len(free.ports)
    finally:
        for listener in held:
            listener.close()


def test_prometheus_scrapes_the_loopback_addresses_with_the_metrics_token(
    project: Project, tmp_path: Path
) -> None:
    """Compose's prometheus.yml, rewritten: each target the loopback address of the service it names,
    the token file the entrypoint would write, where the configuration now points, private."""
    loopback, _ = allocate(project, Image.read(), published=False)
    process = prometheus_process(project, loopback, tmp_path, "/usr/bin/prometheus")
    original = yaml.safe_load((COMPOSE_DIR / "prometheus" / "prometheus.yml").read_text())
    flags = dict(arg.removeprefix("--").split("=", 1) for arg in process.argv[1:])
    rewritten = yaml.safe_load(Path(flags["config.file"]).read_text())
    for before, after in zip(original["scrape_configs"], rewritten["scrape_configs"], strict=True):
        (targets,) = [group["targets"] for group in before["static_configs"]]
        (local,) = [group["targets"] for group in after["static_configs"]]
        assert local == [loopback.address(host, int(port)) for host, port in (t.split(":") for t in targets)]
        token = Path(after["authorization"]["credentials_file"])
        assert token.read_text() == ENV["CRONOQ_METRICS_TOKEN"]
        assert stat.S_IMODE(token.stat().st_mode) == 0o600 and token.is_relative_to(tmp_path)
    assert flags["web.listen-address"] == loopback.address(PROMETHEUS, PROMETHEUS_PORT)
    assert Path(flags["storage.tsdb.path"]).is_dir() and Path(flags["storage.tsdb.path"]).is_relative_to(
        tmp_path
    )
    # A target that is no service of the cluster would only ever be down: refused by name.
    loopback.ports = {k: v for k, v in loopback.ports.items() if k[0] != "cronoq-gpu-2"}
    with pytest.raises(ClusterError, match="scrape target cronoq-gpu-2:7071 is no cronoq service"):
        prometheus_process(project, loopback, tmp_path / "again", "/usr/bin/prometheus")


def test_prometheus_reads_the_shipped_rules_unless_a_run_edits_its_files(
    project: Project, tmp_path: Path
) -> None:
    """Without ``edit`` (``make cluster``) Prometheus reads the repository's rules file in place, as
    Compose mounts it; with one (the live monitoring test's), it reads edited copies of this run, and
    an edited configuration, while the repository's files stay as they are."""
    loopback, _ = allocate(project, Image.read(), published=False)
    rules = REPO / "charts" / "cronoq" / "files" / "alerts.yaml"
    shipped = rules.read_text()

    def configuration(process: LocalProcess) -> dict[str, Any]:
        flags = dict(arg.removeprefix("--").split("=", 1) for arg in process.argv[1:])
        loaded: dict[str, Any] = yaml.safe_load(Path(flags["config.file"]).read_text())
        return loaded

    plain = configuration(prometheus_process(project, loopback, tmp_path / "plain", "/usr/bin/prometheus"))
    assert plain["rule_files"] == [str(rules)]
    assert plain["global"]["scrape_interval"] == "5s"

    seen: list[Path] = []

    def edit(source: Path, text: str) -> str:
        seen.append(source)
        if source == rules:
            return text.replace("for: 1m", "for: 2s")
        return text.replace("scrape_interval: 5s", "scrape_interval: 1s")

    scratch = tmp_path / "edited"
    edited = configuration(prometheus_process(project, loopback, scratch, "/usr/bin/prometheus", edit=edit))
    assert seen == [rules, COMPOSE_DIR / "prometheus" / "prometheus.yml"]
    (copy,) = [Path(name) for name in edited["rule_files"]]
    assert copy.is_relative_to(scratch) and copy.read_text() == shipped.replace("for: 1m", "for: 2s")
    assert "for: 2s" in copy.read_text() and rules.read_text() == shipped  # the repository's, unchanged
    assert edited["global"]["scrape_interval"] == "1s"
    # The rest as without the edit: the same loopback targets.
    assert [job["static_configs"] for job in edited["scrape_configs"]] == [
        job["static_configs"] for job in plain["scrape_configs"]
    ]
