"""Schedules beyond a plain asset condition: cron, time + asset, and partitions."""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any

from croniter import CroniterError, croniter

from triggerer.assets import AssetAll, BaseAsset
from triggerer.partitions import PartitionKeyMapper


def validate_cron(cron: str) -> str:
    """``cron`` if it is a valid expression or preset, else a ``ValueError`` naming it."""
    if not isinstance(cron, str) or not croniter.is_valid(cron):
        raise ValueError(
            f"invalid cron expression {cron!r}: use five fields like '*/5 * * * *' "
            "or a preset (@hourly, @daily, @weekly, @monthly, @yearly)"
        )
    try:
        next_tick(cron, datetime.now(UTC))
    except CroniterError as error:
        # Valid fields can name a day that never comes ('0 0 31 2 *'): no tick to wait for.
        raise ValueError(f"cron expression {cron!r} never fires: {error}") from error
    return cron


def next_tick(cron: str, after: datetime) -> datetime:
    """The first tick of ``cron`` strictly after ``after`` (same timezone)."""
    tick: datetime = croniter(cron, after).get_next(datetime)
    return tick


def as_condition(assets: BaseAsset | Sequence[BaseAsset]) -> BaseAsset:
    """An asset condition from an asset, an expression, or a list meaning AND."""
    if isinstance(assets, BaseAsset):
        return assets
    if isinstance(assets, (list, tuple)):
        return AssetAll(*assets)
    raise TypeError(
        f"an asset schedule must be an Asset, AssetAlias, an expression or a list of them, "
        f"got {type(assets).__name__}"
    )


@dataclasses.dataclass(frozen=True)
class CronSchedule:
    """Runs on every tick of ``cron`` (what a cron string or preset schedule becomes)."""

    cron: str

    def __post_init__(self) -> None:
        validate_cron(self.cron)

    def __str__(self) -> str:
        return self.cron

    def as_json(self) -> dict[str, Any]:
        return {"cron": self.cron}


@dataclasses.dataclass(frozen=True, init=False)
class AssetOrTimeSchedule:
    """Runs on every tick of ``cron`` and whenever the asset condition is met."""

    cron: str
    assets: BaseAsset

    def __init__(self, *, cron: str, assets: BaseAsset | Sequence[BaseAsset]) -> None:
        object.__setattr__(self, "cron", validate_cron(cron))
        object.__setattr__(self, "assets", as_condition(assets))

    def __str__(self) -> str:
        return f"{self.cron} or {self.assets}"

    def as_json(self) -> dict[str, Any]:
        return {"cron": self.cron, "assets": self.assets.as_json()}


@dataclasses.dataclass(frozen=True, init=False)
class PartitionedAssetTimetable:
    """Triggered by partitioned events; an AND needs the same mapped key on every asset."""

    assets: BaseAsset
    partition_key_mapper: PartitionKeyMapper | None

    def __init__(
        self,
        *,
        assets: BaseAsset | Sequence[BaseAsset],
        partition_key_mapper: PartitionKeyMapper | None = None,
    ) -> None:
        if partition_key_mapper is not None and not isinstance(
            partition_key_mapper, PartitionKeyMapper
        ):
            raise TypeError(
                "partition_key_mapper must be a mapper such as ToDaily(), "
                f"got {type(partition_key_mapper).__name__}"
            )
        object.__setattr__(self, "assets", as_condition(assets))
        object.__setattr__(self, "partition_key_mapper", partition_key_mapper)

    def map_key(self, key: str) -> str:
        return key if self.partition_key_mapper is None else self.partition_key_mapper(key)

    def __str__(self) -> str:
        mapper = f" by {self.partition_key_mapper!r}" if self.partition_key_mapper else ""
        return f"partitions of {self.assets}{mapper}"

    def as_json(self) -> dict[str, Any]:
        return {
            "partitioned": self.assets.as_json(),
            "mapper": repr(self.partition_key_mapper) if self.partition_key_mapper else None,
        }


@dataclasses.dataclass(frozen=True)
class CronPartitionTimetable:
    """Runs on every tick of ``cron``; its outlet events are keyed by the tick."""

    cron: str

    def __post_init__(self) -> None:
        validate_cron(self.cron)

    def __str__(self) -> str:
        return f"{self.cron} (partitioned by tick)"

    def as_json(self) -> dict[str, Any]:
        return {"cron_partitions": self.cron}


Schedule = (
    BaseAsset
    | CronSchedule
    | AssetOrTimeSchedule
    | PartitionedAssetTimetable
    | CronPartitionTimetable
)
