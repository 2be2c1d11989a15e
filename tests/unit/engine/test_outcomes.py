"""Attempt outcomes: success, failures, retry delays, dead letters, timeouts, lease expiry, stale reports,
nacks and cancellation."""

from __future__ import annotations

import random

import pytest

from cronoq.engine import Dispatch, Engine, PoolConfig, RetryRule, Status

from .helpers import FIXED, NO_RETRY, drain, make_engine, only_dispatch, spec, task_of


def engine_with_worker(
    pool: PoolConfig | None = None, slots: int = 1, seed: int = 0
) -> tuple[Engine, Dispatch]:
    """An engine with one worker (id 1) already running one submitted task."""
    engine = make_engine(pool or PoolConfig("p", retry=FIXED), seed=seed)
    engine.add_worker(1, "p", slots, {}, 0.0)
    engine.submit([spec()], 0.0)
    return engine, only_dispatch(engine)


def fail_until_ready(engine: Engine, lease: Dispatch, now: float) -> float:
    """Fail ``lease`` retryably at ``now`` and return the retry delay the engine chose."""
    engine.fail(lease.worker_id, lease.lease, "boom", False, None, now)
    wake = engine.next_wakeup()
    assert wake is not None
    return wake - now


def test_dispatch_carries_lease_attempt_ttl_and_emits_running() -> None:
    engine = make_engine(PoolConfig("p", lease_ttl=30.0))
    [sub] = engine.submit([spec()], 0.0)
    engine.add_worker(7, "p", 1, {}, 2.0)
    actions = drain(engine)
    [lease] = actions.dispatches
    assert (lease.worker_id, lease.lease, lease.attempt, lease.lease_ttl) == (7, 1, 1, 30.0)
    assert lease.task.id == sub.id and lease.task.lease == 1 and lease.task.started == 2.0
    after = actions.actions[actions.actions.index(lease) + 1]  # Dispatch, then its RUNNING event
    assert type(after) is tuple and after[:2] == (Status.RUNNING, 1) and after[4].id == sub.id


def test_lease_ids_start_at_first_lease_and_are_never_reused() -> None:
    engine = Engine([PoolConfig("p", retry=NO_RETRY)], first_lease=500)
    engine.add_worker(1, "p", 2, {}, 0.0)
    engine.add_worker(2, "p", 2, {}, 0.0)
    engine.submit([spec(), spec()], 0.0)
    first = drain(engine).dispatches
    engine.nack(first[0].worker_id, first[0].lease, "no", 0.0)
    engine.complete(first[1].worker_id, first[1].lease, 0.0)
    engine.submit([spec()], 0.0)
    later = drain(engine).dispatches
    leases = [d.lease for d in first + later]
    assert leases == list(range(500, 500 + len(leases)))


def test_complete_succeeds_and_frees_the_slot() -> None:
    engine, lease = engine_with_worker()
    engine.submit([spec()], 0.0)
    assert drain(engine).dispatches == []
    assert engine.complete(1, lease.lease, 1.0)
    actions = drain(engine)
    assert actions.statuses(lease.task.id) == [Status.SUCCEEDED]
    assert len(actions.dispatches) == 1
    assert task_of(engine, lease.task.id).finished == 1.0


def test_permanent_failure_is_failed_with_the_workers_message() -> None:
    engine, lease = engine_with_worker()
    assert engine.fail(1, lease.lease, "bad input", True, None, 1.0)
    task = task_of(engine, lease.task.id)
    assert (task.status, task.message, task.attempt) == (Status.FAILED, "bad input", 1)
    assert engine.snapshot(1.0).totals.failed == 1


def test_retryable_failure_retries_after_exact_backoff_without_jitter() -> None:
    policy = RetryRule(max_attempts=4, initial_backoff=0.1, multiplier=3.0, max_backoff=0.2, jitter=False)
    engine, lease = engine_with_worker(PoolConfig("p", retry=policy))
    now = 0.0
    delays = []
    for attempt in (1, 2, 3):
        assert lease.attempt == attempt
        delay = fail_until_ready(engine, lease, now)
        delays.append(delay)
        assert task_of(engine, lease.task.id).status is Status.RETRYING
        engine.tick(now + delay - 1e-9)
        assert task_of(engine, lease.task.id).status is Status.RETRYING
        now += delay
        engine.tick(now)
        lease = only_dispatch(engine)
    assert delays == pytest.approx([0.1, 0.2, 0.2])
    assert engine.snapshot(now).totals.retries == 3


