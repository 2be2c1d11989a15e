"""The structure of the OpenAPI document (route coverage and live answers are checked in test_http_api)."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import pytest

from cronoq.api import http_codec as codec
from cronoq.api import openapi
from cronoq.api.openapi import OPENAPI
from cronoq.errors import InvalidArgument
from cronoq.v1 import cronoq_pb2 as pb

METHODS = {"get", "post", "put", "delete", "patch", "head", "options"}


def walk(node: object, where: str = "#") -> Iterator[tuple[str, dict[str, Any]]]:
    """Every object in the document with its JSON pointer."""
    if isinstance(node, dict):
        yield where, node
        for key, value in node.items():
            yield from walk(value, f"{where}/{key}")
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from walk(value, f"{where}/{i}")


def resolve(ref: str) -> object:
    node: Any = OPENAPI
    for part in ref.removeprefix("#/").split("/"):
        node = node[part]
    return node


def test_it_is_an_openapi_3_0_document_and_plain_json() -> None:
    assert re.fullmatch(r"3\.0\.\d+", OPENAPI["openapi"])
    assert OPENAPI["info"]["title"] and OPENAPI["info"]["version"]
    assert set(OPENAPI["components"]) >= {"schemas", "responses", "securitySchemes"}
    assert json.loads(json.dumps(OPENAPI)) == OPENAPI


def test_every_reference_resolves() -> None:
    refs = [(where, node["$ref"]) for where, node in walk(OPENAPI) if "$ref" in node]
    assert refs
    for where, ref in refs:
        assert ref.startswith("#/components/"), where
        assert isinstance(resolve(ref), dict), f"{where}: {ref}"


def test_operations_are_complete() -> None:
    ids = []
    for path, item in OPENAPI["paths"].items():
        assert path.startswith("/")
        templated = set(re.findall(r"{(\w+)}", path))
        for method, op in item.items():
            assert method in METHODS, f"{path}: {method}"
            ids.append(op["operationId"])
            assert op["summary"] and op["responses"], f"{method} {path}"
            declared = {p["name"] for p in op.get("parameters", []) if p["in"] == "path"}
            assert declared == templated, f"{method} {path}"
            for param in op.get("parameters", []):
                assert param["in"] in {"path", "query"} and "schema" in param
                assert param["in"] != "path" or param["required"] is True
            for status, response in op["responses"].items():
                assert re.fullmatch(r"[1-5]\d\d", status), f"{method} {path}: {status}"
                if "$ref" in response:
                    response = resolve(response["$ref"])
                assert response["description"], f"{method} {path}: {status}"
                if int(status) >= 400:
                    schema = response["content"]["application/json"]["schema"]
                    assert schema == {"$ref": "#/components/schemas/Error"}
    assert len(ids) == len(set(ids)), "operationIds must be unique"


def test_public_routes_are_exactly_the_probes_and_this_document() -> None:
    public = {
        path for path, item in OPENAPI["paths"].items() for op in item.values() if op.get("security") == []
    }
    assert public == {"/healthz", "/readyz", "/v1/openapi.json"}
    assert OPENAPI["security"] == [{"bearer": []}]


def test_refusals_every_route_can_give_are_documented() -> None:
    """Every route refuses an unknown query parameter or a body it does not read (400) and a body over
    the limit (413); every authenticated API route can reach another shard (the task's or the pool's
    owner, or all of them), so it may be refused as a call this server will not forward (409)."""
    for path, item in OPENAPI["paths"].items():
        for method, op in item.items():
            statuses = set(op["responses"])
            assert {"400", "413"} <= statuses, f"{method} {path}"
            if path.startswith("/v1/") and op.get("security") != []:
                assert "409" in statuses, f"{method} {path}"


def test_nullable_is_only_put_where_openapi_3_0_honours_it() -> None:
    """Beside a ``$ref`` (or without a type) ``nullable`` has no effect: refused when the document is built."""
    with pytest.raises(ValueError, match="nullable needs a type"):
        openapi._nullable({"$ref": "#/components/schemas/TaskId"})
    assert openapi._nullable({"type": "string", "enum": ["a"]}) == {
        "type": "string",
        "enum": ["a", None],
        "nullable": True,
    }


def test_the_servers_are_wherever_the_document_was_fetched() -> None:
    assert OPENAPI["servers"] == [{"url": "/"}]


def test_request_bodies_are_closed_like_the_gateway() -> None:
    """Unknown fields are refused (400), so every request schema says additionalProperties: false."""
    for name in ("TaskSpec", "SubmitRequest", "SubmitBatchRequest", "RetryPolicy", "Dep"):
        assert OPENAPI["components"]["schemas"][name]["additionalProperties"] is False, name


@pytest.mark.parametrize("name", OPENAPI["components"]["schemas"]["SubmitRequest"]["properties"])
def test_every_described_submit_field_is_accepted_by_the_gateway(name: str) -> None:
    try:
        codec.submit_request({name: {"surely": ["not", "valid"]}})
    except InvalidArgument as err:
        assert not err.message.startswith(f"{name}: unknown field"), err.message


def test_every_wire_task_field_has_a_described_json_field() -> None:
    """The JSON TaskSpec is the wire TaskSpec: instants are ``*_at``, bytes also come as base64."""
    renamed = {"deadline_unix_ns": "deadline_at", "start_unix_ns": "start_at"}
    wire = {renamed.get(f.name, f.name) for f in pb.TaskSpec.DESCRIPTOR.fields}
    described = set(OPENAPI["components"]["schemas"]["TaskSpec"]["properties"])
    assert described == wire | {"payload_base64"}
    with pytest.raises(InvalidArgument, match="unknown field"):
        codec.submit_request({"deadline_unix_ns": 1})


def test_enums_match_the_wire_names() -> None:
    schemas = OPENAPI["components"]["schemas"]
    assert schemas["Status"]["enum"] == list(codec.STATUS_NAMES.values())
    assert schemas["Priority"]["enum"] == list(codec.PRIORITY_NAMES.values())
    # Optional request fields may be null ("not given"); OpenAPI 3.0 wants null listed in a nullable enum.
    assert schemas["Dep"]["properties"]["on"]["enum"] == [
        *sorted(codec.COND_NAMES.values(), key=["success", "failure", "complete"].index),
        None,
    ]
    assert schemas["SubmitRequest"]["properties"]["on_miss"]["enum"] == [*codec.MISS_NAMES.values(), None]


def test_optional_request_fields_are_nullable_and_required_ones_are_not() -> None:
    """The gateway reads ``null`` as "not given" for every field, so a required field cannot be null."""
    schemas = OPENAPI["components"]["schemas"]
    for name in ("TaskSpec", "SubmitRequest", "SubmitBatchRequest", "RetryPolicy", "Dep", "RecurringRequest"):
        required = set(schemas[name].get("required", ()))
        for field, schema in schemas[name]["properties"].items():
            typed = "type" in schema or "allOf" in schema
            assert schema.get("nullable", False) is (field not in required and typed), f"{name}.{field}"
