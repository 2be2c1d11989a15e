"""Client against a scripted Tasks + Admin service: requests built, responses converted, errors mapped."""

from __future__ import annotations

import asyncio
import gc
import socket
from collections.abc import Awaitable, Callable
from typing import Any

import grpc
import pytest

from cronoq import errors
from cronoq.client import Client, ClientError, Event, task
from cronoq.client._connect import CHANNEL_DEFAULTS
from cronoq.transport import NOT_RECEIVED_KEY, ChannelOptions, Endpoint, open_channel
from cronoq.v1 import cronoq_pb2 as pb

from .scripted import TIMEOUT, ApiServer, Refusal, serve

NS = 1_000_000_000

# The grpc-timeout header carries at most 8 digits, so a deadline can arrive rounded up slightly.
GRPC_TIMEOUT_ROUNDING = 0.05


@pytest.fixture
async def client(api: ApiServer) -> Any:
    async with Client(f"http://{api.target}", token="producer-token") as client:
        yield client


async def test_submit_builds_the_request_and_sends_the_token(api: ApiServer, client: Client) -> None:
    api.responses["Submit"] = pb.SubmitResponse(id=11, duplicate=True)

    submitted = await client.submit({"image": "s3://x"}, pool="gpu", priority="high", key="k", timeout=120)

    call = api.last("Submit")
    assert call.metadata["authorization"] == "Bearer producer-token"
    spec = call.request.task
    assert (spec.payload, spec.content_type) == (b'{"image":"s3://x"}', "application/json")
    assert (spec.pool, spec.priority, spec.key, spec.timeout_s) == ("gpu", pb.PRIORITY_HIGH, "k", 120.0)
    assert not call.request.wait and not call.request.HasField("wait_timeout_s")
    assert call.time_remaining is None  # no deadline unless asked
    assert (submitted.id, submitted.duplicate, submitted.result) == (11, True, None)


async def test_submit_and_wait_returns_the_result(api: ApiServer, client: Client) -> None:
    result = pb.TaskResult(id=5, status=pb.TASK_STATUS_SUCCEEDED, output=b'{"ok":1}', output_available=True)
    api.responses["Submit"] = pb.SubmitResponse(id=5, result=result)

    submitted = await client.submit(b"raw", wait=True, wait_timeout=0.5)

    call = api.last("Submit")
    assert call.request.wait and call.request.wait_timeout_s == 0.5
    # wait_timeout + 5 s; the grpc-timeout header may round the deadline up by a few milliseconds.
    assert call.time_remaining is not None and 5.0 < call.time_remaining <= 5.5 + GRPC_TIMEOUT_ROUNDING
    assert submitted.result is not None
    assert (
        submitted.result.ok and submitted.result.json() == {"ok": 1} and submitted.result.text() == '{"ok":1}'
    )
    assert (submitted.result.status, submitted.result.output_available) == ("succeeded", True)


async def test_submit_accepts_a_prebuilt_spec(api: ApiServer, client: Client) -> None:
    api.responses["Submit"] = pb.SubmitResponse(id=1)
    await client.submit(task("x", pool="p"))
    assert api.last("Submit").request.task.pool == "p"
    with pytest.raises(ValueError, match="prebuilt"):
        await client.submit(task("x"), pool="p")


@pytest.mark.parametrize(
    "kwargs",
    [
        {"wait_timeout": 1.0},  # without wait=True
        {"wait": True, "wait_timeout": -1.0},
        {"call_timeout": float("nan")},
        {"priority": "urgent"},
        {"deadline_in": 1.0, "deadline_at": 2.0},
    ],
)
async def test_submit_rejects_bad_arguments_before_calling(
    api: ApiServer, client: Client, kwargs: Any
) -> None:
    with pytest.raises(ValueError):
        await client.submit("x", **kwargs)
    assert api.calls == []


