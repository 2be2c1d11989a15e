"""Fuzz the HTTP/JSON API of a real server process over a real socket, and the same API through a
router in front of two shards (every test runs against both).

1. schemathesis against the server's own ``/v1/openapi.json`` (its examples, coverage and fuzzing phases:
   boundary values, wrong types, missing and unexpected fields, other methods, requests without and with
   a wrong credential), once with a client token and once with an admin token. Every answer must be
   documented (status code, content type, body schema) and none may be a 5xx but the documented 504 of
   a server-side wait.
2. Hostile requests beyond the schema: malformed JSON, a wrong type in every field, huge numbers,
   NaN/Infinity, keys given twice, NUL and broken Unicode, other encodings than UTF-8, wrong content
   types, bodies over the size limit, unknown query parameters. Each is refused with a 4xx whose message
   names the field, and nothing is inserted.
"""

from __future__ import annotations

import http.client
import json
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import hypothesis
import pytest
import schemathesis
from hypothesis import strategies as st
from schemathesis import engine
from schemathesis.engine import Status, events

from cronoq.api.openapi import OPENAPI

from .helpers import token, toml_table
from .serverproc import ServerProcess, assert_clean_log
from .shardproc import ShardSpec, server_or_router

CLIENT = "client-fuzz-token-0123456789abcdef"
ADMIN = "admin-fuzz-token-0123456789abcdef"
MAX_BODY = 65536

LIMITS_AND_TOKENS = (
    toml_table("limits", max_wait_s=0.2, max_http_body_bytes=MAX_BODY, max_list=50)
    + token("FUZZ_CLIENT_TOKEN", "client", env=True)
    + token("FUZZ_ADMIN_TOKEN", "admin", env=True)
)
CONFIG = (
    LIMITS_AND_TOKENS
    + """
[[pools]]
name = "default"
max = 4

[[pools]]
name = "reject"
max = 1
max_pending = 2
overflow = "reject"

[[resources]]
kind = "semaphore"
name = "gpu"
permits = 2
"""
)
ENV = {"FUZZ_CLIENT_TOKEN": CLIENT, "FUZZ_ADMIN_TOKEN": ADMIN}

# Answers schemathesis may not hold against the server:
# - a server-side wait that ends unfinished is the documented 504 (max_wait_s is 0.2 s here);
# - GET /v1/tasks/{ref} also matches /v1/tasks/x:cancel (a lookup of the key "x:cancel"), so the Allow
#   header of a wrong method there rightly lists GET as well as POST;
# - a schema-valid request may still break a rule no schema can state (tolerance_s only with a start, at
#   most limits.max_tags tags, no NUL in names, a cron expression that parses, limits of this config): a
#   400 naming the field is then the right answer, so "positive data is accepted" is not checked.
WAIT_ANSWERS = {"not_a_server_error": {"expected-statuses": ["2xx", "3xx", "4xx", "504"]}}
OPERATION_OVERRIDES = [
    {"include-operation-id": "submit", "checks": WAIT_ANSWERS},
    {"include-operation-id": "waitTask", "checks": WAIT_ANSWERS},
    {"include-operation-id": "cancelTask", "checks": {"allow_header_conformance": {"enabled": False}}},
]


# The same API through a router in front of two shards: the router parses, checks and routes every
# request itself before a shard sees it. Each pool's options go to its shard; the rest is shared.
SHARDS = [
    ShardSpec("a", 1, ("default",), pool_options="max = 4"),
    ShardSpec("b", 2, ("reject",), pool_options='max = 1\nmax_pending = 2\noverflow = "reject"'),
]
GPU_ON_A = '[[resources]]\nkind = "semaphore"\nname = "gpu"\npermits = 2\nshard = "a"\n'
SHARED = LIMITS_AND_TOKENS + GPU_ON_A


