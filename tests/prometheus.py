"""Prometheus for the tests of the alerts and dashboards: ``promtool``, the ``prometheus`` program and its
HTTP API.

Both programs come from Debian's ``prometheus`` package, which ``make test`` installs where they are
missing and ``apt-get`` runs as root. Elsewhere the fixtures skip the tests that need them, saying why
(``pytest -rs``, as ``make test`` runs it, prints the reason in the summary). The server the live test
(``tests/integration/test_monitoring.py``) asks through :class:`PrometheusAPI` is the one ``make
cluster`` starts (``deploy/cluster.py``), with its own configuration, storage and port, never one the
package may have started as a service.
"""

from __future__ import annotations

import json
import shutil
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from prometheus_client.metrics_core import Metric
from prometheus_client.openmetrics import parser as openmetrics_parser

MISSING = (
    "{name} is not installed: it comes with Debian's prometheus package, which `make test` installs "
    "where apt-get runs as root"
)


def _binary(name: str) -> Path:
    found = shutil.which(name)
    if found is None:
        pytest.skip(MISSING.format(name=name))
    return Path(found)


@pytest.fixture(scope="session")
def promtool() -> Path:
    return _binary("promtool")


@pytest.fixture(scope="session")
def prometheus_binary() -> Path:
    return _binary("prometheus")


@dataclass(frozen=True, slots=True)
class PrometheusAPI:
    """The HTTP API of a running Prometheus; ``url`` is its base."""

    url: str

    def api(self, path: str, **params: str) -> Any:
        """The ``data`` of a successful answer of the HTTP API at ``/api/v1/<path>``."""
        query = urllib.parse.urlencode(params)
        with urllib.request.urlopen(f"{self.url}/api/v1/{path}?{query}", timeout=10) as response:
            body = json.load(response)
        assert body["status"] == "success", body
        return body["data"]

    def query(self, expr: str) -> list[dict[str, Any]]:
        """The series an instant query of ``expr`` returns now (an error, e.g. bad PromQL, raises)."""
        try:
            data = self.api("query", query=expr)
        except urllib.error.HTTPError as err:
            raise AssertionError(f"{expr}: {err.read().decode(errors='replace')}") from None
        assert data["resultType"] == "vector", (expr, data)
        result: list[dict[str, Any]] = data["result"]
        return result

    def label_values(self, label: str, match: str) -> list[str]:
        values: list[str] = self.api(f"label/{label}/values", **{"match[]": match})
        return values


def openmetrics_families(text: str) -> dict[str, Metric]:
    """An OpenMetrics page's families by name, read by prometheus-client's parser, which is strict:
    it refuses a page without ``# EOF``, a counter sample without ``_total``, a malformed summary."""
    families = openmetrics_parser.text_string_to_metric_families(text)  # type: ignore[no-untyped-call]
    return {family.name: family for family in families}
