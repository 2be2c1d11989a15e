"""The autoscaler against the values observed on the reference engine (engine-behaviour §6)."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest

from cronoq.engine import AutoscaleRule, Priority
from cronoq.engine.autoscale import Autoscaler, slots

# Lifts the step-up limit so that one evaluation shows the formula's value on its own.
UNLIMITED_UP = AutoscaleRule(max_step_up_abs=10_000)
# No smoothing on the way down either: every evaluation's target is the formula's value.
UNSMOOTHED = replace(UNLIMITED_UP, stabilization_window=0.0, cooldown=0.0, max_step_down=10_000)


def class_backlog(cls: Priority, count: int) -> list[int]:
    backlog = [0, 0, 0, 0]
    backlog[cls] = count
    return backlog


def burst(
    config: AutoscaleRule,
    tasks: int,
    *,
    cls: Priority = Priority.NORMAL,
    reserved: int = 0,
    max_workers: int = 1000,
) -> int | None:
    """Start (first evaluation at 0, no load), then ``tasks`` arrive at once and one of them runs: the
    target returned by the evaluation one interval later, with S = 1."""
    scaler = Autoscaler(config, 1, max_workers, 1.0)
    assert (
        scaler.evaluate(0.0, arrivals=0, service_time=None, backlog=[0] * 4, capacity=1, reserved=0) is None
    )
    return scaler.evaluate(
        1.0,
        arrivals=tasks,
        service_time=1.0,
        backlog=class_backlog(cls, tasks - 1),
        capacity=1,
        reserved=reserved,
    )


def idle(scaler: Autoscaler, now: float, capacity: int) -> int | None:
    return scaler.evaluate(now, arrivals=0, service_time=1.0, backlog=[0] * 4, capacity=capacity, reserved=0)


def test_slots_ignores_negligible_demand_and_rounds_up() -> None:
    assert [slots(x) for x in (0.0, 0.0099, 0.01, 1.0, 1.2, 40.0)] == [0, 0, 1, 1, 2, 40]


def test_thirty_tasks_in_one_burst_need_forty_for_the_rate_plus_one_for_the_backlog() -> None:
    # lambda = 30/s, S = 1: 30 / 0.75 = 40; backlog 29 * 1 / 30 s -> 1
    assert burst(UNLIMITED_UP, 30) == 41


def test_sixty_tasks_need_eighty_two() -> None:
    assert burst(UNLIMITED_UP, 60) == 82  # 60 / 0.75 = 80, 59 / 30 -> 2


def test_lower_target_utilization_needs_more_workers_for_the_same_rate() -> None:
    assert burst(replace(UNLIMITED_UP, target_utilization=0.5), 30) == 61  # 30 / 0.5 = 60, + 1


def test_shorter_drain_time_needs_more_workers_for_the_same_backlog() -> None:
    assert burst(replace(UNLIMITED_UP, drain_time=10.0), 30) == 43  # 40 + ceil(29 / 10)


def test_a_class_slo_wins_when_it_needs_more_than_rate_and_drain() -> None:
    config = replace(UNLIMITED_UP, slo={Priority.NORMAL: 0.1})
    assert burst(config, 30) == 290  # 29 * 1 / 0.1


def test_a_low_class_slo() -> None:
    config = replace(UNLIMITED_UP, slo={Priority.LOW: 0.5})
    assert burst(config, 30, cls=Priority.LOW) == 58  # 29 / 0.5, above base 41


def test_an_slo_counts_only_its_own_class_backlog() -> None:
    config = replace(UNLIMITED_UP, slo={Priority.LOW: 0.5})
    assert burst(config, 30, cls=Priority.HIGH) == 41  # no Low backlog: base wins


def test_reservations_add_to_the_queue_demand() -> None:
    assert burst(UNLIMITED_UP, 30, reserved=5) == 46


def test_reservations_alone_are_the_target_from_the_first_evaluation() -> None:
    scaler = Autoscaler(AutoscaleRule(), 1, 10, 1.0)
    assert scaler.evaluate(0.0, arrivals=0, service_time=None, backlog=[0] * 4, capacity=1, reserved=5) == 5


def test_ewma_decay_after_a_burst() -> None:
    """The observed series 83, 57, 40 ... 4 with S = 0.2: 305 arrivals in the first second (a backlog of
    at most 150 left behind adds 1), then nothing, so lambda falls by 1 - alpha = 0.7 per evaluation:
    305 * 0.2 / 0.75 = 81.3 -> 82 (+1), then 56.9 -> 57, 39.9 -> 40, 27.9 -> 28, 19.5 -> 20 ..."""
    scaler = Autoscaler(UNSMOOTHED, 1, 1000, 1.0)
    scaler.evaluate(0.0, arrivals=0, service_time=0.2, backlog=[0] * 4, capacity=1, reserved=0)
    targets = [
        scaler.evaluate(1.0, arrivals=305, service_time=0.2, backlog=[0, 0, 100, 0], capacity=1, reserved=0)
    ]
    for t in range(2, 11):
        targets.append(
            scaler.evaluate(float(t), arrivals=0, service_time=0.2, backlog=[0] * 4, capacity=83, reserved=0)
        )
    assert targets == [83, 57, 40, 28, 20, 14, 10, 7, 5, 4]


def test_scale_up_steps_are_the_larger_of_capacity_times_ratio_and_the_absolute_step() -> None:
    scaler = Autoscaler(AutoscaleRule(), 1, 100, 1.0)
    assert idle(scaler, 0.0, 1) is None
    targets = []
    for t in range(1, 5):
        capacity = scaler.desired  # library mode: capacity follows the target
        targets.append(
            scaler.evaluate(
                float(t),
                arrivals=100,
                service_time=1.0,
                backlog=[0, 0, 100, 0],
                capacity=capacity,
                reserved=0,
            )
        )
    assert targets == [5, 10, 20, 40]  # +max(1, 4), +max(5, 4), +max(10, 4), +max(20, 4)


def test_scale_up_ratio_counts_whole_workers() -> None:
    scaler = Autoscaler(replace(AutoscaleRule(), max_step_up_abs=1, max_step_up_ratio=0.5), 1, 100, 1.0)
    assert (
        scaler.evaluate(0.0, arrivals=0, service_time=1.0, backlog=[0, 0, 90, 0], capacity=3, reserved=0) == 2
    )


def test_scale_down_waits_for_the_window_then_steps_once_per_cooldown() -> None:
    config = replace(UNLIMITED_UP, stabilization_window=2.0, cooldown=1.0, max_step_down=3)
    assert burst(config, 30) == 41  # at t = 1; the load vanishes after it
    scaler = Autoscaler(config, 1, 1000, 1.0)
    idle(scaler, 0.0, 1)
    scaler.evaluate(1.0, arrivals=30, service_time=1.0, backlog=[0, 0, 29, 0], capacity=1, reserved=0)
    # raw: 28 at t=2, 20 at t=3, 14 at t=4 ...; 41 (t=1) stays in the 2 s window until t=3
    assert [idle(scaler, float(t), scaler.desired) for t in range(2, 7)] == [None, 38, 35, 32, 29]


def test_scale_down_goes_no_lower_than_the_window_peak() -> None:
    config = replace(AutoscaleRule(), stabilization_window=0.0, cooldown=0.0, max_step_down=100)
    scaler = Autoscaler(config, 1, 100, 1.0)
    assert (
        scaler.evaluate(0.0, arrivals=0, service_time=1.0, backlog=[0, 0, 0, 0], capacity=1, reserved=4) == 4
    )
    assert (
        scaler.evaluate(1.0, arrivals=0, service_time=1.0, backlog=[0, 0, 0, 0], capacity=4, reserved=2) == 2
    )


def test_default_config_steps_down_by_one_every_thirty_seconds_after_a_minute() -> None:
    scaler = Autoscaler(AutoscaleRule(), 1, 100, 1.0)
    assert scaler.evaluate(0.0, arrivals=0, service_time=1.0, backlog=[0] * 4, capacity=1, reserved=4) == 4
    downs = {t: idle(scaler, float(t), scaler.desired) for t in range(1, 121)}
    assert {t: d for t, d in downs.items() if d is not None} == {60: 3, 90: 2, 120: 1}


def test_target_is_clamped_to_max() -> None:
    assert burst(UNLIMITED_UP, 30, max_workers=10) == 10


def test_target_is_clamped_to_min_and_starts_there() -> None:
    scaler = Autoscaler(UNSMOOTHED, 3, 10, 1.0)
    assert scaler.desired == 3
    assert idle(scaler, 0.0, 3) is None  # raw 0 clamped to 3: unchanged
    assert scaler.evaluate(1.0, arrivals=3, service_time=1.0, backlog=[0] * 4, capacity=3, reserved=0) == 4
    assert [idle(scaler, float(t), scaler.desired) for t in (2, 3, 4)] == [
        3,
        None,
        None,
    ]  # raw 3 (lambda 2.1), 2 -> 3, 2 -> 3


def test_an_unchanged_target_is_not_reported_again() -> None:
    scaler = Autoscaler(UNLIMITED_UP, 1, 100, 1.0)
    idle(scaler, 0.0, 1)
    results = [
        scaler.evaluate(float(t), arrivals=30, service_time=1.0, backlog=[0] * 4, capacity=40, reserved=0)
        for t in (1, 2, 3)
    ]
    assert results == [40, None, None]  # a steady 30/s keeps lambda at 30
    assert scaler.desired == 40


def test_without_an_observed_service_time_the_pool_default_duration_is_used() -> None:
    scaler = Autoscaler(UNLIMITED_UP, 1, 1000, 2.0)
    idle(scaler, 0.0, 1)
    assert scaler.evaluate(1.0, arrivals=30, service_time=None, backlog=[0] * 4, capacity=1, reserved=0) == 80


def test_arrivals_without_elapsed_time_count_in_the_next_sample() -> None:
    scaler = Autoscaler(UNLIMITED_UP, 1, 1000, 1.0)
    assert (
        scaler.evaluate(0.0, arrivals=30, service_time=1.0, backlog=[0] * 4, capacity=1, reserved=0) is None
    )
    assert idle(scaler, 1.0, 1) == 40  # lambda = 30 / 1 s


def test_rate_is_per_second_of_elapsed_time() -> None:
    scaler = Autoscaler(UNLIMITED_UP, 1, 1000, 1.0)
    idle(scaler, 0.0, 1)
    assert scaler.evaluate(2.0, arrivals=30, service_time=1.0, backlog=[0] * 4, capacity=1, reserved=0) == 20


def test_first_evaluation_is_due_at_once_then_every_interval() -> None:
    scaler = Autoscaler(replace(AutoscaleRule(), interval=5.0), 1, 10, 1.0)
    assert scaler.due_at == -math.inf
    idle(scaler, 100.0, 1)
    assert scaler.due_at == 105.0
    idle(scaler, 105.5, 1)  # a late tick: the next interval counts from it
    assert scaler.due_at == 110.5


def test_min_above_max_is_refused() -> None:
    with pytest.raises(ValueError, match="min_workers"):
        Autoscaler(AutoscaleRule(), 5, 4, 1.0)


def test_service_time_scales_every_term() -> None:
    config = replace(UNLIMITED_UP, slo={Priority.HIGH: 1.0})
    scaler = Autoscaler(config, 1, 10_000, 1.0)
    idle(scaler, 0.0, 1)
    target = scaler.evaluate(
        1.0, arrivals=15, service_time=4.0, backlog=[0, 20, 0, 0], capacity=1, reserved=0
    )
    assert target == max(math.ceil(15 * 4 / 0.75) + math.ceil(20 * 4 / 30), 20 * 4) == 83
