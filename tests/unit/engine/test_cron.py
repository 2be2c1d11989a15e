"""Cron schedules: exact next occurrences (5, 6 and 7 fields, zones, both DST transitions), errors, keys.

2026 transitions used below: Europe/Berlin springs forward on 29 March at 01:00Z (02:00 CET becomes
03:00 CEST) and falls back on 25 October at 01:00Z (03:00 CEST becomes 02:00 CET, so 02:00-02:59
happens twice); America/New_York springs forward on 8 March at 07:00Z (02:00 EST becomes 03:00 EDT)
and falls back on 1 November at 06:00Z (02:00 EDT becomes 01:00 EST, so 01:00-01:59 happens twice).
"""

from __future__ import annotations

import itertools
from datetime import UTC, datetime
from zoneinfo import ZoneInfo

import pytest

from cronoq.engine.cron import CronSchedule, occurrence_key


def at(iso: str) -> float:
    """Unix seconds of a UTC time written as "YYYY-MM-DDTHH:MM:SS"."""
    return datetime.fromisoformat(iso).replace(tzinfo=UTC).timestamp()


def next_of(schedule: CronSchedule, t: float) -> float:
    """The next occurrence of a schedule that never ends (no year field)."""
    found = schedule.next_after(t)
    assert found is not None
    return found


def following(schedule: CronSchedule, start: str, n: int) -> list[str]:
    """The next ``n`` occurrences after ``start`` (UTC), each as a UTC "YYYY-MM-DDTHH:MM:SS"."""
    t = at(start)
    out = []
    for _ in range(n):
        t = next_of(schedule, t)
        out.append(datetime.fromtimestamp(t, UTC).strftime("%Y-%m-%dT%H:%M:%S"))
    return out


# --- five fields (minute resolution) ------------------------------------------------------------------------


def test_five_fields_next_is_strictly_after_and_on_the_minute() -> None:
    every5 = CronSchedule.parse("*/5 * * * *")
    assert every5.next_after(at("2026-01-01T00:02:10")) == at("2026-01-01T00:05:00")
    assert every5.next_after(at("2026-01-01T00:04:59") + 0.999) == at("2026-01-01T00:05:00")
    assert every5.next_after(at("2026-01-01T00:05:00")) == at("2026-01-01T00:10:00")
    assert following(every5, "2026-12-31T23:52:00", 3) == [
        "2026-12-31T23:55:00",
        "2027-01-01T00:00:00",
        "2027-01-01T00:05:00",
    ]


def test_five_fields_in_a_zone_without_dst() -> None:
    # 2 January 2026 is a Friday; 09:00 JST is 00:00Z.
    weekdays = CronSchedule.parse("0 9 * * mon-fri", "Asia/Tokyo")
    assert following(weekdays, "2026-01-02T00:00:00", 2) == ["2026-01-05T00:00:00", "2026-01-06T00:00:00"]


def test_day_of_month_and_day_of_week_are_ored() -> None:
    # No 30 February, but the Mondays of February still match (1 February 2026 is a Sunday).
    either = CronSchedule.parse("0 0 30 2 mon")
    assert following(either, "2026-01-01T00:00:00", 2) == ["2026-02-02T00:00:00", "2026-02-09T00:00:00"]


def test_leap_day_waits_for_the_next_leap_year() -> None:
    assert following(CronSchedule.parse("0 0 29 2 *"), "2026-01-01T00:00:00", 1) == ["2028-02-29T00:00:00"]


def test_extra_whitespace_is_accepted_and_expr_kept_as_given() -> None:
    schedule = CronSchedule.parse(" 0  12\t* * * ")
    assert schedule.expr == " 0  12\t* * * "
    assert following(schedule, "2026-05-01T12:00:00", 1) == ["2026-05-02T12:00:00"]


# --- six fields (leading seconds) ---------------------------------------------------------------------------