async def test_submit_call_timeout_raises_timeout_error(api: ApiServer, client: Client) -> None:
    async def slow(request: Any) -> Any:
        await asyncio.sleep(10)

    api.responses["Submit"] = slow
    with pytest.raises(TimeoutError):
        await client.submit("x", call_timeout=0.05)


async def test_submit_batch_keeps_input_order(api: ApiServer, client: Client) -> None:
    api.responses["SubmitBatch"] = pb.SubmitBatchResponse(
        tasks=[pb.SubmitResponse(id=1), pb.SubmitResponse(id=2, duplicate=True)]
    )
    out = await client.submit_batch([task("a", key="a"), task("b", after="a")])
    request = api.last("SubmitBatch").request
    assert [t.key for t in request.tasks] == ["a", ""]
    assert request.tasks[1].deps[0].target.key == "a"
    assert [(s.id, s.duplicate) for s in out] == [(1, False), (2, True)]


async def test_get_by_id_or_key_converts_task_info(api: ApiServer, client: Client) -> None:
    api.responses["Get"] = pb.TaskInfo(
        id=3,
        status=pb.TASK_STATUS_DEAD_LETTERED,
        pool="gpu",
        key="",
        kind="resize",
        attempt=3,
        max_attempts=3,
        created_unix_ns=10 * NS,
        started_unix_ns=11 * NS + NS // 2,
        message="Boom: x",
        tenant="acme",
        priority=pb.PRIORITY_LOW,
    )

    info = await client.get(3)
    assert api.last("Get").request.task.id == 3
    await client.get("nightly")
    assert api.last("Get").request.task.key == "nightly"

    assert (info.id, info.status, info.done, info.pool, info.key, info.kind) == (
        3, "dead_lettered", True, "gpu", None, "resize",
    )  # fmt: skip
    assert (info.attempt, info.max_attempts, info.message, info.tenant, info.priority) == (
        3, 3, "Boom: x", "acme", "low",
    )  # fmt: skip
    assert (info.created_at, info.started_at, info.finished_at) == (10.0, 11.5, None)


async def test_a_bool_is_not_a_task_reference(client: Client) -> None:
    with pytest.raises(TypeError):
        await client.get(True)


async def test_cancel_returns_whether_the_task_was_live(api: ApiServer, client: Client) -> None:
    api.responses["Cancel"] = pb.CancelResponse(cancelled=True)
    assert await client.cancel("k") is True
    api.responses["Cancel"] = pb.CancelResponse(cancelled=False)
    assert await client.cancel(9) is False
    assert api.last("Cancel").request.task.id == 9


async def test_wait_sends_the_timeout_and_a_deadline_five_seconds_later(
    api: ApiServer, client: Client
) -> None:
    api.responses["Wait"] = pb.TaskResult(id=4, status=pb.TASK_STATUS_FAILED, message="bad input")

    result = await client.wait(4, timeout=1.0)
    call = api.last("Wait")
    assert call.request.timeout_s == 1.0
    assert call.time_remaining is not None and 5.5 < call.time_remaining <= 6.0 + GRPC_TIMEOUT_ROUNDING
    assert (result.ok, result.status, result.message, result.output, result.json(), result.text()) == (
        False, "failed", "bad input", None, None, "",
    )  # fmt: skip

    await client.wait(4)
    assert not api.last("Wait").request.HasField("timeout_s")
    assert api.last("Wait").time_remaining is None


async def test_deadline_exceeded_from_the_server_is_a_timeout_for_waits_only(
    api: ApiServer, client: Client
) -> None:
    limit = Refusal(grpc.StatusCode.DEADLINE_EXCEEDED, "max_wait_s reached")
    api.responses.update(Wait=limit, Submit=limit, Get=limit)
    with pytest.raises(TimeoutError, match="max_wait_s"):
        await client.wait(1)
    with pytest.raises(TimeoutError):
        await client.submit("x", wait=True)
    with pytest.raises(errors.DeadlineExceeded):
        await client.get(1)


