"""Schedule classes: validation, ``str`` and ``as_json``."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from triggerer import (
    Asset,
    AssetAll,
    AssetOrTimeSchedule,
    CronPartitionTimetable,
    PartitionedAssetTimetable,
    ToDaily,
)
from triggerer.crons import next_tick, validate_cron
from triggerer.schedules import CronSchedule, as_condition

a, b = Asset("a"), Asset("b")


@pytest.mark.parametrize("cron", ["*/5 * * * *", "0 3 * * 1-5", "@daily", "@hourly", "@weekly"])
def test_validate_cron_accepts_expressions_and_presets(cron: str) -> None:
    assert validate_cron(cron) == cron


@pytest.mark.parametrize("cron", ["nope", "61 * * * *", "", "* * *"])
def test_validate_cron_error_names_the_expression(cron: str) -> None:
    with pytest.raises(ValueError, match="invalid cron expression") as info:
        validate_cron(cron)
    assert repr(cron) in str(info.value)


def test_validate_cron_rejects_an_expression_that_never_fires() -> None:
    with pytest.raises(ValueError, match=r"'0 0 31 2 \*' never fires"):
        validate_cron("0 0 31 2 *")


def test_next_tick_is_strictly_after() -> None:
    start = datetime(2026, 3, 16, 9, 0, tzinfo=UTC)
    assert next_tick("0 * * * *", start) == datetime(2026, 3, 16, 10, 0, tzinfo=UTC)


def test_as_condition_list_means_all() -> None:
    assert as_condition([a, b]) == AssetAll(a, b)
    assert as_condition(a) is a


def test_as_condition_rejects_other_types() -> None:
    with pytest.raises(TypeError, match="str"):
        as_condition("a")  # type: ignore[arg-type]


def test_cron_schedule() -> None:
    schedule = CronSchedule("@daily")
    assert str(schedule) == "@daily"
    assert schedule.as_json() == {"cron": "@daily"}
    with pytest.raises(ValueError, match="'bad'"):
        CronSchedule("bad")


def test_asset_or_time_schedule() -> None:
    schedule = AssetOrTimeSchedule(cron="@hourly", assets=[a, b])
    assert schedule.assets == AssetAll(a, b)
    assert str(schedule) == "@hourly or a & b"
    assert schedule.as_json() == {"cron": "@hourly", "assets": (a & b).as_json()}


def test_asset_or_time_schedule_validates_cron() -> None:
    with pytest.raises(ValueError, match="'every hour'"):
        AssetOrTimeSchedule(cron="every hour", assets=a)


def test_asset_or_time_schedule_is_keyword_only() -> None:
    with pytest.raises(TypeError):
        AssetOrTimeSchedule("@hourly", a)  # type: ignore[misc]


def test_partitioned_asset_timetable() -> None:
    schedule = PartitionedAssetTimetable(assets=a | b, partition_key_mapper=ToDaily())
    assert schedule.map_key("2026-03-16T09:37:51") == "2026-03-16"
    assert str(schedule).startswith("partitions of a | b by ")
    assert schedule.as_json() == {"partitioned": (a | b).as_json(), "mapper": repr(ToDaily())}


def test_partitioned_asset_timetable_without_mapper_keeps_the_key() -> None:
    schedule = PartitionedAssetTimetable(assets=[a])
    assert schedule.map_key("k-1") == "k-1"
    assert str(schedule) == "partitions of a"
    assert schedule.as_json() == {"partitioned": AssetAll(a).as_json(), "mapper": None}


def test_partitioned_asset_timetable_rejects_a_non_mapper() -> None:
    with pytest.raises(TypeError, match="ToDaily"):
        PartitionedAssetTimetable(assets=a, partition_key_mapper=str.upper)  # type: ignore[arg-type]


def test_cron_partition_timetable() -> None:
    schedule = CronPartitionTimetable(cron="0 0 * * *")
    assert str(schedule) == "0 0 * * * (partitioned by tick)"
    assert schedule.as_json() == {"cron_partitions": "0 0 * * *"}
    with pytest.raises(ValueError, match="'x'"):
        CronPartitionTimetable(cron="x")
