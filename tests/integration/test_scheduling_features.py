"""Dependencies, fixed starts, resources, recurring schedules and fair sharing against a real server
process, over gRPC (the SDK) and over HTTP/JSON: what the engine does reaches both transports, and bad
input for every one of these fields gets a clear error that names it and changes nothing."""

from __future__ import annotations

import asyncio
import re
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest

import cronoq
from cronoq.client import Client, Lease, task
from cronoq.errors import ApiError, FailedPrecondition, InvalidArgument, NotFound, PermissionDenied
from cronoq.v1 import cronoq_pb2 as pb

from .helpers import scrape_metrics, token, toml_table, worker
from .serverproc import ServerProcess, running_server

pytestmark = pytest.mark.asyncio

ADMIN = "admin-token-0123456789abcdef"
CLIENT = "client-token-0123456789abcdef"
METRICS = "metrics-token-0123456789abcdef"
WORKER = "worker-token-0123456789abcdef"

TOKENS = (ADMIN, "admin"), (CLIENT, "client"), (METRICS, "metrics"), (WORKER, "worker")
FEATURES_CONFIG = (
    toml_table("server", shutdown_grace_s=2)
    + "".join(token(*t) for t in TOKENS)
    + """
[[pools]]
name = "default"
max = 8
lease_ttl_s = 5
retry = { max_attempts = 1 }
fair_share = true
tenant_weights = { gold = 1.0, silver = 1.0 }

[[pools]]
name = "fixed"
max = 2                 # max x reservable_fraction (0.5): one fixed-start reservation at a time

[[resources]]
kind = "semaphore"
name = "gpu"
permits = 1

[[resources]]
kind = "token_bucket"
name = "api"
rate = 100
burst = 2
"""
)
KEY_AT = re.compile(r"^tick@\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ$")


@pytest.fixture
def server(tmp_path: Path) -> Iterator[ServerProcess]:
    with running_server(tmp_path, FEATURES_CONFIG) as proc:
        yield proc


@pytest.fixture
async def client(server: ServerProcess) -> AsyncIterator[Client]:
    async with Client(server.target, token=ADMIN) as c:
        yield c


class Http:
    """The HTTP/JSON API of one server, with a token."""

    def __init__(self, session: aiohttp.ClientSession, base: str, token: str) -> None:
        self.session = session
        self.base = base
        self.token = token

    async def __call__(
        self, method: str, path: str, body: object = None, *, token: str | None = None
    ) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {token or self.token}"}
        async with self.session.request(method, self.base + path, json=body, headers=headers) as resp:
            return resp.status, await resp.json()


@pytest.fixture
async def http(server: ServerProcess) -> AsyncIterator[Http]:
    async with aiohttp.ClientSession() as session:
        yield Http(session, server.http, ADMIN)


def sdk_worker(server: ServerProcess, handler: Any, **kw: Any) -> Any:
    return worker(server.target, handler, token=WORKER, **kw)


async def submitted(client: Client) -> int:
    return (await client.snapshot()).totals.submitted


# ------------------------------------------------------------------------------------- dependencies


async def test_dependencies_over_grpc(server: ServerProcess, client: Client) -> None:
    order: list[str] = []

    async def handler(lease: Lease) -> str:
        order.append(lease.key or "")
        if lease.key == "bad":
            raise cronoq.Permanent("broken on purpose")
        return lease.key or ""

    # A batch may depend on keys defined later in it; dependents are BLOCKED until their edges are met.
    chain = await client.submit_batch(
        [task(b"c", key="c", after="b"), task(b"b", key="b", after="a"), task(b"a", key="a")]
    )
    failing = await client.submit_batch(
        [
            task(b"x", key="bad"),
            task(b"x", key="skipped-1", after="bad"),
            task(b"x", key="skipped-2", after="skipped-1"),
            task(b"x", key="on-failure", deps=[("bad", "failure")]),
            task(b"x", key="on-complete", deps=[{"ref": "bad", "cond": "complete"}]),
        ]
    )
    assert (await client.get("c")).status == "blocked"
    async with sdk_worker(server, handler, slots=4):
        results = {
            key: await client.wait(key, timeout=10)
            for key in ("c", "b", "a", "bad", "skipped-1", "skipped-2", "on-failure", "on-complete")
        }
    assert order.index("a") < order.index("b") < order.index("c")
    assert [results[k].status for k in ("a", "b", "c")] == ["succeeded"] * 3
    assert results["c"].id == chain[0].id
    assert results["bad"].status == "failed"
    # Skips cascade down the chain, each naming the dependency that ended badly.
    assert (results["skipped-1"].status, results["skipped-1"].message) == (
        "skipped",
        f"dependency {failing[0].id} ended as failed",
    )
    assert (results["skipped-2"].status, results["skipped-2"].message) == (
        "skipped",
        f"dependency {failing[1].id} ended as skipped",
    )
    assert results["on-failure"].status == results["on-complete"].status == "succeeded"
    assert "skipped-1" not in order and "skipped-2" not in order


