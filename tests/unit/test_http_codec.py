"""JSON ⇄ protobuf conversions of the HTTP gateway, without a server."""

from __future__ import annotations

import base64
import contextlib
import json
import re
from collections.abc import Callable, Iterator

import pytest
from multidict import MultiDict

from cronoq.api import http_codec as codec
from cronoq.errors import InvalidArgument
from cronoq.hosts import is_loopback_host_header
from cronoq.v1 import cronoq_pb2 as pb


@contextlib.contextmanager
def refused(pattern: str) -> Iterator[None]:
    """Expect InvalidArgument whose message (without the code prefix) matches ``pattern``."""
    with pytest.raises(InvalidArgument) as info:
        yield
    assert re.search(pattern, info.value.message), info.value.message


# ------------------------------------------------------------------------------------------ requests


def test_submit_request_maps_every_json_field_to_the_wire_spec() -> None:
    req = codec.submit_request(
        {
            "payload": {"n": [1, 2.5, "é"], "ok": True},
            "kind": "resize",
            "pool": "default",
            "key": "k-1",
            "tenant": "acme",
            "priority": "high",
            "deadline_in_s": 30,
            "duration_hint_s": 1.5,
            "timeout_s": 10,
            "retry": {
                "max_attempts": 5,
                "initial_backoff_s": 0.5,
                "multiplier": 3,
                "max_backoff_s": 9,
                "jitter": False,
            },
            "resources": {"gpu": 2},
            "tags": {"team": "media"},
            "labels": {"region": "eu"},
            "wait": True,
            "wait_timeout_s": 2,
        }
    )
    spec = req.task
    assert req.wait and req.wait_timeout_s == 2.0
    assert spec.payload == '{"n":[1,2.5,"é"],"ok":true}'.encode()
    assert spec.content_type == "application/json"
    assert (spec.kind, spec.pool, spec.key, spec.tenant) == ("resize", "default", "k-1", "acme")
    assert spec.priority == pb.PRIORITY_HIGH
    assert spec.deadline_in_s == 30.0 and spec.duration_hint_s == 1.5 and spec.timeout_s == 10.0
    assert not spec.HasField("start_in_s") and not spec.HasField("deadline_unix_ns")
    assert spec.retry == pb.RetryPolicy(
        max_attempts=5, initial_backoff_s=0.5, multiplier=3.0, max_backoff_s=9.0, jitter=False
    )
    assert dict(spec.resources) == {"gpu": 2}
    assert dict(spec.tags) == {"team": "media"} and dict(spec.labels) == {"region": "eu"}


def test_fixed_start_and_dependency_fields_reach_the_wire_message() -> None:
    spec = codec.submit_request(
        {
            "start_in_s": 5,
            "tolerance_s": 1,
            "on_miss": "run_late",
            "deps": [{"id": "7", "on": "failure"}, {"id": 8}, {"key": "parent", "on": "complete"}],
        }
    ).task
    assert spec.start_in_s == 5.0 and spec.tolerance_s == 1.0 and spec.on_miss == pb.MISS_POLICY_RUN_LATE
    assert list(spec.deps) == [
        pb.Dep(target=pb.TaskRef(id=7), cond=pb.EDGE_COND_ON_FAILURE),
        pb.Dep(target=pb.TaskRef(id=8)),
        pb.Dep(target=pb.TaskRef(key="parent"), cond=pb.EDGE_COND_ON_COMPLETE),
    ]


@pytest.mark.parametrize(
    ("value", "unix_ns"),
    [
        ("2030-01-02T03:04:05Z", 1_893_553_445 * codec.NS),
        ("2030-01-02T04:04:05.25+01:00", 1_893_553_445 * codec.NS + 250_000_000),
        ("2030-01-02t03:04:05z", 1_893_553_445 * codec.NS),
        (1_893_553_445, 1_893_553_445 * codec.NS),
        (1_893_553_445.5, 1_893_553_445 * codec.NS + 500_000_000),
    ],
)
def test_instants_are_rfc3339_or_unix_seconds(value: object, unix_ns: int) -> None:
    spec = codec.submit_request({"deadline_at": value, "start_at": value}).task
    assert spec.deadline_unix_ns == unix_ns and spec.start_unix_ns == unix_ns


@pytest.mark.parametrize("value", ["2030-01-02T03:04:05", "tomorrow", "", True, [1], 1e300])
def test_bad_instants_name_the_field(value: object) -> None:
    with refused("^deadline_at: "):
        codec.submit_request({"deadline_at": value})


def test_payload_base64_with_content_type_is_kept_as_bytes() -> None:
    spec = codec.submit_request(
        {"payload_base64": base64.b64encode(b"\x00\xff").decode(), "content_type": "image/png"}
    ).task
    assert spec.payload == b"\x00\xff" and spec.content_type == "image/png"