def test_events_of_a_retry_keep_the_attempt_number() -> None:
    engine, lease = engine_with_worker()
    drain(engine)
    engine.fail(1, lease.lease, "boom", False, None, 0.0)
    engine.tick(1.0)
    events = [(e.status, e.attempt, e.message) for e in drain(engine).events]
    assert events == [(Status.RETRYING, 1, "boom"), (Status.READY, 1, ""), (Status.RUNNING, 2, "")]


def test_jittered_backoff_is_uniform_in_zero_to_b_and_reproducible_with_a_seed() -> None:
    policy = RetryRule(max_attempts=2, initial_backoff=1.0, jitter=True)

    def first_delay(seed: int) -> float:
        engine, lease = engine_with_worker(PoolConfig("p", retry=policy), seed=seed)
        return fail_until_ready(engine, lease, 0.0)

    delays = [first_delay(seed) for seed in range(200)]
    assert all(0.0 <= d <= 1.0 for d in delays)
    assert 0.35 < sum(delays) / len(delays) < 0.65
    assert min(delays) < 0.1 and max(delays) > 0.9
    assert first_delay(42) == first_delay(42) == random.Random(42).uniform(0.0, 1.0)


@pytest.mark.parametrize(("retry_after", "backoff", "expected"), [(0.6, 0.1, 0.6), (0.1, 0.8, 0.8)])
def test_retry_after_is_a_floor_for_the_backoff(retry_after: float, backoff: float, expected: float) -> None:
    policy = RetryRule(max_attempts=2, initial_backoff=backoff, jitter=False)
    engine, lease = engine_with_worker(PoolConfig("p", retry=policy))
    engine.fail(1, lease.lease, "slow down", False, retry_after, 0.0)
    assert engine.next_wakeup() == pytest.approx(expected)


def test_retry_after_with_jitter_never_goes_below_the_floor() -> None:
    policy = RetryRule(max_attempts=2, initial_backoff=1.0, jitter=True)
    for seed in range(50):
        engine, lease = engine_with_worker(PoolConfig("p", retry=policy), seed=seed)
        engine.fail(1, lease.lease, "429", False, 0.5, 0.0)
        wake = engine.next_wakeup()
        assert wake is not None and 0.5 <= wake <= 1.0


def test_zero_backoff_makes_the_task_ready_at_once() -> None:
    policy = RetryRule(max_attempts=2, initial_backoff=0.0, jitter=False)
    engine, lease = engine_with_worker(PoolConfig("p", retry=policy))
    engine.fail(1, lease.lease, "flaky", False, None, 3.0)
    retry = only_dispatch(engine)
    assert (retry.task.id, retry.attempt) == (lease.task.id, 2)


def test_the_last_retryable_failure_dead_letters_with_its_message() -> None:
    policy = RetryRule(max_attempts=2, initial_backoff=0.0, jitter=False)
    engine, lease = engine_with_worker(PoolConfig("p", retry=policy))
    engine.fail(1, lease.lease, "first", False, None, 0.0)
    lease = only_dispatch(engine)
    engine.fail(1, lease.lease, "second", False, None, 0.0)
    task = task_of(engine, lease.task.id)
    assert (task.status, task.message, task.attempt) == (Status.DEAD_LETTERED, "second", 2)
    assert engine.snapshot(0.0).totals.dead_lettered == 1


def test_the_tasks_own_retry_policy_wins_over_the_pools() -> None:
    engine = make_engine(PoolConfig("p", retry=FIXED))
    engine.add_worker(1, "p", 1, {}, 0.0)
    [sub] = engine.submit([spec(retry=NO_RETRY)], 0.0)
    lease = only_dispatch(engine)
    engine.fail(1, lease.lease, "once", False, None, 0.0)
    assert task_of(engine, sub.id).status is Status.DEAD_LETTERED


def test_attempt_timeout_aborts_and_retries() -> None:
    engine = make_engine(PoolConfig("p", retry=FIXED))
    engine.add_worker(1, "p", 1, {}, 0.0)
    [sub] = engine.submit([spec(timeout=5.0)], 10.0)
    lease = only_dispatch(engine)
    assert engine.next_wakeup() == 15.0
    engine.tick(14.9)
    assert drain(engine).aborts == []
    engine.tick(15.0)
    actions = drain(engine)
    assert [(a.worker_id, a.lease, a.reason) for a in actions.aborts] == [
        (1, lease.lease, "attempt timed out")
    ]
    task = task_of(engine, sub.id)
    assert (task.status, task.message) == (Status.RETRYING, "attempt timed out")
    assert engine.snapshot(15.0).totals.timeouts == 1
    assert not engine.complete(1, lease.lease, 15.1)  # the late completion is stale


