"""The names ARCHITECTURE.md promises under ``from triggerer import ...``."""

from __future__ import annotations

from types import ModuleType

import pluggy
import pytest

import triggerer

# The "Public Python API" table of ARCHITECTURE.md.
CONTRACT_NAMES = (
    "Asset",
    "AssetAlias",
    "AssetAll",
    "AssetAny",
    "AssetWatcher",
    "BaseEventTrigger",
    "TriggerEvent",
    "load_trigger",
    "Metadata",
    "pipeline",
    "Pipeline",
    "AssetOrTimeSchedule",
    "PartitionedAssetTimetable",
    "CronPartitionTimetable",
    "Batch",
    "ToHourly",
    "ToDaily",
    "ToWeekly",
    "ToMonthly",
    "ToQuarterly",
    "ToYearly",
    "RunContext",
    "AssetEvent",
    "hookimpl",
)


@pytest.mark.parametrize("name", CONTRACT_NAMES)
def test_contract_name_imports_from_triggerer(name: str) -> None:
    namespace: dict[str, object] = {}
    exec(f"from triggerer import {name}", namespace)  # noqa: S102 - the import statement is the test
    assert namespace[name] is getattr(triggerer, name)


def test_all_is_a_tuple() -> None:
    assert isinstance(triggerer.__all__, tuple)


def test_all_has_no_duplicates() -> None:
    assert len(set(triggerer.__all__)) == len(triggerer.__all__)


def test_all_equals_the_public_names_exported() -> None:
    public = {
        name
        for name in dir(triggerer)
        if not name.startswith("_") and not isinstance(getattr(triggerer, name), ModuleType)
    }
    assert set(triggerer.__all__) == public


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="module 'triggerer' has no attribute 'Assets'"):
        triggerer.Assets  # type: ignore[attr-defined]  # noqa: B018 - the lookup is the test


def test_all_equals_the_contract() -> None:
    assert set(triggerer.__all__) == set(CONTRACT_NAMES)


def test_star_import_gives_exactly_all() -> None:
    namespace: dict[str, object] = {}
    exec("from triggerer import *", namespace)  # noqa: S102 - the import statement is the test
    assert set(namespace) - {"__builtins__"} == set(triggerer.__all__)


def test_hookimpl_is_the_pluggy_marker_of_the_project() -> None:
    assert isinstance(triggerer.hookimpl, pluggy.HookimplMarker)
    assert triggerer.hookimpl.project_name == "triggerer"