def test_a_json_payload_keeps_a_json_content_type_with_parameters() -> None:
    spec = codec.submit_request({"payload": 1, "content_type": "application/json; charset=utf-8"}).task
    assert spec.payload == b"1" and spec.content_type == "application/json; charset=utf-8"


@pytest.mark.parametrize(
    ("document", "message"),
    [
        ({"payload": 1, "payload_base64": "AA=="}, "^payload: send either payload or payload_base64"),
        ({"payload": 1, "content_type": "text/plain"}, "^content_type: payload is JSON"),
        ({"payload_base64": "not base64!"}, "^payload_base64: not valid base64"),
        ({"payload_base64": "\u0080AA="}, "^payload_base64: not valid base64"),
        ({"payload": ["\ud800"]}, "^payload: not valid Unicode"),
        ({"colour": "red"}, "^colour: unknown field"),
        ({"retry": {"tries": 3}}, r"^retry\.tries: unknown field"),
        ({"deps": [{"id": 1, "when": "x"}]}, r"^deps\[0\]\.when: unknown field"),
        ({"deps": [{"id": 1, "key": "x"}]}, r"^deps\[0\]: set either id or key"),
        ({"deps": [{}]}, r"^deps\[0\]: set either id or key"),
        ({"deps": {"id": 1}}, "^deps: expected an array"),
        ({"deps": [{"id": "x1"}]}, r"^deps\[0\]\.id: expected a task id"),
        ({"deps": [{"id": 2**64}]}, r"^deps\[0\]\.id: expected a task id"),
        ({"deps": [{"key": "a", "on": "always"}]}, r"^deps\[0\]\.on: expected one of success, complete"),
        ({"timeout_s": "10"}, "^timeout_s: expected a number of seconds$"),
        ({"timeout_s": True}, "^timeout_s: expected a number of seconds$"),
        ({"timeout_s": 10**400}, "^timeout_s: expected a number of seconds"),
        ({"priority": "urgent"}, "^priority: expected one of critical, high, normal, low$"),
        ({"priority": 2}, "^priority: expected one of"),
        ({"on_miss": "later"}, "^on_miss: expected one of run_late, skip, fail$"),
        ({"kind": 5}, "^kind: expected a string$"),
        ({"key": "\udc00"}, "^key: not valid Unicode"),
        ({"tags": ["a"]}, "^tags: expected an object$"),
        ({"tags": {"a": 1}}, r"^tags\.a: expected a string$"),
        ({"labels": {"\ud800": "x"}}, "^labels key: not valid Unicode"),
        ({"resources": {"gpu": -1}}, r"^resources\.gpu: expected an integer between 0 and 4294967295$"),
        ({"resources": {"gpu": 1.5}}, r"^resources\.gpu: expected an integer"),
        ({"retry": {"max_attempts": 2**32}}, r"^retry\.max_attempts: expected an integer"),
        ({"retry": {"jitter": "yes"}}, r"^retry\.jitter: expected true or false$"),
        ({"retry": {"multiplier": "2"}}, r"^retry\.multiplier: expected a number$"),
        ({"retry": 3}, "^retry: expected a JSON object$"),
        ({"wait": 1}, "^wait: expected true or false$"),
        ({"wait_timeout_s": "1"}, "^wait_timeout_s: expected a number of seconds$"),
    ],
)
def test_submit_shape_errors_name_the_json_field(document: object, message: str) -> None:
    with refused(message):
        codec.submit_request(document)


@pytest.mark.parametrize("document", [[], "task", 3, None])
def test_a_body_that_is_not_an_object_is_refused(document: object) -> None:
    with refused("^request body: expected a JSON object$"):
        codec.submit_request(document)


def test_null_means_absent() -> None:
    req = codec.submit_request({"payload": None, "timeout_s": None, "retry": None, "wait": None})
    assert req == pb.SubmitRequest()


def test_batch_errors_carry_the_index() -> None:
    assert len(codec.submit_batch_request({"tasks": [{}, {"kind": "b"}]}).tasks) == 2
    with refused(r"^tasks\[1\]\.timeout_s: expected a number of seconds$"):
        codec.submit_batch_request({"tasks": [{}, {"timeout_s": "x"}]})
    with refused(r"^tasks\[0\]\.wait: unknown field$"):
        codec.submit_batch_request({"tasks": [{"wait": True}]})
    with refused("^tasks: required$"):
        codec.submit_batch_request({})
    with refused("^tasks: expected an array$"):
        codec.submit_batch_request({"tasks": {}})
    with refused("^extra: unknown field$"):
        codec.submit_batch_request({"tasks": [], "extra": 1})


