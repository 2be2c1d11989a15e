"""Recurring schedules in the engine: occurrences as fixed starts created one ahead, occurrence keys,
overlap policies, template rules, conflicts, replacement, removal and restore."""

from __future__ import annotations

import dataclasses
from typing import Any

import pytest

from cronoq.engine import (
    DepEdge,
    DepOn,
    Engine,
    Overlap,
    PoolConfig,
    Recurring,
    RecurringError,
    RecurringSpec,
    ScheduleChanged,
    Status,
    Task,
)

from .helpers import NO_RETRY, drain, spec, task_of

EVERY_10S = "*/10 * * * * *"  # 6 fields: seconds first


def make(max_workers: int = 10) -> Engine:
    return Engine([PoolConfig("p", max=max_workers, retry=NO_RETRY)])


def schedule(
    cron: str = EVERY_10S,
    *,
    name: str = "sh",
    key: str = "sh",
    overlap: Overlap = Overlap.SKIP,
    **template: Any,
) -> RecurringSpec:
    base = dataclasses.replace(spec(key=key), **template)
    return RecurringSpec(name=name, cron=cron, template=base, overlap=overlap)


def occurrences(engine: Engine) -> list[Task]:
    tasks, _ = engine.list_tasks(pools=None, statuses=None, after=0, limit=100)
    return tasks


def test_first_occurrence_is_created_when_added_and_the_next_when_it_fires() -> None:
    e = make()
    recurring = e.add_recurring(schedule(), 3.0)
    assert recurring.next_start == 10.0
    actions = drain(e).actions
    changed = [a for a in actions if isinstance(a, ScheduleChanged)]
    assert [(c.name, c.recurring) for c in changed] == [("sh", recurring)]
    [first] = occurrences(e)
    assert (first.spec.key, first.spec.start, first.status) == (
        "sh@1970-01-01T00:00:10Z",
        10.0,
        Status.SCHEDULED,
    )
    assert recurring.last_task_id == first.id
    e.tick(10.0)
    first_again, second = occurrences(e)
    assert first_again.status is Status.READY  # no worker
    assert (second.spec.key, second.spec.start) == ("sh@1970-01-01T00:00:20Z", 20.0)
    assert (recurring.next_start, recurring.last_task_id) == (20.0, second.id)


def test_without_a_key_occurrences_have_none_and_deadline_in_is_relative() -> None:
    e = make()
    e.add_recurring(dataclasses.replace(schedule(key=""), deadline_in=5.0), 0.0)
    [first] = occurrences(e)
    assert (first.spec.key, first.spec.deadline) == ("", 15.0)


def test_overlap_skip_skips_an_occurrence_while_the_previous_one_runs() -> None:
    e = make()
    e.add_worker(1, "p", 2, {}, 0.0)
    e.add_recurring(schedule(), 0.0)
    e.tick(10.0)
    assert len(drain(e).dispatches) == 1  # the first occurrence runs (and is not completed)
    e.tick(20.0)
    first, second, third = occurrences(e)
    assert first.status is Status.RUNNING
    assert (second.status, second.message) == (Status.SKIPPED, "previous occurrence still running")
    assert third.status is Status.SCHEDULED
    assert e.snapshot(20.0).totals.skipped == 1


def test_overlap_skip_keeps_skipping_while_the_occurrence_before_a_skipped_one_runs() -> None:
    """A skipped occurrence never ran, so the next one is judged against the one still running: the
    schedule never has two occurrences running at once, however many starts the long run spans."""
    e = make()
    e.add_worker(1, "p", 4, {}, 0.0)
    e.add_recurring(schedule(), 0.0)
    e.tick(10.0)
    [(_, first_lease)] = [(d.task.id, d.lease) for d in drain(e).dispatches]
    e.tick(20.0)
    e.tick(30.0)
    e.tick(40.0)
    first, second, third, fourth, fifth = occurrences(e)
    assert first.status is Status.RUNNING
    assert [t.status for t in (second, third, fourth)] == [Status.SKIPPED] * 3
    assert fifth.status is Status.SCHEDULED
    assert e.snapshot(40.0).totals.skipped == 3
    # Once the long run ends, the next start runs again.
    assert e.complete(1, first_lease, 45.0)
    e.tick(50.0)
    assert occurrences(e)[4].status is Status.RUNNING