STATUSES = [  # CANCELLED has its own test below
    (grpc.StatusCode.UNKNOWN, errors.Unknown, False),
    (grpc.StatusCode.INVALID_ARGUMENT, errors.InvalidArgument, False),
    (grpc.StatusCode.DEADLINE_EXCEEDED, errors.DeadlineExceeded, False),
    (grpc.StatusCode.NOT_FOUND, errors.NotFound, False),
    (grpc.StatusCode.ALREADY_EXISTS, errors.AlreadyExists, False),
    (grpc.StatusCode.PERMISSION_DENIED, errors.PermissionDenied, False),
    (grpc.StatusCode.RESOURCE_EXHAUSTED, errors.ResourceExhausted, True),
    (grpc.StatusCode.FAILED_PRECONDITION, errors.FailedPrecondition, False),
    (grpc.StatusCode.ABORTED, errors.Aborted, False),
    (grpc.StatusCode.OUT_OF_RANGE, errors.OutOfRange, False),
    (grpc.StatusCode.UNIMPLEMENTED, errors.Unimplemented, False),
    (grpc.StatusCode.INTERNAL, errors.Internal, False),
    (grpc.StatusCode.UNAVAILABLE, errors.Unavailable, True),
    (grpc.StatusCode.DATA_LOSS, errors.DataLoss, False),
    (grpc.StatusCode.UNAUTHENTICATED, errors.Unauthenticated, False),
]


@pytest.mark.parametrize(("code", "error", "retryable"), STATUSES, ids=[s[0].name for s in STATUSES])
async def test_every_status_maps_to_its_error_class(
    api: ApiServer, client: Client, code: grpc.StatusCode, error: type[ClientError], retryable: bool
) -> None:
    api.responses["Get"] = Refusal(code, "task.pool: unknown pool 'x'")
    with pytest.raises(ClientError) as raised:
        await client.get(1)
    assert type(raised.value) is error
    assert raised.value.code == code.name.lower()
    assert raised.value.retryable is retryable
    assert raised.value.message == "task.pool: unknown pool 'x'"


@pytest.mark.parametrize(
    "method",
    ["Submit", "SubmitBatch", "Get", "Cancel", "Wait", "ListTasks", "Snapshot", "ListWorkers", "AddRecurring",
     "RemoveRecurring", "ListRecurring"],
)  # fmt: skip
async def test_every_method_raises_api_errors(api: ApiServer, client: Client, method: str) -> None:
    api.responses[method] = Refusal(grpc.StatusCode.PERMISSION_DENIED, "needs an admin token")
    calls: dict[str, Callable[[], Awaitable[object]]] = {
        "Submit": lambda: client.submit("x"),
        "SubmitBatch": lambda: client.submit_batch([task()]),
        "Get": lambda: client.get(1),
        "Cancel": lambda: client.cancel(1),
        "Wait": lambda: client.wait(1),
        "ListTasks": lambda: client.list_tasks(),
        "Snapshot": lambda: client.snapshot(),
        "ListWorkers": lambda: client.list_workers(),
        "AddRecurring": lambda: client.add_recurring("n", "* * * * *"),
        "RemoveRecurring": lambda: client.remove_recurring("n"),
        "ListRecurring": lambda: client.list_recurring(),
    }
    with pytest.raises(errors.PermissionDenied, match="admin token"):
        await calls[method]()


async def test_an_unreachable_server_is_unavailable_and_the_call_never_received() -> None:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    async with Client(f"127.0.0.1:{port}") as client:
        with pytest.raises(errors.Unavailable) as raised:
            await client.submit("x")
    assert raised.value.retryable
    assert raised.value.metadata == ((NOT_RECEIVED_KEY, "1"),)  # safe to send again, keyless or not