def test_timeout_zero_times_out_at_the_next_tick() -> None:
    engine = make_engine(PoolConfig("p", retry=NO_RETRY))
    engine.add_worker(1, "p", 1, {}, 0.0)
    [sub] = engine.submit([spec(timeout=0.0)], 1.0)
    assert engine.next_wakeup() == 1.0
    engine.tick(1.0)
    assert task_of(engine, sub.id).status is Status.DEAD_LETTERED


def test_lease_expires_ttl_after_dispatch_without_heartbeat() -> None:
    engine = make_engine(PoolConfig("p", lease_ttl=0.3, retry=FIXED))
    engine.add_worker(1, "p", 1, {}, 0.0)
    [sub] = engine.submit([spec()], 1.0)
    lease = only_dispatch(engine)
    assert engine.next_wakeup() == pytest.approx(1.3)
    engine.tick(1.3)
    assert [(a.lease, a.reason) for a in drain(engine).aborts] == [(lease.lease, "lease expired")]
    task = task_of(engine, sub.id)
    assert (task.status, task.message) == (Status.RETRYING, "lease expired")
    assert engine.snapshot(1.3).totals.lease_expiries == 1


def test_heartbeats_extend_the_lease() -> None:
    engine = make_engine(PoolConfig("p", lease_ttl=2.0))
    engine.add_worker(1, "p", 1, {}, 0.0)
    engine.submit([spec()], 0.0)
    lease = only_dispatch(engine)
    for t in (1.5, 3.0, 4.5):
        assert engine.heartbeat(1, lease.lease, t)
        engine.tick(t)
    assert engine.next_wakeup() == pytest.approx(6.5)
    engine.tick(6.4)
    assert drain(engine).aborts == []
    engine.tick(6.5)
    assert len(drain(engine).aborts) == 1


def test_timeout_is_not_extended_by_heartbeats() -> None:
    engine = make_engine(PoolConfig("p", lease_ttl=2.0, retry=NO_RETRY))
    engine.add_worker(1, "p", 1, {}, 0.0)
    engine.submit([spec(timeout=3.0)], 0.0)
    lease = only_dispatch(engine)
    engine.heartbeat(1, lease.lease, 1.5)
    engine.tick(3.0)
    assert [a.reason for a in drain(engine).aborts] == ["attempt timed out"]


def test_stale_reports_change_nothing_but_the_stale_counter() -> None:
    engine, lease = engine_with_worker(slots=2)
    engine.add_worker(2, "p", 1, {}, 0.0)
    drain(engine)
    before = engine.snapshot(1.0)
    assert not engine.complete(2, lease.lease, 1.0)  # not its lease
    assert not engine.fail(1, 999, "?", True, None, 1.0)  # unknown lease
    assert not engine.nack(2, lease.lease, "no", 1.0)
    assert not engine.cancelled(2, lease.lease, 1.0)
    assert not engine.heartbeat(2, lease.lease, 1.0)
    assert engine.take_actions() == []
    after = engine.snapshot(1.0)
    assert after.totals.stale_completions == before.totals.stale_completions + 5
    after.totals.stale_completions = before.totals.stale_completions
    assert after == before
    assert engine.complete(1, lease.lease, 1.0)
    assert not engine.complete(1, lease.lease, 1.0)  # a second outcome for the same lease
    assert engine.snapshot(1.0).totals.stale_completions == 6


def test_nack_offers_the_same_attempt_to_another_worker() -> None:
    engine, lease = engine_with_worker()
    engine.add_worker(2, "p", 1, {}, 0.0)
    assert engine.nack(1, lease.lease, "busy", 1.0)
    again = only_dispatch(engine)
    assert (again.worker_id, again.attempt, again.task.id) == (2, 1, lease.task.id)
    assert again.lease != lease.lease
    assert task_of(engine, lease.task.id).status is Status.RUNNING
    assert engine.snapshot(1.0).totals.dispatched == 1  # no new attempt counted
    assert not engine.complete(1, lease.lease, 1.0)
    assert engine.complete(2, again.lease, 1.0)


