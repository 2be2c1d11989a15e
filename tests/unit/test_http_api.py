"""The HTTP/JSON gateway over a real ShardService, Runtime and Engine, on a loopback socket.

Workers are simulated the way ``shard.workers.WorkerStream`` drives the runtime (attach a sink, report
outcomes to the engine, keep the output), so these tests exercise exactly the HTTP layer plus the shared
request logic.
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import json
import re
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

import jsonschema_rs
import pytest
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from cronoq.api import http_codec as codec
from cronoq.api.http_api import build_http_app
from cronoq.api.openapi import OPENAPI
from cronoq.auth import Authenticator, Role, TokenEntry
from cronoq.engine import Engine
from cronoq.engine.model import (
    Abort,
    DepEdge,
    DepOn,
    Dispatch,
    MissPolicy,
    Overflow,
    Overlap,
    PoolConfig,
    RetryRule,
    Semaphore,
    Status,
    TokenBucket,
)
from cronoq.errors import Unavailable
from cronoq.prometheus import Exposition, family
from cronoq.v1 import cronoq_pb2 as pb
from shard.outputs import OutputCache
from shard.runtime import Runtime
from shard.service import ShardService
from tests.shardkit import service_over

CLIENT = "client-token-0123456789"
METRICS = "metrics-token-0123456789"
ADMIN = "admin-token-0123456789"
OTHER_ONLY = "other-pool-client-token"
NO_POOLS = "no-pool-client-token-0123"
MAX_BODY = 4096
UP = Exposition(lambda: [family("cronoq_up", "gauge", "Up.", [({}, 1.0)])], store="memory")
Client = TestClient[web.Request, web.Application]


class Sink:
    """A connected worker as the runtime sees it: it records leases and aborts."""

    def __init__(self) -> None:
        self.worker_id = 0
        self.leases: list[Dispatch] = []
        self.leased = asyncio.Event()

    def send_lease(self, action: Dispatch) -> None:
        self.leases.append(action)
        self.leased.set()

    def send_abort(self, action: Abort) -> None:
        self.leases = [lease for lease in self.leases if lease.lease != action.lease]


@dataclass
class Api:
    client: Client
    service: ShardService
    runtime: Runtime
    connected: dict[int, tuple[str, int]] = field(default_factory=dict)

    async def call(
        self,
        method: str,
        path: str,
        body: object = None,
        *,
        token: str | None = CLIENT,
        headers: dict[str, str] | None = None,
        data: bytes | None = None,
    ) -> tuple[int, Any]:
        """One request; ``body`` is sent as JSON. Returns the status and the decoded JSON answer."""
        sent = dict(headers or {})
        if token is not None:
            sent["Authorization"] = f"Bearer {token}"
        if body is not None:
            data = json.dumps(body).encode()
        if data is not None:
            sent.setdefault("Content-Type", "application/json")
        async with self.client.request(method, path, data=data, headers=sent) as resp:
            text = await resp.text()
            assert resp.content_type == "application/json", text
            return resp.status, json.loads(text)

    async def submit(self, **spec: object) -> str:
        status, answer = await self.call("POST", "/v1/tasks", spec)
        assert status == 200, answer
        assert isinstance(answer["id"], str)
        return str(answer["id"])

    def worker(self, pool: str = "default", slots: int = 4) -> Sink:
        sink = Sink()
        sink.worker_id = self.runtime.new_worker_id()
        self.runtime.attach(sink.worker_id, sink, pool, slots, {})
        self.connected[sink.worker_id] = ("w-1", 1_893_553_445 * 10**9)
        return sink

    def complete(self, sink: Sink, output: bytes = b"", content_type: str = "") -> None:
        """The worker finishes its oldest lease (what a ``complete`` message does)."""
        lease = sink.leases.pop(0)
        runtime = self.runtime
        assert runtime.engine.complete(sink.worker_id, lease.lease, runtime.clock())
        runtime.outputs.put(lease.task.id, output, content_type)
        runtime.flush()

    def submitted(self) -> int:
        return int(self.runtime.engine.snapshot(self.runtime.clock()).totals.submitted)


@contextlib.asynccontextmanager
async def serve(
    *, auth: bool = True, metrics: Exposition | None = None, max_body: int = MAX_BODY
) -> AsyncIterator[Api]:
    pools = [
        PoolConfig("default", max=8, retry=RetryRule(max_attempts=2, initial_backoff=0.01, jitter=False)),
        PoolConfig("tight", max=1, max_pending=1, overflow=Overflow.REJECT),
        PoolConfig("other", max=2),
    ]
    resources: list[Semaphore | TokenBucket] = [Semaphore("gpu", 1), TokenBucket("api", 5.0, 2)]
    runtime = Runtime(Engine(pools, resources=resources), OutputCache(100, 1 << 20))
    tokens = [
        TokenEntry(CLIENT, Role.CLIENT),
        TokenEntry(METRICS, Role.METRICS),
        TokenEntry(ADMIN, Role.ADMIN),
        TokenEntry(OTHER_ONLY, Role.CLIENT, pools=frozenset({"other"})),
        TokenEntry(NO_POOLS, Role.CLIENT, pools=frozenset()),
    ]
    service = service_over(
        runtime, pools, Authenticator(tokens if auth else []), max_wait_s=1.0, request_timeout_s=0.2
    )
    app = build_http_app(
        service, max_body_bytes=max_body, loopback_only_guard=not auth, metrics=metrics, sse_keepalive_s=0.05
    )
    async with TestClient(TestServer(app, host="127.0.0.1")) as client:
        yield Api(client, service, runtime, service.connected)
    runtime.cancel_timer()


@pytest.fixture
async def api() -> AsyncIterator[Api]:
    async with serve() as running:
        yield running


def assert_error(answer: Any, code: str, pattern: str = "") -> None:
    assert set(answer) == {"error", "code"}, answer
    assert answer["code"] == code, answer
    assert re.search(pattern, answer["error"]), answer


# ------------------------------------------------------------------------------------------- tasks


async def test_submit_get_and_the_lease_carry_a_json_payload(api: Api) -> None:
    sink = api.worker()
    task_id = await api.submit(payload={"w": 640, "name": "é"}, kind="resize", priority="high", key="img-1")
    lease = sink.leases[0]
    assert str(lease.task.id) == task_id
    assert lease.task.spec.payload == '{"w":640,"name":"é"}'.encode()
    assert lease.task.spec.content_type == "application/json"

    status, info = await api.call("GET", f"/v1/tasks/{task_id}")
    assert status == 200
    assert info["id"] == task_id and info["status"] == "running"
    assert (info["kind"], info["key"], info["pool"], info["priority"]) == (
        "resize",
        "img-1",
        "default",
        "high",
    )
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{6}Z", info["created_at"])
    assert info["finished_at"] is None

    status, by_key = await api.call("GET", "/v1/tasks/img-1")
    assert status == 200 and by_key["id"] == task_id


async def test_payload_base64_reaches_the_worker_as_bytes(api: Api) -> None:
    sink = api.worker()
    await api.submit(payload_base64=base64.b64encode(b"\x89PNG\x00").decode(), content_type="image/png")
    spec = sink.leases[0].task.spec
    assert (spec.payload, spec.content_type) == (b"\x89PNG\x00", "image/png")


async def test_a_duplicate_key_returns_the_same_id(api: Api) -> None:
    first = await api.submit(key="once")
    status, answer = await api.call("POST", "/v1/tasks", {"key": "once"})
    assert status == 200 and answer == {"id": first, "duplicate": True}


async def test_keys_are_url_decoded_and_digit_refs_are_ids(api: Api) -> None:
    task_id = await api.submit(key="reports/2030 Q1")
    status, info = await api.call("GET", "/v1/tasks/reports%2F2030%20Q1")
    assert status == 200 and info["id"] == task_id
    status, answer = await api.call("GET", f"/v1/tasks/{2**64}")
    assert status == 400
    assert_error(answer, "invalid_argument", "^id: .* out of range")


async def test_submit_with_wait_returns_the_result(api: Api) -> None:
    sink = api.worker()
    request = asyncio.create_task(api.call("POST", "/v1/tasks", {"payload": 1, "wait": True}))
    await asyncio.wait_for(sink.leased.wait(), 5)
    api.complete(sink, b'{"ok":true}', "application/json")
    status, answer = await request
    assert status == 200
    assert answer["result"] == {
        "id": answer["id"],
        "status": "succeeded",
        "message": "",
        "output_available": True,
        "output": {"ok": True},
        "content_type": "application/json",
    }


async def test_results_render_json_outputs_as_values_and_others_as_base64(api: Api) -> None:
    sink = api.worker()
    json_id, bytes_id, broken_id = [await api.submit() for _ in range(3)]
    api.complete(sink, b'[1,"two"]', "application/json")
    api.complete(sink, b"\x00\x01", "application/octet-stream")
    api.complete(sink, b"{not json", "application/json")

    _, result = await api.call("GET", f"/v1/tasks/{json_id}/result")
    assert result["output"] == [1, "two"] and "output_base64" not in result
    _, result = await api.call("GET", f"/v1/tasks/{bytes_id}/result?timeout_s=1")
    assert base64.b64decode(result["output_base64"]) == b"\x00\x01"
    assert result["content_type"] == "application/octet-stream" and "output" not in result
    _, result = await api.call("GET", f"/v1/tasks/{broken_id}/result")
    assert base64.b64decode(result["output_base64"]) == b"{not json"
    _, info = await api.call("GET", f"/v1/tasks/{json_id}")
    assert info["status"] == "succeeded" and info["output_available"] and info["finished_at"]


async def test_json_nested_beyond_the_interpreter_limit_is_a_400_never_a_500() -> None:
    # Deeper than any CPython's JSON decoder takes (3.11 stops near 1,000 levels, 3.13 near 20,000).
    deep = b"[" * 100_000 + b"]" * 100_000
    async with serve(max_body=1 << 20) as api:
        status, answer = await api.call("POST", "/v1/tasks", data=b'{"payload":' + deep + b"}")
        assert status == 400
        assert_error(answer, "invalid_argument", "nested too deeply")

        sink = api.worker()
        task_id = await api.submit()
        api.complete(sink, deep, "application/json")
        status, result = await api.call("GET", f"/v1/tasks/{task_id}/result")
        assert status == 200 and base64.b64decode(result.get("output_base64", "")) in (b"", deep)


async def test_waiting_for_an_unfinished_task_ends_with_504(api: Api) -> None:
    task_id = await api.submit()
    status, answer = await api.call("GET", f"/v1/tasks/{task_id}/result?timeout_s=0.05")
    assert status == 504
    assert_error(answer, "deadline_exceeded", "still not finished")


async def test_cancel(api: Api) -> None:
    task_id = await api.submit()
    assert await api.call("POST", f"/v1/tasks/{task_id}:cancel") == (200, {"cancelled": True})
    assert await api.call("POST", f"/v1/tasks/{task_id}:cancel") == (200, {"cancelled": False})
    _, info = await api.call("GET", f"/v1/tasks/{task_id}")
    assert info["status"] == "cancelled"


async def test_a_lookup_may_name_the_tasks_pool(api: Api) -> None:
    """``?pool=`` on GET, :cancel and /result: the task must be of that pool (else 404 as an unknown
    task); an unknown pool is a 404 naming ``pool``, one outside the credential's pools a 403."""
    task_id = await api.submit(key="in-default")
    status, info = await api.call("GET", "/v1/tasks/in-default?pool=default")
    assert (status, info["id"]) == (200, task_id)
    for method, path in (
        ("GET", "/v1/tasks/in-default?pool=other"),
        ("GET", f"/v1/tasks/{task_id}?pool=other"),
        ("POST", "/v1/tasks/in-default:cancel?pool=other"),
        ("GET", "/v1/tasks/in-default/result?pool=other&timeout_s=0"),
    ):
        status, answer = await api.call(method, path)
        assert status == 404, (path, answer)
        assert_error(answer, "not_found", r"^task: no task .* in pool 'other'$")
    status, answer = await api.call("GET", "/v1/tasks/in-default?pool=nope")
    assert status == 404
    assert_error(answer, "not_found", r"^pool: unknown pool 'nope'$")
    status, answer = await api.call("POST", "/v1/tasks/in-default:cancel?pool=default", token=OTHER_ONLY)
    assert status == 403
    assert_error(answer, "permission_denied", r"^pool: this credential may not use pool 'default'$")
    status, answer = await api.call("GET", "/v1/tasks/in-default?pool=default&pool=other")
    assert status == 400
    assert_error(answer, "invalid_argument", r"^pool: given 2 times")
    assert await status_of(api, task_id) == "ready"  # nothing was cancelled on the way
    assert await api.call("POST", "/v1/tasks/in-default:cancel?pool=default") == (200, {"cancelled": True})