def test_parse_json_refuses_what_cannot_be_stored_back_as_json() -> None:
    for text in (b"NaN", b"[Infinity]", b"1e400", b"{", b"\xff", b"[" * 100_000 + b"]" * 100_000):
        with pytest.raises(ValueError):
            codec.parse_json(text)
    assert codec.parse_json(b'{"a": [1, 2.5, null]}') == {"a": [1, 2.5, None]}


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (b'{"a": 1, "a": 2}', "a: given more than once in the same object"),
        (b'{"a": [{"b": {}}, {"c": 1, "d": 2, "c": 3}]}', "a[1].c: given more than once in the same object"),
        (b'{"tasks": [{}, {"timeout_s": 1e400}]}', "tasks[1].timeout_s: number 1e400 is out of range"),
        (b"[1, -1E+999, 1e999]", "request body[1]: number -1E+999 is out of range"),
        (b'{"x": {"y": 1e999, "y": 1}}', "x.y: given more than once in the same object"),
    ],
)
def test_parse_json_names_the_path_of_a_refused_value(text: bytes, message: str) -> None:
    """A number out of range or a key given twice is named by its path (the first one, in document order)."""
    with pytest.raises(codec.FieldError) as info:
        codec.parse_json(text)
    assert str(info.value) == message


def test_parse_json_takes_utf8_only() -> None:
    assert codec.parse_json('{"k": "caf\u00e9"}'.encode()) == {"k": "caf\u00e9"}
    for encoding in ("utf-16", "utf-16-le", "utf-32", "latin-1"):
        with pytest.raises(ValueError, match=r"^not UTF-8 "):
            codec.parse_json('{"k": "caf\u00e9"}'.encode(encoding))


@pytest.mark.parametrize(
    ("message", "http"),
    [
        (
            "task: use either start_in_s or start_unix_ns, not both",
            "task: use either start_in_s or start_at, not both",
        ),
        (
            "tasks[2]: use either deadline_in_s or deadline_unix_ns, not both",
            "tasks[2]: use either deadline_in_s or deadline_at, not both",
        ),
        ("task.start_unix_ns: 5 is not a usable start", "task.start_at: 5 is not a usable start"),
        (
            "template.deadline_unix_ns: a recurring template cannot",
            "template.deadline_at: a recurring template cannot",
        ),
        (
            "task.tolerance_s: only meaningful with a fixed start (start_in_s or start_unix_ns)",
            "task.tolerance_s: only meaningful with a fixed start (start_in_s or start_at)",
        ),
        ("pools: unknown pool 'nope'", "pool: unknown pool 'nope'"),
        ("pools: this credential may not use pool 'a'", "pool: this credential may not use pool 'a'"),
        # What the caller sent (quoted) and English words stay as they are.
        ("pools: unknown pool 'start_unix_ns'", "pool: unknown pool 'start_unix_ns'"),
        ("task.resources['pools']: amount must be > 0", "task.resources['pools']: amount must be > 0"),
        (
            "task.key: key 'k' is held by a task outside this credential's pools",
            "task.key: key 'k' is held by a task outside this credential's pools",
        ),
        (
            "/metrics covers every pool: it needs a credential without pools",
            "/metrics covers every pool: it needs a credential without pools",
        ),
        ("timeout_s: expected a number of seconds", "timeout_s: expected a number of seconds"),
        ('task: no task "start_unix_ns\'s"', 'task: no task "start_unix_ns\'s"'),
    ],
)
def test_error_messages_name_the_http_fields(message: str, http: str) -> None:
    assert codec.http_message(message) == http


# --------------------------------------------------------------------------------- paths, queries


def test_task_ref_is_an_id_when_all_digits_else_a_key() -> None:
    assert codec.task_ref("42") == pb.TaskRef(id=42)
    assert codec.task_ref(str(2**64 - 1)) == pb.TaskRef(id=2**64 - 1)
    assert codec.task_ref("job-42") == pb.TaskRef(key="job-42")
    assert codec.task_ref("٣") == pb.TaskRef(key="٣")  # non-ASCII digits are a key
    with refused("^id: .* out of range"):
        codec.task_ref(str(2**64))
    with refused("^id: .* out of range"):
        codec.task_ref("9" * 5000)


def query(**params: str | list[str]) -> codec.Query:
    pairs = [(k, v) for k, vs in params.items() for v in ([vs] if isinstance(vs, str) else vs)]
    return codec.Query(MultiDict(pairs))


def test_list_query_accepts_repeats_and_comma_lists() -> None:
    req = codec.list_request(
        query(pool=["a,b", "c"], status=["ready", "dead_lettered,shed"], after="9", limit="5")
    )
    assert list(req.pools) == ["a", "b", "c"]
    assert list(req.statuses) == [
        pb.TASK_STATUS_READY,
        pb.TASK_STATUS_DEAD_LETTERED,
        pb.TASK_STATUS_SHED,
    ]
    assert (req.after, req.limit) == (9, 5)
    assert codec.list_request(query()) == pb.ListTasksRequest()


