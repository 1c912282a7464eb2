"""An Airflow DAG's ``schedule=`` as a triggerer schedule, and the timetables it may name."""

from __future__ import annotations

import dataclasses
from collections.abc import Collection
from datetime import datetime, timedelta, tzinfo
from typing import Any

from triggerer.airflow.errors import NotSupported
from triggerer.assets import BaseAsset
from triggerer.crons import validate_cron
from triggerer.pipelines import normalize_schedule
from triggerer.schedules import AssetOrTimeSchedule as TimeOrAssets
from triggerer.schedules import Schedule

QUARTERLY = "0 0 1 */3 *"
"""Airflow's ``@quarterly``, which the cron parser does not know by name."""

_UTC_NAMES = frozenset({"UTC", "Etc/UTC", "GMT", "Etc/GMT", "Z", "+00:00", "UTC+00:00"})


@dataclasses.dataclass(frozen=True, init=False)
class CronTriggerTimetable:
    """Airflow's timetable of a cron expression that runs at each tick: here, in UTC only."""

    cron: str

    def __init__(
        self,
        cron: str,
        *,
        timezone: str | tzinfo,
        interval: timedelta | Any = timedelta(0),
        run_immediately: bool | timedelta = False,
    ) -> None:
        if not is_utc(timezone):
            raise NotSupported(
                f"CronTriggerTimetable(timezone={str(timezone)!r})",
                "triggerer's cron schedules tick in UTC; give timezone='UTC' and the "
                "expression in UTC",
            )
        if interval != timedelta(0):
            raise NotSupported(
                f"CronTriggerTimetable(interval={interval!r})",
                "a run has no data interval in triggerer",
            )
        if run_immediately is not False:
            raise NotSupported(
                f"CronTriggerTimetable(run_immediately={run_immediately!r})",
                "a triggerer cron pipeline runs at its ticks only",
            )
        object.__setattr__(self, "cron", cron_of(cron))


def AssetOrTimeSchedule(
    *, timetable: CronTriggerTimetable, assets: BaseAsset | Collection[BaseAsset]
) -> TimeOrAssets:
    """Airflow's ``AssetOrTimeSchedule(timetable=..., assets=...)``: triggerer's own, so that
    an Airflow DAG and a triggerer pipeline share it."""
    if not isinstance(timetable, CronTriggerTimetable):
        raise NotSupported(
            f"AssetOrTimeSchedule(timetable={timetable!r})",
            "only a CronTriggerTimetable in UTC can be the time part",
        )
    if not isinstance(assets, BaseAsset):
        assets = list(assets)
    return TimeOrAssets(cron=timetable.cron, assets=assets)


def cron_of(expression: str) -> str:
    """A cron string or preset of Airflow's as triggerer's cron parser takes it."""
    if expression in ("@once", "@continuous"):
        raise NotSupported(
            f"schedule={expression!r}",
            "triggerer runs a pipeline on assets, on cron ticks or by hand, never once at "
            "load nor continuously",
        )
    if expression == "@quarterly":
        return QUARTERLY
    return validate_cron(expression)


def schedule_of(schedule: object, start_date: object) -> Schedule | None:
    """The triggerer schedule of an Airflow DAG's ``schedule=``. A cron ticks in UTC, so a
    ``start_date`` in another time zone (where Airflow would tick) is refused."""
    if isinstance(schedule, timedelta):
        raise NotSupported(
            f"schedule={schedule!r}",
            "a schedule of intervals runs on data intervals, which triggerer runs do not "
            "have; use a cron expression, e.g. '0 * * * *' for hourly",
        )
    if isinstance(schedule, str):
        schedule = cron_of(schedule)
    elif isinstance(schedule, CronTriggerTimetable):
        schedule = schedule.cron
    elif schedule is not None and not isinstance(schedule, (BaseAsset, TimeOrAssets, list, tuple)):
        raise NotSupported(
            f"schedule={schedule!r}",
            "the schedules triggerer runs are None, a cron string, assets (a list or an "
            "expression), AssetOrTimeSchedule and CronTriggerTimetable",
        )
    result = normalize_schedule(schedule)
    if isinstance(result, BaseAsset) or result is None:
        return result
    zone = start_date.tzinfo if isinstance(start_date, datetime) else None
    if not is_utc(zone):
        raise NotSupported(
            f"a cron schedule with start_date in {zone}",
            "Airflow ticks a cron in the start date's time zone, triggerer in UTC; give the "
            "start_date in UTC and the expression in UTC",
        )
    return result


def is_utc(zone: object) -> bool:
    """Whether ``zone`` (a name, a ``tzinfo``, or ``None`` for Airflow's default) is UTC."""
    return zone is None or str(zone) in _UTC_NAMES