async def status_of(api: Api, task_id: str) -> str:
    status, info = await api.call("GET", f"/v1/tasks/{task_id}")
    assert status == 200, info
    return str(info["status"])


async def test_routes_that_read_no_body_refuse_one_before_acting(api: Api) -> None:
    """A body on a route that reads none is refused unread: 413 over limits.max_http_body_bytes, 400
    otherwise; the cancel does not happen."""
    task_id = await api.submit()
    cancel = f"/v1/tasks/{task_id}:cancel"
    text = {"Content-Type": "text/plain"}
    status, answer = await api.call("POST", cancel, data=b"x" * (25 * MAX_BODY), headers=text)
    assert status == 413
    assert_error(answer, "resource_exhausted", r"^request body: larger than limits\.max_http_body_bytes")
    status, answer = await api.call("POST", cancel, {})
    assert status == 400
    assert_error(
        answer, "invalid_argument", rf"^request body: POST /v1/tasks/{task_id}:cancel takes no body$"
    )
    assert await status_of(api, task_id) == "ready"
    for method, path, token in (
        ("GET", "/v1/tasks", CLIENT),
        ("GET", f"/v1/tasks/{task_id}", CLIENT),
        ("GET", "/v1/snapshot", METRICS),
        ("DELETE", "/v1/recurring/nightly", ADMIN),
        ("GET", "/healthz", None),
    ):
        status, answer = await api.call(method, path, data=b"{}", token=token)
        assert status == 400, (method, path)
        assert_error(answer, "invalid_argument", "takes no body")
    # A chunked body (no length to judge by) is refused the same way.
    head = f"POST {cancel} HTTP/1.1\nHost: 127.0.0.1\nAuthorization: Bearer {CLIENT}\nTransfer-Encoding: chunked\n"
    assert (await raw_request(api, head, b"2\r\n{}\r\n0\r\n\r\n")).startswith(b"HTTP/1.1 400 ")
    assert await status_of(api, task_id) == "ready"
    assert await api.call("POST", cancel) == (200, {"cancelled": True})