async def test_a_call_cancelled_by_the_servers_grpc_is_unavailable_and_never_received(
    api: ApiServer, client: Client
) -> None:
    """gRPC core cancels the calls it had not yet handed to the server when its listener closes; a
    cronoq server never ends a call CANCELLED itself."""
    api.responses["Submit"] = Refusal(grpc.StatusCode.CANCELLED, "CANCELLED")
    with pytest.raises(errors.Unavailable, match=r"gRPC: CANCELLED\); nothing of it ran") as raised:
        await client.submit("x")
    assert raised.value.retryable
    assert raised.value.metadata == ((NOT_RECEIVED_KEY, "1"),)


async def test_a_refusal_marked_never_received_is_marked_once(api: ApiServer, client: Client) -> None:
    marked = ((NOT_RECEIVED_KEY, "1"),)
    api.responses["Submit"] = Refusal(grpc.StatusCode.UNAVAILABLE, "this server is a standby", marked)
    with pytest.raises(errors.Unavailable) as raised:
        await client.submit("x")
    assert raised.value.metadata == marked
    api.responses["Submit"] = Refusal(grpc.StatusCode.UNAVAILABLE, "server is shutting down")
    with pytest.raises(errors.Unavailable) as raised:
        await client.submit("x", wait=True)
    assert raised.value.metadata == ()  # a committed Submit(wait) hears this too


async def test_list_tasks_filters_and_pages(api: ApiServer, client: Client) -> None:
    api.responses["ListTasks"] = pb.ListTasksResponse(
        tasks=[pb.TaskInfo(id=8, status=pb.TASK_STATUS_RUNNING)], next_after=8, unavailable_shards=["b"]
    )
    page = await client.list_tasks(pools="gpu", statuses=["running", "READY"], after=3, limit=50)
    request = api.last("ListTasks").request
    assert list(request.pools) == ["gpu"]
    assert list(request.statuses) == [pb.TASK_STATUS_RUNNING, pb.TASK_STATUS_READY]
    assert (request.after, request.limit) == (3, 50)
    assert [(t.id, t.status, t.done) for t in page.tasks] == [(8, "running", False)]
    assert (page.next_after, page.unavailable_shards) == (8, ["b"])
    with pytest.raises(ValueError, match="status must be one of"):
        await client.list_tasks(statuses=["finished"])


async def test_iter_tasks_follows_next_after_to_the_last_page(api: ApiServer, client: Client) -> None:
    def page(request: Any) -> Any:
        ids = [i for i in range(1, 6) if i > request.after][: request.limit]
        return pb.ListTasksResponse(
            tasks=[pb.TaskInfo(id=i, status=pb.TASK_STATUS_SUCCEEDED) for i in ids],
            next_after=ids[-1] if ids[-1] < 5 else 0,
        )

    api.responses["ListTasks"] = page
    ids = [info.id async for info in client.iter_tasks(pools=["p"], statuses=["succeeded"], page_size=2)]
    assert ids == [1, 2, 3, 4, 5]
    assert [c.request.after for c in api.calls] == [0, 2, 4]


async def test_watch_streams_events_then_raises_the_end_status(api: ApiServer, client: Client) -> None:
    api.events = [
        pb.StatusEvent(
            id=1, pool="p", key="k", status=pb.TASK_STATUS_SUCCEEDED, attempt=1, at_unix_ns=2 * NS
        ),
        pb.StatusEvent(id=2, pool="p", status=pb.TASK_STATUS_FAILED, attempt=3, message="bad"),
    ]
    api.watch_end = Refusal(grpc.StatusCode.DATA_LOSS, "consumer fell behind")
    seen: list[Event] = []
    with pytest.raises(errors.DataLoss, match="fell behind"):
        async for event in client.watch("p", ids=[1, 2], keys=["k"], all_transitions=True):
            seen.append(event)

    request = api.last("Watch").request
    assert (list(request.pools), list(request.ids), list(request.keys)) == (["p"], [1, 2], ["k"])
    assert request.all_transitions
    assert seen == [
        Event(id=1, pool="p", key="k", status="succeeded", attempt=1, at=2.0, message=""),
        Event(id=2, pool="p", key=None, status="failed", attempt=3, at=0.0, message="bad"),
    ]


