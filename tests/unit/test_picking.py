"""Which queued events a run consumes (triggerer.service.scheduling.picking): pure logic, no
store."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

from triggerer import Asset, AssetAlias, AssetAll, Batch, PartitionedAssetTimetable, ToDaily
from triggerer.partitions import PartitionKeyMapper
from triggerer.pipelines import Pipeline
from triggerer.service.scheduling.picking import Pick, Queued, pick_run
from triggerer.service.scheduling.registry import Registry

a, b, c, d = (Asset(name) for name in "abcd")
IDS = {a: 1, b: 2, c: 3, d: 4}
REGISTRY = Registry({i: asset for asset, i in IDS.items()}, IDS, {}, {}, {})


T0 = datetime(2026, 3, 16, 8, 0, tzinfo=UTC)
NOW = T0 + timedelta(minutes=10)


def queue(*items: Asset | tuple[Asset, str]) -> list[Queued]:
    """Queue rows in order; row and event ids count from 1, with an optional partition key;
    event n happened and was queued n seconds after T0."""
    rows = []
    for n, item in enumerate(items, start=1):
        asset, key = item if isinstance(item, tuple) else (item, None)
        at = T0 + timedelta(seconds=n)
        rows.append(Queued(n, n, IDS[asset], key, at, at))
    return rows


def at(minutes: float, asset: Asset, n: int = 0) -> Queued:
    """Event (and queue row) ``n`` of ``asset``, happened and queued ``minutes`` after T0."""
    time = T0 + timedelta(minutes=minutes)
    return Queued(n, n, IDS[asset], None, time, time)


def pick(schedule: Any, rows: list[Queued], now: datetime = NOW, **options: Any) -> Pick:
    pipeline = Pipeline("p", schedule=schedule, function=print, **options)
    assert pipeline.condition is not None
    return pick_run(pipeline, pipeline.condition, rows, REGISTRY, {}, now)


def picked(schedule: Any, rows: list[Queued], **options: Any) -> list[int]:
    result = pick(schedule, rows, **options)
    assert result.problems == []
    return [row.event_id for row in result.rows]


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
    result = pick_run(pipeline, pipeline.condition, queue(a, b, c), REGISTRY, {}, NOW)
    assert result.rows == []
    assert result.problems == [
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
    result = pick_run(pipeline, pipeline.condition, queue(d, c, a), REGISTRY, members, NOW)
    assert [row.event_id for row in result.rows] == [1, 3]


def test_partitioned_runs_take_one_mapped_key_the_oldest_that_allows_a_run() -> None:
    schedule = PartitionedAssetTimetable(assets=[a, b], partition_key_mapper=ToDaily())
    rows = queue((a, "2026-03-16T01:00"), (a, "2026-03-17T01:00"), (b, "2026-03-17T09:00"))
    pipeline = Pipeline("p", schedule=schedule, function=print)
    result = pick_run(pipeline, schedule.assets, rows, REGISTRY, {}, NOW)
    assert ([row.event_id for row in result.rows], result.partition_key) == ([2, 3], "2026-03-17")


def test_a_key_the_mapper_cannot_map_is_skipped_and_reported() -> None:
    schedule = PartitionedAssetTimetable(assets=a, partition_key_mapper=ToDaily())
    pipeline = Pipeline("p", schedule=schedule, function=print)
    rows = queue((a, "eu-west"), (a, "us-east"), (a, "2026-03-16"))
    result = pick_run(pipeline, schedule.assets, rows, REGISTRY, {}, NOW)
    assert [row.event_id for row in result.rows] == [3]
    result = pick_run(pipeline, schedule.assets, rows[:2], REGISTRY, {}, NOW)
    assert result.rows == []
    [problem] = result.problems
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
    result = pick_run(pipeline, schedule.assets, queue((a, "x")), REGISTRY, {}, NOW)
    assert result.rows == []
    assert "Nameless() mapped it to None, not a partition key" in result.problems[0]


# -- time: windows, resets, batches, debounce (now is T0 + 10 minutes unless given)

WINDOW = timedelta(minutes=5)


def test_a_windowed_and_takes_events_within_the_window_of_each_other() -> None:
    # a at 6 and b at 9 lie within 5 minutes: a run; a at 1 expired at 6.
    result = pick((a & b).within(WINDOW), [at(1, a, 1), at(6, a, 2), at(9, b, 3)])
    assert [row.event_id for row in result.rows] == [2, 3]
    assert [(drop.row.event_id, drop.reason, drop.at) for drop in result.dropped] == [
        (1, "expired", T0 + timedelta(minutes=6))
    ]


def test_a_windowed_and_waits_while_the_other_operand_has_no_event_in_the_window() -> None:
    result = pick((a & b).within(WINDOW), [at(8, a, 1)])
    assert result.rows == []
    assert result.dropped == []
    assert result.due == T0 + timedelta(minutes=13)  # when a's event expires


def test_nested_windows_check_the_inner_window_and_expire_by_the_longest() -> None:
    condition = (a & b).within(timedelta(minutes=1)) | (a & c).within(timedelta(minutes=8))
    # a at 3 is 6.5 minutes before b: not within the inner minute; with c, within 8.
    rows = [at(3, a, 1), at(9.5, b, 2)]
    assert pick(condition, rows).rows == []
    assert pick(condition, rows).dropped == []  # a stays for (a & c) until minute 11
    chosen = pick(condition, [*rows, at(9.5, c, 3)], run_policy="per_event").rows
    assert [row.event_id for row in chosen] == [1, 3]


def test_an_asset_also_named_outside_a_window_never_expires() -> None:
    result = pick((a & b).within(WINDOW) | (a & c), [at(0, a, 1)])
    assert result.dropped == []
    assert result.due is None


def test_a_windowed_and_takes_the_earliest_window_that_holds() -> None:
    rows = [at(5.5, b, 1), at(6, a, 2), at(7, a, 3), at(9, b, 4)]
    assert [row.event_id for row in pick((a & b).within(WINDOW), rows).rows] == [1, 2, 3, 4]
    per_event = pick((a & b).within(WINDOW), rows, run_policy="per_event")
    assert [row.event_id for row in per_event.rows] == [1, 2]


def test_partitions_have_a_window_each() -> None:
    schedule = PartitionedAssetTimetable(assets=(a & b).within(WINDOW))
    first, second = T0 + timedelta(minutes=6), T0 + timedelta(minutes=9)
    rows = [
        Queued(1, 1, IDS[a], "x", first, first),
        Queued(2, 2, IDS[b], "y", second, second),
        Queued(3, 3, IDS[b], "x", second, second),
    ]
    result = pick(schedule, rows)
    assert ([row.event_id for row in result.rows], result.partition_key) == ([1, 3], "x")


def test_a_reset_clears_the_events_queued_before_its_last_tick() -> None:
    # Resets every 5 minutes: at 9:59 the last tick was minute 5.
    condition = AssetAll(a, b, reset="*/5 * * * *")
    now = T0 + timedelta(minutes=9, seconds=59)
    result = pick(condition, [at(4, a, 1), at(6, a, 2)], now=now)
    assert [(drop.row.event_id, drop.reason) for drop in result.dropped] == [(1, "reset")]
    assert result.due == T0 + timedelta(minutes=10)  # the next tick clears event 2
    assert pick(condition, [at(4, a, 1), at(6, a, 2), at(7, b, 3)], now=now).rows != []


def test_a_reset_missed_while_nothing_looked_applies_to_what_was_queued_before_it() -> None:
    condition = AssetAll(a, b, reset="0 0 * * *", reset_timezone="Europe/Paris")
    # Paris midnight on 17 March is 23:00 UTC on the 16th; looked at only the next morning.
    now = datetime(2026, 3, 17, 7, 0, tzinfo=UTC)
    before = Queued(1, 1, IDS[a], None, T0, datetime(2026, 3, 16, 22, 59, tzinfo=UTC))
    after = Queued(2, 2, IDS[a], None, T0, datetime(2026, 3, 16, 23, 1, tzinfo=UTC))
    result = pick(condition, [before, after], now=now)
    assert [drop.row.event_id for drop in result.dropped] == [1]
    assert result.dropped[0].at == datetime(2026, 3, 16, 23, 0, tzinfo=UTC)


def test_a_batch_starts_at_max_events_taking_the_oldest() -> None:
    batch = Batch(max_events=3, max_wait_s=600)
    rows = [at(9, a, n) for n in range(1, 6)]
    assert [row.event_id for row in pick(a, rows[:2], batch=batch).rows] == []
    assert [row.event_id for row in pick(a, rows, batch=batch).rows] == [1, 2, 3]


def test_a_batch_starts_when_the_oldest_event_has_waited_max_wait_s() -> None:
    batch = Batch(max_events=100, max_wait_s=240)
    rows = [at(7, a, 1), at(9, a, 2)]
    waiting = pick(a, rows, batch=batch)
    assert waiting.rows == []
    assert waiting.due == T0 + timedelta(minutes=11)  # the oldest's deadline
    # The deadline counts from the stored time: looked at later (a restart), it fires at once.
    assert [r.event_id for r in pick(a, rows, now=T0 + timedelta(hours=1), batch=batch).rows] == [
        1,
        2,
    ]


def test_debounce_waits_for_quiet_and_takes_everything() -> None:
    rows = [at(1, a, 1), at(5, a, 2), at(9.5, a, 3)]
    quiet = pick(a, rows, debounce_s=60)
    assert quiet.rows == []
    assert quiet.due == T0 + timedelta(minutes=10, seconds=30)
    later = T0 + timedelta(minutes=10, seconds=30)
    assert [r.event_id for r in pick(a, rows, now=later, debounce_s=60).rows] == [1, 2, 3]


def test_a_batch_bounds_how_long_a_busy_stream_holds_a_debounce_back() -> None:
    rows = [at(minute, a, minute) for minute in range(1, 10)]  # an event every minute
    options: dict[str, Any] = {"debounce_s": 120, "batch": Batch(max_events=50, max_wait_s=300)}
    assert len(pick(a, rows, **options).rows) == 9  # the first waited 9 minutes > 5