def test_overlap_allow_runs_both() -> None:
    e = make()
    e.add_worker(1, "p", 2, {}, 0.0)
    e.add_recurring(schedule(overlap=Overlap.ALLOW), 0.0)
    e.tick(10.0)
    e.tick(20.0)
    first, second, _ = occurrences(e)
    assert (first.status, second.status) == (Status.RUNNING, Status.RUNNING)


def test_overlap_queue_chains_on_completion_even_late() -> None:
    e = make()
    e.add_worker(1, "p", 2, {}, 0.0)
    e.add_recurring(schedule(overlap=Overlap.QUEUE), 0.0)
    e.tick(10.0)
    lease = drain(e).dispatches[0]
    e.tick(20.0)
    first, second, _ = occurrences(e)
    assert second.spec.deps == (DepEdge(first.id, DepOn.COMPLETE),)
    assert second.status is Status.BLOCKED
    e.fail(1, lease.lease, "boom", True, None, 25.0)
    assert task_of(e, second.id).status is Status.RUNNING  # late, but it runs


def test_overlap_queue_on_success_skips_after_a_failure() -> None:
    e = make()
    e.add_worker(1, "p", 2, {}, 0.0)
    e.add_recurring(schedule(overlap=Overlap.QUEUE_ON_SUCCESS), 0.0)
    e.tick(10.0)
    lease = drain(e).dispatches[0]
    e.tick(20.0)
    _, second, _ = occurrences(e)
    e.fail(1, lease.lease, "boom", True, None, 21.0)
    assert task_of(e, second.id).status is Status.SKIPPED


@pytest.mark.parametrize(
    ("template", "field", "code"),
    [
        ({"deps": (DepEdge("x"),)}, "template.deps", "invalid"),
        ({"start": 50.0}, "template.start", "invalid"),
        ({"deadline": 50.0}, "template.deadline", "invalid"),
        ({"pool": "nope"}, "template.pool", "unknown_pool"),
        ({"resources": {"gpu": 1}}, "template.resources", "unknown_resource"),
    ],
)
def test_template_rules(template: dict[str, Any], field: str, code: str) -> None:
    e = make()
    with pytest.raises(RecurringError, match=f"^{field}: ") as err:
        e.add_recurring(RecurringSpec("sh", EVERY_10S, dataclasses.replace(spec(key="sh"), **template)), 0.0)
    assert err.value.code == code
    assert e.list_recurring() == [] and occurrences(e) == []


@pytest.mark.parametrize(
    ("cron", "tz", "field"), [("61 * * * *", "UTC", "cron"), ("* * * * *", "Mars/X", "tz")]
)
def test_bad_cron_or_zone_names_the_field(cron: str, tz: str, field: str) -> None:
    e = make()
    with pytest.raises(RecurringError, match=f"^{field}: ") as err:
        e.add_recurring(dataclasses.replace(schedule(cron), tz=tz), 0.0)
    assert err.value.code == "invalid"
    assert e.list_recurring() == []


def test_an_occurrence_without_a_reservation_is_not_created_and_counted() -> None:
    e = make(max_workers=1)  # one reservation at a time
    e.add_recurring(schedule("* * * * * *"), 0.0)  # every second: windows [s-1, s+2] overlap
    e.tick(1.0)
    assert len(occurrences(e)) == 1
    assert e.snapshot(1.0).totals.recurring_conflicts == 1
    e.tick(2.0)  # the schedule goes on
    assert e.list_recurring()[0].next_start == 3.0