def test_six_fields_have_a_leading_seconds_field() -> None:
    quarter = CronSchedule.parse("*/15 * * * * *")
    assert quarter.next_after(at("2026-06-01T12:00:07") + 0.5) == at("2026-06-01T12:00:15")
    assert quarter.next_after(at("2026-06-01T12:00:45")) == at("2026-06-01T12:01:00")

    daily = CronSchedule.parse("30 0 12 * * *")  # 12:00:30 every day
    assert following(daily, "2026-06-01T12:00:00", 2) == ["2026-06-01T12:00:30", "2026-06-02T12:00:30"]
    assert daily.next_after(at("2026-06-01T12:00:30")) == at("2026-06-02T12:00:30")


def test_seven_fields_end_with_a_year_field_and_the_schedule_ends_with_it() -> None:
    cron = CronSchedule.parse("30 0 12 1 1 * 2030-2031")
    new_year_2030 = at("2030-01-01T12:00:30")
    assert cron.next_after(at("2026-11-30T00:00:00")) == new_year_2030
    assert cron.next_after(new_year_2030) == at("2031-01-01T12:00:30")
    assert cron.next_after(at("2031-01-01T12:00:30")) is None


def test_a_year_at_the_far_end_of_the_range_is_found() -> None:
    """croniter gives up after 50 years without a match by default: 2099 must still be found from 1970."""
    assert CronSchedule.parse("0 0 0 1 1 * 2099").next_after(0.0) == at("2099-01-01T00:00:00")
    assert CronSchedule.parse("0 0 0 1 1 * 1970").next_after(-1.0) == 0.0  # the first second there is


def test_fractional_time_just_below_an_occurrence() -> None:
    # Times just below a whole second must not be rounded onto it (that would skip the occurrence).
    # Near 1970 a float still resolves 1e-7 s, which datetime would round up to the whole second.
    every_second = CronSchedule.parse("* * * * * *")
    assert every_second.next_after(10 - 1e-7) == 10.0


# --- DST: spring forward (the wall-clock time does not exist) -----------------------------------------------


def test_spring_forward_berlin_daily_0230_runs_once_at_0300() -> None:
    daily = CronSchedule.parse("30 2 * * *", "Europe/Berlin")
    assert following(daily, "2026-03-27T12:00:00", 3) == [
        "2026-03-28T01:30:00",  # 02:30 CET
        "2026-03-29T01:00:00",  # 02:30 does not exist: 03:00 CEST
        "2026-03-30T00:30:00",  # 02:30 CEST
    ]


def test_spring_forward_new_york_daily_0230_runs_once_at_0300() -> None:
    daily = CronSchedule.parse("30 2 * * *", "America/New_York")
    assert following(daily, "2026-03-06T12:00:00", 3) == [
        "2026-03-07T07:30:00",  # 02:30 EST
        "2026-03-08T07:00:00",  # 02:30 does not exist: 03:00 EDT
        "2026-03-09T06:30:00",  # 02:30 EDT
    ]


def test_spring_forward_keeps_the_seconds_of_a_six_field_schedule() -> None:
    daily = CronSchedule.parse("15 30 2 * * *", "Europe/Berlin")
    assert following(daily, "2026-03-28T12:00:00", 2) == ["2026-03-29T01:00:15", "2026-03-30T00:30:15"]


def test_spring_forward_hourly_skips_the_missing_hour() -> None:
    hourly = CronSchedule.parse("0 * * * *", "Europe/Berlin")
    assert following(hourly, "2026-03-28T23:30:00", 4) == [
        "2026-03-29T00:00:00",  # 01:00 CET
        "2026-03-29T01:00:00",  # 03:00 CEST (02:00 does not exist)
        "2026-03-29T02:00:00",
        "2026-03-29T03:00:00",
    ]
    hourly = CronSchedule.parse("30 * * * *", "America/New_York")
    assert following(hourly, "2026-03-08T06:00:00", 3) == [
        "2026-03-08T06:30:00",  # 01:30 EST
        "2026-03-08T07:30:00",  # 03:30 EDT
        "2026-03-08T08:30:00",
    ]


# --- DST: fall back (the wall-clock time happens twice) -----------------------------------------------------


