"""Every configuration the Helm charts render passes the published JSON Schema of its file: the cronoq
chart's for each scenario of ``test_chart`` (servers' and routers' file), the operator chart's for each
of its example values files. (The schemas themselves are tested in tests/unit/test_config_schema.py.)"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jsonschema
import pytest

from cronoq.config import SYNTAXES, syntax_of
from cronoq.config.problems import Problems
from cronoq.config.syntax import parse_document

from .chart_render import render
from .conftest import REPO
from .test_chart import SCENARIOS
from .test_operator_chart import CI_VALUES, one
from .test_operator_chart import render as render_operator

DOCS = REPO / "docs"


def schema_errors(schema: str, document: object) -> list[str]:
    validator = jsonschema.Draft202012Validator(json.loads((DOCS / schema).read_text(encoding="utf-8")))
    return [f"{error.json_path}: {error.message}" for error in validator.iter_errors(document)]


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_the_cronoq_charts_configuration_passes_its_schema(helm: Path, scenario: str) -> None:
    config = render(helm, SCENARIOS[scenario]).config
    assert config["server"] and schema_errors("cronoq-config.schema.json", config) == []


@CI_VALUES
def test_the_operator_charts_configuration_passes_its_schema(helm: Path, values: Path) -> None:
    data: dict[str, str] = one(render_operator(helm, [values]), "ConfigMap")["data"]
    files = {name: text for name, text in data.items() if Path(name).suffix in SYNTAXES}
    assert len(files) == 1, sorted(data)
    [(name, text)] = files.items()
    document: dict[str, Any] | None = parse_document(text, syntax_of(name), Problems())
    assert document is not None and document["servers"]
    assert schema_errors("cronoq-operator.schema.json", document) == []
