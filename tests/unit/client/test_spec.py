"""task(...): payload encoding and the conversion of every option to the wire TaskSpec."""

from __future__ import annotations

import math
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest

from cronoq.client import Lease, Result, task
from cronoq.client._codec import encode
from cronoq.v1 import cronoq_pb2 as pb

ENCODINGS: list[tuple[object, str | None, bytes, str]] = [
    (b"\x00raw", None, b"\x00raw", "application/octet-stream"),
    (bytearray(b"ba"), None, b"ba", "application/octet-stream"),
    (memoryview(b"mv"), None, b"mv", "application/octet-stream"),
    ("héllo", None, "héllo".encode(), "text/plain; charset=utf-8"),
    (None, None, b"", ""),
    ({"b": [1, 2.5, None], "é": "ü"}, None, '{"b":[1,2.5,null],"é":"ü"}'.encode(), "application/json"),
    ([1, 2], None, b"[1,2]", "application/json"),
    (7, None, b"7", "application/json"),
    (b"<x/>", "application/xml", b"<x/>", "application/xml"),
    ({"a": 1}, "application/vnd.acme+json", b'{"a":1}', "application/vnd.acme+json"),
    ("", "", b"", ""),
]  # fmt: skip


@pytest.mark.parametrize(("value", "content_type", "data", "expected_type"), ENCODINGS)
def test_payload_encoding(value: object, content_type: str | None, data: bytes, expected_type: str) -> None:
    assert encode(value, content_type) == (data, expected_type)
    spec = task(value, content_type=content_type)
    assert (spec.payload, spec.content_type) == (data, expected_type)


@pytest.mark.parametrize("value", [object(), {"x": {1, 2}}, math.inf, float("nan")])
def test_values_json_cannot_carry_are_refused(value: object) -> None:
    with pytest.raises((TypeError, ValueError)):
        task(value)


def test_defaults_leave_everything_to_the_pool() -> None:
    spec = task()
    assert spec == pb.TaskSpec(priority=pb.PRIORITY_NORMAL)
    for field in (
        "deadline_in_s",
        "deadline_unix_ns",
        "start_in_s",
        "start_unix_ns",
        "tolerance_s",
        "timeout_s",
    ):
        assert not spec.HasField(field)
    assert not spec.HasField("retry")


def test_every_option_is_converted() -> None:
    spec = task(
        "p",
        pool="gpu",
        kind="resize",
        priority="CRITICAL",
        key="k",
        deadline_in=30,
        start_at=datetime(2030, 1, 1, tzinfo=UTC),
        tolerance=0.5,
        on_miss="skip",
        duration_hint=2.0,
        timeout=60.0,
        retry={"max_attempts": 5, "initial_backoff": 0.5},
        after=["a", 7],
        deps=[("b", "failure"), {"ref": 8, "cond": "on_complete"}, {"ref": "c"}],
        resources={"gpu": 1},
        tags={"n": 1},
        labels={"gpu": True},
        tenant="acme",
    )
    assert (spec.pool, spec.kind, spec.priority, spec.key, spec.tenant) == (
        "gpu", "resize", pb.PRIORITY_CRITICAL, "k", "acme",
    )  # fmt: skip
    assert spec.deadline_in_s == 30.0 and not spec.HasField("deadline_unix_ns")
    assert spec.start_unix_ns == 1_893_456_000 * 1_000_000_000
    assert (spec.tolerance_s, spec.on_miss, spec.duration_hint_s, spec.timeout_s) == (
        0.5, pb.MISS_POLICY_SKIP, 2.0, 60.0,
    )  # fmt: skip
    assert spec.retry == pb.RetryPolicy(max_attempts=5, initial_backoff_s=0.5, jitter=True)
    assert [(d.target.WhichOneof("target"), d.cond) for d in spec.deps] == [
        ("key", pb.EDGE_COND_ON_SUCCESS),
        ("id", pb.EDGE_COND_ON_SUCCESS),
        ("key", pb.EDGE_COND_ON_FAILURE),
        ("id", pb.EDGE_COND_ON_COMPLETE),
        ("key", pb.EDGE_COND_ON_SUCCESS),
    ]
    assert (dict(spec.resources), dict(spec.tags), dict(spec.labels)) == (
        {"gpu": 1},
        {"n": "1"},
        {"gpu": "True"},
    )


def test_retry_from_an_object_and_a_single_after() -> None:
    @dataclass
    class Policy:
        max_attempts: int = 4
        initial_backoff: float = 1.0
        multiplier: float = 3.0
        max_backoff: float = 9.0
        jitter: bool = False

    spec = task(retry=Policy(), after="a", deadline_at=1.25, start_in=3)
    assert spec.retry == pb.RetryPolicy(
        max_attempts=4, initial_backoff_s=1.0, multiplier=3.0, max_backoff_s=9.0, jitter=False
    )
    assert [d.target.key for d in spec.deps] == ["a"]
    assert (spec.deadline_unix_ns, spec.start_in_s) == (1_250_000_000, 3.0)


@pytest.mark.parametrize(
    ("priority", "wire"),
    [
        (None, pb.PRIORITY_NORMAL),
        ("low", pb.PRIORITY_LOW),
        ("High", pb.PRIORITY_HIGH),
        (0, pb.PRIORITY_CRITICAL),
        (3, pb.PRIORITY_LOW),
    ],
)
def test_priorities(priority: str | int | None, wire: int) -> None:
    assert task(priority=priority).priority == wire


BAD: list[tuple[dict[str, Any], type[Exception], str]] = [
    ({"priority": 4}, ValueError, r"0\.\.=3"),
    ({"priority": True}, ValueError, "bool"),
    ({"priority": "urgent"}, ValueError, "priority must be one of"),
    ({"deadline_in": 1, "deadline_at": 2}, ValueError, "either deadline_in or deadline_at"),
    ({"start_in": 1, "start_at": datetime.now(UTC)}, ValueError, "either start_in or start_at"),
    ({"timeout": -1}, ValueError, "timeout must be a finite, non-negative"),
    ({"tolerance": float("nan")}, ValueError, "tolerance"),
    ({"duration_hint": "1"}, ValueError, "duration_hint"),
    ({"deadline_at": float("inf")}, ValueError, "deadline_at"),
    ({"on_miss": "later"}, ValueError, "on_miss must be one of run_late, skip, fail"),
    ({"deps": [("a", "sometimes")]}, ValueError, "dependency condition"),
    ({"after": [True]}, TypeError, "id .int. or key .str."),
    ({"colour": "red"}, TypeError, "unknown task option"),
]


@pytest.mark.parametrize(("options", "error", "match"), BAD)
def test_bad_options(options: dict[str, Any], error: type[Exception], match: str) -> None:
    with pytest.raises(error, match=match):
        task("x", **options)


def test_result_and_lease_decoding_helpers() -> None:
    empty = Result(id=1, status="succeeded", output=b"")
    assert (empty.ok, empty.json(), empty.text()) == (True, None, "")
    lease = Lease(
        1, 2, 1, "é".encode(), "text/plain; charset=utf-8", "", None, {}, None, None, "p", None, None
    )
    assert (lease.text(), lease.cancelled.is_set()) == ("é", False)
