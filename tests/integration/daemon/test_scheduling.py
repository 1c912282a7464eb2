"""Scheduling semantics on the real store (SQLite and PostgreSQL): which runs, which events."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from triggerer.daemon.registry import Registry, sync_definitions
from triggerer.daemon.scheduler import Scheduler
from triggerer.events import NewEvent, record_events
from triggerer.loader import load_pipelines
from triggerer.store import models, session_factory
from triggerer.store.models import RunState

PIPELINES = """
from triggerer import Asset, pipeline

a, b, c = Asset("a"), Asset("b"), Asset("c")

@pipeline(schedule=[a, b])
def both(spark, context): ...

@pipeline(schedule=c, run_policy="per_event")
def each_c(spark, context): ...

@pipeline(schedule=c, max_active_runs=1)
def one_at_a_time(spark, context): ...

@pipeline(schedule=[a, b], run_policy="per_event")
def pairs(spark, context): ...
"""


class Harness:
    def __init__(self, sessions: async_sessionmaker[AsyncSession], registry: Registry) -> None:
        self.sessions = sessions
        self.registry = registry
        self.scheduler = Scheduler(sessions, lambda: registry, lambda: None)

    async def emit(self, name: str, times: int = 1) -> list[int]:
        asset_id = next(i for i, asset in self.registry.assets.items() if asset.name == name)
        async with self.sessions.begin() as session:
            recorded = await record_events(
                session, [NewEvent(asset_id, {"n": n}, "manual") for n in range(times)]
            )
        return [event.id for event in recorded.events]

    async def schedule(self, pipeline_id: str) -> int:
        return await self.scheduler.schedule(self.registry.pipelines[pipeline_id], self.registry)

    async def consumed(self, pipeline_id: str) -> list[list[int]]:
        async with self.sessions() as session:
            rows = await session.execute(
                select(models.Run.id, models.RunEvent.event_id)
                .join(models.RunEvent, models.RunEvent.run_pk == models.Run.id)
                .where(models.Run.pipeline_id == pipeline_id)
                .order_by(models.Run.id, models.RunEvent.event_id)
            )
            runs: dict[int, list[int]] = {}
            for run_pk, event_id in rows.all():
                runs.setdefault(run_pk, []).append(event_id)
            return list(runs.values())

    async def queued(self, pipeline_id: str) -> int:
        async with self.sessions() as session:
            count = await session.scalar(
                select(func.count())
                .select_from(models.QueuedEvent)
                .where(models.QueuedEvent.pipeline_id == pipeline_id)
            )
            return count or 0

    async def finish_runs(self, pipeline_id: str) -> None:
        async with self.sessions.begin() as session:
            await session.execute(
                update(models.Run)
                .where(models.Run.pipeline_id == pipeline_id)
                .values(state=RunState.SUCCESS)
            )


@pytest.fixture
async def harness(migrated_engine: AsyncEngine, tmp_path: Path) -> Harness:
    folder = tmp_path / "pipelines"
    folder.mkdir()
    (folder / "pipelines.py").write_text(PIPELINES)
    loaded = load_pipelines(folder)
    assert loaded.errors == []
    sessions = session_factory(migrated_engine)
    async with sessions.begin() as session:
        registry = await sync_definitions(session, loaded)
    return Harness(sessions, registry)


async def test_and_waits_then_one_run_consumes_every_queued_event(harness: Harness) -> None:
    a_events = await harness.emit("a", times=3)
    assert await harness.schedule("both") == 0
    b_events = await harness.emit("b")
    assert await harness.schedule("both") == 1
    assert await harness.consumed("both") == [sorted(a_events + b_events)]
    await harness.emit("a")
    assert await harness.schedule("both") == 0
    assert await harness.queued("both") == 1


async def test_per_event_gives_one_run_per_event(harness: Harness) -> None:
    events = await harness.emit("c", times=5)
    assert await harness.schedule("each_c") == 5
    assert await harness.consumed("each_c") == [[event] for event in events]


async def test_per_event_under_and_takes_the_oldest_event_of_each_asset(harness: Harness) -> None:
    a_events = await harness.emit("a", times=2)
    b_events = await harness.emit("b", times=1)
    assert await harness.schedule("pairs") == 1
    assert await harness.consumed("pairs") == [[a_events[0], b_events[0]]]
    assert await harness.queued("pairs") == 1


async def test_max_active_runs_keeps_events_queued_for_the_next_run(harness: Harness) -> None:
    first = await harness.emit("c")
    assert await harness.schedule("one_at_a_time") == 1
    later = await harness.emit("c", times=3)
    assert await harness.schedule("one_at_a_time") == 0
    assert await harness.queued("one_at_a_time") == 3
    await harness.finish_runs("one_at_a_time")
    assert await harness.schedule("one_at_a_time") == 1
    assert await harness.consumed("one_at_a_time") == [first, later]
    assert await harness.queued("one_at_a_time") == 0


async def test_paused_pipeline_gets_no_queue_rows(harness: Harness) -> None:
    async with harness.sessions.begin() as session:
        await session.execute(
            update(models.Pipeline)
            .where(models.Pipeline.pipeline_id == "each_c")
            .values(paused=True)
        )
    await harness.emit("c")
    assert await harness.queued("each_c") == 0
    assert await harness.queued("one_at_a_time") == 1


async def test_redelivered_event_with_same_dedup_key_is_not_stored_twice(harness: Harness) -> None:
    asset_id = next(i for i, asset in harness.registry.assets.items() if asset.name == "c")
    event = NewEvent(asset_id, {}, "trigger", dedup_key="topic/0/7")
    async with harness.sessions.begin() as session:
        first = await record_events(session, [event, event])
    async with harness.sessions.begin() as session:
        again = await record_events(session, [event])
    assert (len(first.events), first.duplicates) == (1, 1)
    assert (again.events, again.duplicates) == ([], 1)
    assert await harness.queued("each_c") == 1


async def test_two_schedulers_never_create_two_runs_from_the_same_events(
    harness: Harness,
) -> None:
    import anyio

    await harness.emit("c", times=12)
    other = Scheduler(harness.sessions, lambda: harness.registry, lambda: None)
    counts: list[int] = []

    async def run(scheduler: Scheduler) -> None:
        counts.append(
            await scheduler.schedule(harness.registry.pipelines["each_c"], harness.registry)
        )

    async with anyio.create_task_group() as group:
        group.start_soon(run, harness.scheduler)
        group.start_soon(run, other)
    consumed = await harness.consumed("each_c")
    assert sum(counts) == 12
    assert sorted(e for run in consumed for e in run) == sorted(
        {e for run in consumed for e in run}
    )
    assert len(consumed) == 12