async def test_dependencies_over_http(server: ServerProcess, http: Http) -> None:
    ran: list[str] = []

    async def handler(lease: Lease) -> str:
        ran.append(lease.key or "")
        if lease.key == "first":
            raise cronoq.Permanent("no")
        return "ok"

    status, answer = await http(
        "POST",
        "/v1/tasks:batch",
        {
            "tasks": [
                {"key": "second", "deps": [{"key": "first"}]},
                {"key": "first"},
                {"key": "third", "deps": [{"key": "second", "on": "success"}]},
                {"key": "cleanup", "deps": [{"key": "first", "on": "failure"}]},
            ]
        },
    )
    assert status == 200, answer
    second, first, third, cleanup = (t["id"] for t in answer["tasks"])
    status, info = await http("GET", "/v1/tasks/second")
    assert (status, info["status"]) == (200, "blocked")
    async with sdk_worker(server, handler):
        results = {}
        for task_id in (first, second, third, cleanup):
            status, results[task_id] = await http("GET", f"/v1/tasks/{task_id}/result?timeout_s=10")
            assert status == 200, results[task_id]
    assert [results[i]["status"] for i in (first, second, third, cleanup)] == [
        "failed",
        "skipped",
        "skipped",
        "succeeded",
    ]
    assert results[second]["message"] == f"dependency {first} ended as failed"
    assert results[third]["message"] == f"dependency {second} ended as skipped"
    assert sorted(ran) == ["cleanup", "first"]


async def test_dependency_errors_name_the_field_and_change_nothing(client: Client, http: Http) -> None:
    before = await submitted(client)
    with pytest.raises(NotFound, match=r"^[a-z_]+: task\.deps\[0\]\.key: unknown dependency 'nowhere'$"):
        await client.submit(b"x", after="nowhere")
    with pytest.raises(NotFound, match=r"^[a-z_]+: tasks\[1\]\.deps\[1\]\.id: unknown dependency 424242$"):
        await client.submit_batch(
            [task(b"1", key="p"), task(b"2", deps=[("p", "success"), (424242, "success")])]
        )
    with pytest.raises(InvalidArgument, match=r"^[a-z_]+: tasks\[0\]\.deps: dependency cycle$"):
        await client.submit_batch([task(b"1", key="p", after="q"), task(b"2", key="q", after="p")])
    with pytest.raises(InvalidArgument, match=r"^[a-z_]+: task\.deps: dependency cycle$"):
        await client.submit(b"x", key="self", after="self")
    status, answer = await http("POST", "/v1/tasks", {"deps": [{"key": "nowhere"}]})
    assert (status, answer["code"]) == (404, "not_found")
    assert answer["error"] == "task.deps[0].key: unknown dependency 'nowhere'"
    status, answer = await http(
        "POST",
        "/v1/tasks:batch",
        {"tasks": [{"key": "p", "deps": [{"key": "q"}]}, {"key": "q", "deps": [{"key": "p"}]}]},
    )
    assert (status, answer) == (400, {"error": "tasks[0].deps: dependency cycle", "code": "invalid_argument"})
    assert await submitted(client) == before == 0


# ------------------------------------------------------------------------------------- fixed starts


