"""Scheduling semantics on the real store (SQLite and PostgreSQL): which runs, which events."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from datetime import datetime, timedelta
from pathlib import Path

import pytest
from sqlalchemy import delete, select, update
from sqlalchemy.exc import OperationalError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from triggerer.schedules import PartitionedAssetTimetable
from triggerer.service.events import NewEvent, record_events
from triggerer.service.loader import load_pipelines
from triggerer.service.scheduling.registry import Registry, sync_definitions
from triggerer.service.scheduling.schedule_queries import create_manual_run
from triggerer.service.scheduling.scheduler import TOGETHER, Scheduler
from triggerer.service.store import models, session_factory
from triggerer.service.store.states import RefRole, RunState
from triggerer.service.store.types import utcnow

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
    def __init__(self, sessions: async_sessionmaker[AsyncSession], folder: Path) -> None:
        self.sessions = sessions
        self.folder = folder
        self.registry = Registry({}, {}, {}, {}, {})
        self.scheduler = Scheduler(sessions, lambda: self.registry, lambda: None)

    async def load(self, source: str) -> None:
        """Sync ``source`` as the pipelines folder, as a reload does."""
        (self.folder / "pipelines.py").write_text(source)
        loaded = load_pipelines(self.folder)
        assert loaded.errors == []
        async with self.sessions.begin() as session:
            self.registry = await sync_definitions(session, loaded)

    def asset_id(self, name: str) -> int:
        return next(i for i, asset in self.registry.assets.items() if asset.name == name)

    async def emit(
        self, name: str, times: int = 1, *, partition_key: str | None = None
    ) -> list[int]:
        asset_id = self.asset_id(name)
        new_events = [
            NewEvent(asset_id, {"n": n}, "manual", partition_key=partition_key)
            for n in range(times)
        ]
        async with self.sessions.begin() as session:
            recorded = await record_events(session, new_events)
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

    async def queued_ids(self, pipeline_id: str) -> list[int]:
        async with self.sessions() as session:
            rows = await session.scalars(
                select(models.QueuedEvent.event_id)
                .where(models.QueuedEvent.pipeline_id == pipeline_id)
                .order_by(models.QueuedEvent.event_id)
            )
            return list(rows.all())

    async def queued(self, pipeline_id: str) -> int:
        return len(await self.queued_ids(pipeline_id))

    async def row(self, pipeline_id: str) -> models.Pipeline:
        async with self.sessions() as session:
            return await session.get_one(models.Pipeline, pipeline_id)

    async def runs(self, pipeline_id: str) -> list[models.Run]:
        async with self.sessions() as session:
            rows = await session.scalars(
                select(models.Run)
                .where(models.Run.pipeline_id == pipeline_id)
                .order_by(models.Run.id)
            )
            return list(rows.all())

    async def finish_runs(self, pipeline_id: str) -> None:
        async with self.sessions.begin() as session:
            await session.execute(
                update(models.Run)
                .where(models.Run.pipeline_id == pipeline_id)
                .values(state=RunState.SUCCESS)
            )


@pytest.fixture
async def make_harness(
    migrated_engine: AsyncEngine, tmp_path: Path
) -> Callable[[str], Awaitable[Harness]]:
    """``await make_harness(source)``: a scheduler over the pipelines ``source`` defines."""

    async def make(source: str) -> Harness:
        folder = tmp_path / "pipelines"
        folder.mkdir()
        harness = Harness(session_factory(migrated_engine), folder)
        await harness.load(source)
        return harness

    return make


@pytest.fixture
async def harness(make_harness: Callable[[str], Awaitable[Harness]]) -> Harness:
    return await make_harness(PIPELINES)


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


async def test_a_paused_pipeline_holds_its_queue_rows_and_starts_no_run(harness: Harness) -> None:
    async with harness.sessions.begin() as session:
        await session.execute(
            update(models.Pipeline)
            .where(models.Pipeline.pipeline_id == "each_c")
            .values(paused=True)
        )
    await harness.emit("c")
    assert await harness.queued("each_c") == 1
    assert await harness.schedule("each_c") == 0
    assert await harness.queued("one_at_a_time") == 1


async def test_a_busy_scheduler_still_looks_at_everything_every_idle_period(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Events queued by another process wake no one on SQLite: the periodic full look must come
    even while wakes for other pipelines keep arriving (it used to wait for a quiet moment)."""
    import anyio

    from triggerer.service.scheduling import scheduler

    monkeypatch.setattr(scheduler, "SWEEP_S", 1.0)
    async with anyio.create_task_group() as group:
        group.start_soon(harness.scheduler.run)
        await anyio.sleep(0.2)  # past the first full look
        await harness.emit("c")  # as the CLI would: stored, no wake here
        with anyio.fail_after(10):
            while not await harness.runs("each_c"):
                harness.scheduler.wake(["pairs"])
                await anyio.sleep(0.1)
        group.cancel_scope.cancel()