@pytest.mark.parametrize(
    ("method", "url", "token", "body", "name"),
    [
        # Each request would be served (and change something) without its unknown parameter.
        ("POST", "/v1/tasks?wait=true", CLIENT, {}, "wait"),
        ("POST", "/v1/tasks:batch?atomic=1", CLIENT, {"tasks": [{}]}, "atomic"),
        ("POST", "/v1/tasks/{id}:cancel?bogus=1", CLIENT, None, "bogus"),
        ("GET", "/v1/tasks/{id}?timeout_s=5", CLIENT, None, "timeout_s"),
        ("GET", "/v1/workers?pool=other", METRICS, None, "pool"),
        ("GET", "/v1/snapshot?bogus=1", METRICS, None, "bogus"),
        ("GET", "/v1/recurring?pool=x", METRICS, None, "pool"),
        ("POST", "/v1/recurring?dry_run=1", ADMIN, {"name": "n", "cron": "* * * * *"}, "dry_run"),
        ("DELETE", "/v1/recurring/nightly?force", ADMIN, None, "force"),
        ("GET", "/metrics?name=cronoq_up", METRICS, None, "name"),
        ("GET", "/healthz?verbose", None, None, "verbose"),
        ("GET", "/readyz?full=1", None, None, "full"),
        ("GET", "/v1/openapi.json?format=yaml", None, None, "format"),
    ],
)
async def test_an_unknown_query_parameter_is_refused_on_every_route_before_acting(
    method: str, url: str, token: str | None, body: object, name: str
) -> None:
    async with serve(metrics=UP) as api:
        task_id = await api.submit()
        schedule = {"name": "nightly", "cron": "0 3 * * *"}
        assert (await api.call("POST", "/v1/recurring", schedule, token=ADMIN))[0] == 200
        before = (api.submitted(), api.runtime.engine.list_recurring())
        status, answer = await api.call(method, url.replace("{id}", task_id), body, token=token)
        assert status == 400, answer
        assert_error(answer, "invalid_argument", f"^{name}: unknown query parameter$")
        assert (api.submitted(), api.runtime.engine.list_recurring()) == before
        assert await status_of(api, task_id) == "ready"


async def test_batch_is_atomic(api: Api) -> None:
    status, answer = await api.call("POST", "/v1/tasks:batch", {"tasks": [{"key": "a"}, {"pool": "other"}]})
    assert status == 200
    assert [t["duplicate"] for t in answer["tasks"]] == [False, False]
    assert all(isinstance(t["id"], str) for t in answer["tasks"])

    before = api.submitted()
    status, answer = await api.call("POST", "/v1/tasks:batch", {"tasks": [{"key": "b"}, {"pool": "nope"}]})
    assert status == 404
    assert_error(answer, "not_found", r"tasks\[1\]\.pool: unknown pool 'nope'")
    assert api.submitted() == before


async def test_list_filters_and_pages(api: Api) -> None:
    ids = [await api.submit() for _ in range(3)] + [await api.submit(pool="other")]
    await api.call("POST", f"/v1/tasks/{ids[0]}:cancel")

    _, page = await api.call("GET", "/v1/tasks?pool=default&limit=2")
    assert [t["id"] for t in page["tasks"]] == ids[:2]
    assert page["next_after"] == ids[1] and page["unavailable_shards"] == []
    _, page = await api.call("GET", f"/v1/tasks?pool=default&after={page['next_after']}&limit=2")
    assert [t["id"] for t in page["tasks"]] == ids[2:3] and page["next_after"] == "0"

    _, page = await api.call("GET", "/v1/tasks?status=ready,cancelled&pool=default&pool=other")
    assert {t["id"] for t in page["tasks"]} == set(ids)
    _, page = await api.call("GET", "/v1/tasks?status=cancelled")
    assert [t["id"] for t in page["tasks"]] == ids[:1]

    status, answer = await api.call("GET", "/v1/tasks?status=done")
    assert status == 400
    assert_error(answer, "invalid_argument", "^status: expected one of")
    status, answer = await api.call("GET", "/v1/tasks?colour=red")
    assert status == 400
    assert_error(answer, "invalid_argument", "^colour: unknown query parameter")
    status, answer = await api.call("GET", "/v1/tasks?pool=nope")
    assert status == 404
    assert_error(answer, "not_found", "^pool: unknown pool 'nope'$")
    status, answer = await api.call("GET", "/v1/tasks?pool=default", token=OTHER_ONLY)
    assert status == 403
    assert_error(answer, "permission_denied", "^pool: this credential may not use pool 'default'$")
    # Names the caller chose are the caller's: only the request logic's wire names are translated.
    status, answer = await api.call("GET", "/v1/tasks?pools=default")
    assert status == 400
    assert_error(answer, "invalid_argument", "^pools: unknown query parameter$")
    status, answer = await api.call("POST", "/v1/tasks", {"start_unix_ns": 1})
    assert status == 400
    assert_error(answer, "invalid_argument", "^start_unix_ns: unknown field$")


async def test_fixed_starts_dependencies_and_resources_reach_the_engine(api: Api) -> None:
    first = await api.submit(key="first")
    second = await api.submit(
        start_at="2030-01-02T03:04:05Z",
        tolerance_s=2.5,
        on_miss="skip",
        deps=[{"key": "first", "on": "complete"}, {"id": first}],
        resources={"gpu": 1, "api": 2},
    )
    task = api.runtime.engine.get(int(second))
    assert task is not None and task.status is Status.BLOCKED
    spec = task.spec
    assert (spec.start, spec.tolerance, spec.on_miss) == (1_893_553_445.0, 2.5, MissPolicy.SKIP)
    assert spec.deps == (DepEdge("first", DepOn.COMPLETE), DepEdge(int(first), DepOn.SUCCESS))
    assert spec.resources == {"gpu": 1, "api": 2}
    status, info = await api.call("GET", f"/v1/tasks/{second}")
    assert status == 200 and info["status"] == "blocked"

    later = await api.submit(start_in_s=3600)
    task = api.runtime.engine.get(int(later))
    assert task is not None and task.status is Status.SCHEDULED and task.spec.start is not None


async def test_a_batch_may_depend_on_its_own_keys_and_a_failed_dependency_skips_its_dependents(
    api: Api,
) -> None:
    status, answer = await api.call(
        "POST",
        "/v1/tasks:batch",
        {"tasks": [{"key": "b", "deps": [{"key": "a"}]}, {"key": "a"}, {"deps": [{"key": "b"}]}]},
    )
    assert status == 200, answer
    b, a, c = (t["id"] for t in answer["tasks"])
    status, cancelled = await api.call("POST", f"/v1/tasks/{a}:cancel")
    assert status == 200 and cancelled == {"cancelled": True}
    for task_id in (b, c):
        status, info = await api.call("GET", f"/v1/tasks/{task_id}")
        assert info["status"] == "skipped" and info["message"].startswith("dependency "), info


