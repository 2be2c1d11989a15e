"""The JSON Schemas of the configuration files (``docs/cronoq-config.schema.json`` and
``docs/cronoq-operator.schema.json``): published exactly as the generator makes them from the models,
valid draft 2020-12, passing every example and documented configuration, failing a mistake at its path,
and never failing what the server accepts. (The chart's rendered configurations are checked in
``tests/deploy/test_config_schemas.py``, where Helm is.)"""

from __future__ import annotations

import copy
import json
import re
import textwrap
from collections.abc import Callable, Iterator
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cronoq.config import ConfigError, parse_config, syntax_of
from cronoq.config.problems import Problems
from cronoq.config.schema import Schema, config_schema, doc_descriptions, dumps
from cronoq.config.syntax import parse_document
from kube_operator.schema import operator_schema
from tests.unit.test_config import ENV, FULL, FULL_DOCUMENT, FULL_PATHS, in_syntax, values

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
CONFIG_SCHEMA = DOCS / "cronoq-config.schema.json"
OPERATOR_SCHEMA = DOCS / "cronoq-operator.schema.json"
# Every configuration file the repository ships.
EXAMPLES = [
    ROOT / "examples" / "cronoq.toml",
    ROOT / "compose" / "cronoq.toml",
    ROOT / "deploy" / "image" / "cronoq.toml",
]
FENCED = re.compile(r"^[ \t]*```(toml|yaml)\n(.*?)^[ \t]*```", re.MULTILINE | re.DOTALL)


@cache
def validator(path: Path) -> jsonschema.Draft202012Validator:
    return jsonschema.Draft202012Validator(json.loads(path.read_text(encoding="utf-8")))


def errors(path: Path, document: object) -> list[tuple[str, str]]:
    """Where the schema at ``path`` finds ``document`` wrong: (JSON path, message) pairs."""
    return sorted((error.json_path, error.message) for error in validator(path).iter_errors(document))


def read(text: str, syntax: str) -> dict[str, object]:
    document = parse_document(text, "yaml" if syntax == "yaml" else "toml", Problems())
    assert document is not None
    return document


@pytest.mark.parametrize(
    ("published", "build", "docs"),
    [
        (CONFIG_SCHEMA, config_schema, DOCS / "configuration.md"),
        (OPERATOR_SCHEMA, operator_schema, DOCS / "operator.md"),
    ],
    ids=["config", "operator"],
)
def test_the_published_schema_is_what_the_generator_makes(
    published: Path, build: Callable[[str | None], Schema], docs: Path
) -> None:
    """Generated from the model and described from its reference page: after changing either, `make
    schema` writes the file again (nobody edits it by hand)."""
    made = dumps(build(docs.read_text(encoding="utf-8")))
    assert published.read_text(encoding="utf-8") == made, f"{published.name} is stale: run `make schema`"


@pytest.mark.parametrize("published", [CONFIG_SCHEMA, OPERATOR_SCHEMA], ids=["config", "operator"])
def test_the_schemas_are_valid_draft_2020_12(published: Path) -> None:
    schema = json.loads(published.read_text(encoding="utf-8"))
    assert schema["$schema"] == "https://json-schema.org/draft/2020-12/schema"
    jsonschema.Draft202012Validator.check_schema(schema)


def test_every_table_and_key_is_described_from_the_reference() -> None:
    """The tables of keys of docs/configuration.md describe every key (a table's key, without a row of
    its own, by the paragraph under the table's heading), save the few it describes in prose (a
    scaler's and a resource's ``kind``, a webhook's ``url`` and ``token_env``)."""
    schema = config_schema((DOCS / "configuration.md").read_text(encoding="utf-8"))
    undescribed = {
        f"{name}.{key}"
        for name, table in schema["$defs"].items()
        for key, value in table["properties"].items()
        if "description" not in value and key != "kind"
    }
    assert undescribed == {"WebhookScaler.url", "WebhookScaler.token_env"}
    assert schema["$defs"]["TlsSection"]["description"] == "TLS for both listeners. Present means on."
    tokens = schema["$defs"]["AuthSection"]["properties"]["tokens"]["description"]
    assert tokens.startswith("Bearer tokens (`authorization: Bearer <token>`).")
    assert schema["$defs"]["RetrySection"]["properties"]["max_backoff_s"]["description"] == "Longest delay."
    assert not config_schema()["$defs"]["TlsSection"].get("description")  # without docs: no descriptions


