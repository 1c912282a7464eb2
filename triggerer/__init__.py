"""triggerer: start PySpark pipelines the moment their data arrives.

The SDK users import: assets and conditions, triggers, pipelines and schedules, the run
context, partition mappers and the listener marker.
"""

import importlib
import typing

if typing.TYPE_CHECKING:
    from triggerer.assets import Asset, AssetAlias, AssetAll, AssetAny, AssetWatcher
    from triggerer.context import AssetEvent, RunContext
    from triggerer.listeners import hookimpl
    from triggerer.partitions import ToDaily, ToHourly, ToMonthly, ToQuarterly, ToWeekly, ToYearly
    from triggerer.pipelines import Metadata, Pipeline, pipeline
    from triggerer.schedules import (
        AssetOrTimeSchedule,
        Batch,
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
    "Batch",
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

# The module defining each name, imported when the name is first asked for (PEP 562): the
# service's own modules (``triggerer.service.cli``, ``triggerer.service.store``) are in this
# package too, and importing one of them should not import the SDK, its plugins' entry points,
# pluggy and structlog with it.
_HOMES = {
    "triggerer.assets": ("Asset", "AssetAlias", "AssetAll", "AssetAny", "AssetWatcher"),
    "triggerer.context": ("AssetEvent", "RunContext"),
    "triggerer.listeners": ("hookimpl",),
    "triggerer.partitions": (
        "ToDaily",
        "ToHourly",
        "ToMonthly",
        "ToQuarterly",
        "ToWeekly",
        "ToYearly",
    ),
    "triggerer.pipelines": ("Metadata", "Pipeline", "pipeline"),
    "triggerer.schedules": (
        "AssetOrTimeSchedule",
        "Batch",
        "CronPartitionTimetable",
        "PartitionedAssetTimetable",
    ),
    "triggerer.triggers": ("BaseEventTrigger", "TriggerEvent", "load_trigger"),
}
_HOME_OF = {name: module for module, names in _HOMES.items() for name in names}


def __getattr__(name: str) -> object:
    module = _HOME_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # asked once: later lookups find it without this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