@pytest.mark.parametrize(
    ("body", "status", "code", "pattern"),
    [
        # Refused while converting: the field is named.
        (
            {"start_in_s": 1, "start_at": 2},
            400,
            "invalid_argument",
            r"^task: use either start_in_s or start_at, not both$",
        ),
        (
            {"deadline_in_s": 1, "deadline_at": 2},
            400,
            "invalid_argument",
            r"^task: use either deadline_in_s or deadline_at, not both$",
        ),
        (
            {"start_at": -5},
            400,
            "invalid_argument",
            r"^task\.start_at: -5000000000 is not a usable start",
        ),
        ({"start_in_s": -1}, 400, "invalid_argument", r"^task\.start_in_s: invalid duration"),
        (
            {"tolerance_s": 1},
            400,
            "invalid_argument",
            r"^task\.tolerance_s: only meaningful with a fixed start \(start_in_s or start_at\)$",
        ),
        (
            {"on_miss": "skip"},
            400,
            "invalid_argument",
            r"^task\.on_miss: only meaningful with a fixed start \(start_in_s or start_at\)$",
        ),
        (
            {"start_in_s": 1, "tolerance_s": -2},
            400,
            "invalid_argument",
            r"^task\.tolerance_s: invalid duration",
        ),
        ({"on_miss": "never"}, 400, "invalid_argument", r"^on_miss: expected one of run_late, skip, fail"),
        ({"deps": [{"on": "success"}]}, 400, "invalid_argument", r"^deps\[0\]: set either id or key"),
        ({"deps": [{"key": ""}]}, 400, "invalid_argument", r"^task\.deps\[0\]\.key: must not be empty"),
        ({"deps": [{"id": 0}]}, 400, "invalid_argument", r"^task\.deps\[0\]\.id: task ids start at 1"),
        (
            {"deps": [{"key": "a\u0000"}]},
            400,
            "invalid_argument",
            r"^task\.deps\[0\]\.key: must not contain NUL",
        ),
        (
            {"deps": [{"key": "k"}] * 3},
            400,
            "invalid_argument",
            r"^task\.deps: more than limits\.max_deps \(2\)",
        ),
        (
            {"resources": {"gpu": 0}},
            400,
            "invalid_argument",
            r"^task\.resources\['gpu'\]: amount must be > 0",
        ),
        (
            {"resources": {"": 1}},
            400,
            "invalid_argument",
            r"^task\.resources: resource names must not be empty",
        ),
        ({"resources": {"gpu": -1}}, 400, "invalid_argument", r"^resources\.gpu: expected an integer"),
        # Refused by the engine: mapped as docs/http-api.md (Errors) says, naming the task and the field.
        ({"deps": [{"key": "nope"}]}, 404, "not_found", r"^task\.deps\[0\]\.key: unknown dependency 'nope'"),
        ({"deps": [{"id": 999}]}, 404, "not_found", r"^task\.deps\[0\]\.id: unknown dependency 999"),
        ({"key": "me", "deps": [{"key": "me"}]}, 400, "invalid_argument", r"^task\.deps: dependency cycle"),
        ({"resources": {"disk": 1}}, 404, "not_found", r"^task\.resources: unknown resource 'disk'"),
        (
            {"resources": {"gpu": 2}},
            400,
            "invalid_argument",
            r"^task\.resources: requested amount exceeds capacity of resource 'gpu'",
        ),
    ],
)
async def test_bad_new_fields_are_refused_naming_the_field_and_change_nothing(
    api: Api, body: dict[str, object], status: int, code: str, pattern: str
) -> None:
    before = api.submitted()
    got, answer = await api.call("POST", "/v1/tasks", body)
    assert got == status, answer
    assert_error(answer, code, pattern)
    assert api.submitted() == before


async def test_batch_refusals_name_the_task_and_change_nothing(api: Api) -> None:
    before = api.submitted()
    status, answer = await api.call(
        "POST", "/v1/tasks:batch", {"tasks": [{}, {"start_in_s": 1, "start_at": 2}]}
    )
    assert status == 400
    assert_error(answer, "invalid_argument", r"^tasks\[1\]: use either start_in_s or start_at, not both$")
    status, answer = await api.call(
        "POST", "/v1/tasks:batch", data=b'{"tasks": [{}, {"deadline_in_s": 1e400}]}'
    )
    assert status == 400
    assert_error(answer, "invalid_argument", r"^tasks\[1\]\.deadline_in_s: number 1e400 is out of range$")
    cycle = {
        "tasks": [{"key": "x"}, {"key": "y", "deps": [{"key": "z"}]}, {"key": "z", "deps": [{"key": "y"}]}]
    }
    status, answer = await api.call("POST", "/v1/tasks:batch", cycle)
    assert status == 400
    assert_error(answer, "invalid_argument", r"^tasks\[1\]\.deps: dependency cycle")
    unknown = {"tasks": [{"key": "x"}, {"deps": [{"key": "x"}, {"key": "missing"}]}]}
    status, answer = await api.call("POST", "/v1/tasks:batch", unknown)
    assert status == 404
    assert_error(answer, "not_found", r"^tasks\[1\]\.deps\[1\]\.key: unknown dependency 'missing'")
    assert api.submitted() == before


async def test_a_reservation_conflict_is_409_failed_precondition(api: Api) -> None:
    # Pool "other" has max = 2: one fixed-start reservation at a time (max x 0.5).
    await api.submit(pool="other", start_in_s=100, duration_hint_s=10)
    before = api.submitted()
    status, answer = await api.call("POST", "/v1/tasks", {"pool": "other", "start_in_s": 105})
    assert status == 409
    assert_error(answer, "failed_precondition", r"^task: fixed-start reservation conflict: pool 'other'")
    assert api.submitted() == before
    await api.submit(pool="other", start_in_s=200)  # no overlap: accepted


async def test_instants_reach_the_engine(api: Api) -> None:
    task_id = await api.submit(deadline_at="2030-01-02T03:04:05Z")
    task = api.runtime.engine.get(int(task_id))
    assert task is not None and task.spec.deadline == 1_893_553_445.0


# ------------------------------------------------------------------------------------------ errors


async def test_bad_json_and_wrong_content_type(api: Api) -> None:
    status, answer = await api.call("POST", "/v1/tasks", data=b'{"kind": ')
    assert status == 400
    assert_error(answer, "invalid_argument", "^request body: invalid JSON")
    status, answer = await api.call("POST", "/v1/tasks", data=b"")
    assert status == 400
    status, answer = await api.call("POST", "/v1/tasks", data=b"{}", headers={"Content-Type": "text/plain"})
    assert status == 415
    assert_error(answer, "invalid_argument", "content-type: application/json")


@pytest.mark.parametrize(
    ("body", "pattern"),
    [
        (b'{"timeout_s": 1e400}', r"^timeout_s: number 1e400 is out of range$"),
        (b'{"retry": {"multiplier": -1e999}}', r"^retry\.multiplier: number -1e999 is out of range$"),
        (b'{"payload": [0, {"x": 2E+308}]}', r"^payload\[1\]\.x: number 2E\+308 is out of range$"),
        (b"1e400", r"^request body: number 1e400 is out of range$"),
    ],
)
async def test_a_number_out_of_range_is_refused_naming_its_field(api: Api, body: bytes, pattern: str) -> None:
    status, answer = await api.call("POST", "/v1/tasks", data=body)
    assert status == 400
    assert_error(answer, "invalid_argument", pattern)
    assert api.submitted() == 0


@pytest.mark.parametrize(
    ("path", "body", "pattern"),
    [
        ("/v1/tasks", b'{"pool": "other", "pool": "default"}', r"^pool: given more than once"),
        (
            "/v1/tasks",
            b'{"payload": {"a": 1, "b": {"c": 1, "c": 2}}}',
            r"^payload\.b\.c: given more than once",
        ),
        (
            "/v1/tasks:batch",
            b'{"tasks": [{}, {"key": "a", "key": "b"}]}',
            r"^tasks\[1\]\.key: given more than",
        ),
        ("/v1/tasks:batch", b'{"tasks": [], "tasks": [{}]}', r"^tasks: given more than once"),
    ],
)
async def test_a_key_given_twice_is_refused_naming_it(api: Api, path: str, body: bytes, pattern: str) -> None:
    status, answer = await api.call("POST", path, data=body)
    assert status == 400
    assert_error(answer, "invalid_argument", pattern)
    assert api.submitted() == 0
    schedule = b'{"name": "n", "cron": "* * * * *", "template": {"pool": "other", "pool": "default"}}'
    status, answer = await api.call("POST", "/v1/recurring", data=schedule, token=ADMIN)
    assert status == 400
    assert_error(answer, "invalid_argument", r"^template\.pool: given more than once")
    assert api.runtime.engine.list_recurring() == []


async def test_json_bodies_must_be_utf8(api: Api) -> None:
    document = '{"kind": "caf\u00e9"}'
    status, answer = await api.call("POST", "/v1/tasks", data=document.encode("utf-16"))
    assert status == 400
    assert_error(
        answer, "invalid_argument", r"^request body: invalid JSON: not UTF-8 \(byte 0xff at offset 0\)$"
    )
    latin1 = {"Content-Type": "application/json; charset=latin-1"}
    status, answer = await api.call("POST", "/v1/tasks", data=document.encode("latin-1"), headers=latin1)
    assert status == 415
    assert_error(answer, "invalid_argument", r"^request body: JSON must be UTF-8, not latin-1")
    status, answer = await api.call("POST", "/v1/tasks", data=b'{"kind": "x"}', headers=latin1)
    assert status == 415  # even when the bytes happen to be ASCII: the declared encoding is not guessed past
    assert api.submitted() == 0
    utf8 = {"Content-Type": "application/json; charset=UTF-8"}
    status, answer = await api.call("POST", "/v1/tasks", data=document.encode(), headers=utf8)
    assert status == 200, answer
    task = api.runtime.engine.get(int(answer["id"]))
    assert task is not None and task.spec.kind == "caf\u00e9"


