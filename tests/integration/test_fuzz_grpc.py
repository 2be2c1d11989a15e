"""Fuzz the unary gRPC API (Tasks and Admin) of a real server, and of a router in front of two shards,
with random requests built from the message descriptors: any value of every field's wire type (NaN
and infinite doubles, the extremes of each integer, enum numbers that name nothing, NUL and long
text), nested messages, repeated fields and maps. Every answer must be a status a caller can act on,
never UNKNOWN or INTERNAL (an exception that escaped), an INVALID_ARGUMENT must name the field, and the
processes' logs stay clean.

The HTTP fuzz (``test_fuzz_http``) reaches the same request logic through JSON, which cannot carry
all of these values; this reaches it through protobuf.
"""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from google.protobuf import message_factory
from google.protobuf.descriptor import Descriptor, FieldDescriptor
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from cronoq.v1 import cronoq_pb2 as pb
from cronoq.v1 import cronoq_pb2_grpc as pbg

from .serverproc import ServerProcess, assert_clean_log
from .shardproc import ShardSpec, server_or_router

LIMITS = "[limits]\nmax_wait_s = 0.2\n"
POOLS = ("default", "reject")
SHARDS = [
    ShardSpec("a", 1, ("default",), pool_options="max = 4"),
    ShardSpec("b", 2, ("reject",), pool_options='max = 1\nmax_pending = 2\noverflow = "reject"'),
]
CONFIG = LIMITS + "".join(
    f'\n[[pools]]\nname = "{pool}"\n{spec.pool_options}\n' for spec in SHARDS for pool in spec.pools
)
ANSWERS = {
    grpc.StatusCode.OK,
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.NOT_FOUND,
    grpc.StatusCode.RESOURCE_EXHAUSTED,  # the reject pool, full
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.DEADLINE_EXCEEDED,  # a wait that max_wait_s ended
}

_INTS = {
    FieldDescriptor.TYPE_INT32: (-(2**31), 2**31 - 1),
    FieldDescriptor.TYPE_INT64: (-(2**63), 2**63 - 1),
    FieldDescriptor.TYPE_UINT32: (0, 2**32 - 1),
    FieldDescriptor.TYPE_UINT64: (0, 2**64 - 1),
}
LONG = "é" * 20_000  # quoted whole in a refusal, it would not fit in the status trailer (16 KiB)
_texts = st.text(max_size=20) | st.sampled_from(["", *POOLS, "nope", "x\x00y", "é" * 300, LONG, "* * * * *"])


def _integers(low: int, high: int) -> st.SearchStrategy[int]:
    return st.integers(low, high) | st.sampled_from([low, high, 0, 1, 2]) | st.integers(max(low, -3), 50)


def _scalar(field: FieldDescriptor) -> st.SearchStrategy[Any]:
    kind = field.type
    if kind in _INTS:
        return _integers(*_INTS[kind])
    if kind == FieldDescriptor.TYPE_ENUM:
        assert field.enum_type is not None
        return st.sampled_from([v.number for v in field.enum_type.values]) | _integers(-(2**31), 2**31 - 1)
    if kind == FieldDescriptor.TYPE_DOUBLE:
        return st.floats(allow_nan=True, allow_infinity=True)
    if kind == FieldDescriptor.TYPE_BOOL:
        return st.booleans()
    if kind == FieldDescriptor.TYPE_STRING:
        return _texts
    if kind == FieldDescriptor.TYPE_BYTES:
        return st.binary(max_size=30)
    raise TypeError(f"{field.full_name}: no strategy for wire type {kind}")


def _field(field: FieldDescriptor, depth: int) -> st.SearchStrategy[Any] | None:
    if field.type != FieldDescriptor.TYPE_MESSAGE:
        values = _scalar(field)
    elif field.message_type is None:
        raise TypeError(f"{field.full_name}: a message field without its message type")
    elif field.message_type.GetOptions().map_entry:  # cronoq.v1's maps are of strings
        entry = field.message_type.fields_by_name
        return st.dictionaries(_scalar(entry["key"]), _scalar(entry["value"]), max_size=3)
    elif depth >= 2:
        return None
    else:
        values = messages(field.message_type, depth + 1)
    return st.lists(values, max_size=3) if field.is_repeated else values