def test_descriptions_come_from_tables_of_keys() -> None:
    page = """
## `[outer]`

What the table is for.

| key | type | meaning |
|---|---|---|
| `a` | string | The a key, with a [link](x.md) and a \\| bar. |
| `inner[].b` | string | A key of each entry of inner. |

```toml
# not a heading
```

`sub` keys:

| key | meaning |
|---|---|
| `c` | **Bold** c. |

| role | meaning |
|---|---|
| `admin` | not a key |
"""
    assert doc_descriptions(page) == {
        ("outer", ""): "What the table is for.",
        ("outer", "a"): "The a key, with a link and a | bar.",
        ("outer.inner", "b"): "A key of each entry of inner.",
        ("outer.sub", "c"): "Bold c.",
    }


# ------------------------------------------------------------------------------- what it accepts


@pytest.mark.parametrize("path", EXAMPLES, ids=[str(p.relative_to(ROOT)) for p in EXAMPLES])
def test_every_example_configuration_passes(path: Path) -> None:
    assert errors(CONFIG_SCHEMA, read(path.read_text(encoding="utf-8"), syntax_of(path))) == []


def documented_configs() -> Iterator[tuple[str, str, dict[str, object]]]:
    """Each configuration in the reference pages: (where, which schema, document). Fenced TOML and YAML
    blocks of configuration.md; kubernetes.md's TOML blocks, its excerpts of the chart's file (YAML
    blocks starting ``# cronoq.yaml``) and the ``config`` mapping of its values blocks; and operator.md's
    TOML blocks (the operator's, with ``servers``, and a server's)."""
    for page in ("configuration.md", "kubernetes.md", "operator.md"):
        for index, match in enumerate(FENCED.finditer((DOCS / page).read_text(encoding="utf-8"))):
            syntax, text = match.group(1), textwrap.dedent(match.group(2))
            where = f"{page} block {index}"
            if page == "configuration.md" or syntax == "toml" or text.startswith("# cronoq.yaml"):
                document = read(text, syntax)
                yield where, "operator" if "servers" in document else "config", document
            elif isinstance(values := yaml.safe_load(text), dict) and isinstance(values.get("config"), dict):
                yield where, "config", values["config"]


def test_every_documented_configuration_passes() -> None:
    found = list(documented_configs())
    assert {(where.split()[0], schema) for where, schema, _ in found} == {
        ("configuration.md", "config"),
        ("kubernetes.md", "config"),
        ("operator.md", "operator"),
        ("operator.md", "config"),
    }
    for where, schema, document in found:
        path = OPERATOR_SCHEMA if schema == "operator" else CONFIG_SCHEMA
        assert errors(path, document) == [], where


@pytest.mark.parametrize("syntax", ["toml", "yaml"])
def test_a_file_with_every_key_passes(syntax: str) -> None:
    assert errors(CONFIG_SCHEMA, read(in_syntax(FULL, "yaml" if syntax == "yaml" else "toml"), syntax)) == []


# ------------------------------------------------------------------------------- what it refuses

