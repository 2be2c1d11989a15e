"""Wire -> engine conversion of the fields behind fixed starts, dependencies, resources and recurring
schedules (``shard.convert``), and the gRPC status each engine refusal maps to (``shard.service``)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from cronoq.engine.model import (
    AdmissionError,
    DepEdge,
    DepOn,
    MissPolicy,
    Overlap,
    Priority,
    Recurring,
    RecurringSpec,
    RetryRule,
    TaskSpec,
)
from cronoq.errors import ApiError, FailedPrecondition, InvalidArgument, NotFound, ResourceExhausted
from cronoq.v1 import cronoq_pb2 as pb
from shard.convert import (
    NS,
    SpecLimits,
    lease_size,
    lease_size_bound,
    recurring_from_wire,
    recurring_info,
    spec_from_wire,
)
from shard.service import submit_error
from tests.fulltask import full_spec

NOW = 1_900_000_000.0
LIMITS = SpecLimits(max_key_len=32, max_kind_len=16, max_tags=4, max_tag_len=16, max_deps=3, max_resources=2)
POOLS = {"default": RetryRule(), "gpu": RetryRule(max_attempts=5)}


def convert(msg: pb.TaskSpec, *, template: bool = False, limits: SpecLimits = LIMITS) -> TaskSpec:
    return spec_from_wire(
        "task", msg, default_pool="default", pools=POOLS, limits=limits, now=NOW, template=template
    )


def refused(msg: pb.TaskSpec, *, template: bool = False) -> ApiError:
    with pytest.raises(ApiError) as err:
        convert(msg, template=template)
    return err.value


def test_a_plain_spec_keeps_the_defaults() -> None:
    spec = convert(pb.TaskSpec())
    assert (spec.start, spec.tolerance, spec.on_miss, spec.deps, spec.resources) == (
        None,
        1.0,
        MissPolicy.RUN_LATE,
        (),
        {},
    )


def test_every_field_lands_on_its_engine_field() -> None:
    """The spec is built positionally for speed: a field given to the wrong position shows here (each
    field of the full spec has a value no other field has). The pool is not the default one."""
    spec = full_spec(NOW)
    assert spec.deadline is not None and spec.start is not None and spec.retry is not None
    msg = pb.TaskSpec(
        payload=spec.payload,
        content_type=spec.content_type,
        kind=spec.kind,
        pool=spec.pool,
        priority=pb.Priority.Value(f"PRIORITY_{spec.priority.name}"),
        key=spec.key,
        deadline_in_s=spec.deadline - NOW,
        start_in_s=spec.start - NOW,
        tolerance_s=spec.tolerance,
        on_miss=pb.MissPolicy.Value(f"MISS_POLICY_{spec.on_miss.name}"),
        duration_hint_s=spec.duration_hint,
        timeout_s=spec.timeout,
        retry=pb.RetryPolicy(
            max_attempts=spec.retry.max_attempts,
            initial_backoff_s=spec.retry.initial_backoff,
            multiplier=spec.retry.multiplier,
            max_backoff_s=spec.retry.max_backoff,
            jitter=spec.retry.jitter,
        ),
        deps=[
            pb.Dep(
                target=pb.TaskRef(id=dep.target)
                if isinstance(dep.target, int)
                else pb.TaskRef(key=dep.target),
                cond=pb.EdgeCond.Value(f"EDGE_COND_ON_{dep.on.name}"),
            )
            for dep in spec.deps
        ],
        resources=spec.resources,
        tags=spec.tags,
        labels=spec.labels,
        tenant=spec.tenant,
    )
    assert spec.pool != "default"
    assert convert(msg, limits=replace(LIMITS, max_deps=len(spec.deps))) == spec


def test_retry_fields_left_at_zero_take_the_pools_values() -> None:
    """Clients send unset RetryRule fields as 0: each means the pool's value, initial_backoff_s too
    (else a policy naming only max_attempts would retry at once)."""
    pool = RetryRule(max_attempts=5, initial_backoff=2.0, multiplier=3.0, max_backoff=30.0, jitter=True)
    pools = {"default": pool}
    only_attempts = pb.TaskSpec(retry=pb.RetryPolicy(max_attempts=9, jitter=True))
    spec = spec_from_wire(
        "task", only_attempts, default_pool="default", pools=pools, limits=LIMITS, now=NOW, template=False
    )
    assert spec.retry == RetryRule(9, 2.0, 3.0, 30.0, True)


@pytest.mark.parametrize(
    ("msg", "field"),
    [
        (pb.TaskSpec(kind="k" * 17, key="x" * 33), "task.kind"),  # of several bad fields, the first
        (pb.TaskSpec(key="x" * 33, tenant="t" * 33), "task.key"),
        (pb.TaskSpec(tenant="a\x00b"), "task.tenant"),
        (pb.TaskSpec(content_type="c" * 129), "task.content_type"),
        (pb.TaskSpec(timeout_s=math.nan), "task.timeout_s"),
        (pb.TaskSpec(duration_hint_s=-1), "task.duration_hint_s"),
        (pb.TaskSpec(deadline_in_s=math.inf), "task.deadline_in_s"),
        (pb.TaskSpec(pool="no\x00pe"), "task.pool"),
    ],
)
def test_a_bad_field_is_named(msg: pb.TaskSpec, field: str) -> None:
    assert str(refused(msg)).split(": ")[1].startswith(field)


WIDE = SpecLimits(max_key_len=2048, max_kind_len=16, max_tags=4, max_tag_len=16, max_deps=3)


@pytest.mark.parametrize("at", ["key", "deps", "name"])
def test_a_key_takes_at_most_2048_bytes_of_utf8_whatever_max_key_len_allows(at: str) -> None:
    """The stores index keys (and schedule names), and Postgres refuses an index entry over about 2,700
    bytes: a key that long in characters of several bytes is refused here, naming the field."""

    def check(key: str) -> object:
        if at == "name":
            req = pb.RecurringRequest(name=key, cron="* * * * *")
            return recurring_from_wire(req, default_pool="default", pools=POOLS, limits=WIDE, now=NOW)
        msg = pb.TaskSpec(key=key) if at == "key" else pb.TaskSpec(deps=[pb.Dep(target=pb.TaskRef(key=key))])
        return spec_from_wire("task", msg, default_pool="default", pools=POOLS, limits=WIDE, now=NOW)

    assert check("é" * 1024)  # 2,048 bytes
    assert check("k" * 2048)
    with pytest.raises(InvalidArgument) as err:
        check("é" * 1025)
    field = {"key": "task.key", "deps": "task.deps[0].key", "name": "name"}[at]
    assert (
        err.value.message == f"{field}: 2,050 bytes in UTF-8; a key takes at most 2,048 (the stores index it)"
    )


def test_the_lease_size_bound_never_understates_the_exact_size() -> None:
    """Specs without tags are checked against the bound alone; multi-byte text is where it could fail."""
    for text in ("", "a", "é", "€", "𝄞", "a€𝄞" * 5):
        spec = TaskSpec("default", payload=b"x" * 10, content_type=text, kind=text or "default", key=text)
        assert lease_size_bound(spec) >= lease_size(spec)


def test_a_lease_too_large_for_a_worker_is_refused() -> None:
    small = SpecLimits(max_key_len=32, max_kind_len=16, max_tags=4, max_tag_len=16, max_message_bytes=400)
    fits = spec_from_wire(
        "task", pb.TaskSpec(payload=b"x" * 100), default_pool="default", pools=POOLS, limits=small, now=NOW
    )
    assert len(fits.payload) == 100
    tags = {f"tag{i}": "v" * 16 for i in range(4)}  # with tags, the exact size is computed
    for msg in (pb.TaskSpec(payload=b"x" * 300), pb.TaskSpec(payload=b"x" * 100, tags=tags)):
        with pytest.raises(InvalidArgument, match=r"limits\.max_message_bytes"):
            spec_from_wire("task", msg, default_pool="default", pools=POOLS, limits=small, now=NOW)


def test_fixed_starts() -> None:
    assert convert(pb.TaskSpec(start_in_s=2.5)).start == NOW + 2.5
    spec = convert(
        pb.TaskSpec(start_unix_ns=1_900_000_100 * NS, tolerance_s=0.25, on_miss=pb.MISS_POLICY_FAIL)
    )
    assert (spec.start, spec.tolerance, spec.on_miss) == (1_900_000_100.0, 0.25, MissPolicy.FAIL)
    assert convert(pb.TaskSpec(start_in_s=0, on_miss=pb.MISS_POLICY_SKIP)).on_miss is MissPolicy.SKIP
    assert convert(pb.TaskSpec(start_in_s=0, on_miss=pb.MISS_POLICY_RUN_LATE)).on_miss is MissPolicy.RUN_LATE
    assert convert(pb.TaskSpec(start_unix_ns=0)).start == 0.0  # long past: the engine runs or misses it


@pytest.mark.parametrize(
    ("msg", "message"),
    [
        (
            pb.TaskSpec(start_in_s=1, start_unix_ns=1),
            "task: use either start_in_s or start_unix_ns, not both",
        ),
        (pb.TaskSpec(start_in_s=-1), "task.start_in_s: invalid duration -1.0"),
        (pb.TaskSpec(start_in_s=math.inf), "task.start_in_s: invalid duration inf"),
        (pb.TaskSpec(start_unix_ns=-1), "task.start_unix_ns: -1 is not a usable start"),
        (
            pb.TaskSpec(start_unix_ns=2**63 - 1),
            "task.start_unix_ns: 9223372036854775807 is not a usable start",
        ),
        (pb.TaskSpec(tolerance_s=1), "task.tolerance_s: only meaningful with a fixed start"),
        (pb.TaskSpec(start_in_s=1, tolerance_s=math.nan), "task.tolerance_s: invalid duration nan"),
        (pb.TaskSpec(on_miss=pb.MISS_POLICY_FAIL), "task.on_miss: only meaningful with a fixed start"),
        (
            pb.TaskSpec(start_in_s=1, on_miss=pb.MissPolicy.ValueType(4)),
            "task.on_miss: unknown on_miss value 4",
        ),
    ],
)
def test_bad_fixed_starts(msg: pb.TaskSpec, message: str) -> None:
    err = refused(msg)
    assert isinstance(err, InvalidArgument) and err.message.startswith(message), err.message


def test_dependencies() -> None:
    spec = convert(
        pb.TaskSpec(
            deps=[
                pb.Dep(target=pb.TaskRef(key="a")),
                pb.Dep(target=pb.TaskRef(id=7), cond=pb.EDGE_COND_ON_FAILURE),
                pb.Dep(target=pb.TaskRef(key="b"), cond=pb.EDGE_COND_ON_COMPLETE),
            ]
        )
    )
    assert spec.deps == (DepEdge("a", DepOn.SUCCESS), DepEdge(7, DepOn.FAILURE), DepEdge("b", DepOn.COMPLETE))
    assert convert(
        pb.TaskSpec(deps=[pb.Dep(target=pb.TaskRef(key="a"), cond=pb.EDGE_COND_ON_SUCCESS)])
    ).deps == (DepEdge("a", DepOn.SUCCESS),)


@pytest.mark.parametrize(
    ("deps", "message"),
    [
        ([pb.Dep()], "task.deps[0]: name the task it waits for by id or key"),
        ([pb.Dep(target=pb.TaskRef(key=""))], "task.deps[0].key: must not be empty"),
        (
            [pb.Dep(target=pb.TaskRef(id=1)), pb.Dep(target=pb.TaskRef(id=0))],
            "task.deps[1].id: task ids start at 1",
        ),
        ([pb.Dep(target=pb.TaskRef(key="x" * 33))], "task.deps[0].key: longer than 32 characters (33)"),
        ([pb.Dep(target=pb.TaskRef(key="a\x00"))], "task.deps[0].key: must not contain NUL characters"),
        (
            [pb.Dep(target=pb.TaskRef(key="a"), cond=pb.EdgeCond.ValueType(9))],
            "task.deps[0].cond: unknown dependency condition value 9",
        ),
        ([pb.Dep(target=pb.TaskRef(id=i)) for i in range(1, 5)], "task.deps: more than limits.max_deps (3)"),
    ],
)
def test_bad_dependencies(deps: list[pb.Dep], message: str) -> None:
    err = refused(pb.TaskSpec(deps=deps))
    assert isinstance(err, InvalidArgument) and err.message.startswith(message), err.message


def test_resources() -> None:
    assert convert(pb.TaskSpec(resources={"gpu": 2, "api": 1})).resources == {"gpu": 2, "api": 1}


@pytest.mark.parametrize(
    ("resources", "message"),
    [
        ({"gpu": 0}, "task.resources['gpu']: amount must be > 0"),
        ({"": 1}, "task.resources: resource names must not be empty"),
        ({"g\x00": 1}, "task.resources key 'g\\x00': must not contain NUL characters"),
        ({"r" * 65: 1}, "task.resources key"),
        ({"a": 1, "b": 1, "c": 1}, "task.resources: more than limits.max_resources (2) entries (3)"),
    ],
)
def test_bad_resources(resources: dict[str, int], message: str) -> None:
    err = refused(pb.TaskSpec(resources=resources))
    assert isinstance(err, InvalidArgument) and err.message.startswith(message), err.message


def test_templates_keep_deadline_in_relative_and_refuse_what_the_cron_decides() -> None:
    spec = convert(pb.TaskSpec(deadline_in_s=30, tolerance_s=2, on_miss=pb.MISS_POLICY_SKIP), template=True)
    assert (spec.deadline, spec.start, spec.tolerance, spec.on_miss) == (None, None, 2.0, MissPolicy.SKIP)
    for msg, field in (
        (pb.TaskSpec(start_in_s=1), "task.start_in_s"),
        (pb.TaskSpec(start_unix_ns=1), "task.start_unix_ns"),
        (pb.TaskSpec(deadline_unix_ns=1), "task.deadline_unix_ns"),
        (pb.TaskSpec(deps=[pb.Dep(target=pb.TaskRef(key="k"))]), "task.deps"),
    ):
        err = refused(msg, template=True)
        assert isinstance(err, InvalidArgument) and err.message.startswith(f"{field}: a recurring template")


def test_recurring_requests() -> None:
    req = pb.RecurringRequest(
        name="nightly",
        cron="0 3 * * *",
        tz="Europe/Berlin",
        overlap=pb.OVERLAP_QUEUE_ON_SUCCESS,
        template=pb.TaskSpec(
            pool="gpu", kind="report", key="rep", deadline_in_s=60, priority=pb.PRIORITY_HIGH
        ),
    )
    spec = recurring_from_wire(req, default_pool="default", pools=POOLS, limits=LIMITS, now=NOW)
    assert (spec.name, spec.cron, spec.tz, spec.overlap, spec.deadline_in) == (
        "nightly",
        "0 3 * * *",
        "Europe/Berlin",
        Overlap.QUEUE_ON_SUCCESS,
        60,
    )
    assert (spec.template.pool, spec.template.kind, spec.template.key, spec.template.priority) == (
        "gpu",
        "report",
        "rep",
        Priority.HIGH,
    )
    bare = recurring_from_wire(
        pb.RecurringRequest(name="n", cron="* * * * *"),
        default_pool="default",
        pools=POOLS,
        limits=LIMITS,
        now=NOW,
    )
    assert (bare.tz, bare.overlap, bare.template.pool, bare.deadline_in) == (
        "UTC",
        Overlap.SKIP,
        "default",
        None,
    )


@pytest.mark.parametrize(
    ("req", "error", "message"),
    [
        (pb.RecurringRequest(cron="* * * * *"), InvalidArgument, "name: required"),
        (pb.RecurringRequest(name="x" * 33, cron="* * * * *"), InvalidArgument, "name: longer than 32"),
        (pb.RecurringRequest(name="a\x00", cron="* * * * *"), InvalidArgument, "name: must not contain NUL"),
        (pb.RecurringRequest(name="n", cron="  "), InvalidArgument, "cron: required"),
        (
            pb.RecurringRequest(name="n", cron="* * * * *", overlap=pb.Overlap.ValueType(9)),
            InvalidArgument,
            "overlap: unknown overlap",
        ),
        (
            pb.RecurringRequest(name="n", cron="* * * * *", tz="U\x00"),
            InvalidArgument,
            "tz: must not contain NUL",
        ),
        (
            pb.RecurringRequest(name="n", cron="* * * * *", template=pb.TaskSpec(pool="nope")),
            NotFound,
            "template.pool: unknown pool 'nope'",
        ),
        (
            pb.RecurringRequest(name="n", cron="* * * * *", template=pb.TaskSpec(start_in_s=1)),
            InvalidArgument,
            "template.start_in_s: a recurring template cannot have a fixed start",
        ),
    ],
)
def test_bad_recurring_requests(req: pb.RecurringRequest, error: type[ApiError], message: str) -> None:
    with pytest.raises(error) as err:
        recurring_from_wire(req, default_pool="default", pools=POOLS, limits=LIMITS, now=NOW)
    assert err.value.message.startswith(message), err.value.message


def test_recurring_info() -> None:
    spec = RecurringSpec("n", "*/5 * * * *", TaskSpec("gpu", kind="k"), "Asia/Tokyo", Overlap.QUEUE)
    info = recurring_info(Recurring(spec, 1_900_000_300.5, 42))
    assert (info.name, info.cron, info.tz, info.pool, info.kind, info.overlap) == (
        "n",
        "*/5 * * * *",
        "Asia/Tokyo",
        "gpu",
        "k",
        pb.OVERLAP_QUEUE,
    )
    assert (info.next_unix_ns, info.last_task_id) == (1_900_000_300_500_000_000, 42)
    empty = recurring_info(Recurring(spec))
    assert not empty.HasField("next_unix_ns") and not empty.HasField("last_task_id")


@pytest.mark.parametrize(
    ("code", "error"),
    [
        ("unknown_pool", NotFound),
        ("unknown_resource", NotFound),
        ("unknown_dependency", NotFound),
        ("full", ResourceExhausted),
        ("overloaded", ResourceExhausted),
        ("reservation_conflict", FailedPrecondition),
        ("cycle", InvalidArgument),
        ("resource_exceeds_capacity", InvalidArgument),
        ("duplicate_key_in_batch", InvalidArgument),
        ("invalid", InvalidArgument),
    ],
)
def test_engine_refusals_map_to_statuses(code: str, error: type[ApiError]) -> None:
    mapped = submit_error("tasks[2].deps", AdmissionError(code, "why", 2))
    assert type(mapped) is error and mapped.message == "tasks[2].deps: why"
