"""Library-mode value types and argument checks: what is accepted, and the message for what is not."""

from __future__ import annotations

import math
import pickle
import subprocess
import sys
from datetime import UTC, datetime
from typing import Any

import pytest

import cronoq
import cronoq.engine
import cronoq.library
from cronoq import (
    AutoscaleConfig,
    Dep,
    EventsLagged,
    Pool,
    Priority,
    Resource,
    RetryPolicy,
    Scheduler,
    SchedulerError,
    SubmitError,
    Task,
    TaskFailed,
)
from cronoq.engine import DepOn, MissPolicy, Overflow, Semaphore, TokenBucket, UnknownDependency
from cronoq.library.task import parse

from .helpers import echo


def test_package_exports_library_names_lazily() -> None:
    code = (
        "import sys, cronoq; assert 'cronoq.library' not in sys.modules; "
        "cronoq.Scheduler; assert 'cronoq.library' in sys.modules; assert 'grpc' not in sys.modules"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
    for name in cronoq.__all__:
        assert getattr(cronoq, name) is not None
    # The package lists library mode's names itself (importing them would defeat the lazy loading):
    # the two lists must not drift apart. TaskOptions stays in cronoq.library.
    assert set(cronoq.__all__) - {"__version__"} == set(cronoq.library.__all__) - {"TaskOptions"}
    assert cronoq.SubmitError.__module__ == "cronoq.library.errors"
    assert "Scheduler" in dir(cronoq)


def test_priority_behaves_like_the_reference() -> None:
    assert Priority is cronoq.engine.Priority  # one class for the public name and the engine
    assert [p.value for p in Priority] == [0, 1, 2, 3]
    assert repr(Priority.HIGH) == "Priority.HIGH" and Priority.HIGH.name == "HIGH"
    assert int(Priority.LOW) == 3 and Priority.CRITICAL < Priority.LOW
    assert len({Priority.HIGH, Priority.HIGH}) == 1


@pytest.mark.parametrize(
    ("given", "expected"),
    [
        (Priority.HIGH, Priority.HIGH),
        (0, Priority.CRITICAL),
        ("low", Priority.LOW),
        ("NORMAL", Priority.NORMAL),
    ],
)
def test_priority_accepts_enum_int_and_name(given: Any, expected: Priority) -> None:
    assert parse({"priority": given}).priority is expected


def test_priority_refusals() -> None:
    with pytest.raises(ValueError, match=r"priority must be 0\.\.=3"):
        parse({"priority": 4})
    with pytest.raises(ValueError, match=r"priority must be 0\.\.=3"):
        parse({"priority": -1})
    with pytest.raises(TypeError, match="not a bool"):
        parse({"priority": True})
    with pytest.raises(ValueError, match="critical, high, normal or low"):
        parse({"priority": "urgent"})


@pytest.mark.parametrize("field", ["deadline_in", "start_in", "tolerance", "duration_hint", "timeout"])
@pytest.mark.parametrize("value", [-1, math.nan, math.inf, "3", pytest.param(10**400, id="beyond-float")])
def test_durations_must_be_finite_and_non_negative(field: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"{field} must be a finite, non-negative number of seconds"):
        parse({field: value})


def test_relative_and_absolute_times_exclude_each_other() -> None:
    with pytest.raises(ValueError, match="use either deadline_in or deadline_at"):
        parse({"deadline_in": 1, "deadline_at": 2})
    with pytest.raises(ValueError, match="use either start_in or start_at"):
        parse({"start_in": 1, "start_at": 2})


def test_times_become_absolute_at_submission() -> None:
    template = parse({"deadline_in": 5, "start_at": datetime(2030, 1, 1, tzinfo=UTC), "timeout": 0})
    spec = template.spec("p", "pool", now=100.0)
    assert spec.deadline == 105.0
    assert spec.start == datetime(2030, 1, 1, tzinfo=UTC).timestamp()
    assert spec.timeout == 0.0  # accepted: it times out at once
    assert spec.pool == "pool" and spec.payload == "p"
    with pytest.raises(ValueError, match="deadline_at must be a datetime or finite Unix seconds"):
        parse({"deadline_at": "tomorrow"})


def test_enumerated_options() -> None:
    assert parse({"on_miss": "skip"}).on_miss is MissPolicy.SKIP
    with pytest.raises(ValueError, match="on_miss must be one of run_late, skip, fail"):
        parse({"on_miss": "later"})


def test_dependencies_from_after_and_deps() -> None:
    template = parse({"after": ["a", 7], "deps": [Dep("b", on="on_failure"), Dep(3, on="complete")]})
    assert [(d.target, d.on) for d in template.deps] == [
        ("a", DepOn.SUCCESS),
        (7, DepOn.SUCCESS),
        ("b", DepOn.FAILURE),
        (3, DepOn.COMPLETE),
    ]
    assert parse({"after": "a"}).deps[0].target == "a"
    # Any case, as every other enumerated option (on_miss, overflow, ...).
    assert (Dep("a", on="SUCCESS").on, Dep("a", on="On_Failure").on) == ("success", "failure")
    with pytest.raises(ValueError, match="on must be one of success, failure, complete"):
        Dep("a", on="done")
    with pytest.raises(TypeError, match="task id"):
        Dep(True)
    with pytest.raises(TypeError, match="Dep objects"):
        parse({"deps": [("a", "success")]})
    assert repr(Dep("a", on="on_complete")) == "Dep('a', on='complete')"


def test_text_fields_refuse_nul_and_wrong_types() -> None:
    for field in ("kind", "key", "tenant", "pool"):
        with pytest.raises(ValueError, match=f"{field} must not contain NUL characters"):
            parse({field: "a\x00b"})
    with pytest.raises(ValueError, match="NUL"):
        parse({"tags": {"a": "b\x00"}})
    with pytest.raises(ValueError, match="NUL"):
        parse({"after": "k\x00"})
    with pytest.raises(TypeError, match="key must be a str"):
        parse({"key": 5})
    with pytest.raises(TypeError, match="unexpected keyword argument"):
        parse({"deadline": 5})


def test_tags_and_labels_are_stringified() -> None:
    template = parse({"tags": {"n": 1, "ok": True}, "labels": {"gpu": "a100"}})
    assert template.tags == {"n": "1", "ok": "True"} and template.labels == {"gpu": "a100"}


def test_resource_amounts() -> None:
    assert parse({"resources": {"db": 2}}).resources == {"db": 2}
    with pytest.raises(SubmitError, match="resource amount must be > 0") as err:
        parse({"resources": {"db": 0}})
    assert err.value.code == "invalid"
    with pytest.raises(TypeError, match="must be an int"):
        parse({"resources": {"db": 1.5}})


def test_task_keeps_payload_and_key() -> None:
    task = Task({"n": 1}, key="k", priority="high")
    assert task.payload == {"n": 1} and task.key == "k"
    assert Task(None).key is None
    with pytest.raises(ValueError, match="use either"):
        Task(None, start_in=1, start_at=2)


def test_retry_policy_attributes_are_checked_on_every_assignment() -> None:
    policy = RetryPolicy()
    assert (policy.max_attempts, policy.initial_backoff, policy.multiplier, policy.max_backoff) == (
        3,
        1.0,
        2.0,
        60.0,
    )
    assert policy.jitter is True
    assert RetryPolicy.none().max_attempts == 1
    policy.max_attempts = 5
    assert policy.to_engine().max_attempts == 5
    with pytest.raises(ValueError, match="max_attempts must be >= 1"):
        policy.max_attempts = 0
    with pytest.raises(ValueError, match="multiplier must be a finite number >= 1"):
        RetryPolicy(multiplier=0.5)
    with pytest.raises(ValueError, match="initial_backoff must be a finite, non-negative"):
        RetryPolicy(initial_backoff=-1)
    with pytest.raises(AttributeError, match="no attribute 'retries'"):
        policy.retries = 3
    assert repr(RetryPolicy.none()).startswith("RetryPolicy(max_attempts=1, initial_backoff=1.0")


def test_autoscale_config() -> None:
    config = AutoscaleConfig(slo={Priority.HIGH: 2.0, 3: 10, "Normal": 5})
    assert config.slo == {"high": 2.0, "low": 10.0, "normal": 5.0}
    engine = config.to_engine()
    assert engine.slo == {Priority.HIGH: 2.0, Priority.LOW: 10.0, Priority.NORMAL: 5.0}
    assert AutoscaleConfig().slo == {}
    with pytest.raises(ValueError, match="interval must be a finite number > 0"):
        AutoscaleConfig(interval=0)
    with pytest.raises(ValueError, match="target_utilization must be a number between 0 and 1"):
        AutoscaleConfig(target_utilization=1.5)
    with pytest.raises(ValueError, match=r"slo\['low'\] must be a finite number > 0"):
        AutoscaleConfig(slo={"low": 0})


def test_resources() -> None:
    assert Resource.semaphore("db", 2).config == Semaphore("db", 2)
    assert Resource.token_bucket("api", 4, 2).config == TokenBucket("api", 4.0, 2.0)
    assert repr(Resource.semaphore("db", 2)) == "Resource.semaphore('db', 2)"
    with pytest.raises(ValueError, match="permits must be >= 1"):
        Resource.semaphore("db", 0)
    with pytest.raises(ValueError, match="rate must be a finite number > 0"):
        Resource.token_bucket("api", 0, 1)
    with pytest.raises(ValueError, match="burst must be a finite number >= 1"):
        Resource.token_bucket("api", 1, 0.5)
    with pytest.raises(ValueError, match="name must not be empty"):
        Resource.semaphore("", 1)


def test_pool_defaults_and_engine_config() -> None:
    def sync_executor(ctx: object, payload: object) -> None:
        return None

    pool = Pool("p", echo)
    config = pool.config
    assert pool.is_async and pool.initial == 1
    assert (config.min, config.max, config.lease_ttl, config.max_pending) == (1, 10, None, None)
    assert config.autoscale is not None  # None means "on, with the defaults"
    assert config.overflow is Overflow.WAIT and config.unknown_dependency is UnknownDependency.REJECT
    assert config.retry.max_attempts == 3 and config.default_duration == 1.0
    assert config.reservable_fraction == 0.5 and not config.fair_share
    assert not Pool("s", sync_executor).is_async
    fixed = Pool(
        "f", echo, min=2, max=4, initial=3, autoscale=False, overflow="shed_lowest", tenant_weights={"a": 3}
    )
    assert fixed.config.autoscale is None and fixed.initial == 3
    assert fixed.config.overflow is Overflow.SHED_LOWEST and fixed.config.tenant_weights == {"a": 3.0}
    costly = Pool("c", echo, autoscale=AutoscaleConfig(cost_per_worker_second=0.5))
    assert costly.config.cost_per_worker_second == 0.5


def test_pool_detects_async_callables() -> None:
    class Callable:
        async def __call__(self, ctx: object, payload: object) -> None:
            return None

    assert Pool("p", Callable()).is_async


@pytest.mark.parametrize(
    ("kwargs", "error", "message"),
    [
        ({"min": 0}, ValueError, "min must be >= 1"),
        ({"min": 3, "max": 2}, ValueError, r"min \(3\) must not exceed max \(2\)"),
        ({"initial": 11}, ValueError, r"initial \(11\) must not exceed max \(10\)"),
        ({"max": True}, TypeError, "max must be an int"),
        ({"lease_ttl": 0}, ValueError, "lease_ttl must be a finite number > 0"),
        ({"overflow": "drop"}, ValueError, "overflow must be one of wait, reject, shed_lowest, shed_oldest"),
        ({"unknown_dependency": "ignore"}, ValueError, "unknown_dependency must be one of reject, await"),
        ({"reservable_fraction": 2}, ValueError, "reservable_fraction must be a number between 0 and 1"),
        ({"tenant_weights": {"a": 0}}, ValueError, r"tenant_weights\['a'\] must be a finite number > 0"),
        ({"autoscale": "yes"}, TypeError, "autoscale must be an AutoscaleConfig"),
        ({"retry": {"max_attempts": 1}}, TypeError, "retry must be a RetryPolicy"),
        # 0 would leave no room to wait in: every submission would wait forever or be refused.
        ({"max_pending": 0}, ValueError, r"max_pending must be >= 1 \(got 0\)"),
    ],
)
def test_pool_refusals(kwargs: dict[str, Any], error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        Pool("p", echo, **kwargs)


def test_pool_needs_a_name_and_a_callable() -> None:
    with pytest.raises(ValueError, match="name must not be empty"):
        Pool("", echo)
    with pytest.raises(TypeError, match="executor must be callable"):
        Pool("p", "echo")  # type: ignore[arg-type]


def test_scheduler_construction() -> None:
    scheduler = Scheduler([Pool("a", echo), Pool("default", echo)])
    assert scheduler.pools == ["a", "default"] and scheduler.default_pool == "default"
    assert Scheduler([Pool("a", echo), Pool("b", echo)]).default_pool == "a"
    assert not scheduler.started
    with pytest.raises(ValueError, match="at least one pool is required"):
        Scheduler([])
    with pytest.raises(ValueError, match="duplicate pool name 'a'"):
        Scheduler([Pool("a", echo), Pool("a", echo)])
    with pytest.raises(ValueError, match="event_capacity must be >= 1"):
        Scheduler([Pool("a", echo)], event_capacity=0)
    with pytest.raises(ValueError, match="shutdown_grace must be a non-negative number of seconds or inf"):
        Scheduler([Pool("a", echo)], shutdown_grace=-1)
    with pytest.raises(ValueError, match="duplicate resource name 'db'"):
        Scheduler([Pool("a", echo)], resources=[Resource.semaphore("db", 1), Resource.semaphore("db", 2)])
    Scheduler([Pool("a", echo)], shutdown_grace=math.inf)


def test_errors_format_and_pickle() -> None:
    failed = TaskFailed("dead_lettered", "ValueError: boom", 7)
    assert str(failed) == "task 7 ended as dead_lettered: ValueError: boom"
    errors: list[cronoq.CronoqError] = [
        failed,
        SubmitError("unknown_pool", "unknown pool 'x'", 2),
        SchedulerError("configuration error: bad cron"),
        EventsLagged(3),
    ]
    for err in errors:
        copy = pickle.loads(pickle.dumps(err))
        assert type(copy) is type(err) and str(copy) == str(err) and vars(copy) == vars(err)
    assert str(SubmitError("unknown_pool", "unknown pool 'x'")) == "unknown pool 'x'"
    assert EventsLagged(3).skipped == 3