async def test_a_stream_of_wakes_makes_a_pass_per_spacing_not_one_per_wake(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Under a stream of commits each waking it, the scheduler passes no more often than
    PASS_SPACING_S, and the last wake still gets its pass."""
    import anyio

    from triggerer.service.scheduling import scheduler

    monkeypatch.setattr(scheduler, "PASS_SPACING_S", 0.05)
    passes = 0
    pass_once = harness.scheduler.run_once

    async def counted() -> float:
        nonlocal passes
        passes += 1
        return await pass_once()

    monkeypatch.setattr(harness.scheduler, "run_once", counted)
    async with anyio.create_task_group() as group:
        group.start_soon(harness.scheduler.run)
        await anyio.sleep(0.1)  # past the first full look
        before, started = passes, anyio.current_time()
        for _ in range(100):
            harness.scheduler.wake(["pairs"])
            await anyio.sleep(0.002)
        await harness.emit("c")
        harness.scheduler.wake(["each_c"])
        with anyio.fail_after(10):
            while not await harness.runs("each_c"):  # noqa: ASYNC110
                await anyio.sleep(0.01)
        elapsed = anyio.current_time() - started
        group.cancel_scope.cancel()
    assert passes - before <= elapsed / 0.05 + 2


SPREAD = 3 * TOGETHER
"""Pipelines of a long pass: three transactions' worth."""
MANY = (
    "from triggerer import Asset, pipeline\n"
    + "".join(
        f"@pipeline(schedule=Asset('s{n}'))\ndef p{n:03}(spark, context): ...\n"
        for n in range(SPREAD)
    )
    + "@pipeline(schedule=Asset('hot'))\ndef zz_hot(spark, context): ...\n"
)


async def test_a_pipeline_woken_during_a_long_pass_does_not_wait_for_its_end(
    make_harness: Callable[[str], Awaitable[Harness]],
) -> None:
    """Was: the wake of an event that came during a pass over a thousand waiting pipelines
    (the idle sweep) waited for the whole pass, seconds. Now it waits for the transaction of
    at most TOGETHER pipelines the pass is in."""
    harness = await make_harness(MANY)
    for n in range(SPREAD):
        await harness.emit(f"s{n}")
    await harness.emit("hot")  # stored, its wake not yet come
    created: list[int] = []

    def woken_at_the_first_run() -> None:
        created.append(1)
        if len(created) == 1:
            harness.scheduler.wake(["zz_hot"])

    harness.scheduler = Scheduler(
        harness.sessions, lambda: harness.registry, woken_at_the_first_run
    )
    await harness.scheduler.run_once()  # everything, in name order: p000 .. p149, zz_hot

    async with harness.sessions() as session:
        order = (
            await session.scalars(select(models.Run.pipeline_id).order_by(models.Run.id))
        ).all()
    assert order[: TOGETHER + 1] == [f"p{n:03}" for n in range(TOGETHER)] + ["zz_hot"]
    assert len(order) == SPREAD + 1


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


# -- Faults of one pipeline stay in that pipeline ---------------------------------------------

PARTITIONED = """
from triggerer import Asset, PartitionedAssetTimetable, ToDaily, pipeline
from triggerer.partitions import PartitionKeyMapper

a, f = Asset("a"), Asset("f")


class Flaky(Asset):
    __slots__ = ()

    def evaluate(self, updated):
        raise RuntimeError("flaky condition")


class Broken(PartitionKeyMapper):
    def __call__(self, key):
        raise KeyError(key)


@pipeline(schedule=PartitionedAssetTimetable(assets=a, partition_key_mapper=ToDaily()))
def daily(spark, context): ...

@pipeline(schedule=PartitionedAssetTimetable(assets=a))
def by_key(spark, context): ...

@pipeline(schedule=PartitionedAssetTimetable(assets=a, partition_key_mapper=Broken()))
def broken(spark, context): ...

@pipeline(schedule=Flaky("f"))
def flaky(spark, context): ...
"""


async def test_a_key_the_mapper_cannot_map_fails_the_pipeline_not_the_scheduler(
    make_harness: Callable[[str], Awaitable[Harness]],
) -> None:
    harness = await make_harness(PARTITIONED)
    [poison] = await harness.emit("a", partition_key="eu-west")
    [good] = await harness.emit("a", partition_key="2026-03-16T09:37:51")

    assert await harness.schedule("daily") == 1
    assert await harness.consumed("daily") == [[good]]
    assert [run.partition_key for run in await harness.runs("daily")] == ["2026-03-16"]
    # The poison row stays queued, skipped and reported; it blocks nothing.
    assert await harness.queued_ids("daily") == [poison]
    row = await harness.row("daily")
    assert row.error is not None
    assert row.error_at is not None
    for part in ("'eu-west'", f"event {poison}", "asset 'a'", "ToDaily()"):
        assert part in row.error
    # The same event is fine for a pipeline without a mapper.
    assert await harness.schedule("by_key") == 2
    assert (await harness.row("by_key")).error is None

    # Once the poison row is gone (deleted through the API) the error clears.
    async with harness.sessions.begin() as session:
        await session.execute(
            delete(models.QueuedEvent).where(models.QueuedEvent.pipeline_id == "daily")
        )
    await harness.emit("a", partition_key="2026-03-17")
    assert await harness.schedule("daily") == 1
    row = await harness.row("daily")
    assert (row.error, row.error_at) == (None, None)


async def test_any_error_of_user_code_fails_only_its_pipeline(
    make_harness: Callable[[str], Awaitable[Harness]],
) -> None:
    harness = await make_harness(PARTITIONED)
    [event] = await harness.emit("a", partition_key="2026-03-16")
    await harness.emit("f")

    assert await harness.schedule("broken") == 0
    assert await harness.schedule("flaky") == 0
    assert await harness.schedule("daily") == 1
    broken = (await harness.row("broken")).error
    assert broken is not None
    assert f"event {event}" in broken
    assert "KeyError" in broken
    flaky = (await harness.row("flaky")).error
    assert flaky is not None
    assert "flaky condition" in flaky
    assert await harness.queued("flaky") == 1


async def test_a_pass_makes_its_pipelines_runs_together_and_a_failing_one_fails_alone(
    make_harness: Callable[[str], Awaitable[Harness]],
) -> None:
    """A pass evaluates its pipelines in one transaction; one whose user code raises rolls it
    back, and each is evaluated again alone: the others' runs are made, its error recorded."""
    harness = await make_harness(PARTITIONED)
    await harness.emit("a", partition_key="2026-03-16")
    await harness.emit("f")
    harness.scheduler.wake(["broken", "by_key", "daily", "flaky"])

    await harness.scheduler.run_once()

    assert [len(await harness.runs(p)) for p in ("broken", "by_key", "daily", "flaky")] == [
        0,
        1,
        1,
        0,
    ]
    assert "KeyError" in ((await harness.row("broken")).error or "")
    assert "flaky condition" in ((await harness.row("flaky")).error or "")


async def test_an_unavailable_store_is_no_fault_of_the_pipeline(
    make_harness: Callable[[str], Awaitable[Harness]], monkeypatch: pytest.MonkeyPatch
) -> None:
    harness = await make_harness(PARTITIONED)
    await harness.emit("a", partition_key="2026-03-16")
    outage = OperationalError("SELECT 1", {}, ConnectionError("server closed the connection"))

    def unreachable(self: PartitionedAssetTimetable, key: str) -> str:
        raise outage

    monkeypatch.setattr(PartitionedAssetTimetable, "map_key", unreachable)
    with pytest.raises(OperationalError):
        await harness.schedule("daily")
    assert (await harness.row("daily")).error is None


# -- max_events_per_run, cron and schedule changes -------------------------------------------

LIMITS = """
from triggerer import Asset, pipeline

a, b, c = Asset("a"), Asset("b"), Asset("c")

@pipeline(schedule=[a, b], max_events_per_run=2)
def capped(spark, context): ...

@pipeline(schedule=[a, b, c], max_events_per_run=2)
def too_small(spark, context): ...

@pipeline(schedule=a | (b & c), max_events_per_run=1)
def either(spark, context): ...
"""


async def test_max_events_per_run_under_and_takes_events_that_satisfy_it(
    make_harness: Callable[[str], Awaitable[Harness]],
) -> None:
    harness = await make_harness(LIMITS)
    a_events = await harness.emit("a", times=3)
    b_events = await harness.emit("b", times=2)

    assert await harness.schedule("capped") == 2
    assert await harness.consumed("capped") == [
        [a_events[0], b_events[0]],
        [a_events[1], b_events[1]],
    ]
    assert await harness.queued_ids("capped") == [a_events[2]]
    assert (await harness.row("capped")).error is None


async def test_max_events_per_run_smaller_than_the_condition_needs_is_reported(
    make_harness: Callable[[str], Awaitable[Harness]],
) -> None:
    harness = await make_harness(LIMITS)
    await harness.emit("b")
    await harness.emit("c")
    await harness.emit("a")

    assert await harness.schedule("too_small") == 0
    error = (await harness.row("too_small")).error
    assert error is not None
    assert "max_events_per_run=2" in error
    # Under an OR the smallest satisfying choice fits: a alone, then b & c never can.
    assert await harness.schedule("either") == 1
    assert [len(run) for run in await harness.consumed("either")] == [1]
    assert await harness.queued("either") == 2
    assert "max_events_per_run=1" in ((await harness.row("either")).error or "")


def cron_source(cron: str) -> str:
    return f"""
from triggerer import pipeline

@pipeline(schedule={cron!r}, max_active_runs=1)
def ticking(spark, context): ...
"""


async def test_a_changed_cron_expression_gets_a_tick_of_its_own(
    make_harness: Callable[[str], Awaitable[Harness]],
) -> None:
    harness = await make_harness(cron_source("@yearly"))
    yearly = (await harness.row("ticking")).next_cron_at
    assert yearly is not None
    await harness.load(cron_source("@yearly"))
    assert (await harness.row("ticking")).next_cron_at == yearly

    await harness.load(cron_source("* * * * *"))
    tick = (await harness.row("ticking")).next_cron_at
    assert tick is not None
    assert tick - utcnow() <= timedelta(minutes=1)


async def set_tick(harness: Harness, tick: datetime) -> None:
    async with harness.sessions.begin() as session:
        await session.execute(
            update(models.Pipeline)
            .where(models.Pipeline.pipeline_id == "ticking")
            .values(next_cron_at=tick)
        )


async def test_a_cron_tick_waits_while_max_active_runs_are_active(
    make_harness: Callable[[str], Awaitable[Harness]],
) -> None:
    harness = await make_harness(cron_source("* * * * *"))
    due = utcnow().replace(microsecond=0) - timedelta(minutes=5)
    await set_tick(harness, due)
    await harness.scheduler.run_once()
    assert len(await harness.runs("ticking")) == 1

    await set_tick(harness, due + timedelta(minutes=1))
    await harness.scheduler.run_once()
    assert len(await harness.runs("ticking")) == 1
    assert (await harness.row("ticking")).next_cron_at == due + timedelta(minutes=1)

    await harness.finish_runs("ticking")
    await harness.scheduler.run_once()
    second = (await harness.runs("ticking"))[1]
    assert second.run_type == "cron"
    assert second.run_id.endswith((due + timedelta(minutes=1)).isoformat())
    next_tick = (await harness.row("ticking")).next_cron_at
    assert next_tick is not None
    assert next_tick > utcnow()


CHANGING = """
from triggerer import Asset, PartitionedAssetTimetable, pipeline

a, b = Asset("a"), Asset("b")

@pipeline(schedule={schedule})
def changing(spark, context): ...
"""


async def test_queue_rows_of_assets_a_changed_schedule_dropped_are_not_consumed(
    make_harness: Callable[[str], Awaitable[Harness]],
) -> None:
    harness = await make_harness(CHANGING.format(schedule="[a, b]"))
    stale = await harness.emit("a", times=2)
    await harness.load(CHANGING.format(schedule="b"))
    [fresh] = await harness.emit("b")

    # Before the scheduler has seen the new definition's first pass: never consumed.
    assert await harness.schedule("changing") == 1
    assert await harness.consumed("changing") == [[fresh]]
    assert await harness.queued_ids("changing") == stale
    # Its first pass drops them: nothing waits for a run it cannot belong to.
    await harness.scheduler.run_once()
    assert await harness.queued_ids("changing") == []


async def test_plain_rows_of_a_pipeline_made_partitioned_are_not_consumed(
    make_harness: Callable[[str], Awaitable[Harness]],
) -> None:
    harness = await make_harness(CHANGING.format(schedule="a"))
    [plain] = await harness.emit("a")
    await harness.load(CHANGING.format(schedule="PartitionedAssetTimetable(assets=a)"))
    [keyed] = await harness.emit("a", partition_key="eu-west")

    assert await harness.schedule("changing") == 1
    assert await harness.consumed("changing") == [[keyed]]
    assert await harness.queued_ids("changing") == [plain]
    await harness.scheduler.run_once()
    assert await harness.queued_ids("changing") == []


async def test_run_ids_fit_their_column_however_long_the_pipeline_id(
    make_harness: Callable[[str], Awaitable[Harness]],
) -> None:
    long_id = "p" * models.ID_LENGTH
    harness = await make_harness(f"""
from triggerer import Asset, pipeline

@pipeline({long_id!r}, schedule=Asset("a"), run_policy="per_event")
def long(spark, context): ...
""")
    await harness.emit("a", times=2)
    assert await harness.schedule(long_id) == 2
    async with harness.sessions.begin() as session:
        await create_manual_run(session, long_id)
    run_ids = [run.run_id for run in await harness.runs(long_id)]
    assert len(set(run_ids)) == 3
    assert all(len(run_id) <= models.ID_LENGTH for run_id in run_ids)


async def test_the_error_of_a_schedule_goes_with_it(
    make_harness: Callable[[str], Awaitable[Harness]],
) -> None:
    harness = await make_harness(PARTITIONED)
    await harness.emit("a", partition_key="eu-west")
    assert await harness.schedule("daily") == 0
    assert (await harness.row("daily")).error is not None

    await harness.load(
        PARTITIONED.replace(
            "schedule=PartitionedAssetTimetable(assets=a, partition_key_mapper=ToDaily())",
            "schedule=None",
        )
    )
    await harness.scheduler.run_once()
    row = await harness.row("daily")
    assert (row.error, row.error_at) == (None, None)


@pytest.mark.parametrize("db_backend", ["postgresql"], indirect=True)
async def test_a_run_the_store_refuses_fails_only_its_pipeline(
    make_harness: Callable[[str], Awaitable[Harness]],
) -> None:
    harness = await make_harness("""
from triggerer import Asset, pipeline

a = Asset("a")

@pipeline(schedule=a)
def refused(spark, context): ...

@pipeline(schedule=a)
def fine(spark, context): ...
""")
    # PostgreSQL's jsonb cannot hold NUL, so this pipeline's runs cannot be written. Loading
    # refuses such params; these are set past that check, as a value no check foresaw would be.
    object.__setattr__(harness.registry.pipelines["refused"], "params", {"note": "a\x00b"})
    await harness.emit("a")
    assert await harness.schedule("refused") == 0
    assert await harness.schedule("fine") == 1
    error = (await harness.row("refused")).error
    assert error is not None
    assert error.startswith("evaluating its schedule failed: ")
    assert await harness.queued("refused") == 1


async def test_a_sync_writes_what_changed_and_the_scheduler_looks_at_that_alone(
    harness: Harness,
) -> None:
    """A reload writes the rows that differ and names the pipelines it changed; the scheduler
    evaluates those, not the others (whose queues and due times stand)."""
    assert harness.registry.changed == set(harness.registry.pipelines), "all new"
    await harness.scheduler.run_once()  # the first pass: everything
    async with harness.sessions() as session:
        before = dict(
            (
                await session.execute(
                    select(models.Pipeline.pipeline_id, models.Pipeline.updated_at)
                )
            ).all()
        )
    await harness.emit("c")  # queued for each_c and one_at_a_time, with no wake

    await harness.load(PIPELINES.replace("max_active_runs=1", "max_active_runs=2"))
    assert harness.registry.changed == {"one_at_a_time"}
    async with harness.sessions() as session:
        after = dict(
            (
                await session.execute(
                    select(models.Pipeline.pipeline_id, models.Pipeline.updated_at)
                )
            ).all()
        )
    assert [p for p in after if after[p] != before[p]] == ["one_at_a_time"]

    harness.scheduler.wake(harness.registry.changed)  # as the daemon's reload does
    await harness.scheduler.run_once()
    assert len(await harness.runs("one_at_a_time")) == 1
    assert await harness.runs("each_c") == [], "not changed, not woken: waits for its wake"


async def test_an_alias_among_inlets_is_stored_as_the_pipeline_s_inlet(
    make_harness: Callable[[str], Awaitable[Harness]],
) -> None:
    harness = await make_harness(
        "from triggerer import Asset, AssetAlias, pipeline\n"
        "@pipeline(inlets=[Asset('orders'), AssetAlias('landed')])\n"
        "def reads(spark, context): ...\n"
    )
    async with harness.sessions() as session:
        rows = await session.execute(
            select(models.AssetAlias.name, models.PipelineAliasRef.role).join(
                models.PipelineAliasRef,
                models.PipelineAliasRef.alias_id == models.AssetAlias.id,
            )
        )
    assert rows.all() == [("landed", RefRole.INLET)]
