"""Replaying stored events on the real store (SQLite and PostgreSQL), with the scheduler's own
passes: which events are queued again, which runs their conditions start, and that a replay
asked twice queues nothing new. The daemon, the CLI and the API: tests/e2e/test_replay.py."""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import delete, func, select
from sqlalchemy.ext.asyncio import AsyncEngine

from tests.integration.daemon.test_scheduling import Harness
from triggerer.service import replay
from triggerer.service.daemon import retention
from triggerer.service.errors import Conflict, NotFound, Refused
from triggerer.service.principals import cli_principal
from triggerer.service.store import models, session_factory

MakeHarness = Callable[[str], Awaitable[Harness]]
FIRST = """
from triggerer import Asset, pipeline
from triggerer.partitions import ToDaily
from triggerer.schedules import PartitionedAssetTimetable

a, b = Asset("a"), Asset("b")

@pipeline(schedule=a)
def first(spark, context): ...

@pipeline(schedule=b)
def on_b(spark, context): ...

@pipeline(schedule=PartitionedAssetTimetable(assets=a, partition_key_mapper=ToDaily()))
def daily(spark, context): ...
"""
LATE = (
    FIRST
    + """
@pipeline(schedule=a, run_policy="per_event")
def late(spark, context): ...

@pipeline(schedule=[a, b])
def both(spark, context): ...
"""
)
EPOCH = datetime(2000, 1, 1, tzinfo=UTC)


@pytest.fixture
async def make_harness(migrated_engine: AsyncEngine, tmp_path: Path) -> MakeHarness:
    """``await make_harness(source)``: a scheduler over the pipelines ``source`` defines."""

    async def make(source: str) -> Harness:
        folder = tmp_path / "pipelines"
        folder.mkdir()
        harness = Harness(session_factory(migrated_engine), folder)
        await harness.load(source)
        return harness

    return make


async def replayed(harness: Harness, **options: Any) -> replay.ReplayResult:
    async with harness.sessions.begin() as session:
        return await replay.replay(
            session,
            harness.asset_id(options.pop("asset", "a")),
            since=EPOCH,
            actor=cli_principal(),
            **options,
        )


async def stored(harness: Harness) -> tuple[int, int, int]:
    """(queue rows, replays, replayed events) in the store."""
    async with harness.sessions() as session:
        counts = [
            await session.scalar(select(func.count()).select_from(table))
            for table in (models.QueuedEvent, models.Replay, models.ReplayEvent)
        ]
    return counts[0] or 0, counts[1] or 0, counts[2] or 0


async def test_a_pipeline_added_later_gets_the_events_once(make_harness: MakeHarness) -> None:
    harness = await make_harness(FIRST)
    events = await harness.emit("a", times=3)
    await harness.emit("a", partition_key="2026-01-02T05")
    assert await harness.schedule("first") == 1
    assert await harness.schedule("daily") == 1
    await harness.load(LATE)
    before = await stored(harness)

    dry = await replayed(harness, pipeline_id="late", dry_run=True)

    assert await stored(harness) == before  # nothing changed
    [late] = dry.pipelines
    assert (late.replay_id, late.events, late.queued, late.event_ids) == (None, 3, 3, events)
    predicted = [(run.run_id, run.event_ids) for run in late.runs or []]
    assert predicted == [(f"late__replay__{e}", [e]) for e in events]

    done = await replayed(harness, pipeline_id="late")
    [late] = done.pipelines
    assert late.replay_id is not None
    assert (late.queued, late.event_ids) == (3, events)
    assert [run.run_id for run in late.runs or []] == [run_id for run_id, _ in predicted]
    assert await harness.schedule("late") == 3
    runs = await harness.runs("late")
    assert [run.run_id for run in runs] == [run_id for run_id, _ in predicted]
    assert await harness.consumed("late") == [[e] for e in events]

    again = await replayed(harness, pipeline_id="late")
    [late] = again.pipelines
    assert (late.queued, late.already_replayed, late.runs) == (0, 3, [])
    assert await harness.schedule("late") == 0


