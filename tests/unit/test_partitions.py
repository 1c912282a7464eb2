"""Partition key mappers: each period, its boundaries, input forms, idempotence and bad keys."""

from __future__ import annotations

import dataclasses
from datetime import date, datetime, timedelta, timezone

import pytest

from triggerer.partitions import (
    PartitionKeyMapper,
    ToDaily,
    ToHourly,
    ToMonthly,
    ToQuarterly,
    ToWeekly,
    ToYearly,
)

MAPPERS = (ToHourly(), ToDaily(), ToWeekly(), ToMonthly(), ToQuarterly(), ToYearly())


def _all(key: str | date) -> tuple[str, ...]:
    return tuple(mapper(key) for mapper in MAPPERS)


@pytest.mark.parametrize(
    ("key", "expected"),
    [
        # the contract's example
        (
            "2026-03-16T09:37:51",
            ("2026-03-16T09", "2026-03-16", "2026-03-16 (W12)", "2026-03", "2026-Q1", "2026"),
        ),
        # mid-week, and the last moment of the ISO week
        (
            "2026-03-18T00:00:00",
            ("2026-03-18T00", "2026-03-18", "2026-03-16 (W12)", "2026-03", "2026-Q1", "2026"),
        ),
        (
            "2026-03-22T23:59:59.999999",
            ("2026-03-22T23", "2026-03-22", "2026-03-16 (W12)", "2026-03", "2026-Q1", "2026"),
        ),
        (
            "2026-03-23T00:00:00",
            ("2026-03-23T00", "2026-03-23", "2026-03-23 (W13)", "2026-03", "2026-Q1", "2026"),
        ),
        # year boundary: 2026-01-01 is a Thursday, so its ISO week 1 starts in 2025
        (
            "2025-12-31T23:59:59",
            ("2025-12-31T23", "2025-12-31", "2025-12-29 (W01)", "2025-12", "2025-Q4", "2025"),
        ),
        (
            "2026-01-01T00:00:00",
            ("2026-01-01T00", "2026-01-01", "2025-12-29 (W01)", "2026-01", "2026-Q1", "2026"),
        ),
        # 2026 has 53 ISO weeks; week 53 runs into 2027
        (
            "2026-12-31T12:00:00",
            ("2026-12-31T12", "2026-12-31", "2026-12-28 (W53)", "2026-12", "2026-Q4", "2026"),
        ),
        (
            "2027-01-03T23:00:00",
            ("2027-01-03T23", "2027-01-03", "2026-12-28 (W53)", "2027-01", "2027-Q1", "2027"),
        ),
        (
            "2027-01-04T00:00:00",
            ("2027-01-04T00", "2027-01-04", "2027-01-04 (W01)", "2027-01", "2027-Q1", "2027"),
        ),
        # 2020 had 53 weeks too, its week 53 ending on Sunday 2021-01-03
        (
            "2021-01-03T00:00:00",
            ("2021-01-03T00", "2021-01-03", "2020-12-28 (W53)", "2021-01", "2021-Q1", "2021"),
        ),
        # a Monday in December that starts ISO week 1 of the next year
        (
            "2024-12-30T08:00:00",
            ("2024-12-30T08", "2024-12-30", "2024-12-30 (W01)", "2024-12", "2024-Q4", "2024"),
        ),
        # leap day
        (
            "2028-02-29T10:00:00",
            ("2028-02-29T10", "2028-02-29", "2028-02-28 (W09)", "2028-02", "2028-Q1", "2028"),
        ),
        # years before 1000 keep four digits
        (
            "0999-03-16T01:00:00",
            ("0999-03-16T01", "0999-03-16", "0999-03-11 (W11)", "0999-03", "0999-Q1", "0999"),
        ),
    ],
)
def test_every_mapper(key: str, expected: tuple[str, ...]) -> None:
    assert _all(key) == expected


@pytest.mark.parametrize(
    ("key", "quarter"),
    [
        ("2026-01-01", "2026-Q1"),
        ("2026-03-31T23:59:59", "2026-Q1"),
        ("2026-04-01", "2026-Q2"),
        ("2026-06-30T23:59:59", "2026-Q2"),
        ("2026-07-01", "2026-Q3"),
        ("2026-09-30T23:59:59", "2026-Q3"),
        ("2026-10-01", "2026-Q4"),
        ("2026-12-31T23:59:59", "2026-Q4"),
    ],
)
def test_quarter_boundaries(key: str, quarter: str) -> None:
    assert ToQuarterly()(key) == quarter


@pytest.mark.parametrize("offset_days", range(7))
def test_every_day_of_a_week_maps_to_its_monday(offset_days: int) -> None:
    day = date(2026, 3, 16) + timedelta(days=offset_days)
    assert ToWeekly()(day) == "2026-03-16 (W12)"


