"""The Compose development cluster (``compose/``), without a Docker engine: the file against the Compose
specification, everything it names, the topology and the configuration its processes share, and
then its cronoq processes run here, from the file's own commands and environment, on loopback
(:mod:`.compose_run`), with the test's Postgres in place of the ``postgres`` service."""

from __future__ import annotations

import asyncio
import json
import subprocess
import time
import tomllib
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

import jsonschema
import psycopg
import pytest
import yaml

from cronoq.client import Client
from deploy.cluster import allocate, local_processes, start_in_order, stop_in_order

from .compose_image import REPO, VENV_BIN, Image, local_program
from .compose_model import COMPOSE_DIR, Project, Service, load_raw, read_env_file
from .compose_run import Container, LocalProcess, Loopback

ENV = read_env_file()
CLUSTER_TOML = COMPOSE_DIR / "cronoq.toml"
TOKEN_NAMES = ("CRONOQ_CLIENT_TOKEN", "CRONOQ_WORKER_TOKEN", "CRONOQ_METRICS_TOKEN", "CRONOQ_ADMIN_TOKEN")
SHARD_SCHEMA = '"cronoq_{shard}"'


@pytest.fixture(scope="module")
def project() -> Project:
    return Project.load()


@pytest.fixture(scope="module")
def image() -> Image:
    return Image.read()


@pytest.fixture(scope="module")
def cluster() -> dict[str, Any]:
    return tomllib.loads(CLUSTER_TOML.read_text())


def of_image(project: Project) -> dict[str, Service]:
    """The services that run the cronoq image."""
    return {name: s for name, s in project.services.items() if s.image == "cronoq"}


def servers(project: Project) -> dict[str, Service]:
    """The cronoq servers: the image's own entrypoint, one shard each."""
    return {name: s for name, s in of_image(project).items() if "entrypoint" not in s.spec}


def host_port(url: str) -> tuple[str, int]:
    host, _, port = url.removeprefix("http://").partition(":")
    return host, int(port)


# --- the file ---------------------------------------------------------------------------------------


def test_validates_against_the_compose_specification(compose_schema: Path) -> None:
    """As written (variables unexpanded) and as Compose uses it (expanded from .env)."""
    validator = jsonschema.Draft201909Validator(json.loads(compose_schema.read_text()))
    for document in (load_raw(), Project.load().document):
        errors = [
            f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in validator.iter_errors(document)
        ]
        assert not errors, errors


def test_schema_check_is_not_vacuous(compose_schema: Path) -> None:
    validator = jsonschema.Draft201909Validator(json.loads(compose_schema.read_text()))
    broken = load_raw()
    broken["services"]["cronoq-router"]["depends_on"] = {"cronoq-cpu-1": {"condition": "when_ready"}}
    assert list(validator.iter_errors(broken))


def test_everything_it_names_exists(project: Project) -> None:
    services = project.services
    declared_volumes = set(project.document.get("volumes", {}))
    for service in services.values():
        for dependency, condition in service.depends_on.items():
            assert dependency in services, f"{service.name} depends on unknown {dependency}"
            if condition == "service_healthy":
                assert services[dependency].healthcheck, f"{dependency} has no healthcheck to wait for"
        for config in service.spec.get("configs", []):
            assert config["source"] in project.document["configs"], config
        for mount in project.mounts(service):
            if mount.source is None:
                assert mount.volume in declared_volumes, f"{service.name}: undeclared volume {mount.volume}"
            else:
                assert mount.source.exists(), f"{service.name}: {mount.source} does not exist"
        if "build" in service.spec:
            context = project.path(service.spec["build"]["context"])
            assert context == REPO and (context / service.spec["build"]["dockerfile"]).is_file()
    for name, config in project.document["configs"].items():
        assert project.path(config["file"]).is_file(), name


def test_cronoq_services_fit_the_image(project: Project, image: Image) -> None:
    """The image has no shell: every program a cronoq service runs (entrypoint, healthcheck) is one of
    the image's, in exec form; and the root filesystem is read-only."""
    for service in of_image(project).values():
        container = Container.of_service(project, image, service)
        local_program(container.argv[0])
        assert service.spec["read_only"] is True
        assert service.spec["build"] == {"context": "..", "dockerfile": "Dockerfile"}
        check = service.healthcheck
        if check is not None:
            assert check[0] == "CMD" and PurePosixPath(check[1]).parent == VENV_BIN, check
            local_program(check[1])


