"""Authorization as a table: every RPC and HTTP route x every kind of credential x a pool in and out of
a pool-scoped credential's reach, against ONE server process.

The tables below are the documented rules (docs/configuration.md, "Who may call what"):

- each call needs one role (``admin`` covers every role); probes, ``grpc.health`` and the OpenAPI
  document need none;
- a credential restricted to ``pools = ["a"]`` touching pool ``b``: naming the pool (submit, batch,
  list/watch filter, worker registration, recurring template) is PERMISSION_DENIED; naming a task of
  that pool (Get/Cancel/Wait by id or key) is NOT_FOUND, exactly as for a task that does not exist;
  removing a schedule of that pool answers ``removed = false`` as for an unknown name; views without
  a pool (unfiltered list and watch, snapshot, workers, recurring list) show only its pools; and
  ``/metrics``, which spans every pool, is refused.

Each row is one short call: Wait names a finished task with a tiny timeout, Watch is opened and closed.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import secrets
import urllib.error
import urllib.request
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from cronoq.api.http_api import _Gateway
from cronoq.api.openapi import OPENAPI
from cronoq.auth import Role
from cronoq.prometheus import Exposition
from cronoq.transport import UNAVAILABLE_SHARDS_KEY
from cronoq.v1 import cronoq_pb2 as pb
from cronoq.v1 import cronoq_pb2_grpc as pbg

from .helpers import token, toml_table
from .serverproc import ServerProcess, running_server

CALL_TIMEOUT_S = 10.0  # a Watch is subscribed or refused well within this
SCHEDULE = "0 0 1 1 *"  # yearly: a schedule whose occurrence never runs during the test


@dataclass(frozen=True)
class Cred:
    role: Role
    pools: frozenset[str] | None = None
    labels: dict[str, str] | None = None
    tenant: str | None = None
    literal: bool = False  # `token = "..."` in the file instead of `token_env`
    token: str = field(default="", compare=False)


def _token(name: str) -> str:
    return f"{name}-{secrets.token_hex(16)}"


A = frozenset({"a"})
CREDS: dict[str, Cred] = {
    name: Cred(**kw, token=_token(name))  # type: ignore[arg-type]
    for name, kw in {
        "admin": {"role": Role.ADMIN},
        "admin_a": {"role": Role.ADMIN, "pools": A},
        "client": {"role": Role.CLIENT},
        "client_a": {"role": Role.CLIENT, "pools": A},
        "client_tenant": {"role": Role.CLIENT, "tenant": "acme"},
        "worker": {"role": Role.WORKER, "literal": True},
        "worker_a": {"role": Role.WORKER, "pools": A},
        "worker_labels": {"role": Role.WORKER, "labels": {"zone": "eu", "gpu": "1"}},
        "metrics": {"role": Role.METRICS},
        "metrics_a": {"role": Role.METRICS, "pools": A},
    }.items()
}
WRONG_TOKEN = _token("never-configured")
CALLERS = ["none", "wrong", *CREDS]


def config() -> str:
    tables = [toml_table("server", shutdown_grace_s=1)]
    for name, cred in CREDS.items():
        tables.append(
            token(
                cred.token if cred.literal else f"T_{name.upper()}",
                cred.role.value,
                None if cred.pools is None else sorted(cred.pools),
                env=not cred.literal,
                labels=None if cred.labels is None else [f"{k}={v}" for k, v in cred.labels.items()],
                tenant=cred.tenant,
            )
        )
    # Room for the fixed-start reservations of many schedules' first occurrences (all on 1 January).
    for pool in ("a", "b"):
        tables.append(toml_table("[pools]", name=pool, max=1000, reservable_fraction=1.0))
    return "".join(tables)


ENV = {f"T_{name.upper()}": cred.token for name, cred in CREDS.items() if not cred.literal}


# -------------------------------------------------------------------------------- the server


def http_json(server: ServerProcess, method: str, path: str, body: object = None) -> tuple[int, Any]:
    """A synchronous call with the admin token, for setup and for checking what a row left behind."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(f"{server.http}{path}", data=data, method=method)
    request.add_header("authorization", f"Bearer {CREDS['admin'].token}")
    if data is not None:
        request.add_header("content-type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=10) as r:
            return int(r.status), json.loads(r.read())
    except urllib.error.HTTPError as err:
        return err.code, json.loads(err.read())


@dataclass
class World:
    """The server and what was set up in it: one finished task per pool (``<pool>-done``, cancelled)
    and one schedule per pool (``rec-<pool>``)."""

    server: ServerProcess
    done_ids: dict[str, int]

    def ref(self, pool: str, by: str) -> str:
        return str(self.done_ids[pool]) if by == "id" else f"{pool}-done"

    def exists(self, ref: str) -> bool:
        status, _ = http_json(self.server, "GET", f"/v1/tasks/{ref}")
        return status == 200

    def schedules(self) -> set[str]:
        _, answer = http_json(self.server, "GET", "/v1/recurring")
        return {s["name"] for s in answer["schedules"]}


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[World]:
    env = {**ENV, "CRONOQ_LOG": "debug"}
    with running_server(Path(tmp_path_factory.mktemp("authz")), config(), env=env) as server:
        done: dict[str, int] = {}
        for pool in ("a", "b"):
            status, answer = http_json(server, "POST", "/v1/tasks", {"pool": pool, "key": f"{pool}-done"})
            assert status == 200, answer
            done[pool] = int(answer["id"])
            status, answer = http_json(server, "POST", f"/v1/tasks/{pool}-done:cancel")
            assert (status, answer) == (200, {"cancelled": True})
            recurring = {"name": f"rec-{pool}", "cron": SCHEDULE, "template": {"pool": pool}}
            assert http_json(server, "POST", "/v1/recurring", recurring)[0] == 200
        yield World(server, done)


# ------------------------------------------------------------------------------- the calls

# How a pool-scoped credential is answered for a pool outside its scope.
DENIED, NOT_FOUND, HIDDEN, FILTERED = "permission_denied", "not_found", "hidden", "filtered"
OK, UNAUTHENTICATED = "ok", "unauthenticated"
NO_POOL = "-"


@dataclass(frozen=True)
class Call:
    """One RPC or route: the role it needs (None: public) and how scope applies to it."""

    name: str
    role: Role | None
    outside_scope: str  # DENIED, NOT_FOUND or HIDDEN for a target pool; FILTERED or DENIED for NO_POOL
    run: Callable[[Row], Awaitable[Any]]
    targets: tuple[str, ...] = ("a", "b")


@dataclass
class Row:
    world: World
    caller: str
    pool: str
    channel: grpc.aio.Channel | None = None
    session: aiohttp.ClientSession | None = None

    @property
    def cred(self) -> Cred | None:
        return CREDS.get(self.caller)

    @property
    def token(self) -> str | None:
        if self.caller == "none":
            return None
        return WRONG_TOKEN if self.caller == "wrong" else CREDS[self.caller].token

    @property
    def metadata(self) -> tuple[tuple[str, str], ...]:
        return () if self.token is None else (("authorization", f"Bearer {self.token}"),)

    @property
    def headers(self) -> dict[str, str]:
        return {} if self.token is None else {"authorization": f"Bearer {self.token}"}

    @property
    def scope(self) -> frozenset[str] | None:
        cred = self.cred
        return None if cred is None else cred.pools

    def visible(self, pool: str) -> bool:
        return self.scope is None or pool in self.scope

    def unique(self, what: str) -> str:
        return f"{what}-{self.caller}-{self.pool}-{uuid.uuid4().hex[:8]}"


def expected(call: Call, caller: str, pool: str) -> str:
    if call.role is None:
        return OK
    cred = CREDS.get(caller)
    if cred is None:
        return UNAUTHENTICATED
    if not (cred.role is Role.ADMIN or cred.role is call.role):
        return DENIED
    if cred.pools is not None and (pool not in cred.pools if pool != NO_POOL else True):
        return call.outside_scope
    return OK


# gRPC -----------------------------------------------------------------------------------------


def tasks(row: Row) -> Any:
    return pbg.TasksStub(row.channel)


def admin(row: Row) -> Any:
    return pbg.AdminStub(row.channel)


async def g_submit(row: Row) -> None:
    key = row.unique("submit")
    answer = await tasks(row).Submit(
        pb.SubmitRequest(task=pb.TaskSpec(pool=row.pool, key=key)), metadata=row.metadata
    )
    assert answer.id and not answer.duplicate


async def g_batch(row: Row) -> None:
    """A batch of a task in pool a and one in the row's pool: refused whole, or admitted whole."""
    first, second = row.unique("batch-1"), row.unique("batch-2")
    specs = [pb.TaskSpec(pool="a", key=first), pb.TaskSpec(pool=row.pool, key=second)]
    try:
        answer = await tasks(row).SubmitBatch(pb.SubmitBatchRequest(tasks=specs), metadata=row.metadata)
    except grpc.aio.AioRpcError:
        assert not row.world.exists(first) and not row.world.exists(second), "a refused batch inserted"
        raise
    assert len(answer.tasks) == 2


def task_ref(row: Row, by: str) -> pb.TaskRef:
    ref = row.world.ref(row.pool, by)
    return pb.TaskRef(id=int(ref)) if by == "id" else pb.TaskRef(key=ref)


def g_get(by: str) -> Callable[[Row], Awaitable[None]]:
    async def run(row: Row) -> None:
        info = await tasks(row).Get(pb.GetRequest(task=task_ref(row, by)), metadata=row.metadata)
        assert (info.pool, info.key) == (row.pool, f"{row.pool}-done")

    return run


def g_cancel(by: str) -> Callable[[Row], Awaitable[None]]:
    async def run(row: Row) -> None:
        answer = await tasks(row).Cancel(pb.CancelRequest(task=task_ref(row, by)), metadata=row.metadata)
        assert not answer.cancelled  # finished already

    return run


def g_wait(by: str) -> Callable[[Row], Awaitable[None]]:
    async def run(row: Row) -> None:
        request = pb.WaitRequest(task=task_ref(row, by), timeout_s=0.05)
        result = await tasks(row).Wait(request, metadata=row.metadata)
        assert result.id == row.world.done_ids[row.pool] and result.status == pb.TASK_STATUS_CANCELLED

    return run


async def g_list(row: Row) -> None:
    pools = [] if row.pool == NO_POOL else [row.pool]
    answer = await tasks(row).ListTasks(pb.ListTasksRequest(pools=pools, limit=1000), metadata=row.metadata)
    seen = {t.pool for t in answer.tasks}
    if row.pool != NO_POOL:
        assert seen == {row.pool}
    elif row.scope is not None:
        assert seen == set(row.scope)
    else:
        assert seen >= {"a", "b"}


async def g_watch(row: Row) -> None:
    """Allowed when the server subscribed the stream: it then sends initial metadata naming the shards
    it could not reach (none here), before any event; a refusal ends the call with a status alone,
    which reading it raises."""
    pools = [] if row.pool == NO_POOL else [row.pool]
    call = tasks(row).Watch(pb.WatchRequest(pools=pools), metadata=row.metadata)
    try:
        opened = dict(await asyncio.wait_for(call.initial_metadata(), CALL_TIMEOUT_S) or ())
        if UNAVAILABLE_SHARDS_KEY not in opened:
            await call.read()  # raises the refusal
            raise AssertionError("a Watch was neither subscribed nor refused")
    finally:
        call.cancel()


async def register(row: Row, labels: dict[str, str] | None = None, *, batched: bool = False) -> pb.Registered:
    """Open a Work stream (``batched``: BatchedWorkers.Work), register, and read the first answer:
    Registered, or the refusal."""
    register = pb.Register(pool=row.pool, slots=1, worker_name="matrix", protocol_version=3, labels=labels)
    opening = pb.WorkerMessage(register=register)

    async def messages() -> AsyncIterator[Any]:
        # Sent by gRPC's own writer, so that a refusal arriving first is read as the call's status
        # rather than failing a write; the stream stays open (no half-close) until cancelled.
        yield pb.WorkerBatch(messages=[opening]) if batched else opening
        await asyncio.Event().wait()

    if batched:
        call = pbg.BatchedWorkersStub(row.channel).Work(messages(), metadata=row.metadata)
    else:
        call = pbg.WorkersStub(row.channel).Work(messages(), metadata=row.metadata)
    try:
        frame = await call.read()
        assert frame is not grpc.aio.EOF, await call.code()
        first: pb.ServerMessage = frame.messages[0] if batched else frame
        assert first.WhichOneof("msg") == "registered", first
        return first.registered
    finally:
        call.cancel()


async def g_work(row: Row) -> None:
    await register(row)


async def g_work_batched(row: Row) -> None:
    await register(row, batched=True)


async def g_snapshot(row: Row) -> None:
    answer = await admin(row).Snapshot(pb.Empty(), metadata=row.metadata)
    names = {p.name for p in answer.pools}
    if row.scope is not None:
        assert names == set(row.scope) and answer.totals.submitted == 0 and answer.live_tasks == 0
    else:
        assert names >= {"a", "b"} and answer.totals.submitted >= 2


async def g_workers(row: Row) -> None:
    answer = await admin(row).ListWorkers(pb.Empty(), metadata=row.metadata)
    assert all(row.visible(w.pool) for w in answer.workers)


async def g_list_recurring(row: Row) -> None:
    answer = await admin(row).ListRecurring(pb.Empty(), metadata=row.metadata)
    names = {s.name for s in answer.schedules}
    assert all(row.visible(s.pool) for s in answer.schedules)
    assert "rec-a" in names and ("rec-b" in names) == row.visible("b")


async def g_add_recurring(row: Row) -> None:
    name = row.unique("add")
    request = pb.RecurringRequest(name=name, cron=SCHEDULE, template=pb.TaskSpec(pool=row.pool))
    try:
        await admin(row).AddRecurring(request, metadata=row.metadata)
    except grpc.aio.AioRpcError:
        assert name not in row.world.schedules()
        raise
    assert name in row.world.schedules()
    http_json(row.world.server, "DELETE", f"/v1/recurring/{name}")


async def g_remove_recurring(row: Row) -> None:
    name = row.unique("remove")
    recurring = {"name": name, "cron": SCHEDULE, "template": {"pool": row.pool}}
    assert http_json(row.world.server, "POST", "/v1/recurring", recurring)[0] == 200
    try:
        answer = await admin(row).RemoveRecurring(pb.RemoveRecurringRequest(name=name), metadata=row.metadata)
        # Outside the scope the schedule is left alone and answered as if there were none.
        assert answer.removed == row.visible(row.pool)
        assert (name in row.world.schedules()) != answer.removed
    finally:
        http_json(row.world.server, "DELETE", f"/v1/recurring/{name}")


async def g_health(row: Row) -> None:
    stub = health_pb2_grpc.HealthStub(row.channel)
    answer = await stub.Check(health_pb2.HealthCheckRequest(service=""), metadata=row.metadata)
    assert answer.status == health_pb2.HealthCheckResponse.SERVING


GRPC_CALLS = [
    Call("Tasks.Submit", Role.CLIENT, DENIED, g_submit),
    Call("Tasks.SubmitBatch", Role.CLIENT, DENIED, g_batch),
    Call("Tasks.Get[id]", Role.CLIENT, NOT_FOUND, g_get("id")),
    Call("Tasks.Get[key]", Role.CLIENT, NOT_FOUND, g_get("key")),
    Call("Tasks.Cancel[id]", Role.CLIENT, NOT_FOUND, g_cancel("id")),
    Call("Tasks.Cancel[key]", Role.CLIENT, NOT_FOUND, g_cancel("key")),
    Call("Tasks.Wait[id]", Role.CLIENT, NOT_FOUND, g_wait("id")),
    Call("Tasks.Wait[key]", Role.CLIENT, NOT_FOUND, g_wait("key")),
    Call("Tasks.ListTasks[pool]", Role.CLIENT, DENIED, g_list),
    Call("Tasks.ListTasks", Role.CLIENT, FILTERED, g_list, (NO_POOL,)),
    Call("Tasks.Watch[pool]", Role.CLIENT, DENIED, g_watch),
    Call("Tasks.Watch", Role.CLIENT, FILTERED, g_watch, (NO_POOL,)),
    Call("Workers.Work", Role.WORKER, DENIED, g_work),
    Call("BatchedWorkers.Work", Role.WORKER, DENIED, g_work_batched),
    Call("Admin.Snapshot", Role.METRICS, FILTERED, g_snapshot, (NO_POOL,)),
    Call("Admin.ListWorkers", Role.METRICS, FILTERED, g_workers, (NO_POOL,)),
    Call("Admin.ListRecurring", Role.METRICS, FILTERED, g_list_recurring, (NO_POOL,)),
    Call("Admin.AddRecurring", Role.ADMIN, DENIED, g_add_recurring),
    Call("Admin.RemoveRecurring", Role.ADMIN, HIDDEN, g_remove_recurring),
    Call("grpc.health.v1.Health.Check", None, OK, g_health, (NO_POOL,)),
]


# HTTP -----------------------------------------------------------------------------------------


class HttpError(Exception):
    def __init__(self, status: int, body: Any) -> None:
        super().__init__(f"{status}: {body}")
        self.status = status
        self.body = body


async def request(row: Row, method: str, path: str, body: object = None, **params: str) -> Any:
    assert row.session is not None
    async with row.session.request(
        method, path, json=body, params=params or None, headers=row.headers
    ) as resp:
        text = await resp.text()
        if resp.status != 200:
            raise HttpError(resp.status, json.loads(text))
        return text if resp.content_type == "text/plain" else json.loads(text)


async def h_submit(row: Row) -> None:
    answer = await request(row, "POST", "/v1/tasks", {"pool": row.pool, "key": row.unique("submit")})
    assert answer["id"] and not answer["duplicate"]


async def h_batch(row: Row) -> None:
    first, second = row.unique("batch-1"), row.unique("batch-2")
    body = {"tasks": [{"pool": "a", "key": first}, {"pool": row.pool, "key": second}]}
    try:
        answer = await request(row, "POST", "/v1/tasks:batch", body)
    except HttpError:
        assert not row.world.exists(first) and not row.world.exists(second), "a refused batch inserted"
        raise
    assert len(answer["tasks"]) == 2


def h_get(by: str) -> Callable[[Row], Awaitable[None]]:
    async def run(row: Row) -> None:
        info = await request(row, "GET", f"/v1/tasks/{row.world.ref(row.pool, by)}")
        assert (info["pool"], info["key"]) == (row.pool, f"{row.pool}-done")

    return run


def h_cancel(by: str) -> Callable[[Row], Awaitable[None]]:
    async def run(row: Row) -> None:
        answer = await request(row, "POST", f"/v1/tasks/{row.world.ref(row.pool, by)}:cancel")
        assert answer == {"cancelled": False}

    return run


def h_result(by: str) -> Callable[[Row], Awaitable[None]]:
    async def run(row: Row) -> None:
        ref = row.world.ref(row.pool, by)
        result = await request(row, "GET", f"/v1/tasks/{ref}/result", timeout_s="0.05")
        assert (result["id"], result["status"]) == (str(row.world.done_ids[row.pool]), "cancelled")

    return run


async def h_list(row: Row) -> None:
    params = {} if row.pool == NO_POOL else {"pool": row.pool}
    answer = await request(row, "GET", "/v1/tasks", limit="1000", **params)
    seen = {t["pool"] for t in answer["tasks"]}
    if row.pool != NO_POOL:
        assert seen == {row.pool}
    elif row.scope is not None:
        assert seen == set(row.scope)
    else:
        assert seen >= {"a", "b"}


async def h_watch(row: Row) -> None:
    assert row.session is not None
    params = {} if row.pool == NO_POOL else {"pool": row.pool}
    async with row.session.get("/v1/watch", params=params, headers=row.headers) as resp:
        if resp.status != 200:
            raise HttpError(resp.status, await resp.json())
        assert resp.content_type == "text/event-stream"
        assert await asyncio.wait_for(resp.content.readline(), 5) == b": watching\n"


async def h_snapshot(row: Row) -> None:
    answer = await request(row, "GET", "/v1/snapshot")
    names = {p["name"] for p in answer["pools"]}
    if row.scope is not None:
        assert names == set(row.scope) and answer["totals"]["submitted"] == 0
    else:
        assert names >= {"a", "b"} and answer["totals"]["submitted"] >= 2


async def h_workers(row: Row) -> None:
    answer = await request(row, "GET", "/v1/workers")
    assert all(row.visible(w["pool"]) for w in answer["workers"])


async def h_list_recurring(row: Row) -> None:
    answer = await request(row, "GET", "/v1/recurring")
    names = {s["name"] for s in answer["schedules"]}
    assert all(row.visible(s["pool"]) for s in answer["schedules"])
    assert "rec-a" in names and ("rec-b" in names) == row.visible("b")


async def h_add_recurring(row: Row) -> None:
    name = row.unique("add")
    body = {"name": name, "cron": SCHEDULE, "template": {"pool": row.pool}}
    try:
        assert await request(row, "POST", "/v1/recurring", body) == {"name": name}
    except HttpError:
        assert name not in row.world.schedules()
        raise
    assert name in row.world.schedules()
    http_json(row.world.server, "DELETE", f"/v1/recurring/{name}")


async def h_remove_recurring(row: Row) -> None:
    name = row.unique("remove")
    recurring = {"name": name, "cron": SCHEDULE, "template": {"pool": row.pool}}
    assert http_json(row.world.server, "POST", "/v1/recurring", recurring)[0] == 200
    try:
        answer = await request(row, "DELETE", f"/v1/recurring/{name}")
        assert answer == {"removed": row.visible(row.pool)}
        assert (name in row.world.schedules()) != answer["removed"]
    finally:
        http_json(row.world.server, "DELETE", f"/v1/recurring/{name}")


async def h_metrics(row: Row) -> None:
    assert "# TYPE" in await request(row, "GET", "/metrics")


def h_public(path: str) -> Callable[[Row], Awaitable[None]]:
    async def run(row: Row) -> None:
        await request(row, "GET", path)

    return run


HTTP_CALLS = [
    Call("POST /v1/tasks", Role.CLIENT, DENIED, h_submit),
    Call("POST /v1/tasks:batch", Role.CLIENT, DENIED, h_batch),
    Call("GET /v1/tasks/{id}", Role.CLIENT, NOT_FOUND, h_get("id")),
    Call("GET /v1/tasks/{key}", Role.CLIENT, NOT_FOUND, h_get("key")),
    Call("POST /v1/tasks/{id}:cancel", Role.CLIENT, NOT_FOUND, h_cancel("id")),
    Call("POST /v1/tasks/{key}:cancel", Role.CLIENT, NOT_FOUND, h_cancel("key")),
    Call("GET /v1/tasks/{id}/result", Role.CLIENT, NOT_FOUND, h_result("id")),
    Call("GET /v1/tasks/{key}/result", Role.CLIENT, NOT_FOUND, h_result("key")),
    Call("GET /v1/tasks?pool", Role.CLIENT, DENIED, h_list),
    Call("GET /v1/tasks", Role.CLIENT, FILTERED, h_list, (NO_POOL,)),
    Call("GET /v1/watch?pool", Role.CLIENT, DENIED, h_watch),
    Call("GET /v1/watch", Role.CLIENT, FILTERED, h_watch, (NO_POOL,)),
    Call("GET /v1/snapshot", Role.METRICS, FILTERED, h_snapshot, (NO_POOL,)),
    Call("GET /v1/workers", Role.METRICS, FILTERED, h_workers, (NO_POOL,)),
    Call("GET /v1/recurring", Role.METRICS, FILTERED, h_list_recurring, (NO_POOL,)),
    Call("POST /v1/recurring", Role.ADMIN, DENIED, h_add_recurring),
    Call("DELETE /v1/recurring/{name}", Role.ADMIN, HIDDEN, h_remove_recurring),
    Call("GET /metrics", Role.METRICS, DENIED, h_metrics, (NO_POOL,)),
    Call("GET /healthz", None, OK, h_public("/healthz"), (NO_POOL,)),
    Call("GET /readyz", None, OK, h_public("/readyz"), (NO_POOL,)),
    Call("GET /v1/openapi.json", None, OK, h_public("/v1/openapi.json"), (NO_POOL,)),
]

HTTP_STATUS = {OK: 200, UNAUTHENTICATED: 401, DENIED: 403, NOT_FOUND: 404}


# ------------------------------------------------------------------------------- the matrix


def rows(calls: list[Call]) -> list[Any]:
    return [
        pytest.param(call, caller, pool, id=f"{call.name}-{caller}-{pool}")
        for call in calls
        for caller in CALLERS
        for pool in call.targets
    ]


def answered(outcome: str) -> str:
    """What the transport reports: HIDDEN and FILTERED are ordinary answers (checked by the call)."""
    return OK if outcome in (HIDDEN, FILTERED) else outcome


@pytest.mark.parametrize(("call", "caller", "pool"), rows(GRPC_CALLS))
async def test_grpc(world: World, call: Call, caller: str, pool: str) -> None:
    want = answered(expected(call, caller, pool))
    async with grpc.aio.insecure_channel(world.server.target) as channel:
        row = Row(world, caller, pool, channel=channel)
        try:
            await call.run(row)
            got = OK
        except grpc.aio.AioRpcError as err:
            got = err.code().name.lower()
            assert got == want, f"{call.name} as {caller} on {pool}: {got} ({err.details()}), want {want}"
    assert got == want, f"{call.name} as {caller} on {pool}: allowed, want {want}"


@pytest.mark.parametrize(("call", "caller", "pool"), rows(HTTP_CALLS))
async def test_http(world: World, call: Call, caller: str, pool: str) -> None:
    want = answered(expected(call, caller, pool))
    async with aiohttp.ClientSession(base_url=world.server.http) as session:
        row = Row(world, caller, pool, session=session)
        try:
            await call.run(row)
            got = OK
        except HttpError as err:
            assert err.status == HTTP_STATUS[want], f"{call.name} as {caller} on {pool}: {err}, want {want}"
            got = err.body["code"]
    assert got == want, f"{call.name} as {caller} on {pool}: {got}, want {want}"


def test_the_tables_cover_every_rpc_and_route() -> None:
    rpcs = {
        f"{service.name}.{method.name}"
        for service in pb.DESCRIPTOR.services_by_name.values()
        for method in service.methods
    }
    named = {call.name.partition("[")[0] for call in GRPC_CALLS}
    assert rpcs | {"grpc.health.v1.Health.Check"} == named
    routes = {(method.upper(), path) for path, methods in OPENAPI["paths"].items() for method in methods}
    gateway = _Gateway(None, max_body_bytes=0, metrics=Exposition(list, store="memory"), sse_keepalive_s=1)  # type: ignore[arg-type]
    routes |= {(method, path) for method, path, _, _ in gateway.routes()}
    tested = set()
    for call in HTTP_CALLS:
        method, _, path = call.name.partition(" ")
        path = path.partition("?")[0].replace("{id}", "{ref}").replace("{key}", "{ref}")
        tested.add((method, path))
    assert routes == tested
    # And each authenticated route needs the role the table says.
    roles = {(m, p): role for m, p, role, _ in gateway.routes()}
    for call in HTTP_CALLS:
        method, _, path = call.name.partition(" ")
        key = (method, path.partition("?")[0].replace("{id}", "{ref}").replace("{key}", "{ref}"))
        assert roles.get(key) == call.role, call.name


# ------------------------------------------------------------------- rules beyond the matrix


async def test_worker_labels_are_limited_by_the_credential(world: World) -> None:
    async with grpc.aio.insecure_channel(world.server.target) as channel:
        row = Row(world, "worker_labels", "a", channel=channel)
        assert (await register(row, {"zone": "eu"})).slots == 1
        assert (await register(row, {"zone": "eu", "gpu": "1"})).slots == 1
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await register(row, {"zone": "us", "gpu": "1", "arch": "arm"})
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "arch=arm, zone=us" in (err.value.details() or "")
        # An unrestricted worker credential may claim any label.
        assert (await register(Row(world, "worker", "a", channel=channel), {"arch": "arm"})).slots == 1


async def test_a_credentials_tenant_is_forced_on_its_tasks(world: World) -> None:
    token = CREDS["client_tenant"].token
    md = (("authorization", f"Bearer {token}"),)
    async with grpc.aio.insecure_channel(world.server.target) as channel:
        stub = pbg.TasksStub(channel)
        for given in ("", "acme"):
            key = f"tenant-{given or 'none'}"
            await stub.Submit(
                pb.SubmitRequest(task=pb.TaskSpec(pool="a", key=key, tenant=given)), metadata=md
            )
            info = await stub.Get(pb.GetRequest(task=pb.TaskRef(key=key)), metadata=md)
            assert info.tenant == "acme"
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Submit(pb.SubmitRequest(task=pb.TaskSpec(pool="a", tenant="other")), metadata=md)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "tenant" in (err.value.details() or "")
    async with aiohttp.ClientSession(base_url=world.server.http) as session:
        row = Row(world, "client_tenant", "a", session=session)
        answer = await request(row, "POST", "/v1/tasks", {"pool": "b", "key": "tenant-http"})
        assert (await request(row, "GET", f"/v1/tasks/{answer['id']}"))["tenant"] == "acme"
        with pytest.raises(HttpError) as refused:
            await request(row, "POST", "/v1/tasks:batch", {"tasks": [{"pool": "b", "tenant": "other"}]})
        assert refused.value.status == 403


async def test_out_of_scope_tasks_look_like_missing_ones(world: World) -> None:
    """A scoped credential cannot tell a task of another pool from no task: same code, same words."""
    async with aiohttp.ClientSession(base_url=world.server.http) as session:
        row = Row(world, "client_a", "b", session=session)
        for hidden, missing in ((world.ref("b", "id"), "123456789"), ("b-done", "no-such-key")):
            for suffix in ("", "/result", ":cancel"):
                method = "POST" if suffix == ":cancel" else "GET"
                answers = []
                for ref in (hidden, missing):
                    with pytest.raises(HttpError) as err:
                        await request(row, method, f"/v1/tasks/{ref}{suffix}")
                    answers.append((err.value.status, err.value.body["error"].replace(ref, "<ref>")))
                assert answers[0] == answers[1] and answers[0][0] == 404, answers


async def test_scoped_keys_and_dependencies_stay_within_scope(world: World) -> None:
    md_a = (("authorization", f"Bearer {CREDS['client_a'].token}"),)
    md = (("authorization", f"Bearer {CREDS['client'].token}"),)
    b_id = world.done_ids["b"]
    async with grpc.aio.insecure_channel(world.server.target) as channel:
        stub = pbg.TasksStub(channel)
        # An unscoped caller gets the existing task of that key (idempotent submit) ...
        answer = await stub.Submit(pb.SubmitRequest(task=pb.TaskSpec(pool="a", key="b-done")), metadata=md)
        assert (answer.id, answer.duplicate) == (b_id, True)
        # ... a caller scoped to pool a is refused, without learning the task's id.
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.Submit(pb.SubmitRequest(task=pb.TaskSpec(pool="a", key="b-done")), metadata=md_a)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
        assert "task.key" in (err.value.details() or "") and str(b_id) not in (err.value.details() or "")
        # A dependency on a task outside the scope is an unknown dependency, by key and by id.
        for dep, where in (
            (pb.Dep(target=pb.TaskRef(key="b-done")), "deps[0].key"),
            (pb.Dep(target=pb.TaskRef(id=b_id)), "deps[0].id"),
        ):
            spec = pb.TaskSpec(pool="a", key=f"dep-{where}", deps=[dep])
            with pytest.raises(grpc.aio.AioRpcError) as err:
                await stub.SubmitBatch(pb.SubmitBatchRequest(tasks=[spec]), metadata=md_a)
            assert err.value.code() == grpc.StatusCode.NOT_FOUND
            assert f"tasks[0].{where}: unknown dependency" in (err.value.details() or "")
            assert not world.exists(f"dep-{where}")
        # In scope the same dependency is fine.
        spec = pb.TaskSpec(pool="a", deps=[pb.Dep(target=pb.TaskRef(key="a-done"))])
        await stub.Submit(pb.SubmitRequest(task=spec), metadata=md_a)


async def test_a_scoped_admin_cannot_replace_another_pools_schedule(world: World) -> None:
    md = (("authorization", f"Bearer {CREDS['admin_a'].token}"),)
    async with grpc.aio.insecure_channel(world.server.target) as channel:
        stub = pbg.AdminStub(channel)
        request = pb.RecurringRequest(name="rec-b", cron="0 0 2 1 *", template=pb.TaskSpec(pool="a"))
        with pytest.raises(grpc.aio.AioRpcError) as err:
            await stub.AddRecurring(request, metadata=md)
        assert err.value.code() == grpc.StatusCode.PERMISSION_DENIED
    _, answer = http_json(world.server, "GET", "/v1/recurring")
    [rec_b] = [s for s in answer["schedules"] if s["name"] == "rec-b"]
    assert (rec_b["pool"], rec_b["cron"]) == ("b", SCHEDULE)


async def test_scoped_watch_and_views_see_only_their_pools(world: World) -> None:
    """A Watch without a pool filter by a pool-a credential carries pool a's events only; ListWorkers
    and Snapshot by a pool-a metrics credential show pool a's workers only."""
    md_a = (("authorization", f"Bearer {CREDS['client_a'].token}"),)
    async with grpc.aio.insecure_channel(world.server.target) as channel:
        watch = pbg.TasksStub(channel).Watch(pb.WatchRequest(all_transitions=True), metadata=md_a)
        events: asyncio.Queue[pb.StatusEvent] = asyncio.Queue()

        async def read() -> None:
            while (event := await watch.read()) is not grpc.aio.EOF:
                events.put_nowait(event)

        reader = asyncio.create_task(read())
        try:
            # Subscribed once a pool-a event arrives (a gRPC Watch sends nothing before its first event):
            # only then can a missing pool-b event mean it was filtered out.
            for _ in range(20):
                http_json(world.server, "POST", "/v1/tasks", {"pool": "a"})
                with contextlib.suppress(TimeoutError):
                    first = await asyncio.wait_for(events.get(), 0.5)
                    assert first.pool == "a", first
                    break
            else:
                pytest.fail("the Watch saw no event of pool a within 10 s")
            for pool in ("b", "a"):
                assert (
                    http_json(world.server, "POST", "/v1/tasks", {"pool": pool, "key": f"watched-{pool}"})[0]
                    == 200
                )
            seen: list[pb.StatusEvent] = []
            while not seen or seen[-1].key != "watched-a":
                seen.append(await asyncio.wait_for(events.get(), 5))
            seen += [events.get_nowait() for _ in range(events.qsize())]
            assert {e.pool for e in seen} == {"a"}, seen
        finally:
            watch.cancel()
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)

        rows = [Row(world, "worker", pool, channel=channel) for pool in ("a", "b")]
        calls = [pbg.WorkersStub(channel).Work(metadata=r.metadata) for r in rows]
        try:
            for call, r in zip(calls, rows, strict=True):
                await call.write(
                    pb.WorkerMessage(register=pb.Register(pool=r.pool, slots=1, protocol_version=3))
                )
                assert (await call.read()).WhichOneof("msg") == "registered"
            admin_stub = pbg.AdminStub(channel)
            md_metrics_a = (("authorization", f"Bearer {CREDS['metrics_a'].token}"),)
            md_metrics = (("authorization", f"Bearer {CREDS['metrics'].token}"),)
            workers = await admin_stub.ListWorkers(pb.Empty(), metadata=md_metrics)
            assert {w.pool for w in workers.workers} >= {"a", "b"}
            workers = await admin_stub.ListWorkers(pb.Empty(), metadata=md_metrics_a)
            assert {w.pool for w in workers.workers} == {"a"}
            snapshot = await admin_stub.Snapshot(pb.Empty(), metadata=md_metrics_a)
            [pool_a] = snapshot.pools
            assert snapshot.workers_connected == pool_a.workers_connected >= 1
        finally:
            for call in calls:
                call.cancel()


def test_no_token_appears_in_the_server_log(world: World) -> None:
    """Runs last in this module: the log of the whole matrix (at debug level) names no token."""
    logs = world.server.logs()
    assert "worker_stream_refused" in logs or "worker_registered" in logs  # the log was captured
    for secret in [WRONG_TOKEN, *(cred.token for cred in CREDS.values())]:
        assert secret not in logs
        assert secret[: len(secret) // 2] not in logs