async def test_a_backfill_runs_consumed_events_again_once(make_harness: MakeHarness) -> None:
    harness = await make_harness(LATE)
    events = await harness.emit("a", times=2)
    await harness.emit("a", partition_key="2026-01-02T05")
    await harness.emit("a", partition_key="2026-01-02T07")
    for pipeline_id in ("first", "late", "daily"):
        assert await harness.schedule(pipeline_id) >= 1
    pending = await harness.emit("a")  # queued still for first, late and both

    dry = await replayed(harness, dry_run=True)

    by_id = {p.pipeline_id: p for p in dry.pipelines}
    assert sorted(by_id) == ["both", "daily", "first", "late"]
    first = by_id["first"]
    assert (first.events, first.queued, first.already_queued) == (3, 2, 1)
    # One coalescing run: the event queued still (the oldest row) and the two replayed.
    assert [(r.run_id, r.event_ids) for r in first.runs or []] == [
        (f"first__asset__{pending[0]}", [*events, *pending])
    ]
    daily = by_id["daily"]
    assert (daily.queued, [(r.partition_key, r.events) for r in daily.runs or []]) == (
        2,
        [("2026-01-02", 2)],
    )
    both = by_id["both"]  # never ran: its events are queued still, and wait for b's
    assert (both.queued, both.already_queued, both.runs) == (0, 3, [])

    await replayed(harness)
    assert await harness.schedule("first") == 1  # no unique link refused, no endless retry
    assert await harness.consumed("first") == [events, [*events, *pending]]
    assert await harness.schedule("daily") == 1

    again = await replayed(harness)
    assert [(p.queued, p.already_replayed) for p in again.pipelines] == [
        (0, 3),
        (0, 2),
        (0, 3),
        (0, 3),
    ]
    assert await harness.schedule("first") == 0
    later = await replayed(harness, until=datetime.now(UTC) + timedelta(hours=1))
    assert sum(p.queued for p in later.pipelines) == 0


async def test_paused_consumers_are_skipped_or_refused(make_harness: MakeHarness) -> None:
    harness = await make_harness(LATE)
    await harness.emit("a")
    async with harness.sessions.begin() as session:
        row = await session.get_one(models.Pipeline, "late")
        row.paused = True

    done = await replayed(harness, dry_run=True)

    assert [(s.pipeline_id, s.reason) for s in done.skipped] == [("late", "paused")]
    with pytest.raises(Conflict, match="pipeline 'late' is paused"):
        await replayed(harness, pipeline_id="late")


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"pipeline_id": "nope"}, NotFound, "pipeline 'nope' does not exist"),
        ({"pipeline_id": "on_b"}, Refused, "pipeline 'on_b' does not consume asset 'a'"),
        ({"until": EPOCH}, Refused, "since 2000-01-01T00:00:00+00:00 is not before until"),
    ],
)
async def test_what_cannot_be_replayed_is_named(
    make_harness: MakeHarness, options: dict[str, Any], error: type[Exception], message: str
) -> None:
    harness = await make_harness(LATE)
    with pytest.raises(error, match=re.escape(message)):
        await replayed(harness, **options)


async def test_assets_are_found_by_name_or_uri(make_harness: MakeHarness) -> None:
    harness = await make_harness(LATE)
    async with harness.sessions() as session:
        assert await replay.find_asset(session, "a") == harness.asset_id("a")
        with pytest.raises(NotFound, match="no asset named 'c'"):
            await replay.find_asset(session, "c")
    with pytest.raises(Refused, match="--since 'yesterday' is not an ISO date"):
        replay.parse_time("--since", "yesterday")
    assert replay.parse_time("--since", "2026-01-31") == datetime(2026, 1, 31, tzinfo=UTC)


async def test_retention_deletes_replayed_events_once_not_queued(
    make_harness: MakeHarness, tmp_path: Path
) -> None:
    harness = await make_harness(LATE)
    events = await harness.emit("a", times=2)
    assert await harness.schedule("first") == 1
    await replayed(harness, pipeline_id="first")  # queued again: kept while queued
    cutoffs = retention.Cutoffs.before(datetime.now(UTC) + timedelta(seconds=1))

    await retention.clean(harness.sessions, cutoffs, tmp_path / "logs", batch_size=10)
    assert await harness.queued_ids("first") == events
    await harness.schedule("first")
    for pipeline_id in ("first", "late", "both"):
        async with harness.sessions.begin() as session:
            await session.execute(
                delete(models.QueuedEvent).where(models.QueuedEvent.pipeline_id == pipeline_id)
            )
    await harness.finish_runs("first")
    await retention.clean(harness.sessions, cutoffs, tmp_path / "logs", batch_size=10)

    assert await stored(harness) == (0, 1, 0)  # the replay's events went with them