def test_fall_back_berlin_daily_0230_runs_on_the_first_pass_only() -> None:
    daily = CronSchedule.parse("30 2 * * *", "Europe/Berlin")
    assert following(daily, "2026-10-23T12:00:00", 3) == [
        "2026-10-24T00:30:00",  # 02:30 CEST
        "2026-10-25T00:30:00",  # 02:30 CEST; the second 02:30 (CET, 01:30Z) is not an occurrence
        "2026-10-26T01:30:00",  # 02:30 CET
    ]


def test_fall_back_new_york_daily_0130_runs_on_the_first_pass_only() -> None:
    daily = CronSchedule.parse("30 1 * * *", "America/New_York")
    assert following(daily, "2026-10-30T12:00:00", 3) == [
        "2026-10-31T05:30:00",  # 01:30 EDT
        "2026-11-01T05:30:00",  # 01:30 EDT; the second 01:30 (EST, 06:30Z) is not an occurrence
        "2026-11-02T06:30:00",  # 01:30 EST
    ]


def test_fall_back_new_york_daily_0230_is_not_ambiguous() -> None:
    daily = CronSchedule.parse("30 2 * * *", "America/New_York")
    assert following(daily, "2026-10-31T00:00:00", 2) == ["2026-10-31T06:30:00", "2026-11-01T07:30:00"]


def test_fall_back_from_inside_the_repeated_hour_waits_for_the_next_day() -> None:
    # 01:10Z is 02:10 CET on the second pass; 02:30 already ran on the first pass (00:30Z).
    daily = CronSchedule.parse("30 2 * * *", "Europe/Berlin")
    assert following(daily, "2026-10-25T01:10:00", 1) == ["2026-10-26T01:30:00"]


def test_fall_back_fixed_hour_with_minute_steps_runs_each_wall_clock_time_once() -> None:
    steps = CronSchedule.parse("*/20 2 * * *", "Europe/Berlin")
    assert following(steps, "2026-10-24T23:00:00", 4) == [
        "2026-10-25T00:00:00",  # 02:00 CEST
        "2026-10-25T00:20:00",
        "2026-10-25T00:40:00",  # 02:40 CEST; the CET pass of 02:00-02:40 is skipped
        "2026-10-26T01:00:00",  # 02:00 CET the next day
    ]
    every_minute = CronSchedule.parse("* 1 * * *", "America/New_York")
    assert following(every_minute, "2026-11-01T05:58:00", 2) == ["2026-11-01T05:59:00", "2026-11-02T06:00:00"]


def test_fall_back_with_a_half_hour_shift() -> None:
    # Australia/Lord_Howe falls back 30 minutes on 5 April 2026: 02:00 (+11:00) becomes 01:30 (+10:30).
    daily = CronSchedule.parse("45 1 * * *", "Australia/Lord_Howe")
    assert following(daily, "2026-04-04T00:00:00", 2) == [
        "2026-04-04T14:45:00",  # 01:45 +11:00; the second 01:45 (+10:30, 15:15Z) is not an occurrence
        "2026-04-05T15:15:00",  # 01:45 +10:30 the next day
    ]


def test_fall_back_hourly_runs_in_both_passes_of_the_repeated_hour() -> None:
    hourly = CronSchedule.parse("0 * * * *", "Europe/Berlin")
    assert following(hourly, "2026-10-24T23:30:00", 4) == [
        "2026-10-25T00:00:00",  # 02:00 CEST
        "2026-10-25T01:00:00",  # 02:00 CET
        "2026-10-25T02:00:00",  # 03:00 CET
        "2026-10-25T03:00:00",
    ]
    hourly = CronSchedule.parse("30 * * * *", "America/New_York")
    assert following(hourly, "2026-11-01T05:00:00", 3) == [
        "2026-11-01T05:30:00",  # 01:30 EDT
        "2026-11-01T06:30:00",  # 01:30 EST
        "2026-11-01T07:30:00",  # 02:30 EST
    ]


# --- DST over several days and a whole year -----------------------------------------------------------------