async def test_unknown_and_mistyped_fields_are_named(api: Api) -> None:
    before = api.submitted()
    for body, pattern in (
        ({"colour": "red"}, "^colour: unknown field$"),
        ({"retry": {"max_attempts": 2, "backoff": 1}}, r"^retry\.backoff: unknown field$"),
        ({"timeout_s": "10s"}, "^timeout_s: expected a number of seconds$"),
        ({"payload": 1, "payload_base64": "AA=="}, "^payload: send either"),
    ):
        status, answer = await api.call("POST", "/v1/tasks", body)
        assert status == 400
        assert_error(answer, "invalid_argument", pattern)
    status, answer = await api.call("POST", "/v1/tasks", {"timeout_s": -1})
    assert status == 400
    assert_error(answer, "invalid_argument", r"^task\.timeout_s: invalid duration")  # the service's words
    assert api.submitted() == before


async def test_authentication_and_roles() -> None:
    async with serve() as api:
        status, answer = await api.call("GET", "/v1/tasks", token=None)
        assert status == 401
        assert_error(answer, "unauthenticated", "missing credentials")
        status, answer = await api.call("GET", "/v1/tasks", token="not-a-known-token-at-all")
        assert status == 401
        assert_error(answer, "unauthenticated", "unknown token")
        status, answer = await api.call("POST", "/v1/tasks", {}, token=METRICS)
        assert status == 403
        assert_error(answer, "permission_denied", "needs client")
        for path in ("/v1/snapshot", "/v1/workers", "/v1/recurring"):
            status, answer = await api.call("GET", path)
            assert status == 403, path
        status, answer = await api.call("POST", "/v1/recurring", {}, token=METRICS)
        assert status == 403
        status, answer = await api.call("POST", "/v1/tasks", {"pool": "default"}, token=OTHER_ONLY)
        assert status == 403
        assert_error(answer, "permission_denied", r"task\.pool: this credential may not use pool 'default'")
        assert (await api.call("POST", "/v1/tasks", {"pool": "other"}, token=OTHER_ONLY))[0] == 200


async def test_authentication_comes_before_the_body_is_read(api: Api) -> None:
    status, _ = await api.call("POST", "/v1/tasks", data=b"not json", token=None)
    assert status == 401


async def test_without_auth_only_loopback_hosts_are_served() -> None:
    async with serve(auth=False) as api:
        status, answer = await api.call("GET", "/v1/tasks", token=None, headers={"Host": "evil.example"})
        assert status == 403
        assert_error(answer, "permission_denied", "'evil.example' is not a loopback name")
        status, _ = await api.call("GET", "/nowhere", token=None, headers={"Host": "evil.example:7071"})
        assert status == 403
        for host in ("localhost:7071", "127.0.0.1", "[::1]:7071"):
            status, _ = await api.call("GET", "/v1/snapshot", token=None, headers={"Host": host})
            assert status == 200, host
        for probe in ("/healthz", "/readyz"):
            status, _ = await api.call("GET", probe, token=None, headers={"Host": "evil.example"})
            assert status == 200


async def test_unknown_task_route_and_method(api: Api) -> None:
    for path in ("/v1/tasks/999999", "/v1/tasks/no-such-key", "/v1/tasks/no-such-key/result"):
        status, answer = await api.call("GET", path)
        assert status == 404, path
        assert_error(answer, "not_found", "no task")
    status, answer = await api.call("GET", "/v2/whatever")
    assert status == 404
    assert_error(answer, "not_found", "^no route GET /v2/whatever$")
    async with api.client.request("PUT", "/v1/tasks", headers={"Authorization": f"Bearer {CLIENT}"}) as resp:
        assert resp.status == 405
        assert resp.headers["Allow"] == "GET, HEAD, POST"
        assert_error(await resp.json(), "unimplemented", "PUT is not allowed on /v1/tasks")


async def raw_request(api: Api, head: str, body: bytes = b"") -> bytes:
    """Send a hand-written request and return the response head, without finishing the body."""
    server = api.client.server
    reader, writer = await asyncio.open_connection(server.host, server.port)
    try:
        writer.write(head.replace("\n", "\r\n").encode() + b"\r\n" + body)
        await writer.drain()
        return await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)
    finally:
        writer.close()


async def test_an_oversized_body_is_refused_before_it_is_read(api: Api) -> None:
    head = (
        "POST /v1/tasks HTTP/1.1\nHost: 127.0.0.1\nContent-Type: application/json\n"
        f"Authorization: Bearer {CLIENT}\nContent-Length: 1000000000\n"
    )
    # Not a byte of the announced gigabyte is sent: an answer proves nothing was waited for.
    assert (await raw_request(api, head)).startswith(b"HTTP/1.1 413 ")