async def test_a_fixed_start_runs_at_its_start(server: ServerProcess, client: Client, http: Http) -> None:
    started: dict[int, float] = {}

    async def handler(lease: Lease) -> None:
        started[lease.task_id] = time.time()

    async with sdk_worker(server, handler, pool="fixed"):
        start_at = time.time() + 2.0
        sub = await client.submit(b"x", pool="fixed", start_at=start_at, tolerance=1.0)
        info = await client.get(sub.id)
        assert info.status == "scheduled"  # waiting for its start (2 s away), not ready
        assert (await client.snapshot()).pool("fixed").reservations == 1
        done = await client.wait(sub.id, timeout=15)
        assert done.status == "succeeded"
        assert started[sub.id] >= start_at - 0.01  # never before its start
        info = await client.get(sub.id)
        assert info.started_at is not None and info.started_at >= start_at - 0.001

        # The same over HTTP, with an RFC 3339 start.
        start = time.time() + 2.0
        rfc3339 = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(start)) + f".{int(start % 1 * 1e6):06d}Z"
        status, answer = await http("POST", "/v1/tasks", {"pool": "fixed", "start_at": rfc3339})
        assert status == 200, answer
        status, result = await http("GET", f"/v1/tasks/{answer['id']}/result?timeout_s=15")
        assert (status, result["status"]) == (200, "succeeded")
        assert started[int(answer["id"])] >= start - 0.01
    snap = await client.snapshot()
    assert snap.pool("fixed").fixed_start_hit_rate == 1.0
    status, body = await http("GET", "/v1/snapshot")
    fixed = next(p for p in body["pools"] if p["name"] == "fixed")
    assert fixed["fixed_start_hit_rate"] == 1.0 and {"held", "desired", "reservations"} <= set(fixed)


async def test_a_reservation_conflict_is_failed_precondition(client: Client, http: Http) -> None:
    await client.submit(b"x", pool="fixed", start_in=60, duration_hint=10)
    before = await submitted(client)
    with pytest.raises(
        FailedPrecondition, match=r"^[a-z_]+: task: fixed-start reservation conflict: pool 'fixed'"
    ):
        await client.submit(b"y", pool="fixed", start_in=65)
    status, answer = await http("POST", "/v1/tasks", {"pool": "fixed", "start_in_s": 62})
    assert (status, answer["code"]) == (409, "failed_precondition")
    assert await submitted(client) == before
    await client.submit(b"z", pool="fixed", start_in=300)  # no overlap: fine


# ----------------------------------------------------------------------------------------- resources


async def test_a_one_permit_semaphore_serialises_two_tasks(server: ServerProcess, client: Client) -> None:
    holding: set[int] = set()
    peak = 0
    first_started = asyncio.Event()
    release = asyncio.Event()

    async def handler(lease: Lease) -> None:
        nonlocal peak
        if lease.text() == "free":
            return
        holding.add(lease.task_id)
        peak = max(peak, len(holding))
        first_started.set()
        await release.wait()
        holding.discard(lease.task_id)

    async with sdk_worker(server, handler, slots=4):
        one, two = await client.submit_batch(
            [task("gpu", resources={"gpu": 1}), task("gpu", resources={"gpu": 1})]
        )
        await asyncio.wait_for(first_started.wait(), 10)
        # A task that needs no gpu runs at once beside the holder: the worker has free slots...
        free = await client.submit("free")
        assert (await client.wait(free.id, timeout=10)).status == "succeeded"
        # ...yet the second gpu task waits for the permit.
        assert sorted([(await client.get(one.id)).status, (await client.get(two.id)).status]) == [
            "ready",
            "running",
        ]
        metrics = await scrape_metrics(server, METRICS)
        gpu = {"resource": "gpu", "kind": "semaphore"}
        assert metrics("cronoq_resource_capacity", **gpu) == 1
        assert metrics("cronoq_resource_available", **gpu) == 0
        assert metrics("cronoq_resource_waiting", **gpu) == 1
        assert metrics("cronoq_resource_capacity", resource="api", kind="token_bucket") == 2
        release.set()
        assert (await client.wait(one.id, timeout=10)).status == "succeeded"
        assert (await client.wait(two.id, timeout=10)).status == "succeeded"
    assert peak == 1


async def test_resource_errors(client: Client, http: Http) -> None:
    before = await submitted(client)
    with pytest.raises(NotFound, match=r"^[a-z_]+: task\.resources: unknown resource 'disk'$"):
        await client.submit(b"x", resources={"disk": 1})
    with pytest.raises(
        InvalidArgument, match=r"^[a-z_]+: tasks\[0\]\.resources: requested amount exceeds capacity"
    ):
        await client.submit_batch([task(b"x", resources={"gpu": 2})])
    with pytest.raises(InvalidArgument, match=r"^[a-z_]+: task\.resources\['api'\]: amount must be > 0$"):
        await client.submit(b"x", resources={"api": 0})
    status, answer = await http("POST", "/v1/tasks", {"resources": {"disk": 1}})
    assert (status, answer) == (
        404,
        {"error": "task.resources: unknown resource 'disk'", "code": "not_found"},
    )
    assert await submitted(client) == before


