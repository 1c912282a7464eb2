"""Partition key mappers: map a partition key to the key of the period that contains it.

A ``PartitionedAssetTimetable`` uses a mapper so that events keyed by a fine time (an hour, an
exact instant) line up on a coarser one (a day, a month). For the key ``2026-03-16T09:37:51``:

=================  ====================  =================================================
mapper             result                period
=================  ====================  =================================================
``ToHourly()``     ``2026-03-16T09``     the hour
``ToDaily()``      ``2026-03-16``        the day
``ToWeekly()``     ``2026-03-16 (W12)``  the ISO week: its Monday and its ISO week number
``ToMonthly()``    ``2026-03``           the month
``ToQuarterly()``  ``2026-Q1``           the quarter
``ToYearly()``     ``2026``              the year
=================  ====================  =================================================

Every mapper accepts

- a ``datetime``, or a ``date`` (taken as its midnight);
- ISO 8601 date or datetime text, as :meth:`datetime.fromisoformat` reads it: ``2026-03-16``
  (midnight), ``2026-03-16T09``, ``2026-03-16 09:37:51.5``, ``2026-W12-1``, ...;
- keys of its own period, so every mapper is idempotent (``ToDaily()("2026-03-16")`` is
  ``2026-03-16``), and the coarser keys that lie in exactly one of its periods: a monthly key
  for ``ToQuarterly``/``ToYearly``, a quarterly key for ``ToYearly``.

A UTC offset is kept as written, never converted: the wall-clock time of the key decides its
period, so ``2026-03-16T23:30:00-05:00`` is on 2026-03-16. A weekly key is not accepted by the
monthly, quarterly and yearly mappers, because a week can straddle two of their periods. A key
that cannot be read raises :class:`ValueError` naming the key and the forms that are accepted.
"""

from __future__ import annotations

import abc
import dataclasses
import enum
import re
from datetime import date, datetime, timedelta
from typing import NamedTuple

__all__ = (
    "PartitionKeyMapper",
    "ToDaily",
    "ToHourly",
    "ToMonthly",
    "ToQuarterly",
    "ToWeekly",
    "ToYearly",
)

# [0-9] rather than \d: \d also matches non-ASCII digits, which are not valid in a key.
_WEEK_RE = re.compile(r"([0-9]{4})-([0-9]{2})-([0-9]{2}) \(W([0-9]{2})\)")
_MONTH_RE = re.compile(r"([0-9]{4})-([0-9]{2})")
_QUARTER_RE = re.compile(r"([0-9]{4})-Q([1-4])")
_YEAR_RE = re.compile(r"[0-9]{4}")


class _Period(enum.Enum):
    """The coarser key forms a mapper may accept, with the example shown in errors."""

    WEEK = "weekly", "2026-03-16 (W12)"
    MONTH = "monthly", "2026-03"
    QUARTER = "quarterly", "2026-Q1"
    YEAR = "yearly", "2026"


class _Key(NamedTuple):
    """A parsed key: the start of the period it names (``None`` for a date or instant)."""

    period: _Period | None
    day: date
    hour: int


@dataclasses.dataclass(frozen=True)
class PartitionKeyMapper(abc.ABC):
    """Maps a partition key to the key of the period containing it.

    Mappers are immutable values: two mappers of the same class are equal, and their ``repr``
    is the expression that builds them (``ToDaily()``).
    """

    @abc.abstractmethod
    def __call__(self, key: str | date) -> str:
        """Return the key of the period containing ``key`` (text, ``datetime`` or ``date``)."""


@dataclasses.dataclass(frozen=True)
class ToHourly(PartitionKeyMapper):
    """Maps a key to its hour: ``2026-03-16T09``."""

    def __call__(self, key: str | date) -> str:
        """Return the hour containing ``key``."""
        parsed = _parse(key, self, frozenset())
        return f"{_format_day(parsed.day)}T{parsed.hour:02d}"


@dataclasses.dataclass(frozen=True)
class ToDaily(PartitionKeyMapper):
    """Maps a key to its day: ``2026-03-16``."""

    def __call__(self, key: str | date) -> str:
        """Return the day containing ``key``."""
        return _format_day(_parse(key, self, frozenset()).day)


@dataclasses.dataclass(frozen=True)
class ToWeekly(PartitionKeyMapper):
    """Maps a key to its ISO week, as the week's Monday and ISO week number: ``2026-03-16 (W12)``.

    The Monday may fall in the previous calendar year (``2026-01-01`` maps to
    ``2025-12-29 (W01)``) and the week number may be 53 (``2027-01-01`` maps to
    ``2026-12-28 (W53)``).
    """

    def __call__(self, key: str | date) -> str:
        """Return the ISO week containing ``key``."""
        return _format_week(_parse(key, self, frozenset({_Period.WEEK})).day)