async def test_watch_ends_when_the_stream_ends(api: ApiServer, client: Client) -> None:
    api.events = [pb.StatusEvent(id=1, status=pb.TASK_STATUS_CANCELLED)]
    assert [e.status async for e in client.watch()] == ["cancelled"]
    assert not api.last("Watch").request.all_transitions


async def test_a_watch_names_the_shards_it_could_not_reach(api: ApiServer, client: Client) -> None:
    api.watch_metadata = (("cronoq-unavailable-shards", "b,c"),)
    api.events = [pb.StatusEvent(id=1, status=pb.TASK_STATUS_SUCCEEDED)]
    events = client.watch()
    assert await events.unavailable_shards() == ["b", "c"]
    assert [e.id async for e in events] == [1]


async def test_a_watch_of_every_shard_names_none_and_can_be_closed_early(
    api: ApiServer, client: Client
) -> None:
    api.watch_metadata = (("cronoq-unavailable-shards", ""),)
    api.events = [pb.StatusEvent(id=n, status=pb.TASK_STATUS_SUCCEEDED) for n in (1, 2)]
    events = client.watch()
    assert await events.unavailable_shards() == []
    assert (await anext(events)).id == 1
    await events.aclose()
    assert [e.id async for e in events] == []


async def test_the_client_channel_pings_while_a_call_is_open_unless_options_say_otherwise(
    api: ApiServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A Wait or Watch on a server that froze must fail rather than hang: the producer's channel gets
    the same keepalive defaults as a worker's, each replaced by a same-named option."""
    opened: list[dict[str, object]] = []

    def spy(endpoint: Endpoint, credentials: object, options: ChannelOptions) -> object:
        opened.append(dict(options))
        return open_channel(endpoint, credentials, options)

    monkeypatch.setattr("cronoq.client._client.open_channel", spy)
    api.responses["Snapshot"] = pb.SnapshotResponse()
    for options in (None, [("grpc.keepalive_time_ms", 60_000)]):
        async with Client(api.target, options=options) as client:
            await client.snapshot()
    assert opened == [dict(CHANNEL_DEFAULTS), dict(CHANNEL_DEFAULTS) | {"grpc.keepalive_time_ms": 60_000}]
    assert opened[0]["grpc.keepalive_time_ms"] == 20_000


async def test_snapshot_converts_pools_groups_and_totals(api: ApiServer, client: Client) -> None:
    api.responses["Snapshot"] = pb.SnapshotResponse(
        pools=[
            pb.PoolSnapshot(
                name="gpu",
                capacity=4,
                busy=3,
                desired=6,
                pending_by_class=[1, 2, 3, 4],
                utilization=0.5,
                wait_p99_s=1.5,
                workers_connected=2,
                groups=[pb.WorkerGroup(labels={"gpu": "a100"}, capacity=2, busy=1)],
            )
        ],
        live_tasks=13,
        running=3,
        pending=10,
        totals=pb.Totals(submitted=20, succeeded=7, lease_expiries=1),
        workers_connected=2,
        unavailable_shards=["c"],
    )
    snap = await client.snapshot()
    gpu = snap.pool("gpu")
    assert gpu.pending_by_class == {"critical": 1, "high": 2, "normal": 3, "low": 4}
    assert gpu.pending == 10
    assert (gpu.capacity, gpu.busy, gpu.desired, gpu.utilization, gpu.wait_p99) == (4, 3, 6, 0.5, 1.5)
    assert [(g.labels, g.capacity, g.busy) for g in gpu.groups] == [({"gpu": "a100"}, 2, 1)]
    assert (snap.live_tasks, snap.running, snap.pending, snap.workers_connected) == (13, 3, 10, 2)
    assert (snap.totals.submitted, snap.totals.succeeded, snap.totals.lease_expiries) == (20, 7, 1)
    assert snap.unavailable_shards == ["c"]
    with pytest.raises(KeyError):
        snap.pool("cpu")


async def test_list_workers(api: ApiServer, client: Client) -> None:
    api.responses["ListWorkers"] = pb.ListWorkersResponse(
        workers=[
            pb.WorkerInfo(
                id=1, name="w1", pool="gpu", labels={"a": "b"}, slots=2, busy=1, connected_unix_ns=NS
            )
        ]
    )
    [worker] = await client.list_workers()
    assert (worker.id, worker.name, worker.pool, worker.labels) == (1, "w1", "gpu", {"a": "b"})
    assert (worker.slots, worker.busy, worker.connected_at) == (2, 1, 1.0)


async def test_recurring_schedules(api: ApiServer, client: Client) -> None:
    api.responses.update(
        AddRecurring=pb.Empty(),
        RemoveRecurring=pb.RemoveRecurringResponse(removed=True),
        ListRecurring=pb.ListRecurringResponse(
            schedules=[
                pb.RecurringInfo(
                    name="n", cron="0 * * * *", tz="UTC", pool="p", kind="k", next_unix_ns=60 * NS
                ),
                pb.RecurringInfo(name="m", overlap=pb.OVERLAP_QUEUE, last_task_id=4),
            ]
        ),
    )

    await client.add_recurring("n", "0 * * * *", {"report": 1}, tz="Europe/Paris", overlap="queue", pool="p")
    request = api.last("AddRecurring").request
    assert (request.name, request.cron, request.tz, request.overlap) == (
        "n", "0 * * * *", "Europe/Paris", pb.OVERLAP_QUEUE,
    )  # fmt: skip
    assert (request.template.payload, request.template.pool) == (b'{"report":1}', "p")

    await client.add_recurring("n", "* * * * *", task("x", kind="k"))
    request = api.last("AddRecurring").request
    assert (request.tz, request.overlap, request.template.kind) == ("", pb.OVERLAP_SKIP, "k")

    with pytest.raises(ValueError, match="prebuilt"):
        await client.add_recurring("n", "* * * * *", task("x"), pool="p")
    with pytest.raises(ValueError, match="overlap"):
        await client.add_recurring("n", "* * * * *", overlap="sometimes")

    assert await client.remove_recurring("n") is True
    assert api.last("RemoveRecurring").request.name == "n"
    first, second = await client.list_recurring()
    assert (first.name, first.cron, first.tz, first.overlap, first.next_at, first.last_task_id) == (
        "n", "0 * * * *", "UTC", "skip", 60.0, None,
    )  # fmt: skip
    assert (second.overlap, second.next_at, second.last_task_id) == ("queue", None, 4)


@pytest.mark.parametrize("prefix", ["", "http://", "grpc://"])
async def test_plain_target_spellings(api: ApiServer, prefix: str) -> None:
    api.responses["Cancel"] = pb.CancelResponse(cancelled=True)
    async with Client(prefix + api.target) as client:
        assert await client.cancel(1)
    assert "authorization" not in api.last("Cancel").metadata


def test_the_channel_is_reopened_on_another_event_loop() -> None:
    """A Client made once and used from two ``asyncio.run`` calls (two loops) keeps working."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    client = Client(f"127.0.0.1:{port}")

    async def cancel_once() -> bool:
        api = ApiServer(responses={"Cancel": pb.CancelResponse(cancelled=True)})
        async with serve(api, port=port):
            return await client.cancel(1)

    assert asyncio.run(cancel_once())
    assert asyncio.run(cancel_once())


# ------------------------------------------------------------------------------ message sizes


async def test_an_answer_over_grpcs_default_receive_limit_is_read(api: ApiServer, client: Client) -> None:
    """A server sends up to its max_message_bytes, which can be above grpc's 4 MiB default."""
    output = b"o" * (5 * 1024 * 1024)
    api.responses["Wait"] = pb.TaskResult(id=1, status=pb.TASK_STATUS_SUCCEEDED, output=output)
    assert (await client.wait(1)).output == output


async def test_a_message_over_a_size_limit_is_not_retryable(api: ApiServer) -> None:
    api.responses["Wait"] = pb.TaskResult(id=1, status=pb.TASK_STATUS_SUCCEEDED, output=b"o" * 2048)
    async with Client(api.target, options=[("grpc.max_receive_message_length", 1024)]) as small:
        with pytest.raises(errors.ResourceExhausted, match="larger than max") as raised:
            await small.wait(1)  # the caller's own limit wins over the SDK's default
    assert not raised.value.retryable

    refusal = "limits.max_message_bytes: a message of 9000000 bytes is larger than 4194304 bytes"
    api.responses["Submit"] = Refusal(grpc.StatusCode.RESOURCE_EXHAUSTED, refusal)
    async with Client(api.target) as client:
        with pytest.raises(errors.ResourceExhausted) as raised:
            await client.submit("x")
    assert not raised.value.retryable


# ------------------------------------------------------------------------------------ metadata


async def test_a_refusal_keeps_the_cronoq_trailing_metadata(api: ApiServer, client: Client) -> None:
    api.responses["Submit"] = Refusal(
        grpc.StatusCode.FAILED_PRECONDITION,
        "pool 'gpu' is served by another shard",
        (("cronoq-shard", "b"), ("cronoq-shard-endpoint", "https://b.internal:7070"), ("x-other", "1")),
    )
    with pytest.raises(errors.FailedPrecondition) as raised:
        await client.submit("x", pool="gpu")
    assert raised.value.metadata == (
        ("cronoq-shard", "b"),
        ("cronoq-shard-endpoint", "https://b.internal:7070"),
    )


# ------------------------------------------------------------------------------- watch reads


def _event(task_id: int) -> Any:
    return pb.StatusEvent(id=task_id, status=pb.TASK_STATUS_SUCCEEDED)


async def test_a_cancelled_watch_read_leaves_the_stream_usable(api: ApiServer, client: Client) -> None:
    api.watch_feed = asyncio.Queue()
    events = client.watch()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):  # nothing is sent: the read can only time out
            await anext(events)
    api.watch_feed.put_nowait(_event(1))
    assert (await asyncio.wait_for(anext(events), TIMEOUT)).id == 1
    api.watch_feed.put_nowait(_event(2))
    api.watch_feed.put_nowait(None)
    assert [event.id async for event in events] == [2]