CONFIG_MISTAKES: list[tuple[dict[str, Any], str, str]] = [
    ({"limits": {"max_wait_sx": 1}}, "$.limits", "'max_wait_sx' was unexpected"),
    ({"bogus": {}}, "$", "'bogus' was unexpected"),
    ({"pools": [{"name": "a", "lease_ttl_s": -1}]}, "$.pools[0].lease_ttl_s", "less than or equal to the minimum of 0"),
    ({"pools": [{"name": "a", "max": 10**7}]}, "$.pools[0].max", "greater than the maximum of 1000000"),
    ({"pools": [{"lease_ttl_s": 1}]}, "$.pools[0]", "'name' is a required property"),
    ({"pools": [{"name": "a b"}]}, "$.pools[0].name", "does not match"),
    ({"pools": [{"name": "a", "overflow": "drop"}]}, "$.pools[0].overflow", "is not one of"),
    ({"pools": [{"name": "a", "tenant_weights": {"x": 0}}]}, "$.pools[0].tenant_weights.x", "minimum of 0"),
    ({"pools": [{"name": "a", "scaler": {"kind": "webhook"}}]}, "$.pools[0].scaler", "'url' is a required property"),
    ({"store": {"kind": "sqlite"}}, "$.store", "'path' is a required property"),
    ({"store": {"kind": "sqlite", "path": "x", "url": "y"}}, "$.store", "'url' was unexpected"),
    ({"store": {"kind": "mysql"}}, "$.store.kind", "is not one of"),
    ({"store": {"path": "x"}}, "$.store", "'kind' is a required property"),
    ({"server": {"insecure_no_auth": 1}}, "$.server.insecure_no_auth", "is not of type 'boolean'"),
    ({"server": {"grpc_addr": "localhost"}}, "$.server.grpc_addr", "does not match"),
    ({"auth": {"tokens": [{"role": "admin", "token": "short"}]}}, "$.auth.tokens[0].token", "is too short"),
    ({"resources": [{"kind": "semaphore", "name": "r"}]}, "$.resources[0]", "'permits' is a required property"),
    ({"shards": [{"name": "s", "number": 1, "endpoint": "s:7070"}]}, "$.shards[0].endpoint", "does not match"),
]  # fmt: skip


@pytest.mark.parametrize(
    ("document", "path", "message"), CONFIG_MISTAKES, ids=[case[1] for case in CONFIG_MISTAKES]
)
def test_a_mistake_fails_at_its_path(document: dict[str, Any], path: str, message: str) -> None:
    found = errors(CONFIG_SCHEMA, document)
    assert [where for where, text in found if message in text] == [path], found
    with pytest.raises(ConfigError):  # and the server refuses it as well
        parse_config(json.dumps(document), syntax="yaml", env={})


def test_the_operator_schema_fails_a_mistake_at_its_path() -> None:
    server = {"name": "a", "url": "http://c:7070", "token_env": "T"}
    assert errors(OPERATOR_SCHEMA, {"servers": [server], "interval_s": 15, "namespaces": ["jobs"]}) == []
    assert errors(OPERATOR_SCHEMA, {"servers": [{**server, "url": "c:7070"}], "interval_s": 0.5}) == [
        ("$.interval_s", "0.5 is less than the minimum of 1"),
        ("$.servers[0].url", "'c:7070' does not match '[Hh][Tt][Tt][Pp][Ss]?://'"),
    ]
    assert errors(OPERATOR_SCHEMA, {"servers": [{**server, "tokn_env": "T"}], "namespaces": ["Jobs"]}) == [
        ("$.namespaces[0]", "'Jobs' does not match '^(?:[a-z0-9]([-a-z0-9]{0,61}[a-z0-9])?)$'"),
        ("$.servers[0]", "Additional properties are not allowed ('tokn_env' was unexpected)"),
    ]


# ------------------------------------------------------------------- never stricter than the server


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(FULL_PATHS), values | st.none())
def test_what_the_server_accepts_the_schema_accepts(path: tuple[str | int, ...], replacement: object) -> None:
    """A file with every key, one value changed (or left out): when the server accepts it, so must the
    schema, or an editor would flag a file that works."""
    document = copy.deepcopy(FULL_DOCUMENT)
    parent: Any = document
    for step in path[:-1]:
        parent = parent[step]
    if replacement is None:
        del parent[path[-1]]
    else:
        parent[path[-1]] = replacement
    try:
        parse_config(yaml.safe_dump(document), syntax="yaml", env=ENV)
    except ConfigError:
        return
    assert errors(CONFIG_SCHEMA, document) == []