@pytest.mark.parametrize(
    ("tz", "first"),
    [
        ("Europe/Berlin", "2026-03-28T00:00:00"),
        ("Europe/Berlin", "2026-10-24T00:00:00"),
        ("America/New_York", "2026-03-07T00:00:00"),
        ("America/New_York", "2026-10-31T00:00:00"),
    ],
)
def test_hourly_across_a_transition_is_every_real_hour_exactly_once(tz: str, first: str) -> None:
    # Three days around the transition: 72 starts, one hour apart, never repeated, never backwards.
    hourly = CronSchedule.parse("0 * * * *", tz)
    t = at(first) - 1
    starts = []
    while (t := next_of(hourly, t)) < at(first) + 72 * 3600:
        starts.append(t)
    assert len(starts) == 72
    assert starts[0] == at(first)
    assert all(b - a == 3600 for a, b in itertools.pairwise(starts))


@pytest.mark.parametrize("tz", ["Europe/Berlin", "America/New_York"])
@pytest.mark.parametrize("expr", ["30 2 * * *", "30 1 * * *"])
def test_daily_over_a_year_runs_once_per_local_day(tz: str, expr: str) -> None:
    daily = CronSchedule.parse(expr, tz)
    zone = ZoneInfo(tz)
    t = datetime(2026, 1, 1, tzinfo=zone).timestamp()
    days = []
    while True:
        t = next_of(daily, t)
        day = datetime.fromtimestamp(t, zone).date()
        if day.year > 2026:
            break
        days.append(day)
    assert len(days) == 365
    assert len(set(days)) == 365


# --- invalid input ------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("expr", "message"),
    [
        ("61 * * * *", "cron: invalid cron '61 * * * *': minute field '61' is not valid (values 0-59)"),
        ("0 24 * * *", "cron: invalid cron '0 24 * * *': hour field '24' is not valid (values 0-23)"),
        ("0 0 0 * *", "cron: invalid cron '0 0 0 * *': day-of-month field '0' is not valid (values 1-31)"),
        (
            "0 0 * 13 *",
            "cron: invalid cron '0 0 * 13 *': month field '13' is not valid (values 1-12 or JAN-DEC)",
        ),
        (
            "0 0 * * mon#6",
            "cron: invalid cron '0 0 * * mon#6': day-of-week field 'mon#6' is not valid (values 0-7 or SUN-SAT)",
        ),
        ("60 0 0 * * *", "cron: invalid cron '60 0 0 * * *': second field '60' is not valid (values 0-59)"),
        ("*/0 * * * *", "cron: invalid cron '*/0 * * * *': minute field '*/0' is not valid (values 0-59)"),
        ("x * * * *", "cron: invalid cron 'x * * * *': minute field 'x' is not valid (values 0-59)"),
        ("* * * *", "cron: invalid cron '* * * *': Pattern must have between 5 and 7 fields, got 4"),
        (
            "0 0 0 1 1 * 2030 1",
            "cron: invalid cron '0 0 0 1 1 * 2030 1': Pattern must have between 5 and 7 fields, got 8",
        ),
        (
            "0 0 0 1 1 * 2100",
            "cron: invalid cron '0 0 0 1 1 * 2100': year field '2100' is not valid (values 1970-2099)",
        ),
        ("", "cron: invalid cron '': Pattern must have between 5 and 7 fields, got 0"),
        ("@hourly", "cron: invalid cron '@hourly': Pattern must have between 5 and 7 fields, got 1"),
        (
            "R * * * *",
            "cron: invalid cron 'R * * * *': minute field 'R': hashed (H) and random (R) values are not supported",
        ),
        (
            "0 H * * *",
            "cron: invalid cron '0 H * * *': hour field 'H': hashed (H) and random (R) values are not supported",
        ),
        ("* * * * *\0", "cron: invalid cron '* * * * *\\x00': contains a NUL character"),
    ],
)
def test_invalid_cron_names_the_argument_and_the_field(expr: str, message: str) -> None:
    with pytest.raises(ValueError) as raised:
        CronSchedule.parse(expr)
    assert str(raised.value) == message


def test_absurdly_long_cron_is_rejected_and_cut_short_in_the_message() -> None:
    assert CronSchedule.parse("0 0 * * *".ljust(256)).next_after(0.0) == 86400.0
    with pytest.raises(ValueError) as raised:
        CronSchedule.parse("0 0 * * *".ljust(257))
    assert (
        str(raised.value)
        == "cron: invalid cron '" + "0 0 * * *".ljust(64) + "...': longer than 256 characters"
    )


