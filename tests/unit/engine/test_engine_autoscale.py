"""The engine drives each autoscaled pool's Autoscaler: inputs from its own state, ``Scale`` actions
when the target changes, ``desired`` in the snapshot. (The formula itself: test_autoscale.py.)"""

from __future__ import annotations

import dataclasses

import pytest

from cronoq.engine import AutoscaleRule, Engine, MissPolicy, PoolConfig, Scale

from .helpers import NO_RETRY, drain, spec, task_of


def scaled_engine(**config: object) -> Engine:
    autoscale = AutoscaleRule(max_step_up_abs=1000, **config)  # type: ignore[arg-type]
    return Engine([PoolConfig("p", min=1, max=1000, retry=NO_RETRY, autoscale=autoscale)])


def scales(engine: Engine) -> list[Scale]:
    return [a for a in drain(engine).actions if isinstance(a, Scale)]


def test_a_burst_of_30_with_one_running_wants_41() -> None:
    engine = scaled_engine()
    assert engine.next_wakeup() == 0.0  # the first evaluation is due at once
    engine.tick(0.0)
    engine.add_worker(1, "p", 1, {}, 0.0)
    engine.submit([spec() for _ in range(30)], 0.5)
    drain(engine)
    assert engine.next_wakeup() == 1.0
    engine.tick(1.0)
    assert scales(engine) == [Scale("p", 41)]
    assert engine.snapshot(1.0).pools[0].desired == 41
    engine.tick(2.0)
    assert engine.snapshot(2.0).pools[0].desired == 41


def test_upcoming_fixed_starts_add_their_reservations() -> None:
    engine = scaled_engine()
    engine.tick(0.0)
    fixed = [
        dataclasses.replace(spec(), start=30.0 + 0.1 * i, tolerance=1.0, on_miss=MissPolicy.SKIP)
        for i in range(5)
    ]
    engine.submit(fixed, 0.5)
    engine.tick(1.0)
    assert scales(engine) == [Scale("p", 5)]


def test_pools_without_autoscaling_report_capacity_as_desired_and_emit_nothing() -> None:
    engine = Engine([PoolConfig("p", retry=NO_RETRY)])
    assert engine.next_wakeup() is None
    engine.add_worker(1, "p", 3, {}, 0.0)
    engine.submit([spec() for _ in range(30)], 0.0)
    engine.tick(5.0)
    assert scales(engine) == [] and engine.snapshot(5.0).pools[0].desired == 3


def test_the_first_target_moves_from_the_capacity_the_pool_starts_with() -> None:
    below = Engine([PoolConfig("p", min=2, max=4, initial=0, retry=NO_RETRY, autoscale=AutoscaleRule())])
    assert below.snapshot(0.0).pools[0].desired == 0
    below.add_worker(1, "p", 0, {}, 0.0)
    below.tick(0.0)
    assert scales(below) == [Scale("p", 2)]  # min, at the first evaluation
    # Without an initial capacity (the server: remote workers come later) the target starts at min.
    server = scaled_engine()
    server.tick(0.0)
    assert scales(server) == [] and server.snapshot(0.0).pools[0].desired == 1


# --- fixed starts missed before they were ever scheduled: no phantom backlog -----------------------------


def unscaled_start() -> Engine:
    """An autoscaled pool that may scale to zero, evaluated once with nothing to do: any later target
    other than 0 comes from backlog the engine believes it has."""
    engine = Engine([PoolConfig("p", min=0, max=10, retry=NO_RETRY, autoscale=AutoscaleRule())])
    engine.tick(0.0)
    assert scales(engine) == []
    return engine


@pytest.mark.parametrize("on_miss", [MissPolicy.SKIP, MissPolicy.FAIL])
def test_a_fixed_start_submitted_past_its_tolerance_leaves_no_backlog(on_miss: MissPolicy) -> None:
    engine = unscaled_start()
    missed = dataclasses.replace(spec(), start=10.0, tolerance=1.0, on_miss=on_miss)
    engine.submit([missed], 50.0)
    engine.tick(51.0)
    assert scales(engine) == []  # it was counted out of the waiting tasks twice: a backlog of one


def test_a_restored_fixed_start_past_its_tolerance_leaves_no_backlog() -> None:
    old = Engine([PoolConfig("p", retry=NO_RETRY)])
    [scheduled] = old.submit([dataclasses.replace(spec(), start=10.0, on_miss=MissPolicy.SKIP)], 0.0)
    engine = unscaled_start()
    engine.restore([dataclasses.replace(task_of(old, scheduled.id))], 50.0)
    engine.tick(51.0)
    assert scales(engine) == []  # it was counted out of the waiting tasks without being counted in