def test_topology(project: Project, cluster: dict[str, Any]) -> None:
    """Postgres 15; a leader and a standby per shard (cpu: pool default, gpu: pool llm), sharing the
    schema cronoq_{shard}; the router; a worker per pool."""
    services = project.services
    assert services["postgres"].image == "postgres:15"
    shards = {s["name"]: s for s in cluster["shards"]}
    assert {name: s["pools"] for name, s in shards.items()} == {"cpu": ["default"], "gpu": ["llm"]}
    assert cluster["server"]["insecure_peer_http"] is True
    assert cluster["store"] == {"kind": "postgres", "url_env": "DATABASE_URL", "schema": "cronoq_{shard}"}
    by_shard: dict[str, list[str]] = {}
    for name, service in servers(project).items():
        by_shard.setdefault(service.environment["CRONOQ_SHARD"], []).append(name)
        assert "@postgres:5432/" in service.environment["DATABASE_URL"]
    assert by_shard == {
        "cpu": ["cronoq-cpu-1", "cronoq-cpu-2"],
        "gpu": ["cronoq-gpu-1", "cronoq-gpu-2"],
    }
    for shard, members in by_shard.items():
        assert [host_port(m) for m in shards[shard]["members"]] == [(m, 7070) for m in members]
        endpoint, port = host_port(shards[shard]["endpoint"])
        assert port == 7070 and all(endpoint in services[m].aliases for m in members)
    assert services["cronoq-router"].spec["entrypoint"] == [str(VENV_BIN / "cronoq-router")]
    workers = [s for s in of_image(project).values() if "CRONOQ_POOL" in s.environment]
    assert {s.environment["CRONOQ_POOL"] for s in workers} == {"default", "llm"}
    for worker in workers:
        # Through the router, which redirects it to plain http:// shard endpoints on other hosts.
        assert worker.environment["CRONOQ_TARGET"] == "cronoq-router:7070"
        assert worker.environment["CRONOQ_INSECURE_REDIRECT_HTTP"] == "1"
        assert worker.environment["CRONOQ_TOKEN"] == ENV["CRONOQ_WORKER_TOKEN"]


def test_tokens_are_development_defaults() -> None:
    """compose/.env says what it is, and holds usable, distinct tokens for every role."""
    text = (COMPOSE_DIR / ".env").read_text()
    assert text.startswith("# DEVELOPMENT ONLY.")
    tokens = [ENV[name] for name in TOKEN_NAMES]
    assert len(set(tokens)) == 4 and all(len(t) >= 16 and t.startswith("dev-only-") for t in tokens)


def test_prometheus_scrapes_every_server_and_the_router(project: Project) -> None:
    services = project.services
    config = yaml.safe_load((COMPOSE_DIR / "prometheus" / "prometheus.yml").read_text())
    prometheus = services["prometheus"]
    command = " ".join(prometheus.spec["entrypoint"])
    targets: set[str] = set()
    for job in config["scrape_configs"]:
        # The token file the entrypoint writes from the variable Compose passes in.
        credentials = job["authorization"]["credentials_file"]
        assert f'"$CRONOQ_METRICS_TOKEN" > {credentials}' in command
        targets |= {t for group in job["static_configs"] for t in group["targets"]}
    assert prometheus.environment["CRONOQ_METRICS_TOKEN"] == ENV["CRONOQ_METRICS_TOKEN"]
    expected = {f"{name}:7071" for name, s in of_image(project).items() if s.healthcheck}
    assert targets == expected
    assert {"cronoq-router:7071", "cronoq-gpu-2:7071"} <= targets


def test_prometheus_evaluates_the_charts_alert_rules(project: Project) -> None:
    """The one rules file, the chart's: mounted where prometheus.yml's rule_files names it."""
    config = yaml.safe_load((COMPOSE_DIR / "prometheus" / "prometheus.yml").read_text())
    mounts = {m.target: m.source for m in project.mounts(project.services["prometheus"])}
    (rules,) = config["rule_files"]
    assert mounts[PurePosixPath(rules)] == REPO / "charts" / "cronoq" / "files" / "alerts.yaml"


def test_grafana_is_provisioned_with_the_dashboards(project: Project) -> None:
    grafana = project.services["grafana"]
    mounts = {m.source: m.target for m in project.mounts(grafana) if m.source is not None}
    dashboards = mounts[REPO / "dashboards"]
    provisioning = COMPOSE_DIR / "grafana" / "provisioning"
    assert mounts[provisioning] == PurePosixPath("/etc/grafana/provisioning")
    (provider,) = yaml.safe_load((provisioning / "dashboards" / "cronoq.yaml").read_text())["providers"]
    assert PurePosixPath(provider["options"]["path"]) == dashboards
    home = PurePosixPath(grafana.environment["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"])
    assert home.parent == dashboards and (REPO / "dashboards" / home.name).is_file()
    (source,) = yaml.safe_load((provisioning / "datasources" / "prometheus.yaml").read_text())["datasources"]
    assert source["type"] == "prometheus" and source["url"] == "http://prometheus:9090"
    assert "127.0.0.1:9090:9090" in project.services["prometheus"].spec["ports"]


