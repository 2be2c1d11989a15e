"""Resources gating dispatch: submit validation, all-or-nothing takes, token refill and wake-up times."""

from __future__ import annotations

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cronoq.engine import Semaphore, TokenBucket
from cronoq.engine.resources import Resources

UNIX = 1_700_000_000.1  # a present-day timestamp: floats there resolve only about 0.24 us


def dispatch_times(resources: Resources, amounts: dict[str, int], count: int, start: float) -> list[float]:
    """Drive the resources as the engine does: take when possible, else wait until the refill of the
    resource the refused take names."""
    times: list[float] = []
    now = start
    while len(times) < count:
        short = resources.take(amounts, now)
        if short is None:
            times.append(now)
        else:
            wake = resources.refill_at(short, amounts[short], now)
            assert wake > now
            now = wake
    return times


# ------------------------------------------------------------------------------------------ validation


def test_check_accepts_known_resources_within_capacity() -> None:
    resources = Resources([Semaphore("db", 2), TokenBucket("api", 4.0, 2.0)])
    assert resources.check({"db": 2, "api": 2}) is None
    assert resources.check({}) is None


def test_check_refuses_an_unknown_resource() -> None:
    resources = Resources([Semaphore("db", 2)])
    assert resources.check({"db": 1, "gpu": 1}) == ("unknown_resource", "unknown resource 'gpu'")


@pytest.mark.parametrize("amounts", [{"db": 3}, {"api": 3}])
def test_check_refuses_more_than_permits_or_burst(amounts: dict[str, int]) -> None:
    resources = Resources([Semaphore("db", 2), TokenBucket("api", 4.0, 2.5)])
    name = next(iter(amounts))
    assert resources.check(amounts) == (
        "resource_exceeds_capacity",
        f"requested amount exceeds capacity of resource '{name}'",
    )


@pytest.mark.parametrize("amount", [0, -1])
def test_check_refuses_an_amount_below_one(amount: int) -> None:
    resources = Resources([Semaphore("db", 2)])
    assert resources.check({"db": amount}) == ("invalid", "invalid task: resource amount must be > 0")


def test_check_reports_the_first_problem_in_request_order() -> None:
    resources = Resources([Semaphore("db", 2)])
    assert resources.check({"gpu": 1, "db": 0}) == ("unknown_resource", "unknown resource 'gpu'")
    assert resources.check({"db": 0, "gpu": 1}) == ("invalid", "invalid task: resource amount must be > 0")