# ----------------------------------------------------------------------------------------- recurring


async def test_recurring_over_grpc(server: ServerProcess, client: Client) -> None:
    keys: list[str] = []
    two = asyncio.Event()

    async def handler(lease: Lease) -> str:
        keys.append(lease.key or "")
        if len(set(keys)) >= 2:
            two.set()
        return "tick"

    async with sdk_worker(server, handler, slots=2):
        await client.add_recurring(
            "ticker", "* * * * * *", b"t", key="tick", kind="heartbeat", overlap="allow"
        )
        [schedule] = await client.list_recurring()
        assert (
            schedule.name,
            schedule.cron,
            schedule.tz,
            schedule.pool,
            schedule.kind,
            schedule.overlap,
        ) == (
            "ticker",
            "* * * * * *",
            "UTC",
            "default",
            "heartbeat",
            "allow",
        )
        assert schedule.next_at is not None and schedule.last_task_id is not None
        await asyncio.wait_for(two.wait(), 10)  # one occurrence a second, each keyed by its start
        assert await client.remove_recurring("ticker")
        assert not await client.remove_recurring("ticker")
        assert await client.list_recurring() == []
    assert all(KEY_AT.match(k) for k in keys), keys
    assert len(set(keys)) == len(keys)  # each occurrence ran once
    info = await client.get(keys[0])
    assert info.kind == "heartbeat" and info.status == "succeeded"


async def test_recurring_over_http(server: ServerProcess, http: Http) -> None:
    keys: list[str] = []
    two = asyncio.Event()

    async def handler(lease: Lease) -> None:
        keys.append(lease.key or "")
        if len(set(keys)) >= 2:
            two.set()

    async with sdk_worker(server, handler, slots=2):
        body = {
            "name": "ticker",
            "cron": "* * * * * *",
            "overlap": "allow",
            "template": {"key": "tick", "payload": {"n": 1}, "tags": {"source": "cron"}},
        }
        assert await http("POST", "/v1/recurring", body) == (200, {"name": "ticker"})
        status, listed = await http("GET", "/v1/recurring", token=METRICS)
        assert status == 200 and listed["unavailable_shards"] == []
        [schedule] = listed["schedules"]
        assert (schedule["name"], schedule["pool"], schedule["overlap"], schedule["tz"]) == (
            "ticker",
            "default",
            "allow",
            "UTC",
        )
        assert schedule["next_at"].endswith("Z") and schedule["last_task_id"].isdigit()
        await asyncio.wait_for(two.wait(), 10)
        assert await http("DELETE", "/v1/recurring/ticker") == (200, {"removed": True})
        assert await http("DELETE", "/v1/recurring/ticker") == (200, {"removed": False})
        assert (await http("GET", "/v1/recurring"))[1]["schedules"] == []
    assert all(KEY_AT.match(k) for k in keys), keys


async def test_recurring_errors_and_roles(client: Client, http: Http, server: ServerProcess) -> None:
    cases: list[tuple[dict[str, object], type[ApiError], str]] = [
        ({"cron": "61 * * * *"}, InvalidArgument, r"^[a-z_]+: cron: invalid cron '61 \* \* \* \*'"),
        ({"cron": "* * * * *", "tz": "Mars/Olympus"}, InvalidArgument, r"^[a-z_]+: tz: unknown time zone"),
        ({"cron": "* * * * *", "pool": "nope"}, NotFound, r"^[a-z_]+: template\.pool: unknown pool 'nope'"),
        (
            {"cron": "* * * * *", "after": "k"},
            InvalidArgument,
            r"^[a-z_]+: template\.deps: a recurring template cannot",
        ),
        (
            {"cron": "* * * * *", "start_in": 5},
            InvalidArgument,
            r"^[a-z_]+: template\.start_in_s: a recurring template",
        ),
        (
            {"cron": "* * * * *", "deadline_at": time.time() + 60},
            InvalidArgument,
            r"^[a-z_]+: template\.deadline_unix_ns: a recurring template cannot have an absolute deadline",
        ),
        (
            {"cron": "* * * * *", "resources": {"disk": 1}},
            NotFound,
            r"^[a-z_]+: template\.resources: unknown resource",
        ),
    ]
    for opts, error, pattern in cases:
        cron = str(opts.pop("cron"))
        tz = opts.pop("tz", None)
        with pytest.raises(error, match=pattern):
            await client.add_recurring("bad", cron, b"x", tz=None if tz is None else str(tz), **opts)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgument, match=r"^[a-z_]+: name: required"):
        await client.add_recurring("", "* * * * *")
    with pytest.raises(InvalidArgument, match=r"^[a-z_]+: name: must not contain NUL"):
        await client.add_recurring("a\x00b", "* * * * *")
    status, answer = await http("POST", "/v1/recurring", {"name": "bad", "cron": "* * *"})
    assert (status, answer["code"]) == (400, "invalid_argument") and answer["error"].startswith("cron: ")
    # Roles: admin adds and removes, metrics (or admin) lists, a client does neither.
    async with Client(server.target, token=CLIENT) as producer:
        with pytest.raises(PermissionDenied):
            await producer.add_recurring("r", "* * * * *")
        with pytest.raises(PermissionDenied):
            await producer.list_recurring()
    async with Client(server.target, token=METRICS) as reader:
        assert await reader.list_recurring() == []
        with pytest.raises(PermissionDenied):
            await reader.remove_recurring("r")
    assert await client.list_recurring() == [] and await submitted(client) == 0