async def test_a_watch_read_allows_no_second_reader_and_ends_on_aclose(
    api: ApiServer, client: Client
) -> None:
    api.watch_feed = asyncio.Queue()
    events = client.watch()
    reader = asyncio.create_task(anext(events))
    await events.unavailable_shards()  # the call is open, and the reader waits on it
    with pytest.raises(RuntimeError, match="already reading"):
        await anext(events)
    await events.aclose()
    with pytest.raises(StopAsyncIteration):
        await asyncio.wait_for(reader, TIMEOUT)


async def test_closing_the_client_during_a_watch_read_is_a_clear_error(api: ApiServer) -> None:
    api.watch_feed = asyncio.Queue()
    client = Client(api.target)
    events = client.watch()
    reader = asyncio.create_task(anext(events))
    await events.unavailable_shards()
    await client.close()
    with pytest.raises(errors.Cancelled, match="cancelled on this side"):
        await asyncio.wait_for(reader, TIMEOUT)


async def test_dropping_a_watch_after_a_cancelled_read_cancels_the_call(
    api: ApiServer, client: Client
) -> None:
    """The read left running for the next caller must not keep a dropped stream open."""
    api.watch_feed = asyncio.Queue()
    events = client.watch()
    with pytest.raises(TimeoutError):
        async with asyncio.timeout(0.05):
            await anext(events)
    del events
    gc.collect()
    await asyncio.wait_for(api.watch_ended.wait(), TIMEOUT)