@dataclasses.dataclass(frozen=True)
class ToMonthly(PartitionKeyMapper):
    """Maps a key to its month: ``2026-03``."""

    def __call__(self, key: str | date) -> str:
        """Return the month containing ``key``."""
        day = _parse(key, self, frozenset({_Period.MONTH})).day
        return f"{day.year:04d}-{day.month:02d}"


@dataclasses.dataclass(frozen=True)
class ToQuarterly(PartitionKeyMapper):
    """Maps a key to its calendar quarter: ``2026-Q1`` (January to March)."""

    def __call__(self, key: str | date) -> str:
        """Return the quarter containing ``key``."""
        day = _parse(key, self, frozenset({_Period.MONTH, _Period.QUARTER})).day
        return f"{day.year:04d}-Q{(day.month - 1) // 3 + 1}"


@dataclasses.dataclass(frozen=True)
class ToYearly(PartitionKeyMapper):
    """Maps a key to its calendar year: ``2026``."""

    def __call__(self, key: str | date) -> str:
        """Return the year containing ``key``."""
        accepted = frozenset({_Period.MONTH, _Period.QUARTER, _Period.YEAR})
        return f"{_parse(key, self, accepted).day.year:04d}"


def _format_day(day: date) -> str:
    # By hand rather than strftime: %Y does not zero-pad years before 1000 on every platform.
    return f"{day.year:04d}-{day.month:02d}-{day.day:02d}"


def _format_week(day: date) -> str:
    week = day.isocalendar().week
    return f"{_format_day(day - timedelta(days=day.weekday()))} (W{week:02d})"


def _parse(key: str | date, mapper: PartitionKeyMapper, accepted: frozenset[_Period]) -> _Key:
    """Read ``key`` for ``mapper``, which also takes the coarser key forms in ``accepted``."""
    if isinstance(key, datetime):
        return _Key(None, key.date(), key.hour)
    if isinstance(key, date):
        return _Key(None, key, 0)
    if not isinstance(key, str):
        raise TypeError(
            f"partition key {key!r} is a {type(key).__name__}: {mapper!r} takes ISO 8601 "
            "text, a datetime or a date"
        )
    try:
        parsed = _parse_text(key)
    except ValueError as exc:
        raise ValueError(
            f"partition key {key!r} is not valid for {mapper!r} ({exc}): expected "
            f"{_expected(accepted)}"
        ) from exc
    if parsed.period is not None and parsed.period not in accepted:
        raise ValueError(
            f"partition key {key!r} is a {parsed.period.value[0]} key, which can span several "
            f"periods of {mapper!r}: expected {_expected(accepted)}"
        )
    return parsed


def _parse_text(key: str) -> _Key:
    """Read key text of any form; a ``ValueError`` says what is wrong with it."""
    if match := _WEEK_RE.fullmatch(key):
        year, month, day, week = (int(group) for group in match.groups())
        monday = date(year, month, day)
        if monday.weekday() != 0:
            raise ValueError(f"{_format_day(monday)} is not a Monday")
        if monday.isocalendar().week != week:
            raise ValueError(
                f"the week of {_format_day(monday)} is W{monday.isocalendar().week:02d}"
            )
        return _Key(_Period.WEEK, monday, 0)
    if match := _MONTH_RE.fullmatch(key):
        return _Key(_Period.MONTH, date(int(match[1]), int(match[2]), 1), 0)
    if match := _QUARTER_RE.fullmatch(key):
        return _Key(_Period.QUARTER, date(int(match[1]), int(match[2]) * 3 - 2, 1), 0)
    if _YEAR_RE.fullmatch(key):
        return _Key(_Period.YEAR, date(int(key), 1, 1), 0)
    moment = datetime.fromisoformat(key)
    return _Key(None, moment.date(), moment.hour)


def _expected(accepted: frozenset[_Period]) -> str:
    forms = [
        "ISO 8601 date or datetime text such as '2026-03-16' or '2026-03-16T09:37:51' "
        "(a UTC offset is allowed)"
    ]
    forms += [
        f"a {period.value[0]} key such as {period.value[1]!r}"
        for period in _Period
        if period in accepted
    ]
    return ", ".join(forms) + ", or a datetime or date"