@pytest.mark.parametrize(
    ("year", "last_week"),
    [(2015, 53), (2020, 53), (2026, 53), (2021, 52), (2024, 52), (2025, 52)],
)
def test_iso_week_of_december_28_is_the_last_week(year: int, last_week: int) -> None:
    # December 28 always lies in the last ISO week of its year.
    assert ToWeekly()(date(year, 12, 28)).endswith(f"(W{last_week})")


def test_date_only_text_is_midnight() -> None:
    assert _all("2026-03-16") == (
        "2026-03-16T00",
        "2026-03-16",
        "2026-03-16 (W12)",
        "2026-03",
        "2026-Q1",
        "2026",
    )


@pytest.mark.parametrize(
    ("key", "hourly"),
    [
        ("2026-03-16 09:37:51", "2026-03-16T09"),
        ("2026-03-16T09", "2026-03-16T09"),
        ("2026-03-16T09:37", "2026-03-16T09"),
        ("2026-03-16T09:37:51.123456", "2026-03-16T09"),
        ("20260316T093751", "2026-03-16T09"),
        ("20260316", "2026-03-16T00"),
        ("2026-W12-3", "2026-03-18T00"),
        ("2026-W12", "2026-03-16T00"),
    ],
)
def test_iso_8601_text_forms(key: str, hourly: str) -> None:
    assert ToHourly()(key) == hourly


@pytest.mark.parametrize(
    ("key", "hourly", "daily"),
    [
        ("2026-03-16T09:37:51Z", "2026-03-16T09", "2026-03-16"),
        ("2026-03-16T09:37:51+00:00", "2026-03-16T09", "2026-03-16"),
        # Late evening west of UTC stays on its own day: the wall clock is kept, not converted.
        ("2026-03-16T23:30:00-05:00", "2026-03-16T23", "2026-03-16"),
        ("2026-03-16T00:30:00+14:00", "2026-03-16T00", "2026-03-16"),
        ("2026-03-16T09:37:51.5+05:30", "2026-03-16T09", "2026-03-16"),
    ],
)
def test_tz_aware_text_keeps_the_wall_clock(key: str, hourly: str, daily: str) -> None:
    assert ToHourly()(key) == hourly
    assert ToDaily()(key) == daily


def test_tz_aware_datetime_keeps_the_wall_clock() -> None:
    moment = datetime(2025, 12, 31, 23, 30, tzinfo=timezone(timedelta(hours=-5)))
    assert _all(moment) == (
        "2025-12-31T23",
        "2025-12-31",
        "2025-12-29 (W01)",
        "2025-12",
        "2025-Q4",
        "2025",
    )


def test_naive_datetime_input() -> None:
    moment = datetime.fromisoformat("2026-03-16T09:37:51")
    assert _all(moment) == _all("2026-03-16T09:37:51")


def test_date_input_is_midnight() -> None:
    assert _all(date(2026, 3, 16)) == _all("2026-03-16T00:00:00")


@pytest.mark.parametrize(
    "key",
    [
        "2026-03-16T09:37:51",
        "2026-01-01",
        "2027-01-03T23:00:00",
        "2024-12-30T08:00:00+02:00",
    ],
)
@pytest.mark.parametrize("mapper", MAPPERS, ids=repr)
def test_every_mapper_is_idempotent(mapper: PartitionKeyMapper, key: str) -> None:
    mapped = mapper(key)
    assert mapper(mapped) == mapped


@pytest.mark.parametrize(
    ("mapper", "key", "expected"),
    [
        (ToWeekly(), "2026-03-16 (W12)", "2026-03-16 (W12)"),
        (ToWeekly(), "2025-12-29 (W01)", "2025-12-29 (W01)"),
        (ToWeekly(), "2026-12-28 (W53)", "2026-12-28 (W53)"),
        (ToMonthly(), "2026-03", "2026-03"),
        (ToQuarterly(), "2026-05", "2026-Q2"),
        (ToQuarterly(), "2026-12", "2026-Q4"),
        (ToQuarterly(), "2026-Q3", "2026-Q3"),
        (ToYearly(), "2026-12", "2026"),
        (ToYearly(), "2026-Q4", "2026"),
        (ToYearly(), "2026", "2026"),
        (ToDaily(), "2026-03-16T09", "2026-03-16"),
        (ToMonthly(), "2026-03-16", "2026-03"),
    ],
)
def test_coarser_keys_inside_one_period(
    mapper: PartitionKeyMapper, key: str, expected: str
) -> None:
    assert mapper(key) == expected