# ------------------------------------------------------------------------------------- fair sharing


async def test_fair_share_interleaves_tenants(server: ServerProcess, client: Client) -> None:
    """All of tenant gold's tasks were submitted before silver's; with fair_share they still take turns."""
    order: list[str] = []
    done = asyncio.Event()

    async def handler(lease: Lease) -> None:
        order.append(lease.text())
        if len(order) == 8:
            done.set()

    specs = [task(f"gold{i}", tenant="gold") for i in range(4)] + [
        task(f"silver{i}", tenant="silver") for i in range(4)
    ]
    await client.submit_batch(specs)
    async with sdk_worker(server, handler, slots=1):
        await asyncio.wait_for(done.wait(), 10)
    tenants = [name.rstrip("0123456789") for name in order]
    assert tenants[:2] in (["gold", "silver"], ["silver", "gold"]), order
    assert tenants != ["gold"] * 4 + ["silver"] * 4  # not FIFO


# ----------------------------------------------------------------------------------- bad wire input


@pytest.mark.parametrize(
    ("spec", "pattern"),
    [
        (pb.TaskSpec(start_in_s=1, start_unix_ns=1), r"^task: use either start_in_s or start_unix_ns"),
        (pb.TaskSpec(start_unix_ns=-5), r"^task\.start_unix_ns: -5 is not a usable start"),
        (pb.TaskSpec(start_in_s=float("nan")), r"^task\.start_in_s: invalid duration"),
        (pb.TaskSpec(tolerance_s=1), r"^task\.tolerance_s: only meaningful with a fixed start"),
        (pb.TaskSpec(start_in_s=1, tolerance_s=-1), r"^task\.tolerance_s: invalid duration"),
        (pb.TaskSpec(on_miss=pb.MISS_POLICY_SKIP), r"^task\.on_miss: only meaningful with a fixed start"),
        (
            pb.TaskSpec(start_in_s=1, on_miss=pb.MissPolicy.ValueType(9)),
            r"^task\.on_miss: unknown on_miss value 9",
        ),
        (pb.TaskSpec(deps=[pb.Dep()]), r"^task\.deps\[0\]: name the task it waits for by id or key"),
        (pb.TaskSpec(deps=[pb.Dep(target=pb.TaskRef(key=""))]), r"^task\.deps\[0\]\.key: must not be empty"),
        (pb.TaskSpec(deps=[pb.Dep(target=pb.TaskRef(id=0))]), r"^task\.deps\[0\]\.id: task ids start at 1"),
        (
            pb.TaskSpec(deps=[pb.Dep(target=pb.TaskRef(key="k"), cond=pb.EdgeCond.ValueType(7))]),
            r"^task\.deps\[0\]\.cond: unknown dependency condition value 7",
        ),
        (pb.TaskSpec(resources={"gpu": 0}), r"^task\.resources\['gpu'\]: amount must be > 0"),
        (pb.TaskSpec(resources={"": 1}), r"^task\.resources: resource names must not be empty"),
        (pb.TaskSpec(resources={"g\x00": 1}), r"^task\.resources key 'g\\x00': must not contain NUL"),
    ],
)
async def test_bad_wire_specs_are_invalid_argument_and_change_nothing(
    client: Client, spec: pb.TaskSpec, pattern: str
) -> None:
    with pytest.raises(InvalidArgument, match=r"^invalid_argument: " + pattern.removeprefix("^")):
        await client.submit(spec)
    assert await submitted(client) == 0