async def test_an_oversized_chunked_body_is_refused_at_the_limit(api: Api) -> None:
    head = (
        "POST /v1/tasks:batch HTTP/1.1\nHost: 127.0.0.1\nContent-Type: application/json\n"
        f"Authorization: Bearer {CLIENT}\nTransfer-Encoding: chunked\n"
    )
    chunk = b"400\r\n" + b" " * 0x400 + b"\r\n"
    # More than the limit is sent but the body never ends: only a capped read can answer.
    response = await raw_request(api, head, chunk * (MAX_BODY // 0x400 + 2))
    assert response.startswith(b"HTTP/1.1 413 ")
    status, answer = await api.call("POST", "/v1/tasks", {"payload": "x" * MAX_BODY})
    assert status == 413
    assert_error(answer, "resource_exhausted", "max_http_body_bytes")


EXPECTING = "POST /v1/tasks HTTP/1.1\nHost: 127.0.0.1\nContent-Type: application/json\nExpect: 100-continue\n"


@pytest.mark.parametrize(
    ("headers", "status"),
    [
        ("Authorization: Bearer not-a-known-token-at-all\nContent-Length: 2\n", 401),
        (f"Authorization: Bearer {METRICS}\nContent-Length: 2\n", 403),
        (f"Authorization: Bearer {CLIENT}\nContent-Length: {MAX_BODY + 1}\n", 413),
        (f"Authorization: Bearer {CLIENT}\nContent-Length: 2\nX-Standby: 1\n", 503),
    ],
    ids=["bad token", "wrong role", "oversized", "standby"],
)
async def test_a_refusal_is_the_first_answer_to_expect_100_continue(
    api: Api, headers: str, status: int
) -> None:
    """A client that holds its body back for ``100 Continue`` is refused without being invited to send it:
    the first status line is the refusal (the body is never sent here)."""
    if "X-Standby" in headers:
        api.runtime.accepting = False
    head = await raw_request(api, EXPECTING + headers)
    assert head.startswith(f"HTTP/1.1 {status} ".encode()), head
    assert b"connection: close" in head.lower()  # the body it held back is not waited for


async def test_expect_100_continue_invites_the_body_once_the_request_passed_its_checks(api: Api) -> None:
    server = api.client.server
    reader, writer = await asyncio.open_connection(server.host, server.port)
    try:
        head = EXPECTING + f"Authorization: Bearer {CLIENT}\nContent-Length: 2\n"
        writer.write(head.replace("\n", "\r\n").encode() + b"\r\n")
        assert await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5) == b"HTTP/1.1 100 Continue\r\n\r\n"
        writer.write(b"{}")
        assert (await asyncio.wait_for(reader.readuntil(b"\r\n\r\n"), 5)).startswith(b"HTTP/1.1 200 ")
    finally:
        writer.close()
    assert api.submitted() == 1


async def test_a_full_reject_pool_answers_429(api: Api) -> None:
    await api.submit(pool="tight")
    status, answer = await api.call("POST", "/v1/tasks", {"pool": "tight"})
    assert status == 429
    assert_error(answer, "resource_exhausted", "tight")


async def test_not_accepting_answers_503_but_stays_alive(api: Api) -> None:
    api.runtime.accepting = False
    status, answer = await api.call("POST", "/v1/tasks", {})
    assert status == 503
    assert_error(answer, "unavailable", "shutting down")
    status, answer = await api.call("GET", "/readyz", token=None)
    assert status == 503
    assert_error(answer, "unavailable", "not serving")
    assert await api.call("GET", "/healthz", token=None) == (200, {"status": "ok"})


async def test_probes(api: Api) -> None:
    assert await api.call("GET", "/healthz", token=None) == (200, {"status": "ok"})
    assert await api.call("GET", "/readyz", token=None) == (200, {"status": "ok"})


async def head(api: Api, path: str, token: str | None = None) -> tuple[int, str, bytes]:
    """HEAD ``path``: the status, the content type and the body (which must be empty)."""
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    async with api.client.head(path, headers=headers) as resp:
        return resp.status, resp.content_type, await resp.read()


async def test_head_is_answered_wherever_get_is(api: Api) -> None:
    """Load balancers probe with HEAD: it gets GET's status and headers, without a body."""
    for path, token in (
        ("/healthz", None),
        ("/readyz", None),
        ("/v1/openapi.json", None),
        ("/v1/tasks", CLIENT),
        ("/v1/snapshot", METRICS),
    ):
        assert await head(api, path, token) == (200, "application/json", b""), path
    assert (await head(api, "/v1/tasks"))[0] == 401
    assert (await head(api, "/v1/tasks?colour=red", CLIENT))[0] == 400
    # The event stream answers its headers and ends, rather than streaming nothing forever.
    assert await head(api, "/v1/watch?pool=default", CLIENT) == (200, "text/event-stream", b"")
    assert (await head(api, "/v1/watch?pool=nope", CLIENT))[0] == 404
    assert not api.runtime._watchers
    api.runtime.accepting = False
    assert (await head(api, "/readyz"))[0] == 503


# ------------------------------------------------------------------------------------------- admin


async def test_snapshot_and_workers(api: Api) -> None:
    api.worker(slots=3)
    await api.submit()
    status, snap = await api.call("GET", "/v1/snapshot", token=METRICS)
    assert status == 200
    assert [p["name"] for p in snap["pools"]] == ["default", "tight", "other"]
    default = snap["pools"][0]
    assert default["capacity"] == 3 and default["busy"] == 1
    assert set(default["pending_by_class"]) == {"critical", "high", "normal", "low"}
    assert snap["totals"]["submitted"] == 1 and snap["unavailable_shards"] == []

    status, listed = await api.call("GET", "/v1/workers", token=ADMIN)
    assert status == 200
    [worker] = listed["workers"]
    assert worker["name"] == "w-1" and worker["slots"] == 3 and worker["busy"] == 1
    assert worker["connected_at"] == "2030-01-02T03:04:05.000000Z" and isinstance(worker["id"], str)


async def test_recurring_schedules_are_added_listed_and_removed(api: Api) -> None:
    assert await api.call("GET", "/v1/recurring", token=METRICS) == (
        200,
        {"schedules": [], "unavailable_shards": []},
    )
    body = {
        "name": "nightly",
        "cron": "0 3 * * *",
        "tz": "Europe/Berlin",
        "overlap": "queue",
        "template": {
            "pool": "other",
            "kind": "report",
            "key": "rep",
            "payload": {"x": 1},
            "deadline_in_s": 60,
        },
    }
    status, answer = await api.call("POST", "/v1/recurring", body, token=ADMIN)
    assert (status, answer) == (200, {"name": "nightly"})
    status, listed = await api.call("GET", "/v1/recurring", token=METRICS)
    assert status == 200
    [info] = listed["schedules"]
    assert {k: info[k] for k in ("name", "cron", "tz", "pool", "kind", "overlap")} == {
        "name": "nightly",
        "cron": "0 3 * * *",
        "tz": "Europe/Berlin",
        "pool": "other",
        "kind": "report",
        "overlap": "queue",
    }
    assert info["next_at"].endswith(("T01:00:00.000000Z", "T02:00:00.000000Z"))  # 03:00 CET / CEST
    # The first occurrence exists at once: a fixed-start task keyed "rep@<UTC start>".
    occurrence = api.runtime.engine.get(int(info["last_task_id"]))
    assert occurrence is not None and occurrence.status is Status.SCHEDULED
    assert occurrence.spec.key == "rep@" + info["next_at"][:19] + "Z"
    assert occurrence.spec.start is not None and occurrence.spec.deadline == occurrence.spec.start + 60
    assert occurrence.spec.payload == b'{"x":1}'

    assert await api.call("DELETE", "/v1/recurring/nightly", token=ADMIN) == (200, {"removed": True})
    assert await api.call("DELETE", "/v1/recurring/nightly", token=ADMIN) == (200, {"removed": False})
    assert (await api.call("GET", "/v1/recurring", token=METRICS))[1]["schedules"] == []
    assert api.runtime.engine.get(occurrence.id) is not None  # an occurrence already created stays


@pytest.mark.parametrize(
    ("body", "status", "code", "pattern"),
    [
        ({"cron": "* * * * *"}, 400, "invalid_argument", r"^name: required"),
        ({"name": "a\u0000", "cron": "* * * * *"}, 400, "invalid_argument", r"^name: must not contain NUL"),
        ({"name": "n" * 129, "cron": "* * * * *"}, 400, "invalid_argument", r"^name: longer than 128"),
        ({"name": "n"}, 400, "invalid_argument", r"^cron: required"),
        (
            {"name": "n", "cron": "61 * * * *"},
            400,
            "invalid_argument",
            r"^cron: invalid cron '61 \* \* \* \*'",
        ),
        ({"name": "n", "cron": "* * *"}, 400, "invalid_argument", r"^cron: .*between 5 and 7 fields"),
        (
            {"name": "n", "cron": "* * * * *", "tz": "Mars/X"},
            400,
            "invalid_argument",
            r"^tz: unknown time zone",
        ),
        (
            {"name": "n", "cron": "* * * * *", "overlap": "sometimes"},
            400,
            "invalid_argument",
            r"^overlap: expected",
        ),
        ({"name": "n", "cron": "* * * * *", "bogus": 1}, 400, "invalid_argument", r"^bogus: unknown field"),
        (
            {"name": "n", "cron": "* * * * *", "template": {"pool": "nope"}},
            404,
            "not_found",
            r"^template\.pool: unknown pool 'nope'",
        ),
        (
            {"name": "n", "cron": "* * * * *", "template": {"deps": [{"key": "k"}]}},
            400,
            "invalid_argument",
            r"^template\.deps: a recurring template cannot have dependencies",
        ),
        (
            {"name": "n", "cron": "* * * * *", "template": {"start_in_s": 5}},
            400,
            "invalid_argument",
            r"^template\.start_in_s: a recurring template cannot have a fixed start",
        ),
        (
            {"name": "n", "cron": "* * * * *", "template": {"deadline_at": "2030-01-01T00:00:00Z"}},
            400,
            "invalid_argument",
            r"^template\.deadline_at: a recurring template cannot have an absolute deadline",
        ),
        (
            {"name": "n", "cron": "* * * * *", "template": {"start_at": "2030-01-01T00:00:00Z"}},
            400,
            "invalid_argument",
            r"^template\.start_at: a recurring template cannot have a fixed start",
        ),
        (
            {"name": "n", "cron": "* * * * *", "template": {"resources": {"disk": 1}}},
            404,
            "not_found",
            r"^template\.resources: unknown resource 'disk'",
        ),
        (
            {"name": "n", "cron": "* * * * *", "template": {"timeout_s": -1}},
            400,
            "invalid_argument",
            r"^template\.timeout_s: invalid duration",
        ),
    ],
)
async def test_bad_recurring_requests_are_refused_naming_the_field_and_change_nothing(
    api: Api, body: dict[str, object], status: int, code: str, pattern: str
) -> None:
    got, answer = await api.call("POST", "/v1/recurring", body, token=ADMIN)
    assert got == status, answer
    assert_error(answer, code, pattern)
    assert api.runtime.engine.list_recurring() == [] and api.submitted() == 0


async def test_recurring_roles(api: Api) -> None:
    body = {"name": "n", "cron": "* * * * *"}
    for token in (CLIENT, METRICS):
        status, answer = await api.call("POST", "/v1/recurring", body, token=token)
        assert status == 403, answer
        status, answer = await api.call("DELETE", "/v1/recurring/n", token=token)
        assert status == 403, answer
    assert (await api.call("GET", "/v1/recurring", token=CLIENT))[0] == 403
    assert (await api.call("POST", "/v1/recurring", body, token=ADMIN))[0] == 200
    assert (await api.call("GET", "/v1/recurring", token=ADMIN))[0] == 200
    assert api.runtime.engine.list_recurring()[0].spec.template.pool == "default"
    assert api.runtime.engine.list_recurring()[0].spec.overlap is Overlap.SKIP


async def test_metrics_text_needs_the_metrics_role() -> None:
    async with serve(metrics=UP) as api:
        async with api.client.get("/metrics", headers={"Authorization": f"Bearer {METRICS}"}) as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"] == "text/plain; version=0.0.4; charset=utf-8"
            assert "\ncronoq_up 1.0\n" in await resp.text()
        openmetrics = {
            "Authorization": f"Bearer {METRICS}",
            "Accept": "application/openmetrics-text; version=1.0.0",
        }
        async with api.client.get("/metrics", headers=openmetrics) as resp:
            assert resp.status == 200
            assert resp.headers["Content-Type"].startswith("application/openmetrics-text; version=1.0.0;")
            page = await resp.text()
            assert "\ncronoq_up 1.0\n" in page and page.endswith("\n# EOF\n")
        assert (await api.call("GET", "/metrics"))[0] == 403
    async with serve() as api:
        status, answer = await api.call("GET", "/metrics", token=METRICS)
        assert status == 404
        assert_error(answer, "not_found", "no route")


# ------------------------------------------------------------------------------------------- watch


async def frame(resp: Any) -> str:
    """The next SSE frame, comments included."""
    data = b""
    while not data.endswith(b"\n\n"):
        data += await asyncio.wait_for(resp.content.readline(), 5)
    return data.decode()


async def next_frame(resp: Any) -> str:
    """The next SSE frame that is not a comment (keepalives arrive every 50 ms here)."""
    while (data := await frame(resp)).startswith(":"):
        pass
    return data


async def test_watch_streams_status_events(api: Api) -> None:
    sink = api.worker()
    headers = {"Authorization": f"Bearer {CLIENT}"}
    async with api.client.get("/v1/watch?pool=default", headers=headers) as resp:
        assert resp.status == 200 and resp.content_type == "text/event-stream"
        task_id = await api.submit(key="watched")
        api.complete(sink)
        frame = await next_frame(resp)
        assert frame.startswith("data: ")
        event = json.loads(frame.removeprefix("data: "))
        assert event["id"] == task_id and event["status"] == "succeeded" and event["key"] == "watched"
        assert event["pool"] == "default" and event["at"].endswith("Z")
        SCHEMAS.check(OPENAPI["components"]["schemas"]["StatusEvent"], event)

    async with api.client.get("/v1/watch?all=true&key=watched2", headers=headers) as resp:
        await api.submit(key="watched2")
        statuses = []
        while "running" not in statuses:  # non-terminal transitions too; a timeout fails the test
            statuses.append(json.loads((await next_frame(resp)).removeprefix("data: "))["status"])
        assert statuses[0] == "blocked"


async def test_an_unfiltered_watch_by_a_credential_scoped_to_no_pools_sees_nothing(api: Api) -> None:
    """``pools = []`` scopes a credential to no pool: its Watch without a filter must not fall back to
    every pool (an empty filter once meant "all")."""
    sink = api.worker()
    scoped = {"Authorization": f"Bearer {NO_POOLS}"}
    everything = {"Authorization": f"Bearer {CLIENT}"}
    async with (
        api.client.get("/v1/watch", headers=scoped) as none,
        api.client.get("/v1/watch", headers=everything) as every,
    ):
        assert await frame(none) == ": watching\n\n" and await frame(every) == ": watching\n\n"
        watchers = {w.pools: w for w in api.runtime._watchers}
        assert set(watchers) == {frozenset(), None}
        await api.submit(key="unseen")
        api.complete(sink)  # delivers the events to every watcher before the handlers run again
        assert watchers[None].buffer and not watchers[frozenset()].buffer
        assert json.loads((await next_frame(every)).removeprefix("data: "))["key"] == "unseen"


async def test_watch_ends_with_an_error_event_on_shutdown(api: Api) -> None:
    async with api.client.get("/v1/watch", headers={"Authorization": f"Bearer {CLIENT}"}) as resp:
        assert await frame(resp) == ": watching\n\n"  # the stream is open
        api.runtime.close_watchers(Unavailable("server is shutting down"))
        ending = await next_frame(resp)
        assert ending.startswith("event: error\ndata: ")
        assert json.loads(ending.split("data: ", 1)[1]) == {
            "error": "server is shutting down",
            "code": "unavailable",
        }
        assert await asyncio.wait_for(resp.content.read(), 5) == b""


async def test_watch_request_errors_are_plain_json(api: Api) -> None:
    status, answer = await api.call("GET", "/v1/watch?pool=nope")
    assert status == 404
    assert_error(answer, "not_found", "^pool: unknown pool 'nope'$")
    status, answer = await api.call("GET", "/v1/watch?pool=default", token=OTHER_ONLY)
    assert status == 403
    status, answer = await api.call("GET", "/v1/watch?id=abc")
    assert status == 400


async def test_a_vanished_watcher_is_unsubscribed(api: Api) -> None:
    async with api.client.get("/v1/watch", headers={"Authorization": f"Bearer {CLIENT}"}) as resp:
        await frame(resp)
        assert len(api.runtime._watchers) == 1
    for _ in range(200):  # found by the next keepalive write
        if not api.runtime._watchers:
            break
        await asyncio.sleep(0.01)
    assert not api.runtime._watchers


# ----------------------------------------------------------------------------------------- openapi


def json_schema(node: object) -> Any:
    """An OpenAPI 3.0 schema as JSON Schema (draft 4, which OpenAPI 3.0 extends), read as OpenAPI 3.0.3
    says: the siblings of a ``$ref`` are ignored, and ``nullable`` adds null to the ``type`` beside it,
    and has no effect without one."""
    if isinstance(node, list):
        return [json_schema(item) for item in node]
    if not isinstance(node, dict):
        return node
    if "$ref" in node:
        return {"$ref": node["$ref"]}
    converted = {key: json_schema(value) for key, value in node.items() if key != "nullable"}
    if node.get("nullable") and "type" in node:
        converted["type"] = [node["type"], "null"]
    return converted


class Schemas:
    """Validates answers against an OpenAPI document with a real JSON Schema validator (jsonschema_rs)."""

    def __init__(self, document: dict[str, Any]) -> None:
        self.components = json_schema(document["components"])

    def check(self, schema: dict[str, Any], value: object, where: str = "") -> None:
        validator = jsonschema_rs.Draft4Validator(
            {"components": self.components, **json_schema(schema)}, validate_formats=True
        )
        errors = [f"{error.instance_path}: {error.message}" for error in validator.iter_errors(value)]
        assert not errors, f"{where} {value!r}: {errors}"


SCHEMAS = Schemas(OPENAPI)


def response_schema(method: str, path: str, status: int) -> dict[str, Any]:
    response = OPENAPI["paths"][path][method.lower()]["responses"][str(status)]
    if "$ref" in response:
        response = OPENAPI["components"]["responses"][response["$ref"].rsplit("/", 1)[1]]
    schema: dict[str, Any] = response["content"]["application/json"]["schema"]
    return schema


async def test_every_route_is_described_by_the_openapi_document() -> None:
    async with serve(metrics=UP) as api:
        routes = {
            (route.method, route.resource.canonical)
            for route in api.client.app.router.routes()
            if route.resource is not None
        }
        described = {(m.upper(), path) for path, ops in OPENAPI["paths"].items() for m in ops}
        implied_head = {("HEAD", path) for method, path in described if method == "GET"}
        assert routes == described | implied_head
        status, document = await api.call("GET", "/v1/openapi.json", token=None)
        assert status == 200 and document == json.loads(json.dumps(OPENAPI))
        assert document["servers"] == [{"url": "/"}]  # wherever it was fetched from


async def test_live_answers_match_the_openapi_schemas(api: Api) -> None:
    """Every kind of answer, validated against the document the server serves."""
    status, document = await api.call("GET", "/v1/openapi.json", token=None)
    assert status == 200
    schemas = Schemas(document)
    sink = api.worker()
    task_id = await api.submit(payload=[1], key="k")
    api.complete(sink, b"\x00", "application/octet-stream")
    waiting = await api.submit(tags={"a": "b"})
    await api.submit(pool="tight")  # fills it: the first occurrence of "full" below cannot be created
    answers = [
        ("POST", "/v1/tasks", "/v1/tasks", {"payload": 1, "wait": True, "wait_timeout_s": 0.01}, CLIENT),
        ("POST", "/v1/tasks:batch", "/v1/tasks:batch", {"tasks": [{}]}, CLIENT),
        ("GET", f"/v1/tasks/{task_id}", "/v1/tasks/{ref}", None, CLIENT),
        ("GET", f"/v1/tasks/{task_id}/result", "/v1/tasks/{ref}/result", None, CLIENT),
        ("POST", f"/v1/tasks/{waiting}:cancel", "/v1/tasks/{ref}:cancel", None, CLIENT),
        ("GET", "/v1/tasks?limit=2", "/v1/tasks", None, CLIENT),
        ("GET", "/v1/snapshot", "/v1/snapshot", None, METRICS),
        ("GET", "/v1/workers", "/v1/workers", None, METRICS),
        ("GET", "/v1/recurring", "/v1/recurring", None, METRICS),
        ("GET", "/healthz", "/healthz", None, None),
        ("POST", "/v1/tasks", "/v1/tasks", {"bogus": 1}, CLIENT),
        ("GET", "/v1/tasks/missing", "/v1/tasks/{ref}", None, CLIENT),
        ("POST", "/v1/recurring", "/v1/recurring", None, ADMIN),
        ("POST", "/v1/recurring", "/v1/recurring", {"name": "r", "cron": "0 0 * * *"}, ADMIN),
        ("POST", "/v1/recurring", "/v1/recurring", {"name": "r", "cron": "bad"}, ADMIN),
        (
            "POST",
            "/v1/recurring",
            "/v1/recurring",
            {"name": "full", "cron": "0 0 * * *", "template": {"pool": "tight"}},
            ADMIN,
        ),
        ("GET", "/v1/recurring", "/v1/recurring", None, METRICS),
        ("DELETE", "/v1/recurring/r", "/v1/recurring/{name}", None, ADMIN),
        ("POST", "/v1/tasks", "/v1/tasks", {"pool": "other", "start_in_s": 50}, CLIENT),
        ("POST", "/v1/tasks", "/v1/tasks", {"pool": "other", "start_in_s": 50}, CLIENT),
    ]
    listed: dict[str, Any] = {}
    for method, url, path, body, token in answers:
        status, answer = await api.call(method, url, body, token=token)
        schemas.check(response_schema(method, path, status), answer, f"{method} {url}")
        if url == "/v1/recurring" and method == "GET":
            listed.update({s["name"]: s for s in answer["schedules"]})
    assert listed["full"]["last_task_id"] is None and listed["r"]["last_task_id"] is not None
    # A task of a leader that did not see it accepted: its priority is unknown (null).
    unknown = codec.task_info(pb.TaskInfo(id=7, status=pb.TASK_STATUS_SUCCEEDED))
    assert unknown["priority"] is None
    schemas.check(document["components"]["schemas"]["TaskInfo"], unknown)
    schemas.check(
        document["components"]["schemas"]["SubmitRequest"],
        {"payload": 1, "deps": [{"id": "1", "on": "failure"}]},
    )


# ------------------------------------------------------------------------------------------- fuzz

scalars = (
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**70), max_value=2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
seconds = st.floats(min_value=-1, max_value=1e10, allow_nan=False) | st.integers(-5, 10**12)
names = st.text(max_size=4)
# Mostly well-typed values, so documents get past the shape checks and reach the service's rules.
typed_fields = {
    "payload": json_values,
    "payload_base64": st.binary(max_size=8).map(lambda b: base64.b64encode(b).decode()) | names,
    "content_type": st.sampled_from(["application/json", "image/png", ""]),
    "kind": names,
    "pool": st.sampled_from(["default", "other", "tight", "nope", ""]),
    "priority": st.sampled_from(["critical", "high", "normal", "low", "urgent"]),
    "key": names,
    "deadline_in_s": seconds,
    "deadline_at": st.sampled_from(["2030-01-01T00:00:00Z", "2030-01-01", "9999-12-31T23:59:59Z"]) | seconds,
    "start_in_s": seconds,
    "tolerance_s": seconds,
    "on_miss": st.sampled_from(["run_late", "skip", "fail", "never"]),
    "duration_hint_s": seconds,
    "timeout_s": seconds,
    "retry": st.fixed_dictionaries(
        {}, optional={"max_attempts": st.integers(-1, 2**33), "multiplier": seconds, "jitter": st.booleans()}
    ),
    "deps": st.lists(st.fixed_dictionaries({}, optional={"id": st.integers(0, 9), "key": names}), max_size=2),
    "resources": st.dictionaries(
        st.sampled_from(["gpu", "api", "nope", ""]) | names, st.integers(-1, 3), max_size=2
    ),
    "tags": st.dictionaries(names, names, max_size=3),
    "labels": st.dictionaries(names, names | st.integers(), max_size=2),
    "tenant": names,
    "wait_timeout_s": seconds,
}
typed_specs = st.fixed_dictionaries({}, optional=typed_fields)
task_specs = typed_specs | st.dictionaries(st.sampled_from([*typed_fields, "bogus"]) | names, json_values)
documents = task_specs | st.fixed_dictionaries({"tasks": st.lists(task_specs, max_size=3)}) | json_values
bodies = documents.map(lambda doc: json.dumps(doc).encode()) | st.binary(max_size=64)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(path=st.sampled_from(["/v1/tasks", "/v1/tasks:batch"]), body=bodies)
async def test_fuzzed_bodies_get_a_json_answer_and_rejections_change_nothing(
    api: Api, path: str, body: bytes
) -> None:
    before = api.submitted()
    async with api.client.post(
        path, data=body, headers={"Authorization": f"Bearer {CLIENT}", "Content-Type": "application/json"}
    ) as resp:
        assert resp.content_type == "application/json"
        answer = await resp.json()
    assert resp.status < 500, answer
    event(f"HTTP {resp.status}")
    if resp.status == 200:
        assert isinstance(answer["id"] if path == "/v1/tasks" else answer["tasks"], str | list)
    else:
        assert set(answer) == {"error", "code"} and answer["error"], answer
        assert api.submitted() == before