@pytest.mark.parametrize(
    ("configs", "message"),
    [
        ([Semaphore("x", 1), TokenBucket("x", 1.0, 1.0)], "duplicate resource name 'x'"),
        ([Semaphore("x", 0)], "permits must be >= 1"),
        ([TokenBucket("x", 0.0, 1.0)], "rate must be a finite number > 0"),
        ([TokenBucket("x", float("inf"), 1.0)], "rate must be a finite number > 0"),
        ([TokenBucket("x", 1.0, 0.5)], "burst must be a finite number >= 1"),
    ],
)
def test_invalid_configurations_are_refused(configs: list[Semaphore | TokenBucket], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        Resources(configs)


# ----------------------------------------------------------------------------------------- semaphores


def test_semaphore_holds_at_most_its_permits_until_released() -> None:
    resources = Resources([Semaphore("db", 3)])
    assert resources.take({"db": 2}, 0.0) is None
    assert resources.take({"db": 2}, 0.0) == "db"
    assert resources.take({"db": 1}, 0.0) is None
    assert resources.take({"db": 1}, 0.0) == "db"
    resources.release({"db": 2})
    assert resources.room("db", 0.0) == 2
    assert resources.take({"db": 2}, 0.0) is None


def test_a_take_is_all_or_nothing() -> None:
    resources = Resources([Semaphore("db", 2), Semaphore("gpu", 1)])
    assert resources.take({"gpu": 1}, 0.0) is None
    assert resources.take({"db": 2, "gpu": 1}, 0.0) == "gpu"
    assert resources.room("db", 0.0) == 2  # nothing taken from db by the refused request
    assert resources.room("gpu", 0.0) == 0


def test_a_refused_take_leaves_buckets_untouched() -> None:
    resources = Resources([TokenBucket("api", 1.0, 1.0), Semaphore("db", 1)])
    assert resources.take({"db": 1}, 0.0) is None
    assert resources.take({"api": 1, "db": 1}, 0.0) == "db"
    assert resources.room("api", 0.0) == 1


def test_a_request_without_resources_always_goes() -> None:
    resources = Resources([])
    assert resources.take({}, 0.0) is None


# -------------------------------------------------------------------------------------- token buckets


def test_rate_four_burst_two_gives_two_at_once_then_one_every_quarter_second() -> None:
    resources = Resources([TokenBucket("api", 4.0, 2.0)])
    assert dispatch_times(resources, {"api": 1}, 6, 0.0) == [0.0, 0.0, 0.25, 0.5, 0.75, 1.0]


def test_refill_at_names_the_refill_time_and_not_a_moment_earlier() -> None:
    resources = Resources([TokenBucket("api", 4.0, 2.0)])
    assert resources.take({"api": 2}, 10.0) is None
    assert resources.refill_at("api", 1, 10.0) == 10.25
    assert resources.refill_at("api", 2, 10.0) == 10.5
    assert resources.take({"api": 1}, 10.249) == "api"
    assert resources.take({"api": 1}, 10.25) is None


def test_burst_survives_float_rounding_at_unix_timestamps() -> None:
    resources = Resources([TokenBucket("api", 3.0, 5.0)])
    assert dispatch_times(resources, {"api": 1}, 5, UNIX) == [UNIX] * 5
    later = UNIX + 100.0  # idle long enough to refill to exactly 5 again
    assert dispatch_times(resources, {"api": 1}, 5, later) == [later] * 5


def test_every_wake_up_time_succeeds_with_an_awkward_rate() -> None:
    resources = Resources([TokenBucket("api", 3.0, 2.0)])
    times = dispatch_times(resources, {"api": 1}, 302, UNIX)  # asserts each wake-up lets the take through
    assert times[:2] == [UNIX, UNIX]
    # the rate holds exactly: waking a fraction of a microsecond late (the next float) costs nothing
    assert times[301] - times[1] == pytest.approx(100.0, abs=1e-6)


def test_refill_stops_at_burst() -> None:
    resources = Resources([TokenBucket("api", 4.0, 2.0)])
    assert dispatch_times(resources, {"api": 1}, 2, 0.0) == [0.0, 0.0]
    assert dispatch_times(resources, {"api": 1}, 3, 100.0) == [100.0, 100.0, 100.25]


def test_a_dispatch_consumes_its_amount_of_tokens() -> None:
    resources = Resources([TokenBucket("api", 2.0, 3.0)])
    assert resources.take({"api": 3}, 0.0) is None
    assert resources.refill_at("api", 3, 0.0) == 1.5
    assert resources.room("api", 1.0) == 2


def test_release_does_not_give_tokens_back() -> None:
    resources = Resources([TokenBucket("api", 1.0, 1.0)])
    assert resources.take({"api": 1}, 0.0) is None
    resources.release({"api": 1})
    assert resources.take({"api": 1}, 0.5) == "api"


def test_refill_at_is_now_once_the_tokens_are_there() -> None:
    resources = Resources([TokenBucket("api", 1.0, 1.0)])
    assert resources.refill_at("api", 1, 3.0) == 3.0  # full since for ever
    assert resources.take({"api": 1}, 3.0) is None
    assert resources.refill_at("api", 1, 5.0) == 5.0  # refilled at 4.0


# ------------------------------------------------------------------------------------ mixed requests


def test_a_short_semaphore_is_named_before_a_short_bucket() -> None:
    # Only a release helps a semaphore, and a release wakes its waiters; a task parked on the bucket
    # would wait for a refill that finds the semaphore still short, and no release would wake it.
    resources = Resources([TokenBucket("api", 1.0, 1.0), Semaphore("db", 1)])
    assert resources.take({"api": 1, "db": 1}, 0.0) is None
    assert resources.take({"api": 1, "db": 1}, 0.0) == "db"
    resources.release({"db": 1})
    assert resources.take({"api": 1, "db": 1}, 0.0) == "api"
    assert resources.refill_at("api", 1, 0.0) == 1.0


def test_the_bucket_that_refills_last_is_named() -> None:
    resources = Resources([TokenBucket("fast", 10.0, 1.0), TokenBucket("slow", 0.5, 1.0)])
    assert resources.take({"fast": 1, "slow": 1}, 0.0) is None
    assert resources.take({"fast": 1, "slow": 1}, 0.0) == "slow"
    assert resources.refill_at("slow", 1, 0.0) == 2.0
    assert resources.take({"fast": 1, "slow": 1}, 1.0) == "slow"  # fast has refilled by then
    assert resources.refill_at("fast", 1, 0.0) == 0.1


def test_refills_tells_buckets_from_semaphores() -> None:
    resources = Resources([TokenBucket("api", 4.0, 2.0), Semaphore("db", 3)])
    assert resources.refills("api") and not resources.refills("db")
    assert resources.take({"api": 2, "db": 1}, 0.0) is None
    assert (resources.room("api", 0.125), resources.room("db", 0.125)) == (Fraction(1, 2), Fraction(2))


# ------------------------------------------------------------------------------ exact against a model


class ExactBucket:
    """The token bucket in rational arithmetic only, as the engine's was before its float fast path."""

    def __init__(self, rate: float, burst: float) -> None:
        self.rate, self.burst = Fraction(rate), Fraction(burst)
        self.empty_at: Fraction | None = None

    def tokens(self, now: Fraction) -> Fraction:
        return self.burst if self.empty_at is None else min(self.burst, (now - self.empty_at) * self.rate)

    def take(self, amount: int, now: float) -> bool:
        exact = Fraction(now)
        if self.tokens(exact) < amount:
            return False
        full_since = exact - self.burst / self.rate
        start = full_since if self.empty_at is None else max(self.empty_at, full_since)
        self.empty_at = start + amount / self.rate
        return True


@settings(max_examples=300, deadline=None)
@given(
    rate=st.sampled_from([0.3, 1.0, 3.0, 7.0, 1000.0, 1e9]),
    burst=st.sampled_from([1.0, 2.0, 3.5, 100.0]),
    start=st.sampled_from([0.0, 1e6, UNIX]),
    steps=st.lists(
        st.tuples(st.sampled_from([0.0, 1e-9, 1e-7, 0.001, 0.1, 0.5, 1.0, 3.0, 1000.0]), st.integers(1, 3)),
        min_size=1,
        max_size=40,
    ),
)
def test_takes_and_tokens_match_exact_arithmetic(
    rate: float, burst: float, start: float, steps: list[tuple[float, int]]
) -> None:
    """Whatever the rate, burst, time scale and spacing of the takes (a bucket that is always full, one
    that is always short, or in between), every take is granted or refused exactly as in rational
    arithmetic, and the bucket holds exactly as many tokens after it: the float shortcut for a full
    bucket never grants a take early nor changes the state it leaves."""
    resources = Resources([TokenBucket("api", rate, burst)])
    model = ExactBucket(rate, burst)
    now = start
    for step, (gap, amount) in enumerate(steps, 1):
        now += gap
        amount = min(amount, int(burst))
        granted = resources.take({"api": amount}, now) is None
        assert granted == model.take(amount, now), (now, amount)
        if step % 3 == 0 or step == len(steps):  # not every time: takes in a row run on unexamined state
            assert resources.room("api", now) == model.tokens(Fraction(now))