@pytest.mark.parametrize(
    ("mapper", "key", "kind"),
    [
        (ToHourly(), "2026-03-16 (W12)", "weekly"),
        (ToDaily(), "2026-03-16 (W12)", "weekly"),
        (ToMonthly(), "2026-03-30 (W14)", "weekly"),
        (ToQuarterly(), "2026-03-16 (W12)", "weekly"),
        (ToYearly(), "2025-12-29 (W01)", "weekly"),
        (ToHourly(), "2026-03", "monthly"),
        (ToDaily(), "2026-03", "monthly"),
        (ToWeekly(), "2026-03", "monthly"),
        (ToMonthly(), "2026-Q1", "quarterly"),
        (ToWeekly(), "2026-Q1", "quarterly"),
        (ToQuarterly(), "2026", "yearly"),
        (ToDaily(), "2026", "yearly"),
    ],
)
def test_keys_of_a_longer_period_are_rejected(
    mapper: PartitionKeyMapper, key: str, kind: str
) -> None:
    with pytest.raises(ValueError, match="expected ISO 8601 date or datetime text") as caught:
        mapper(key)
    assert str(caught.value).startswith(
        f"partition key {key!r} is a {kind} key, which can span several periods of {mapper!r}"
    )


@pytest.mark.parametrize(
    ("key", "reason"),
    [
        ("", "Invalid isoformat string"),
        ("foo", "Invalid isoformat string"),
        (" 2026-03-16", "Invalid isoformat string"),
        ("16/03/2026", "Invalid isoformat string"),
        ("2026-03-16T25:00", "hour must be in 0..23"),
        ("2026-02-30", "day is out of range for month"),
        ("2026-13", "month must be in 1..12"),
        ("2026-00", "month must be in 1..12"),
        ("2026-Q5", "Invalid isoformat string"),
        ("2026-03-17 (W12)", "2026-03-17 is not a Monday"),
        ("2026-03-16 (W13)", "the week of 2026-03-16 is W12"),
        ("2026-03-16 (W1)", "Invalid isoformat string"),
        ("2026-02-30 (W09)", "day is out of range for month"),
        ("\N{ARABIC-INDIC DIGIT TWO}026", "Invalid isoformat string"),
    ],
)
@pytest.mark.parametrize("mapper", MAPPERS, ids=repr)
def test_bad_keys_name_the_key_and_the_expected_forms(
    mapper: PartitionKeyMapper, key: str, reason: str
) -> None:
    with pytest.raises(ValueError, match="expected ISO 8601 date or datetime text") as caught:
        mapper(key)
    message = str(caught.value)
    assert message.startswith(f"partition key {key!r} is not valid for {mapper!r} (")
    assert reason in message
    assert message.endswith("or a datetime or date")


@pytest.mark.parametrize(
    ("mapper", "forms"),
    [
        (ToHourly(), []),
        (ToDaily(), []),
        (ToWeekly(), ["a weekly key such as '2026-03-16 (W12)'"]),
        (ToMonthly(), ["a monthly key such as '2026-03'"]),
        (ToQuarterly(), ["a monthly key such as '2026-03'", "a quarterly key such as '2026-Q1'"]),
        (
            ToYearly(),
            [
                "a monthly key such as '2026-03'",
                "a quarterly key such as '2026-Q1'",
                "a yearly key such as '2026'",
            ],
        ),
    ],
    ids=repr,
)
def test_error_lists_exactly_the_forms_the_mapper_takes(
    mapper: PartitionKeyMapper, forms: list[str]
) -> None:
    with pytest.raises(ValueError, match="foo") as caught:
        mapper("foo")
    message = str(caught.value)
    assert message.count(" key such as ") == len(forms)
    for form in forms:
        assert form in message


@pytest.mark.parametrize("key", [None, 20260316, 2026.0, b"2026-03-16"])
def test_non_text_keys_are_a_type_error(key: object) -> None:
    with pytest.raises(TypeError, match=rf"partition key {key!r} is a {type(key).__name__}"):
        ToDaily()(key)  # type: ignore[arg-type]


def test_mappers_are_values() -> None:
    assert ToDaily() == ToDaily()
    others: list[object] = [ToHourly(), "ToDaily()"]
    assert all(ToDaily() != other for other in others)
    assert hash(ToDaily()) == hash(ToDaily())
    assert len(set(MAPPERS + MAPPERS)) == len(MAPPERS)
    assert [repr(mapper) for mapper in MAPPERS] == [
        "ToHourly()",
        "ToDaily()",
        "ToWeekly()",
        "ToMonthly()",
        "ToQuarterly()",
        "ToYearly()",
    ]
    assert all(isinstance(mapper, PartitionKeyMapper) for mapper in MAPPERS)


def test_mappers_are_immutable() -> None:
    with pytest.raises(dataclasses.FrozenInstanceError):
        ToDaily().anything = 1  # type: ignore[attr-defined]


def test_base_class_is_abstract() -> None:
    with pytest.raises(TypeError, match="abstract"):
        PartitionKeyMapper()  # type: ignore[abstract]
