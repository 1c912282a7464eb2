"""Schedules beyond a plain asset condition: cron, time + asset, partitions, and a batching
window."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any

from triggerer.assets import AssetAll, BaseAsset
from triggerer.crons import validate_cron
from triggerer.partitions import PartitionKeyMapper


@dataclasses.dataclass(frozen=True, kw_only=True)
class Batch:
    """A pipeline's batching window: a run starts once ``max_events`` events are queued, or once
    the oldest has waited ``max_wait_s`` seconds, whichever comes first, and takes at most
    ``max_events``, oldest first. The wait is counted from when each event was queued (stored),
    so a daemon restarted in the middle keeps the deadline."""

    max_events: int
    max_wait_s: float

    def __post_init__(self) -> None:
        if (
            not isinstance(self.max_events, int)
            or isinstance(self.max_events, bool)
            or self.max_events < 1
        ):
            raise ValueError(
                f"Batch max_events={self.max_events!r} must be an integer >= 1, e.g. 500"
            )
        if not _positive_seconds(self.max_wait_s):
            raise ValueError(
                f"Batch max_wait_s={self.max_wait_s!r} must be a number of seconds above 0, e.g. 60"
            )

    def __str__(self) -> str:
        return f"batch of {self.max_events} or {self.max_wait_s:g} s"


def _positive_seconds(value: object) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < math.inf


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