@pytest.fixture(scope="module", params=["server", "router"])
def fuzz_server(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    directory = Path(tmp_path_factory.mktemp(f"fuzz-http-{request.param}"))
    with server_or_router(request.param, directory, CONFIG, SHARDS, SHARED, ENV) as proc:
        yield proc


def _schemathesis(
    server: ServerProcess, token: str, max_examples: int, coverage: bool
) -> tuple[list[str], set[str]]:
    """Run schemathesis' engine against the live server; the failures found and the operations tested."""
    config = schemathesis.Config.from_dict(
        {
            "seed": 6,
            "cache": {"enabled": False},  # no crash replays from (or files left in) the working directory
            "base-url": server.http,
            "request-timeout": 10,
            "workers": 1,
            "auth": {"openapi": {"bearer": {"bearer": token}}},
            "generation": {"max-examples": max_examples, "deterministic": True},
            "phases": {"coverage": {"enabled": coverage}, "stateful": {"enabled": False}},
            "checks": {"positive_data_acceptance": {"enabled": False}},
            "operations": OPERATION_OVERRIDES,
        }
    )
    loaded = schemathesis.openapi.from_url(f"{server.http}/v1/openapi.json", config=config)
    assert loaded.raw_schema == json.loads(json.dumps(OPENAPI))  # the served document is the one under test
    # The SSE stream never ends on its own; its request errors are fuzzed by hand below.
    schema = loaded.exclude(path="/v1/watch")
    failures: list[str] = []
    tested: set[str] = set()
    for event in engine.from_schema(schema).execute():
        if isinstance(event, events.ScenarioFinished):
            tested.add(event.recorder.label)
            for case_id, nodes in event.recorder.checks.items():
                for node in nodes:
                    if node.status is Status.FAILURE and node.failure_info is not None:
                        failure = node.failure_info.failure
                        interaction = event.recorder.interactions.get(case_id)
                        sent = (
                            f"{interaction.request.method} {interaction.request.uri} "
                            f"{(interaction.request.body or b'')[:300]!r}"
                            if interaction is not None
                            else "?"
                        )
                        failures.append(
                            f"[{event.phase}] {event.recorder.label}: {failure.title}: "
                            f"{failure.message[:400]}\n  sent: {sent}"
                        )
        elif isinstance(event, events.NonFatalError | events.FatalError):
            failures.append(f"schemathesis error: {event}")
    return failures, tested


# The admin token may call everything, so its run includes the (slow, ~20 s) coverage phase: boundary
# values, each field missing or of each wrong type, other methods, other content types. The client
# token's run is random fuzzing only: mostly it checks that refusals (403 on admin routes) are documented.
@pytest.mark.parametrize(
    ("token", "examples", "coverage"), [(CLIENT, 10, False), (ADMIN, 15, True)], ids=["client", "admin"]
)
def test_schemathesis_answers_are_documented_and_never_5xx(
    fuzz_server: ServerProcess, token: str, examples: int, coverage: bool
) -> None:
    failures, tested = _schemathesis(fuzz_server, token, examples, coverage)
    assert not failures, "\n".join(failures)
    # Everything but the SSE stream (excluded) and this document (nothing to generate for it).
    described = {f"{method.upper()} {path}" for path, item in OPENAPI["paths"].items() for method in item}
    assert described - {"GET /v1/watch", "GET /v1/openapi.json"} <= tested
    assert fuzz_server.probe("/healthz") == 200
    assert_clean_log(fuzz_server)


# ------------------------------------------------------------------------------------ hostile requests


def request(
    server: ServerProcess,
    method: str,
    path: str,
    body: bytes | None = None,
    *,
    token: str | None = CLIENT,
    content_type: str | None = "application/json",
    headers: dict[str, str] | None = None,
) -> tuple[int, dict[str, Any]]:
    """One request on a fresh connection; the status and the JSON answer (every answer must be JSON)."""
    sent = dict(headers or {})
    if token is not None:
        sent["authorization"] = f"Bearer {token}"
    if content_type is not None and body is not None:
        sent["content-type"] = content_type
    conn = http.client.HTTPConnection("127.0.0.1", server.http_port, timeout=10)
    try:
        conn.request(method, path, body=body, headers=sent)
        response = conn.getresponse()
        text = response.read()
        assert response.getheader("content-type", "").startswith("application/json"), (response.status, text)
        return response.status, json.loads(text)
    finally:
        conn.close()


def counts(server: ServerProcess) -> tuple[int, int, int]:
    """Tasks submitted and live, and recurring schedules: what a refused request must not change."""
    status, snapshot = request(server, "GET", "/v1/snapshot", token=ADMIN)
    assert status == 200, snapshot
    status, schedules = request(server, "GET", "/v1/recurring", token=ADMIN)
    assert status == 200, schedules
    return snapshot["totals"]["submitted"], snapshot["live_tasks"], len(schedules["schedules"])


def _schema(schema: dict[str, Any]) -> dict[str, Any]:
    """A property's schema with references and nullable wrappers resolved."""
    while True:
        if "$ref" in schema:
            schema = OPENAPI["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
        elif "allOf" in schema:
            schema = schema["allOf"][0]
        else:
            return schema


def wrong_value(schema: dict[str, Any]) -> object:
    """A JSON value of another type than ``schema`` allows."""
    schema = _schema(schema)
    kind = str(schema.get("type"))
    if "oneOf" in schema and "type" not in schema:  # an instant (string or number), a dependency id
        return True
    return {
        "string": 12345,
        "number": "12",
        "integer": "12",
        "boolean": "true",
        "object": [1, 2],
        "array": {"a": 1},
    }[kind]


def _fields(name: str) -> list[tuple[str, dict[str, Any]]]:
    """The typed fields of a request schema (``payload`` takes any JSON value)."""
    properties = OPENAPI["components"]["schemas"][name]["properties"]
    return [(f, s) for f, s in properties.items() if "type" in _schema(s) or "oneOf" in _schema(s)]


SUBMIT_FIELDS = _fields("SubmitRequest")
# The same wrong value one level down: in each nested object and map, and in one task of a batch.
NESTED: list[tuple[str, dict[str, Any], str]] = [
    *((f"retry.{f}", {"retry": {f: wrong_value(s)}}, f"retry.{f}") for f, s in _fields("RetryPolicy")),
    *(
        (
            f"deps[0].{f}",
            {"deps": [{"key": "k", f: wrong_value(s)} if f == "on" else {f: wrong_value(s)}]},
            f"deps[0].{f}",
        )
        for f, s in _fields("Dep")
    ),
    ("tags value", {"tags": {"a": 1}}, "tags.a"),
    ("labels value", {"labels": {"a": None}}, "labels.a"),
    ("resources value", {"resources": {"gpu": "1"}}, "resources.gpu"),
    ("resources huge", {"resources": {"gpu": 2**40}}, "resources.gpu"),
    ("deps[0] not an object", {"deps": ["x"]}, "deps[0]"),
    ("retry not an object", {"retry": 3}, "retry"),
]


@pytest.mark.parametrize(("field", "schema"), SUBMIT_FIELDS, ids=[f for f, _ in SUBMIT_FIELDS])
def test_a_wrong_type_in_any_submit_field_is_refused_naming_it(
    fuzz_server: ServerProcess, field: str, schema: dict[str, Any]
) -> None:
    before = counts(fuzz_server)
    body = json.dumps({field: wrong_value(schema)}).encode()
    for path, prefix in (("/v1/tasks", field), ("/v1/tasks:batch", f"tasks[1].{field}")):
        sent = body if path == "/v1/tasks" else b'{"tasks": [{}, ' + body + b"]}"
        if path.endswith(":batch") and field in ("wait", "wait_timeout_s"):
            prefix = f"tasks[1].{field}: unknown field"  # not a TaskSpec field
        status, answer = request(fuzz_server, "POST", path, sent)
        assert status == 400, (path, answer)
        assert answer["code"] == "invalid_argument"
        assert answer["error"].startswith(f"{prefix}"), (path, answer)
    assert counts(fuzz_server) == before


@pytest.mark.parametrize(("name", "body", "prefix"), NESTED, ids=[n for n, _, _ in NESTED])
def test_a_wrong_type_inside_nested_fields_is_refused_naming_its_path(
    fuzz_server: ServerProcess, name: str, body: dict[str, Any], prefix: str
) -> None:
    before = counts(fuzz_server)
    status, answer = request(fuzz_server, "POST", "/v1/tasks", json.dumps(body).encode())
    assert (status, answer["code"]) == (400, "invalid_argument"), answer
    assert answer["error"].startswith(f"{prefix}:"), answer
    template = {"name": "fuzz", "cron": "0 3 * * *", "template": body}
    status, answer = request(fuzz_server, "POST", "/v1/recurring", json.dumps(template).encode(), token=ADMIN)
    assert status == 400 and answer["error"].startswith(f"template.{prefix}:"), answer
    assert counts(fuzz_server) == before


# (what, body, content type, status, message prefix)
HOSTILE: list[tuple[str, bytes, str | None, int, str]] = [
    ("empty body", b"", "application/json", 400, "request body: invalid JSON"),
    ("truncated", b'{"pool": "default"', "application/json", 400, "request body: invalid JSON"),
    ("no value", b'{"pool": }', "application/json", 400, "request body: invalid JSON"),
    ("trailing garbage", b'{"pool": "default"} x', "application/json", 400, "request body: invalid JSON"),
    ("single quotes", b"{'pool': 'default'}", "application/json", 400, "request body: invalid JSON"),
    ("not UTF-8", b'{"kind": "\xff\xfe"}', "application/json", 400, "request body: invalid JSON: not UTF-8"),
    (
        "UTF-16",
        '{"kind": "x"}'.encode("utf-16"),
        "application/json",
        400,
        "request body: invalid JSON: not UTF-8",
    ),
    (
        "latin-1",
        b'{"kind": "x"}',
        "application/json; charset=iso-8859-1",
        415,
        "request body: JSON must be UTF-8",
    ),
    (
        "key twice",
        b'{"pool": "reject", "pool": "default"}',
        "application/json",
        400,
        "pool: given more than once",
    ),
    (
        "key twice in payload",
        b'{"payload": {"a": 1, "a": 2}}',
        "application/json",
        400,
        "payload.a: given more",
    ),
    ("null document", b"null", "application/json", 400, "request body: expected a JSON object"),
    ("array document", b"[{}]", "application/json", 400, "request body: expected a JSON object"),
    ("string document", b'"task"', "application/json", 400, "request body: expected a JSON object"),
    (
        "deeply nested",
        b'{"payload": ' + b"[" * 30_000 + b"]" * 30_000 + b"}",
        "application/json",
        400,
        "request body: invalid JSON",
    ),
    ("NaN", b'{"timeout_s": NaN}', "application/json", 400, "request body: invalid JSON: NaN is not JSON"),
    ("Infinity", b'{"deadline_in_s": Infinity}', "application/json", 400, "request body: invalid JSON"),
    ("-Infinity", b'{"start_at": -Infinity}', "application/json", 400, "request body: invalid JSON"),
    (
        "float overflow",
        b'{"timeout_s": 1e400}',
        "application/json",
        400,
        "timeout_s: number 1e400 is out of range",
    ),
    (
        "start_at and start_in_s",
        b'{"start_at": 1, "start_in_s": 1}',
        "application/json",
        400,
        "task: use either start_in_s or start_at",
    ),
    ("start_at before 1970", b'{"start_at": -1}', "application/json", 400, "task.start_at:"),
    ("huge integer seconds", b'{"timeout_s": 1' + b"0" * 400 + b"}", "application/json", 400, "timeout_s:"),
    ("centuries of timeout", b'{"timeout_s": 1e300}', "application/json", 400, "task.timeout_s:"),
    ("huge deadline", b'{"deadline_in_s": 1e18}', "application/json", 400, "task.deadline_in_s:"),
    ("negative timeout", b'{"timeout_s": -1}', "application/json", 400, "task.timeout_s:"),
    ("start_at far future", b'{"start_at": 1e300}', "application/json", 400, "start_at: out of range"),
    ("start_at year 9999", b'{"start_at": "9999-12-31T23:59:59Z"}', "application/json", 400, "start_at:"),
    ("start_at no offset", b'{"start_at": "2030-01-01T00:00:00"}', "application/json", 400, "start_at:"),
    (
        "max_attempts 2^64",
        b'{"retry": {"max_attempts": 18446744073709551616}}',
        "application/json",
        400,
        "retry.max_attempts:",
    ),
    ("dep id 2^64", b'{"deps": [{"id": "18446744073709551616"}]}', "application/json", 400, "deps[0].id:"),
    ("dep id and key", b'{"deps": [{"id": "1", "key": "k"}]}', "application/json", 400, "deps[0]:"),
    ("unknown field", b'{"pool": "default", "poool": 1}', "application/json", 400, "poool: unknown field"),
    ("payload and base64", b'{"payload": 1, "payload_base64": "AA=="}', "application/json", 400, "payload:"),
    ("bad base64", b'{"payload_base64": "***"}', "application/json", 400, "payload_base64:"),
    ("unknown priority", b'{"priority": "urgent"}', "application/json", 400, "priority:"),
    ("NUL in kind", b'{"kind": "a\\u0000b"}', "application/json", 400, "task.kind: must not contain NUL"),
    ("NUL in key", b'{"key": "\\u0000"}', "application/json", 400, "task.key: must not contain NUL"),
    ("NUL in tag name", b'{"tags": {"\\u0000": "v"}}', "application/json", 400, "task.tags"),
    ("lone surrogate kind", b'{"kind": "\\ud800"}', "application/json", 400, "kind: not valid Unicode"),
    ("lone surrogate tag name", b'{"tags": {"\\udfff": "v"}}', "application/json", 400, "tags key:"),
    ("lone surrogate payload", b'{"payload": ["\\ud800"]}', "application/json", 400, "payload:"),
    ("unicode pool", '{"pool": "d\u00e9fault \u2603"}'.encode(), "application/json", 404, "task.pool:"),
    ("key too long", b'{"key": "' + b"k" * 5000 + b'"}', "application/json", 400, "task.key:"),
    ("text/plain", b'{"pool": "default"}', "text/plain", 415, "request body:"),
    ("form", b"pool=default", "application/x-www-form-urlencoded", 415, "request body:"),
    ("no content type", b'{"pool": "default"}', None, 415, "request body:"),
    ("json lookalike", b'{"pool": "default"}', "application/jsonx", 415, "request body:"),
    (
        "over the size limit",
        b'{"payload": "' + b"x" * MAX_BODY + b'"}',
        "application/json",
        413,
        "request body: larger than limits.max_http_body_bytes",
    ),
]


@pytest.mark.parametrize(
    ("what", "body", "content_type", "status", "prefix"), HOSTILE, ids=[h[0] for h in HOSTILE]
)
def test_hostile_submit_bodies_are_refused_naming_the_field_and_insert_nothing(
    fuzz_server: ServerProcess, what: str, body: bytes, content_type: str | None, status: int, prefix: str
) -> None:
    before = counts(fuzz_server)
    for path in ("/v1/tasks", "/v1/tasks:batch"):
        sent = body
        expected = prefix
        if path.endswith(":batch") and not prefix.startswith("request body"):
            sent = b'{"tasks": [{}, ' + body + b"]}"
            # The service names a submitted task "task", a batch's "tasks[i]".
            expected = (
                f"tasks[1]{prefix.removeprefix('task')}"
                if prefix.startswith(("task.", "task:"))
                else f"tasks[1].{prefix}"
            )
        got, answer = request(fuzz_server, "POST", path, sent, content_type=content_type)
        assert got == status, (path, answer)
        assert answer["error"].startswith(expected), (path, answer)
        assert answer["code"] == {413: "resource_exhausted", 404: "not_found"}.get(status, "invalid_argument")
    assert counts(fuzz_server) == before


def test_oversized_bodies_are_refused_before_they_are_read(fuzz_server: ServerProcess) -> None:
    """A declared Content-Length over the limit is refused from the header alone; a chunked body is cut
    off once it passes the limit. Neither inserts anything, and the server keeps serving."""
    before = counts(fuzz_server)
    conn = http.client.HTTPConnection("127.0.0.1", fuzz_server.http_port, timeout=10)
    try:
        conn.putrequest("POST", "/v1/tasks")
        conn.putheader("authorization", f"Bearer {CLIENT}")
        conn.putheader("content-type", "application/json")
        conn.putheader("content-length", str(10 * 2**30))  # 10 GiB announced, nothing sent
        conn.endheaders()
        response = conn.getresponse()
        assert response.status == 413
        assert json.loads(response.read())["error"].startswith("request body: larger than")
    finally:
        conn.close()

    def chunks() -> Iterator[bytes]:
        yield b'{"payload": "'
        for _ in range(2 * MAX_BODY // 4096):
            yield b"x" * 4096
        yield b'"}'

    conn = http.client.HTTPConnection("127.0.0.1", fuzz_server.http_port, timeout=10)
    try:
        headers = {"authorization": f"Bearer {CLIENT}", "content-type": "application/json"}
        try:
            conn.request("POST", "/v1/tasks", body=chunks(), headers=headers, encode_chunked=True)
            response = conn.getresponse()
            assert response.status == 413
        except (BrokenPipeError, ConnectionResetError):
            pass  # refused and closed while we were still sending: also a refusal
    finally:
        conn.close()
    assert counts(fuzz_server) == before


# (what, method, path, token, status, message prefix)
HOSTILE_QUERIES: list[tuple[str, str, str, str, int, str]] = [
    ("limit negative", "GET", "/v1/tasks?limit=-1", CLIENT, 400, "limit:"),
    ("limit float", "GET", "/v1/tasks?limit=1e3", CLIENT, 400, "limit:"),
    ("limit 2^64", "GET", "/v1/tasks?limit=18446744073709551616", CLIENT, 400, "limit:"),
    ("after letters", "GET", "/v1/tasks?after=abc", CLIENT, 400, "after:"),
    ("after twice", "GET", "/v1/tasks?after=1&after=2", CLIENT, 400, "after:"),
    ("status unknown", "GET", "/v1/tasks?status=done", CLIENT, 400, "status:"),
    ("unknown parameter", "GET", "/v1/tasks?pools=default", CLIENT, 400, "pools: unknown query parameter"),
    ("unknown pool", "GET", "/v1/tasks?pool=nope%00", CLIENT, 404, "pool: unknown pool"),
    ("id out of range", "GET", "/v1/tasks/99999999999999999999999", CLIENT, 400, "id:"),
    ("result NaN", "GET", "/v1/tasks/fuzz-wait/result?timeout_s=NaN", CLIENT, 400, "timeout_s:"),
    ("result inf", "GET", "/v1/tasks/fuzz-wait/result?timeout_s=inf", CLIENT, 400, "timeout_s:"),
    ("result 1e400", "GET", "/v1/tasks/fuzz-wait/result?timeout_s=1e400", CLIENT, 400, "timeout_s:"),
    ("result negative", "GET", "/v1/tasks/fuzz-wait/result?timeout_s=-1", CLIENT, 400, "timeout_s:"),
    ("result unknown parameter", "GET", "/v1/tasks/fuzz-wait/result?timeout=1", CLIENT, 400, "timeout:"),
    ("watch bad id", "GET", "/v1/watch?id=x", CLIENT, 400, "id:"),
    ("watch id 2^64", "GET", "/v1/watch?id=18446744073709551616", CLIENT, 400, "id:"),
    ("watch bad all", "GET", "/v1/watch?all=maybe", CLIENT, 400, "all:"),
    ("watch unknown parameter", "GET", "/v1/watch?since=1", CLIENT, 400, "since: unknown query parameter"),
    ("watch unknown pool", "GET", "/v1/watch?pool=nope", CLIENT, 404, "pool: unknown pool 'nope'"),
    ("submit unknown parameter", "POST", "/v1/tasks?wait=true", CLIENT, 400, "wait: unknown query parameter"),
    ("cancel unknown parameter", "POST", "/v1/tasks/fuzz-wait:cancel?bogus=1", CLIENT, 400, "bogus: unknown"),
    ("get unknown parameter", "GET", "/v1/tasks/fuzz-wait?timeout_s=5", CLIENT, 400, "timeout_s: unknown"),
    ("workers filter", "GET", "/v1/workers?pool=reject", ADMIN, 400, "pool: unknown query parameter"),
    (
        "snapshot unknown parameter",
        "GET",
        "/v1/snapshot?bogus=1",
        ADMIN,
        400,
        "bogus: unknown query parameter",
    ),
    ("recurring filter", "GET", "/v1/recurring?pool=x", ADMIN, 400, "pool: unknown query parameter"),
    ("key with NUL", "GET", "/v1/tasks/a%00b", CLIENT, 404, "task: no task"),
    ("cancel with NUL", "POST", "/v1/tasks/a%00b:cancel", CLIENT, 404, "task: no task"),
    ("recurring NUL name", "DELETE", "/v1/recurring/a%00b", ADMIN, 400, ""),
]


@pytest.mark.parametrize(
    ("what", "method", "path", "token", "status", "prefix"),
    HOSTILE_QUERIES,
    ids=[h[0] for h in HOSTILE_QUERIES],
)
def test_hostile_paths_and_queries_are_refused_naming_the_parameter(
    fuzz_server: ServerProcess, what: str, method: str, path: str, token: str, status: int, prefix: str
) -> None:
    # A task that exists, so that the wait's own arguments are judged (an unknown task is a 404 first).
    request(fuzz_server, "POST", "/v1/tasks", b'{"key": "fuzz-wait", "pool": "reject"}')
    before = counts(fuzz_server)
    body = b"{}" if method == "POST" and path.startswith("/v1/tasks?") else None  # a valid submission
    got, answer = request(fuzz_server, method, path, body, token=token)
    assert got == status, answer
    assert answer["error"].startswith(prefix), answer
    assert counts(fuzz_server) == before
    _, task = request(fuzz_server, "GET", "/v1/tasks/fuzz-wait")
    assert task["status"] != "cancelled", task


RECURRING: list[tuple[str, object, int, str]] = [
    ("cron not a string", {"name": "r", "cron": 5}, 400, "cron:"),
    ("no cron", {"name": "r"}, 400, "cron:"),
    ("no name", {"cron": "* * * * *"}, 400, "name:"),
    ("NUL in name", {"name": "a\x00", "cron": "* * * * *"}, 400, "name:"),
    ("bad cron", {"name": "r", "cron": "61 * * * *"}, 400, "cron:"),
    ("bad tz", {"name": "r", "cron": "* * * * *", "tz": "Mars/Base"}, 400, "tz:"),
    ("bad overlap", {"name": "r", "cron": "* * * * *", "overlap": 1}, 400, "overlap:"),
    (
        "template deps",
        {"name": "r", "cron": "* * * * *", "template": {"deps": [{"id": 1}]}},
        400,
        "template.deps",
    ),
    (
        "template start",
        {"name": "r", "cron": "* * * * *", "template": {"start_in_s": 5}},
        400,
        "template.start_in_s:",
    ),
    (
        "template start_at",
        {"name": "r", "cron": "* * * * *", "template": {"start_at": 5}},
        400,
        "template.start_at:",
    ),
    (
        "template deadline_at",
        {"name": "r", "cron": "* * * * *", "template": {"deadline_at": 5}},
        400,
        "template.deadline_at:",
    ),
    (
        "template unknown pool",
        {"name": "r", "cron": "* * * * *", "template": {"pool": "x"}},
        404,
        "template.pool",
    ),
    ("name too long", {"name": "n" * 5000, "cron": "* * * * *"}, 400, "name:"),
]


@pytest.mark.parametrize(("what", "body", "status", "prefix"), RECURRING, ids=[r[0] for r in RECURRING])
def test_hostile_recurring_schedules_are_refused_naming_the_field(
    fuzz_server: ServerProcess, what: str, body: object, status: int, prefix: str
) -> None:
    before = counts(fuzz_server)
    got, answer = request(fuzz_server, "POST", "/v1/recurring", json.dumps(body).encode(), token=ADMIN)
    assert got == status, answer
    assert answer["error"].startswith(prefix), answer
    assert counts(fuzz_server) == before


json_scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**80), max_value=2**80)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8)
)
json_values = st.recursive(
    json_scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
field_names = st.sampled_from([f for f, _ in SUBMIT_FIELDS]) | st.text(max_size=6)
documents = st.dictionaries(field_names, json_values, max_size=5)
raw_bodies = (
    st.binary(max_size=200)
    | documents.map(lambda d: json.dumps(d).encode())
    | documents.map(lambda d: json.dumps(d).encode()[: max(1, len(json.dumps(d)) // 2)])
)


def test_random_bodies_never_get_a_5xx_and_every_error_names_what_was_wrong(
    fuzz_server: ServerProcess,
) -> None:
    """Random documents (mostly known field names with values of any type) and random bytes: the answer
    is 200 or a 4xx with an error message, never a 5xx; the server stays healthy."""

    @hypothesis.settings(
        max_examples=60,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(hypothesis.HealthCheck),
    )
    @hypothesis.given(body=raw_bodies, batch=st.booleans())
    def run(body: bytes, batch: bool) -> None:
        path = "/v1/tasks:batch" if batch else "/v1/tasks"
        sent = b'{"tasks": [' + body + b"]}" if batch else body
        status, answer = request(fuzz_server, "POST", path, sent)
        assert status < 500, answer
        if status != 200:
            assert status in (400, 404, 409, 413, 429), answer
            assert answer["error"] and ":" in answer["error"], answer

    run()
    assert fuzz_server.probe("/healthz") == 200
    assert_clean_log(fuzz_server)


def test_the_openapi_document_is_plain_json_with_finite_numbers(fuzz_server: ServerProcess) -> None:
    status, document = request(fuzz_server, "GET", "/v1/openapi.json", token=None)
    assert status == 200

    def finite(node: object) -> bool:
        if isinstance(node, float):
            return math.isfinite(node)
        if isinstance(node, dict):
            return all(finite(v) for v in node.values())
        if isinstance(node, list):
            return all(finite(v) for v in node)
        return True

    assert finite(document) and document == json.loads(json.dumps(OPENAPI))