def test_replacing_keeps_the_name_and_stale_timers_do_nothing() -> None:
    e = make()
    e.add_recurring(schedule(), 0.0)
    e.add_recurring(schedule("*/30 * * * * *", key="v2"), 1.0)
    [recurring] = e.list_recurring()
    assert recurring.spec.cron == "*/30 * * * * *"
    e.tick(10.0)  # the replaced schedule's timer must not create an occurrence
    assert [t.spec.key for t in occurrences(e)] == ["sh@1970-01-01T00:00:10Z", "v2@1970-01-01T00:00:30Z"]


@pytest.mark.parametrize("key", ["", "sh"])
@pytest.mark.parametrize("overlap", list(Overlap))
def test_re_adding_a_schedule_unchanged_runs_each_start_once(overlap: Overlap, key: str) -> None:
    """The new schedule takes over the occurrence the replaced one made for the same start: the start
    runs once, not twice (without a key nothing else would catch it), and is not skipped or refused as
    a reservation conflict with itself (a pool of 2 reserves one window)."""
    e = make(max_workers=2)
    e.add_worker(1, "p", 2, {}, 0.0)
    again = schedule(key=key, overlap=overlap)
    e.add_recurring(again, 1.0)
    e.add_recurring(again, 2.0)
    assert len(occurrences(e)) == 1
    e.tick(10.0)
    assert len(drain(e).dispatches) == 1
    e.tick(20.0)  # the adopted occurrence still runs as the new schedule's: its successor follows it
    first, second, third = occurrences(e)
    assert [first.spec.start, second.spec.start, third.spec.start] == [10.0, 20.0, 30.0]
    totals = e.snapshot(20.0).totals
    assert (totals.recurring_conflicts, totals.recurring_skipped) == (0, 0)
    if overlap is Overlap.SKIP:  # the first still runs: judged against it, as the new schedule says
        assert second.status is Status.SKIPPED


def test_a_replacing_schedule_with_another_start_keeps_the_created_occurrence() -> None:
    e = make()
    e.add_recurring(schedule(), 0.0)
    e.add_recurring(schedule(EVERY_10S.replace("*/10", "5-59/10")), 1.0)
    first, second = occurrences(e)
    assert (first.spec.start, first.status) == (10.0, Status.SCHEDULED)
    assert (second.spec.start, second.status) == (5.0, Status.SCHEDULED)


def test_a_schedule_with_a_year_field_ends_with_its_last_year() -> None:
    e = make()
    e.add_worker(1, "p", 2, {}, 0.0)
    # Every 10 s in 1970 only: 1970 ends at 31,536,000.
    last_of_1970 = 31_536_000.0 - 10
    recurring = e.add_recurring(schedule("*/10 * * * * * 1970"), last_of_1970 - 15)
    assert recurring.next_start == last_of_1970 - 10
    e.tick(last_of_1970 - 10)
    assert recurring.next_start == last_of_1970
    e.tick(last_of_1970)
    assert recurring.next_start is None
    assert [t.spec.start for t in occurrences(e)] == [last_of_1970 - 10, last_of_1970]
    e.tick(last_of_1970 + 3600)
    assert len(occurrences(e)) == 2 and e.list_recurring() == [recurring]


def test_a_schedule_whose_years_have_passed_is_refused() -> None:
    e = make()
    with pytest.raises(RecurringError) as raised:
        e.add_recurring(schedule("0 0 0 1 1 * 1970-1972"), 1_000_000_000.0)
    assert "has no start after now" in str(raised.value)
    assert e.list_recurring() == []


def test_remove_stops_new_occurrences_and_cancels_the_one_created_ahead() -> None:
    """Left scheduled, the occurrence created ahead would run once more after the removal."""
    e = make()
    e.add_recurring(schedule(), 3.0)
    [ahead] = occurrences(e)
    drain(e)
    assert e.remove_recurring("sh", 4.0)
    assert not e.remove_recurring("sh", 4.0)
    drained = drain(e)
    assert [a for a in drained.actions if isinstance(a, ScheduleChanged)] == [ScheduleChanged("sh", None)]
    assert [(ev.id, ev.status, ev.message) for ev in drained.events] == [
        (ahead.id, Status.CANCELLED, "cancelled: its recurring schedule was removed")
    ]
    e.tick(10.0)
    e.tick(20.0)
    assert [t.status for t in occurrences(e)] == [Status.CANCELLED] and e.list_recurring() == []
    assert e.snapshot(20.0).pending == 0