def test_nack_skips_workers_that_refused_the_attempt_and_fails_when_none_is_left() -> None:
    engine, lease = engine_with_worker(slots=2)
    engine.add_worker(2, "p", 1, {}, 0.0)
    engine.nack(1, lease.lease, "no gpu", 1.0)
    second = only_dispatch(engine)
    assert second.worker_id == 2
    engine.nack(2, second.lease, "no disk", 2.0)  # worker 1 has a free slot but refused already
    task = task_of(engine, lease.task.id)
    assert (task.status, task.message, task.attempt) == (Status.RETRYING, "no disk", 1)
    assert drain(engine).dispatches == []


def test_nack_without_another_worker_fails_the_attempt() -> None:
    engine, lease = engine_with_worker(PoolConfig("p", retry=NO_RETRY))
    engine.nack(1, lease.lease, "cannot run this", 1.0)
    task = task_of(engine, lease.task.id)
    assert (task.status, task.message) == (Status.DEAD_LETTERED, "cannot run this")


def test_nack_respects_labels() -> None:
    engine = make_engine(PoolConfig("p", retry=NO_RETRY))
    engine.add_worker(1, "p", 1, {"gpu": "1"}, 0.0)
    engine.add_worker(2, "p", 1, {}, 0.0)
    engine.submit([spec(labels={"gpu": "1"})], 0.0)
    lease = only_dispatch(engine)
    engine.nack(1, lease.lease, "busy", 1.0)
    assert task_of(engine, lease.task.id).status is Status.DEAD_LETTERED


def test_worker_cancelled_ends_the_task_cancelled_without_retry() -> None:
    engine, lease = engine_with_worker()
    assert engine.cancelled(1, lease.lease, 1.0)
    task = task_of(engine, lease.task.id)
    assert task.status is Status.CANCELLED and task.attempt == 1
    assert engine.snapshot(1.0).totals.cancelled == 1


def test_cancel_a_running_task_aborts_it_and_frees_the_slot() -> None:
    engine, lease = engine_with_worker()
    [waiting] = engine.submit([spec()], 0.0)
    assert engine.cancel(lease.task.id, 2.0)
    actions = drain(engine)
    assert [(a.worker_id, a.lease, a.reason) for a in actions.aborts] == [(1, lease.lease, "cancelled")]
    task = task_of(engine, lease.task.id)
    assert (task.status, task.message, task.attempt) == (Status.CANCELLED, "cancelled", 1)
    assert actions.dispatched_ids() == [waiting.id]
    assert not engine.complete(1, lease.lease, 2.0)


def test_cancel_by_key_of_ready_and_retrying_tasks() -> None:
    engine, lease = engine_with_worker()
    [queued] = engine.submit([spec(key="q")], 0.0)
    assert engine.cancel("q", 1.0)
    engine.fail(1, lease.lease, "boom", False, None, 1.0)
    assert engine.cancel(lease.task.id, 1.5)
    assert task_of(engine, lease.task.id).status is Status.CANCELLED
    engine.tick(100.0)
    assert drain(engine).dispatches == []
    assert task_of(engine, queued.id).status is Status.CANCELLED
    assert engine.next_wakeup() is not None  # only retention is left
    assert engine.pending_count("p") == 0


def test_cancel_of_finished_or_unknown_tasks_is_false() -> None:
    engine, lease = engine_with_worker()
    engine.complete(1, lease.lease, 1.0)
    assert not engine.cancel(lease.task.id, 2.0)
    assert not engine.cancel(12345, 2.0)
    assert not engine.cancel("nobody", 2.0)
    assert task_of(engine, lease.task.id).status is Status.SUCCEEDED


def test_next_wakeup_ignores_timers_that_no_longer_apply() -> None:
    engine = make_engine(PoolConfig("p", lease_ttl=10.0, retry=FIXED))
    assert engine.next_wakeup() is None
    engine.add_worker(1, "p", 1, {}, 0.0)
    engine.submit([spec(timeout=5.0)], 0.0)
    lease = only_dispatch(engine)
    assert engine.next_wakeup() == 5.0
    engine.complete(1, lease.lease, 1.0)
    assert engine.next_wakeup() == 1.0 + 86_400.0  # retention of the finished task only


def test_timers_of_ended_leases_do_not_pile_up() -> None:
    engine = make_engine(PoolConfig("p", lease_ttl=3600.0))
    engine.add_worker(1, "p", 1, {}, 0.0)
    for i in range(5000):
        engine.submit([spec(timeout=3600.0)], float(i))
        engine.complete(1, only_dispatch(engine).lease, float(i))
    assert len(engine._timers) < 2000  # memory stays bounded: dead entries are compacted away
    assert engine.next_wakeup() == 86_400.0  # no timer is live: only retention of the first task
