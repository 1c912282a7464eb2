"""triggerer: start PySpark pipelines the moment their data arrives.

The SDK users import: assets and conditions, triggers, pipelines and schedules, the run
context, partition mappers and the listener marker.
"""

from triggerer.assets import Asset, AssetAlias, AssetAll, AssetAny, AssetWatcher
from triggerer.context import AssetEvent, RunContext
from triggerer.listeners import hookimpl
from triggerer.partitions import ToDaily, ToHourly, ToMonthly, ToQuarterly, ToWeekly, ToYearly
from triggerer.pipelines import Metadata, Pipeline, pipeline
from triggerer.schedules import (
    AssetOrTimeSchedule,
    CronPartitionTimetable,
    PartitionedAssetTimetable,
)
from triggerer.triggers import BaseEventTrigger, TriggerEvent, load_trigger

__all__ = (
    "Asset",
    "AssetAlias",
    "AssetAll",
    "AssetAny",
    "AssetEvent",
    "AssetOrTimeSchedule",
    "AssetWatcher",
    "BaseEventTrigger",
    "CronPartitionTimetable",
    "Metadata",
    "PartitionedAssetTimetable",
    "Pipeline",
    "RunContext",
    "ToDaily",
    "ToHourly",
    "ToMonthly",
    "ToQuarterly",
    "ToWeekly",
    "ToYearly",
    "TriggerEvent",
    "hookimpl",
    "load_trigger",
    "pipeline",
)