def messages(descriptor: Descriptor, depth: int = 0) -> st.SearchStrategy[Any]:
    """Messages of ``descriptor`` with a random subset of fields set, each to any value of its type."""
    cls = message_factory.GetMessageClass(descriptor)
    fields = [(f, s) for f in descriptor.fields if (s := _field(f, depth)) is not None]

    @st.composite
    def build(draw: st.DrawFn) -> Any:
        message = cls()
        for field, values in fields:
            if not draw(st.booleans()):
                continue
            value = draw(values)
            if field.is_repeated and field.type == FieldDescriptor.TYPE_MESSAGE and isinstance(value, dict):
                getattr(message, field.name).update(value)
            elif field.is_repeated:
                getattr(message, field.name).extend(value)
            elif field.type == FieldDescriptor.TYPE_MESSAGE:
                getattr(message, field.name).CopyFrom(value)
            else:
                setattr(message, field.name, value)
        return message

    return build()


UNARY = [
    (service, method.name, method.input_type)
    for service in ("Tasks", "Admin")
    for method in pb.DESCRIPTOR.services_by_name[service].methods
    if not method.client_streaming and not method.server_streaming
]
calls = st.one_of(*(st.tuples(st.just((service, name)), messages(kind)) for service, name, kind in UNARY))


@pytest.fixture(scope="module", params=["server", "router"])
def target(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[ServerProcess]:
    directory = Path(tmp_path_factory.mktemp(f"fuzz-grpc-{request.param}"))
    with server_or_router(request.param, directory, CONFIG, SHARDS, LIMITS) as proc:
        yield proc


async def _call(target: str, service: str, method: str, request: Any) -> tuple[grpc.StatusCode, str]:
    async with grpc.aio.insecure_channel(target) as channel:
        stub = getattr(pbg, f"{service}Stub")(channel)
        try:
            await getattr(stub, method)(request, timeout=10)
        except grpc.aio.AioRpcError as err:
            return err.code(), err.details() or ""
        return grpc.StatusCode.OK, ""


def test_random_requests_get_an_answer_a_caller_can_act_on(target: ServerProcess) -> None:
    @settings(
        max_examples=300,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=list(HealthCheck),
    )
    @given(call=calls)
    def run(call: tuple[tuple[str, str], Any]) -> None:
        (service, method), request = call
        code, details = asyncio.run(_call(target.target, service, method, request))
        assert code in ANSWERS, (service, method, request, code, details)
        if code is grpc.StatusCode.INVALID_ARGUMENT:
            assert ": " in details, (method, details)  # "<field>: <what is wrong with it>"
        # The server's own status, not grpc's "Stream removed" for one dropped on the way (as a status
        # too long for its trailer is), which the RESOURCE_EXHAUSTED of a full pool could hide.
        assert not details.startswith("Stream removed"), (method, details)

    run()
    assert target.probe("/readyz") == 200
    assert_clean_log(target)


LONG_REFS = [
    ("Get", pb.GetRequest(task=pb.TaskRef(key=LONG)), "task: no task"),
    ("Cancel", pb.CancelRequest(task=pb.TaskRef(key=LONG)), "task: no task"),
    ("Wait", pb.WaitRequest(task=pb.TaskRef(key=LONG)), "task: no task"),
    ("ListTasks", pb.ListTasksRequest(pools=[LONG]), "pools: unknown pool"),
]


@pytest.mark.parametrize(
    ("method", "request_"), [(m, r) for m, r, _ in LONG_REFS], ids=[m for m, _, _ in LONG_REFS]
)
def test_a_long_unknown_value_is_refused_with_its_field_and_a_short_quote(
    target: ServerProcess, method: str, request_: Any
) -> None:
    """A refusal quoting all of a long value the server does not know would not reach the caller:
    grpc clients drop a status trailer over their metadata limit and report RESOURCE_EXHAUSTED
    "Stream removed" instead. The value is quoted short, and the field is still named."""
    expected = next(prefix for m, _, prefix in LONG_REFS if m == method)
    code, details = asyncio.run(_call(target.target, "Tasks", method, request_))
    assert code is grpc.StatusCode.NOT_FOUND, (code, details)
    assert details == f"{expected} '{LONG[:64]}...' (20,000 characters)"


def test_a_watch_of_a_long_unknown_pool_is_refused_with_a_short_quote(target: ServerProcess) -> None:
    async def watch() -> tuple[grpc.StatusCode, str]:
        async with grpc.aio.insecure_channel(target.target) as channel:
            call = pbg.TasksStub(channel).Watch(pb.WatchRequest(pools=[LONG]), timeout=10)
            try:
                async for _ in call:
                    pass
            except grpc.aio.AioRpcError as err:
                return err.code(), err.details() or ""
            return grpc.StatusCode.OK, ""

    code, details = asyncio.run(watch())
    assert (code, details) == (
        grpc.StatusCode.NOT_FOUND,
        f"pools: unknown pool '{LONG[:64]}...' (20,000 characters)",
    )