@pytest.mark.parametrize(
    ("params", "message"),
    [
        ({"status": "done"}, "^status: expected one of blocked, scheduled"),
        ({"after": "-1"}, "^after: expected an integer between 0 and 18446744073709551615$"),
        ({"limit": "ten"}, "^limit: expected an integer between 0 and 4294967295$"),
        ({"limit": ["1", "2"]}, "^limit: given 2 times; give it once$"),
        ({"pools": "a"}, "^pools: unknown query parameter$"),
    ],
)
def test_list_query_errors_name_the_parameter(params: dict[str, str | list[str]], message: str) -> None:
    with refused(message):
        codec.list_request(query(**params))


def test_watch_query() -> None:
    req = codec.watch_request(query(pool="a,b", id=["1,2", "3"], key=["x,y", "z"], all=""))
    assert list(req.pools) == ["a", "b"] and list(req.ids) == [1, 2, 3]
    assert list(req.keys) == ["x,y", "z"]  # keys are free text: never split on commas
    assert req.all_transitions
    assert not codec.watch_request(query(all="false")).all_transitions
    with refused("^all: expected true or false$"):
        codec.watch_request(query(all="maybe"))
    with refused("^id: expected a task id"):
        codec.watch_request(query(id="x"))


def test_wait_query() -> None:
    assert codec.wait_request("7", query(timeout_s="1.5")) == pb.WaitRequest(
        task=pb.TaskRef(id=7), timeout_s=1.5
    )
    assert not codec.wait_request("k", query()).HasField("timeout_s")
    for bad in ("soon", "1_0", "nan"):
        with refused("^timeout_s: expected a number of seconds$"):
            codec.wait_request("7", query(timeout_s=bad))


# ------------------------------------------------------------------------------------------ responses


def test_task_info_renders_ids_as_strings_names_and_rfc3339_times() -> None:
    info = pb.TaskInfo(
        id=2**63 + 5,
        status=pb.TASK_STATUS_DEAD_LETTERED,
        pool="p",
        priority=pb.PRIORITY_LOW,
        created_unix_ns=1_893_553_445 * codec.NS + 123_456_789,
    )
    rendered = codec.task_info(info)
    assert rendered["id"] == str(2**63 + 5)
    assert rendered["status"] == "dead_lettered" and rendered["priority"] == "low"
    assert rendered["created_at"] == "2030-01-02T03:04:05.123456Z"
    assert rendered["started_at"] is None and rendered["finished_at"] is None
    assert codec.task_info(pb.TaskInfo(id=1))["priority"] is None


def ct(value: str) -> Callable[[int], str]:
    return lambda _task_id: value


def test_outputs_render_as_json_or_base64() -> None:
    def render(output: bytes, content_type: str) -> codec.JsonObject:
        return codec.task_result(
            pb.TaskResult(id=1, status=pb.TASK_STATUS_SUCCEEDED, output=output), ct(content_type)
        )

    assert render(b'{"a":1}', "application/json")["output"] == {"a": 1}
    assert render(b"[1]", "application/json; charset=utf-8")["output"] == [1]
    for data, content_type in ((b"\x00\x01", "application/octet-stream"), (b"{oops", "application/json")):
        rendered = render(data, content_type)
        assert "output" not in rendered
        assert base64.b64decode(str(rendered["output_base64"])) == data
        assert rendered["content_type"] == content_type
    assert "content_type" not in render(b"x", "")
    none = codec.task_result(
        pb.TaskResult(id=1, status=pb.TASK_STATUS_FAILED, message="boom"), ct("application/json")
    )
    assert none == {"id": "1", "status": "failed", "message": "boom", "output_available": False}


def test_responses_are_valid_json_even_for_unpaired_surrogates() -> None:
    text = codec.dump_json({"output": "\ud800"})
    assert json.loads(text) == {"output": "\ud800"} and text.isascii()


@pytest.mark.parametrize(
    ("host", "loopback"),
    [
        ("localhost", True),
        ("LOCALHOST:7071", True),
        ("127.0.0.1", True),
        ("127.9.8.7:80", True),
        ("[::1]", True),
        ("[::1]:7071", True),
        ("::1", False),
        ("[127.0.0.1]", False),
        ("[localhost]", False),
        ("localhost.evil.example", False),
        ("evil.example", False),
        ("10.0.0.1:7071", False),
        ("127.0.0.1.nip.io", False),
        ("localhost:port", False),
        ("", False),
        (None, False),
    ],
)
def test_loopback_host_names(host: str | None, loopback: bool) -> None:
    assert is_loopback_host_header(host) is loopback
