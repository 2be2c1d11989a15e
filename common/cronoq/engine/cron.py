"""Cron schedules for recurring tasks: parse once, then ask for the first occurrence after a given time.

The cron language itself is croniter's (5 fields, 6 with a leading seconds field, or 7 with a
trailing year field as well, as the reference's parser takes; lists, ranges, steps, month and weekday
names, ``L``, ``W``, ``#``); this module only puts the engine's rules around it:

- Times are Unix seconds as floats, passed in by the caller. Nothing here reads a clock; the only
  I/O is zoneinfo loading a zone's rules from the tz database the first time it is named.
- Occurrences are evaluated in the schedule's IANA zone, so a daily 02:30 stays at 02:30 local time
  all year.
- Day of month and day of week are ORed when both are restricted (classic cron):
  ``0 0 30 2 mon`` fires on the Mondays of February. With ``#`` or ``W`` croniter ANDs them instead,
  so ``0 0 31 2 1#1`` never fires.
- DST, spring forward: a wall-clock time inside the gap does not exist. A schedule with a fixed hour
  still runs that day, once, as soon as the gap ends: the time moves forward by whole minutes to the
  first wall-clock time that exists (a daily 02:30 in Europe/Berlin runs at 03:00 CEST, a 6-field
  02:30:15 at 03:00:15). A schedule with a wildcard hour just skips the missing wall-clock times and
  loses nothing, because every real hour still has its occurrences. This is croniter's behaviour,
  kept as is.
- DST, fall back: wall-clock times in the repeated hour exist twice. A schedule with a fixed hour runs
  at the first of the two instants only, so a daily job still runs once a day (croniter alone would
  run it twice). A schedule with a wildcard hour runs at both, because they are different real hours
  and an hourly job should not pause for one.
  Either way successive occurrences are strictly increasing instants.
- A pattern that can never match (``0 0 30 2 *``) is rejected by ``parse`` with "never fires", so
  ``next_after`` always has an answer and the engine never needs a "no next occurrence" case.
- Hashed and random values (croniter's ``H`` and ``R``) are refused: ``R`` would make the engine's
  decisions non-deterministic, and ``H`` needs a hash id the engine does not have.

- A year field (1970-2099) can end a schedule: ``next_after`` then answers None, and the engine
  plans no further occurrence. Without one every schedule repeats, so it never does.

This is the one engine module that imports ``datetime`` (for calendar arithmetic in a zone); it
only converts the times it is given and never asks for the current one, which
``tests/unit/engine/test_purity.py`` checks.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from datetime import UTC, datetime
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import HOUR_FIELD, CroniterBadDateError, croniter

from .model import Rebuilt

MAX_LENGTH = 256
"""Longest cron expression accepted; real ones are far shorter."""

_FIELD_NAMES = ("minute", "hour", "day-of-month", "month", "day-of-week")
_WITH_SECONDS = ("second", *_FIELD_NAMES)
_WITH_YEAR = (*_WITH_SECONDS, "year")
_VALUES = {
    "second": "0-59",
    "minute": "0-59",
    "hour": "0-23",
    "day-of-month": "1-31",
    "month": "1-12 or JAN-DEC",
    "day-of-week": "0-7 or SUN-SAT",
    "year": "1970-2099",
}
# croniter gives up when no date matches within this many years of the start; with a year field the
# next one may lie up to 2099 - 1970 years ahead, and giving up must mean there is none.
_YEARS_SEARCHED = 2099 - 1970 + 1
# Split fields exactly as croniter does (ASCII whitespace only), so the count checked here is the one
# croniter will see.
_FIELD_RE = re.compile(r"\S+", re.ASCII)


@dataclass(frozen=True, slots=True)
class CronSchedule(Rebuilt):
    """A validated cron schedule in an IANA time zone. Build it with :meth:`parse`.

    ``expr`` is the expression as given and ``tz`` the zone name ("UTC" when none was given); both
    are kept for listing. Equality compares these two only.
    """

    expr: str
    tz: str
    _pattern: str = field(repr=False, compare=False)  # the fields joined by single spaces
    _with_seconds: bool = field(repr=False, compare=False)
    _with_year: bool = field(repr=False, compare=False)
    _hour_wildcard: bool = field(repr=False, compare=False)
    _zone: ZoneInfo = field(repr=False, compare=False)

    @classmethod
    def parse(cls, expr: str, tz: str = "UTC") -> CronSchedule:
        """Validate ``expr`` and ``tz``; raise ``ValueError`` naming the bad argument ("cron: …", "tz: …")."""
        fields = _cron_fields(expr)
        with_seconds = len(fields) >= 6
        pattern = " ".join(fields)
        expanded, _ = croniter.expand(pattern, second_at_beginning=with_seconds)
        name, zone = _load_zone(tz)
        schedule = cls(
            expr, name, pattern, with_seconds, len(fields) == 7, expanded[HOUR_FIELD] == ["*"], zone
        )
        # Every date a schedule can match lies from 1970 on (a year field ends in 2099; without one the
        # schedule repeats within croniter's search window), so one search from then tells whether it
        # can fire at all.
        if schedule.next_after(-1.0) is None:
            raise _cron_error(expr, "the schedule never fires (no date matches)")
        return schedule

    def next_after(self, t: float) -> float | None:
        """The first occurrence strictly after ``t``, as Unix seconds (always a whole second); None
        when there is none (only a schedule with a year field ends)."""
        # Occurrences fall on whole seconds, so the first one after t is the first one after floor(t);
        # starting croniter from a whole second also keeps sub-microsecond rounding out of its search.
        after = math.floor(t)
        years = _YEARS_SEARCHED if self._with_year else None
        while True:
            start = datetime.fromtimestamp(after, self._zone)
            search = croniter(
                self._pattern, start, second_at_beginning=self._with_seconds, max_years_between_matches=years
            )
            try:
                found: float = search.get_next(float)
            except CroniterBadDateError:
                return None
            if self._hour_wildcard or not datetime.fromtimestamp(found, self._zone).fold:
                return found
            # The second pass of a repeated wall-clock time that already fired on the first pass.
            after = self._end_of_repeat(int(found)) - 1

    def last_until(self, t: float, after: float) -> float:
        """The last occurrence in (``after``, ``t``]; the caller knows there is one.

        Bisects whole seconds with ``next_after`` (occurrences fall on whole seconds), so it costs
        O(log(t - after)) searches however many occurrences lie between: a schedule a day late may
        have tens of thousands.
        """
        low, high = math.floor(after), math.floor(t)
        # Invariant: next_after(low) <= t < next_after(high) (None counts as after t).
        first = self.next_after(low)
        assert first is not None and first <= t, "no occurrence in (after, t]"
        while high - low > 1:
            middle = (low + high) // 2
            found = self.next_after(middle)
            if found is not None and found <= t:
                low, first = middle, found
            else:
                high = middle
        return first

    def _end_of_repeat(self, second_pass: int) -> int:
        """The first whole second after ``second_pass`` that is past the repeated (fall-back) wall-clock hour.

        zoneinfo exposes no transition list, so this bisects on ``fold``: it is 1 at ``second_pass``
        and 0 again once the clock has caught up, which happens within the size of the shift.
        """
        local = datetime.fromtimestamp(second_pass, self._zone)
        shift = second_pass - int(local.replace(fold=0).timestamp())
        low, high = second_pass, second_pass + shift
        while high - low > 1:
            middle = (low + high) // 2
            if datetime.fromtimestamp(middle, self._zone).fold:
                low = middle
            else:
                high = middle
        return high


def occurrence_key(prefix: str, start: float) -> str:
    """The idempotency key of the occurrence at ``start``: "{prefix}@YYYY-MM-DDTHH:MM:SSZ" in UTC.

    An empty prefix means the schedule has no key, so its occurrences get none ("").
    """
    if not prefix:
        return ""
    at = datetime.fromtimestamp(math.floor(start), UTC)
    return f"{prefix}@{at:%Y-%m-%dT%H:%M:%SZ}"


def _cron_fields(expr: str) -> list[str]:
    """Split ``expr`` into fields and check each one alone, so that an error can name the field."""
    if "\0" in expr:
        raise _cron_error(expr, "contains a NUL character")
    if len(expr) > MAX_LENGTH:
        raise _cron_error(expr, f"longer than {MAX_LENGTH} characters")
    fields = _FIELD_RE.findall(expr)
    if len(fields) not in (5, 6, 7):
        raise _cron_error(expr, f"Pattern must have between 5 and 7 fields, got {len(fields)}")
    with_seconds = len(fields) >= 6
    names = (_FIELD_NAMES, _WITH_SECONDS, _WITH_YEAR)[len(fields) - 5]
    for i, (name, token) in enumerate(zip(names, fields, strict=True)):
        if token[0] in "hHrR":
            raise _cron_error(
                expr, f"{name} field {token!r}: hashed (H) and random (R) values are not supported"
            )
        alone = ["*"] * len(fields)
        alone[i] = token
        if not croniter.is_valid(" ".join(alone), second_at_beginning=with_seconds):
            raise _cron_error(expr, f"{name} field {token!r} is not valid (values {_VALUES[name]})")
    return fields


def _load_zone(tz: str) -> tuple[str, ZoneInfo]:
    """The zone's name ("UTC" for an empty one) and its rules."""
    name = tz or "UTC"
    # "localtime" names whatever zone the host is set to, which would make schedules host-dependent.
    if name != "localtime":
        try:
            return name, ZoneInfo(name)
        except (ZoneInfoNotFoundError, ValueError, OSError):
            pass  # not found, not a zone key, or a directory such as "America"
    raise ValueError(f"tz: unknown time zone {_shown(tz)}")


def _cron_error(expr: str, reason: str) -> ValueError:
    return ValueError(f"cron: invalid cron {_shown(expr)}: {reason}")


def _shown(text: str) -> str:
    """``text`` quoted for an error message, control characters escaped, cut short if it is absurdly long."""
    return repr(text if len(text) <= 64 else text[:64] + "...")