def test_remove_keeps_the_occurrences_whose_start_has_come() -> None:
    """Only the occurrence still waiting for its start goes: the one running, and the one queued
    behind it (``overlap = queue``) whose start has passed, were due before the removal and run."""
    e = make()
    e.add_worker(1, "p", 1, {}, 0.0)
    e.add_recurring(schedule(overlap=Overlap.QUEUE), 0.0)
    e.tick(10.0)
    lease = drain(e).dispatches[0]
    e.tick(20.0)
    _, queued, ahead = occurrences(e)
    assert (queued.status, ahead.status) == (Status.BLOCKED, Status.BLOCKED)
    assert e.remove_recurring("sh", 21.0)
    assert [t.status for t in occurrences(e)] == [Status.RUNNING, Status.BLOCKED, Status.CANCELLED]
    e.complete(1, lease.lease, 22.0)
    assert task_of(e, queued.id).status is Status.RUNNING
    assert task_of(e, ahead.id).status is Status.CANCELLED


def test_restored_schedules_continue_and_invalid_ones_are_counted() -> None:
    e = make()
    recurring = e.add_recurring(schedule(), 0.0)
    [first] = occurrences(e)
    broken = Recurring(schedule("not a cron", name="bad"), 10.0, 0)
    fresh = Engine([PoolConfig("p", retry=NO_RETRY)], first_id=1000)
    fresh.restore([dataclasses.replace(first)], 5.0, [dataclasses.replace(recurring), broken])
    assert [r.spec.name for r in fresh.list_recurring()] == ["sh"]
    assert fresh.snapshot(5.0).totals.recurring_invalid == 1
    fresh.tick(10.0)
    keys = [t.spec.key for t in occurrences(fresh)]
    assert keys == ["sh@1970-01-01T00:00:10Z", "sh@1970-01-01T00:00:20Z"]


# --- late timers: downtime before a takeover, a stalled loop ---------------------------------------------


def taken_over(e: Engine, now: float, *, first_id: int = 1000) -> Engine:
    """A new leader that restores ``e``'s tasks and schedules (as a store returns them) at ``now``."""
    fresh = Engine([PoolConfig("p", retry=NO_RETRY)], first_id=first_id)
    tasks = [dataclasses.replace(t) for t in occurrences(e)]
    fresh.restore(tasks, now, [dataclasses.replace(r) for r in e.list_recurring()])
    return fresh


def test_a_takeover_a_day_late_creates_one_occurrence_not_one_per_missed_start() -> None:
    e = make()
    e.add_recurring(schedule("* * * * *"), 0.0)  # its occurrence at 60 is stored, not yet started
    now = 60.0 + 86_400.0 + 30.0  # a day later, mid-minute: no passed start is within tolerance
    fresh = taken_over(e, now)
    fresh.tick(now)
    stored, *created = occurrences(fresh)
    assert (stored.spec.start, stored.status) == (60.0, Status.READY)  # run_late: it stands for the gap
    [ahead] = created
    assert (ahead.spec.start, ahead.status) == (86_520.0, Status.SCHEDULED)
    [recurring] = fresh.list_recurring()
    assert (recurring.next_start, recurring.last_task_id) == (86_520.0, ahead.id)
    assert fresh.snapshot(now).totals.recurring_skipped == 1  # one catch-up, 1,440 starts skipped
    fresh.tick(86_520.0)  # and the schedule goes on as usual
    assert [t.spec.start for t in occurrences(fresh)][-2:] == [86_520.0, 86_580.0]