# --- the configuration, as each process checks it ----------------------------------------------------


def test_every_process_accepts_the_shared_configuration(
    project: Project, image: Image, tmp_path: Path
) -> None:
    """``--check`` by a server of each shard (told its shard by CRONOQ_SHARD) and by the router, with
    the program and environment Compose gives them, all at once."""
    loopback = Loopback.allocate(of_image(project), image.exposed)
    checks: dict[str, subprocess.Popen[str]] = {}
    for name in ("cronoq-cpu-1", "cronoq-gpu-1", "cronoq-router"):
        process = Container.of_service(project, image, project.services[name]).local(
            loopback, tmp_path / name
        )
        checks[name] = subprocess.Popen(
            [*process.argv, "--check"], env=process.env, cwd=process.cwd, stdout=subprocess.PIPE, text=True
        )
    for name, proc in checks.items():
        out, _ = proc.communicate(timeout=60)
        assert proc.returncode == 0, f"{name}: {out}"
        shard = project.services[name].environment.get("CRONOQ_SHARD")
        expected = f"ok for shard {shard}" if shard else "ok: 2 shard(s): cpu, gpu"
        assert expected in out, f"{name}: {out}"


# --- the cluster, run ---------------------------------------------------------------------------------


@pytest.fixture
def running(
    project: Project, image: Image, tmp_path: Path, postgres_url: str, pg_schema: str
) -> Iterator[tuple[dict[str, list[LocalProcess]], Loopback]]:
    """Every cronoq container of the Compose file, started as ``make cluster`` starts them (in
    Compose's order, each waited for by its own healthcheck; ``deploy/cluster.py``). Changed from the
    file, besides addresses: DATABASE_URL is the test's Postgres, and the schema prefix is this test's
    (``pg_schema``) so that tests do not share tables."""
    loopback, _ = allocate(project, image, published=False)

    def own_schema(source: Path, text: str) -> str:
        if source != CLUSTER_TOML:
            return text
        assert text.count(SHARD_SCHEMA) == 1
        return text.replace(SHARD_SCHEMA, f'"{pg_schema}_{{shard}}"')

    processes = local_processes(project, image, loopback, tmp_path, postgres_url, edit=own_schema)
    try:
        start_in_order(project, processes)
        yield processes, loopback
    except BaseException:
        for process in (p for group in processes.values() for p in group):
            print(f"----- {process.name} -----\n{process.logs()}")
        raise
    finally:
        stop_in_order(project, processes)


def _status(url: str) -> int:
    """The HTTP status of GET ``url``; 0 while nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=2) as response:
            return int(response.status)
    except urllib.error.HTTPError as err:
        return err.code
    except OSError:
        return 0


@pytest.mark.slow
async def test_cluster_runs_tasks_of_both_shards_through_the_router(
    running: tuple[dict[str, list[LocalProcess]], Loopback], postgres_url: str, pg_schema: str
) -> None:
    processes, loopback = running
    # One leader and one standby per shard (the leader may still be recovering when both are up).
    deadline = time.monotonic() + 15
    for shard in ("cpu", "gpu"):
        urls = [f"http://{loopback.address(f'cronoq-{shard}-{n}', 7071)}/readyz" for n in (1, 2)]
        while sorted(ready := [_status(url) for url in urls]) != [200, 503]:
            assert time.monotonic() < deadline, (shard, ready)
            await asyncio.sleep(0.05)
    router = loopback.address("cronoq-router", 7070)
    async with Client(router, token=ENV["CRONOQ_CLIENT_TOKEN"]) as client:
        for pool, shard_number in (("default", 1), ("llm", 2)):
            done = await client.submit({"hello": pool}, pool=pool, wait=True, wait_timeout=20)
            assert done.result is not None and done.result.ok, done
            output = done.result.json()
            # Run by the example worker script, which names its pool and echoes the payload.
            assert output["pool"] == pool and output["echo"] == {"hello": pool}, output
            assert done.id >> 56 == shard_number  # a task id carries its shard's number
            assert (await client.get(done.id)).status == "succeeded"
    with psycopg.connect(postgres_url) as conn:
        for shard in ("cpu", "gpu"):
            (count,) = conn.execute(f"SELECT count(*) FROM {pg_schema}_{shard}.cronoq_tasks").fetchone() or (
                0,
            )
            assert count == 1, shard
    assert all(p.proc is not None and p.proc.poll() is None for group in processes.values() for p in group)
    assert "serving pool llm" in processes["worker-llm"][0].logs()