@pytest.mark.parametrize(
    "expr", ["0 0 30 2 *", "0 0 31 4,6,9,11 *", "0 0 0 31 11 *", "0 0 31 2 1#1", "0 0 0 29 2 * 2097-2099"]
)
def test_a_schedule_that_never_fires_is_rejected_at_parse(expr: str) -> None:
    with pytest.raises(ValueError) as raised:
        CronSchedule.parse(expr)
    assert str(raised.value) == f"cron: invalid cron '{expr}': the schedule never fires (no date matches)"


@pytest.mark.parametrize(
    ("tz", "shown"),
    [
        ("Mars/X", "'Mars/X'"),
        ("America", "'America'"),  # a directory of the tz database, not a zone
        ("../etc/passwd", "'../etc/passwd'"),
        ("/etc/localtime", "'/etc/localtime'"),
        ("localtime", "'localtime'"),  # the host's zone: schedules would depend on the host
        ("europe/berlin", "'europe/berlin'"),
        ("UTC\0", "'UTC\\x00'"),
        ("A" * 300, "'" + "A" * 64 + "...'"),
    ],
)
def test_unknown_time_zone(tz: str, shown: str) -> None:
    with pytest.raises(ValueError) as raised:
        CronSchedule.parse("* * * * *", tz)
    assert str(raised.value) == f"tz: unknown time zone {shown}"


# --- the last occurrence up to a time (a late timer's catch-up) ---------------------------------------------


def test_last_until_is_the_latest_occurrence_in_the_half_open_interval() -> None:
    minutely = CronSchedule.parse("* * * * *")
    day = at("2026-05-01T00:00:00")
    assert minutely.last_until(day + 86_430.0, day + 60.0) == day + 86_400.0  # 1,439 in between
    assert minutely.last_until(day + 120.0, day + 60.0) == day + 120.0  # the end is included
    assert minutely.last_until(day + 179.9, day + 119.5) == day + 120.0  # a single one
    # Fall back: the second 02:30 in Berlin (01:30Z) is not an occurrence, so the first pass is the last.
    berlin = CronSchedule.parse("30 2 * * *", "Europe/Berlin")
    assert berlin.last_until(at("2026-10-25T01:45:00"), at("2026-10-20T00:00:00")) == at(
        "2026-10-25T00:30:00"
    )


# --- attributes and keys ------------------------------------------------------------------------------------


def test_attributes_for_listing_and_empty_zone_is_utc() -> None:
    schedule = CronSchedule.parse("0 12 * * *", "")
    assert (schedule.expr, schedule.tz) == ("0 12 * * *", "UTC")
    assert schedule.next_after(at("2026-05-01T00:00:00")) == at("2026-05-01T12:00:00")
    berlin = CronSchedule.parse("0 12 * * *", "Europe/Berlin")
    assert (berlin.expr, berlin.tz) == ("0 12 * * *", "Europe/Berlin")
    assert repr(berlin) == "CronSchedule(expr='0 12 * * *', tz='Europe/Berlin')"
    assert berlin == CronSchedule.parse("0 12 * * *", "Europe/Berlin")
    assert berlin != schedule


def test_occurrence_key_is_prefix_at_utc_start() -> None:
    assert occurrence_key("sh", at("2026-11-30T01:28:38")) == "sh@2026-11-30T01:28:38Z"
    assert occurrence_key("sh", at("2026-11-30T01:28:38") + 0.9) == "sh@2026-11-30T01:28:38Z"
    assert occurrence_key("nightly", at("2027-01-01T00:00:00")) == "nightly@2027-01-01T00:00:00Z"
    assert occurrence_key("", at("2026-11-30T01:28:38")) == ""


def test_occurrence_key_is_in_utc_whatever_the_schedule_zone() -> None:
    daily = CronSchedule.parse("30 2 * * *", "Europe/Berlin")
    start = next_of(daily, at("2026-03-28T12:00:00"))
    assert occurrence_key("backup", start) == "backup@2026-03-29T01:00:00Z"