def test_a_stalled_tick_skips_the_missed_starts_and_counts_them() -> None:
    e = make()
    e.add_recurring(schedule("0 * * * *"), 0.0)
    e.tick(3_600.0)  # on time: the 7,200 occurrence is created
    e.tick(86_400.0 + 1_800.0)  # the loop stalled for a day
    starts = [t.spec.start for t in occurrences(e)]
    assert starts == [3_600.0, 7_200.0, 90_000.0]
    assert e.snapshot(90_000.0).totals.recurring_skipped == 1  # 10,800 ... 86,400, more than a tolerance late


def test_the_latest_passed_start_still_within_tolerance_runs_on_time() -> None:
    e = make()
    e.add_worker(1, "p", 5, {}, 0.0)
    e.add_recurring(schedule(overlap=Overlap.ALLOW, tolerance=1.0), 0.0)
    e.tick(10.0)  # 10 runs, 20 is created
    e.tick(50.5)  # 20 is late; 30 and 40 passed; 50 is half a second late
    by_start = {t.spec.start or 0.0: t for t in occurrences(e)}  # occurrences all have a start
    assert sorted(by_start) == [10.0, 20.0, 50.0, 60.0]
    assert by_start[50.0].status is Status.RUNNING
    assert by_start[60.0].status is Status.SCHEDULED
    assert e.snapshot(50.5).pools[0].fixed_start_hit_rate == pytest.approx(2 / 3)  # 20 was late
    [recurring] = e.list_recurring()
    assert (recurring.next_start, e.snapshot(50.5).totals.recurring_skipped) == (60.0, 1)  # 30 and 40


@pytest.mark.parametrize("key", ["sh", ""])
def test_overlap_skip_still_applies_to_an_occurrence_restored_after_failover(key: str) -> None:
    e = make()
    e.add_recurring(schedule(key=key), 0.0)
    e.tick(10.0)  # no worker: 10 stays READY (run_late), 20 is created
    fresh = taken_over(e, 12.0)
    fresh.tick(20.0)
    first, second, third = occurrences(fresh)
    assert first.status is Status.READY  # still pending
    assert (second.status, second.message) == (Status.SKIPPED, "previous occurrence still running")
    assert third.status is Status.SCHEDULED


# --- an occurrence whose start passed before it was scheduled obeys overlap like an on-time one -------------


@pytest.mark.parametrize(
    ("overlap", "status"),
    [
        (Overlap.SKIP, Status.SKIPPED),
        (Overlap.QUEUE, Status.BLOCKED),
        (Overlap.QUEUE_ON_SUCCESS, Status.BLOCKED),
        (Overlap.ALLOW, Status.RUNNING),
    ],
)
def test_an_occurrence_created_late_obeys_overlap_while_the_previous_one_runs(
    overlap: Overlap, status: Status
) -> None:
    e = make()
    e.add_worker(1, "p", 5, {}, 0.0)
    e.add_recurring(schedule(overlap=overlap), 0.0)
    e.tick(10.0)
    [first] = drain(e).dispatches
    e.complete(1, first.lease, 15.0)
    e.tick(30.5)  # a stalled loop: 20 starts (late) and runs; 30, half a second late, is created now
    by_start = {t.spec.start: t for t in occurrences(e)}
    assert by_start[20.0].status is Status.RUNNING
    late = by_start[30.0]
    assert late.status is status
    if status is Status.SKIPPED:
        assert late.message == "previous occurrence still running"
        assert e.snapshot(30.5).totals.skipped == 1


def test_overlap_skip_judges_an_occurrence_whose_start_passed_during_a_takeover() -> None:
    e = make()
    e.add_recurring(schedule(), 0.0)
    e.tick(10.0)  # no worker: 10 stays READY (run_late), 20 is created
    fresh = taken_over(e, 20.5)  # 20's start passed while no engine led, within its tolerance
    first, second = occurrences(fresh)
    assert first.status is Status.READY
    assert (second.status, second.message) == (Status.SKIPPED, "previous occurrence still running")
