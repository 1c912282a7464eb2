"""Which queued events a run consumes (triggerer.service.scheduling.picking): pure logic, no
store."""

from __future__ import annotations

from typing import Any

from triggerer import Asset, AssetAlias, PartitionedAssetTimetable, ToDaily
from triggerer.partitions import PartitionKeyMapper
from triggerer.pipelines import Pipeline
from triggerer.service.scheduling.picking import Queued, pick_run
from triggerer.service.scheduling.registry import Registry

a, b, c, d = (Asset(name) for name in "abcd")
IDS = {a: 1, b: 2, c: 3, d: 4}
REGISTRY = Registry({i: asset for asset, i in IDS.items()}, IDS, {}, {}, {})


def queue(*items: Asset | tuple[Asset, str]) -> list[Queued]:
    """Queue rows in order; row and event ids count from 1, with an optional partition key."""
    rows = []
    for n, item in enumerate(items, start=1):
        asset, key = item if isinstance(item, tuple) else (item, None)
        rows.append(Queued(row_id=n, event_id=n, asset_id=IDS[asset], partition_key=key))
    return rows


def picked(schedule: Any, rows: list[Queued], **options: Any) -> list[int]:
    pipeline = Pipeline("p", schedule=schedule, function=print, **options)
    assert pipeline.condition is not None
    pick = pick_run(pipeline, pipeline.condition, rows, REGISTRY, {})
    assert pick.problems == []
    return [row.event_id for row in pick.rows]


def test_coalesce_takes_every_queued_event_of_the_condition() -> None:
    assert picked([a, b], queue(a, a, b, a)) == [1, 2, 3, 4]
    assert picked([a, b], queue(a, a)) == []


def test_coalesce_under_a_cap_takes_one_event_per_needed_asset_first() -> None:
    assert picked([a, b], queue(a, a, a, b), max_events_per_run=2) == [1, 4]
    assert picked([a, b], queue(a, a, a, b), max_events_per_run=3) == [1, 2, 4]


def test_per_event_takes_the_choice_satisfied_earliest() -> None:
    # b and c arrived before a: they make the first run, a the next.
    assert picked(a | (b & c), queue(b, c, a), run_policy="per_event") == [1, 2]
    assert picked(a | (b & c), queue(b, a, c), run_policy="per_event") == [2]


def test_a_cap_too_small_for_the_earliest_choice_takes_the_smallest() -> None:
    assert picked(a | (b & c), queue(b, c, a), max_events_per_run=1) == [3]


def test_a_cap_smaller_than_any_choice_is_reported() -> None:
    pipeline = Pipeline("p", schedule=[a, b, c], function=print, max_events_per_run=2)
    assert pipeline.condition is not None
    pick = pick_run(pipeline, pipeline.condition, queue(a, b, c), REGISTRY, {})
    assert pick.rows == []
    assert pick.problems == [
        "max_events_per_run=2 is too small for a & b & c: a run needs 3 events (a, b, c), "
        "so they stay queued"
    ]


def test_rows_a_changed_schedule_cannot_consume_are_never_picked() -> None:
    assert picked([a, b], queue(d, a, c, b)) == [2, 4]
    assert picked(a, queue(a, (a, "2026-03-16"))) == [1]
    partitioned = PartitionedAssetTimetable(assets=a)
    assert picked(partitioned, queue(a, (a, "2026-03-16"))) == [2]


def test_an_alias_is_satisfied_by_any_asset_added_through_it() -> None:
    alias = AssetAlias("new_tables")
    pipeline = Pipeline("p", schedule=alias & a, function=print, run_policy="per_event")
    assert pipeline.condition is not None
    members = {IDS[c]: {alias}, IDS[d]: {alias}}
    pick = pick_run(pipeline, pipeline.condition, queue(d, c, a), REGISTRY, members)
    assert [row.event_id for row in pick.rows] == [1, 3]


def test_partitioned_runs_take_one_mapped_key_the_oldest_that_allows_a_run() -> None:
    schedule = PartitionedAssetTimetable(assets=[a, b], partition_key_mapper=ToDaily())
    rows = queue((a, "2026-03-16T01:00"), (a, "2026-03-17T01:00"), (b, "2026-03-17T09:00"))
    pipeline = Pipeline("p", schedule=schedule, function=print)
    pick = pick_run(pipeline, schedule.assets, rows, REGISTRY, {})
    assert ([row.event_id for row in pick.rows], pick.partition_key) == ([2, 3], "2026-03-17")


def test_a_key_the_mapper_cannot_map_is_skipped_and_reported() -> None:
    schedule = PartitionedAssetTimetable(assets=a, partition_key_mapper=ToDaily())
    pipeline = Pipeline("p", schedule=schedule, function=print)
    rows = queue((a, "eu-west"), (a, "us-east"), (a, "2026-03-16"))
    pick = pick_run(pipeline, schedule.assets, rows, REGISTRY, {})
    assert [row.event_id for row in pick.rows] == [3]
    pick = pick_run(pipeline, schedule.assets, rows[:2], REGISTRY, {})
    assert pick.rows == []
    [problem] = pick.problems
    assert problem.startswith(
        "partition key 'eu-west' of event 1 on asset 'a': ToDaily() cannot map it: ValueError: "
    )
    assert "(and 1 more); skipped" in problem


class Nameless(PartitionKeyMapper):
    def __call__(self, key: object) -> str:
        return None  # type: ignore[return-value]  # a user's mapper can return anything


def test_a_mapper_giving_no_usable_key_is_reported() -> None:
    schedule = PartitionedAssetTimetable(assets=a, partition_key_mapper=Nameless())
    pipeline = Pipeline("p", schedule=schedule, function=print)
    pick = pick_run(pipeline, schedule.assets, queue((a, "x")), REGISTRY, {})
    assert pick.rows == []
    assert "Nameless() mapped it to None, not a partition key" in pick.problems[0]
