"""A model-based test of the scheduler: random histories against a small reference model.

Hypothesis drives the real :class:`Scheduler` on a real SQLite store through random sequences
of events (plain and partitioned, keys its mapper cannot map among them), schedule changes,
pauses, runs ending, and scheduler passes. Only the pipeline definitions are made up in
Python instead of loaded from files. The model keeps which events each pipeline has queued
and checks, after every step:

- a run consumes only events queued for its pipeline and not consumed before;
- every run's events satisfy the pipeline's condition when it is created, within
  ``max_events_per_run`` (one per asset for ``per_event``), under one mapped partition key;
- the queue holds exactly what the model says;
- after a full pass nothing is stranded: no unpaused pipeline below ``max_active_runs`` has
  queued events that allow a run, and ``pipeline.error`` is set exactly when queued events
  cannot be mapped or the cap is smaller than the condition needs.
"""

from __future__ import annotations

import asyncio
import dataclasses
import itertools
import sqlite3
import tempfile
from collections.abc import Coroutine
from contextlib import closing
from pathlib import Path
from typing import Any, TypeVar

from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)
from sqlalchemy import delete, select, update

from triggerer import Asset, PartitionedAssetTimetable, ToDaily
from triggerer.pipelines import Pipeline
from triggerer.service.events import NewEvent, record_events
from triggerer.service.loader import LoadedPipelines
from triggerer.service.scheduling.registry import Registry, sync_definitions
from triggerer.service.scheduling.schedule_queries import ACTIVE_STATES
from triggerer.service.scheduling.scheduler import Scheduler
from triggerer.service.store import create_engine, models, session_factory
from triggerer.service.store.states import RunState

T = TypeVar("T")

ASSETS = {name: Asset(name) for name in "abc"}
a, b, c = ASSETS.values()
CONDITIONS = {"a": a, "a & b": a & b, "a | (b & c)": a | (b & c)}
KEYS = ("2026-03-16T01:00:00", "2026-03-16T23:00:00", "2026-03-17", "eu-west")
"""Partition keys of events: two of one day, another day, one ToDaily cannot map."""
MAPPER = ToDaily()
PIPELINE_IDS = ("first", "second")


@dataclasses.dataclass(frozen=True)
class Definition:
    """What the test varies of a pipeline's definition."""

    condition: str
    partitioned: bool
    run_policy: str
    max_events_per_run: int | None
    max_active_runs: int

    def pipeline(self, pipeline_id: str) -> Pipeline:
        condition = CONDITIONS[self.condition]
        schedule = (
            PartitionedAssetTimetable(assets=condition, partition_key_mapper=MAPPER)
            if self.partitioned
            else condition
        )
        return Pipeline(
            pipeline_id,
            schedule=schedule,
            function=print,
            run_policy=self.run_policy,  # type: ignore[arg-type]  # sampled from the two
            max_events_per_run=self.max_events_per_run,
            max_active_runs=self.max_active_runs,
        )


definitions = st.builds(
    Definition,
    condition=st.sampled_from(list(CONDITIONS)),
    partitioned=st.booleans(),
    run_policy=st.sampled_from(["coalesce", "per_event"]),
    max_events_per_run=st.sampled_from([None, 1, 2]),
    max_active_runs=st.sampled_from([1, 2, 16]),
)


@dataclasses.dataclass(frozen=True)
class Event:
    asset: str
    partition_key: str | None


def mapped(key: str | None) -> str | None:
    """The day of ``key``, or ``None`` when ToDaily cannot map it."""
    try:
        return MAPPER(str(key))
    except ValueError:
        return None


class SchedulerModel(RuleBasedStateMachine):
    template: Path
    """A migrated SQLite file, copied for every history."""

    def __init__(self) -> None:
        super().__init__()
        self.runner = asyncio.Runner()
        self.folder = tempfile.TemporaryDirectory()
        path = Path(self.folder.name) / "triggerer.db"
        with (
            closing(sqlite3.connect(self.template)) as source,
            closing(sqlite3.connect(path)) as dest,
        ):
            source.backup(dest)
        self.engine = create_engine(f"sqlite:///{path}")
        self.sessions = session_factory(self.engine)
        self.registry = Registry({}, {}, {}, {}, {})
        self.asset_ids: dict[str, int] = {}
        self.scheduler = Scheduler(self.sessions, lambda: self.registry, lambda: None)
        self.definitions: dict[str, Definition] = {}
        self.paused = dict.fromkeys(PIPELINE_IDS, False)
        self.events: dict[int, Event] = {}
        self.pending: dict[str, set[int]] = {pipeline_id: set() for pipeline_id in PIPELINE_IDS}
        self.last_run_pk = 0
        # The scheduler drops rows a schedule change orphaned on its first pass after it.
        self.untidied = True

    def run(self, work: Coroutine[Any, Any, T]) -> T:
        return self.runner.run(work)

    def teardown(self) -> None:
        self.run(self.engine.dispose())
        self.runner.close()
        self.folder.cleanup()

    # -- Rules -------------------------------------------------------------------------------

    @initialize(first=definitions, second=definitions)
    def define(self, first: Definition, second: Definition) -> None:
        self.run(self.sync({"first": first, "second": second}))

    @rule(pipeline_id=st.sampled_from(PIPELINE_IDS), definition=definitions)
    def redefine(self, pipeline_id: str, definition: Definition) -> None:
        self.run(self.sync({**self.definitions, pipeline_id: definition}))

    @rule(asset=st.sampled_from(list(ASSETS)), times=st.integers(1, 3))
    def emit_plain(self, asset: str, times: int) -> None:
        self.emit(asset, None, times)

    @rule(asset=st.sampled_from(list(ASSETS)), key=st.sampled_from(KEYS), times=st.integers(1, 3))
    def emit_keyed(self, asset: str, key: str, times: int) -> None:
        self.emit(asset, key, times)

    def emit(self, asset: str, partition_key: str | None, times: int) -> None:
        new = [NewEvent(self.asset_ids[asset], {}, "manual", partition_key=partition_key)] * times
        ids = self.run(self.record(new))
        for event_id in ids:
            self.events[event_id] = Event(asset, partition_key)
            for pipeline_id, definition in self.definitions.items():
                condition = CONDITIONS[definition.condition]
                consumes = ASSETS[asset] in set(condition.iter_assets())
                if consumes and definition.partitioned == (partition_key is not None):
                    self.pending[pipeline_id].add(event_id)

    @rule(pipeline_id=st.sampled_from(PIPELINE_IDS), paused=st.booleans())
    def pause(self, pipeline_id: str, paused: bool) -> None:
        self.paused[pipeline_id] = paused
        self.run(
            self.execute(
                update(models.Pipeline)
                .where(models.Pipeline.pipeline_id == pipeline_id)
                .values(paused=paused)
            )
        )

    @rule(
        index=st.integers(0, 20),
        state=st.sampled_from([RunState.SUCCESS, RunState.FAILED, RunState.UP_FOR_RETRY]),
    )
    def end_run(self, index: int, state: RunState) -> None:
        """A run ends, or fails and waits for a retry (still active), as the launcher records."""
        active = self.run(self.active_runs())
        if active:
            run_pk = active[index % len(active)]
            self.run(
                self.execute(update(models.Run).where(models.Run.id == run_pk).values(state=state))
            )

    @rule(pipeline_id=st.sampled_from(PIPELINE_IDS))
    def delete_queued(self, pipeline_id: str) -> None:
        """What ``DELETE /pipelines/{id}/assets/queuedEvents`` does."""
        self.pending[pipeline_id].clear()
        self.run(
            self.execute(
                delete(models.QueuedEvent).where(models.QueuedEvent.pipeline_id == pipeline_id)
            )
        )

    @rule(pipeline_id=st.sampled_from(PIPELINE_IDS))
    def schedule_one(self, pipeline_id: str) -> None:
        """A wake for one pipeline (ingest, a run ending), evaluated directly."""
        self.run(self.scheduler.schedule(self.registry.pipelines[pipeline_id], self.registry))
        self.check_new_runs()

    @rule()
    def full_pass(self) -> None:
        """The idle sweep: every pipeline evaluated; afterwards nothing may be stranded."""
        self.scheduler.wake()
        self.run(self.scheduler.run_once())
        self.tidy()
        self.check_new_runs()
        self.check_nothing_stranded()

    # -- Invariants --------------------------------------------------------------------------

    @invariant()
    def queue_is_what_the_model_says(self) -> None:
        if not self.definitions:
            return
        queued = self.run(self.queued())
        for pipeline_id in PIPELINE_IDS:
            assert queued.get(pipeline_id, set()) == self.pending[pipeline_id], pipeline_id

    def check_new_runs(self) -> None:
        for run, event_ids in self.run(self.new_runs()):
            definition = self.definitions[run.pipeline_id]
            events = [self.events[event_id] for event_id in event_ids]
            pending = self.pending[run.pipeline_id]
            assert set(event_ids) <= pending, f"{run.run_id} consumed events not queued for it"
            pending -= set(event_ids)
            condition = CONDITIONS[definition.condition]
            assets = {ASSETS[event.asset] for event in events}
            assert assets <= set(condition.iter_assets()), run.run_id
            assert condition.evaluate(assets), f"{run.run_id}: {events} do not satisfy {condition}"
            if definition.max_events_per_run is not None:
                assert len(events) <= definition.max_events_per_run, run.run_id
            if definition.run_policy == "per_event":
                assert len(events) == len(assets), f"{run.run_id}: one event per asset"
            if definition.partitioned:
                assert {mapped(event.partition_key) for event in events} == {run.partition_key}
            else:
                assert run.partition_key is None
                assert all(event.partition_key is None for event in events)

    def check_nothing_stranded(self) -> None:
        active = self.run(self.active_counts())
        errors = self.run(self.errors())
        for pipeline_id, definition in self.definitions.items():
            if self.paused[pipeline_id] or active.get(pipeline_id, 0) >= definition.max_active_runs:
                continue  # not evaluated: the events wait, as they should
            runnable, failing = self.outlook(pipeline_id, definition)
            assert not runnable, f"{pipeline_id} has queued events that allow a run"
            assert (errors[pipeline_id] is not None) == failing, (pipeline_id, errors[pipeline_id])

    def outlook(self, pipeline_id: str, definition: Definition) -> tuple[bool, bool]:
        """(whether the queued events allow a run, whether the pipeline should be failing)."""
        condition = CONDITIONS[definition.condition]
        events = [self.events[event_id] for event_id in self.pending[pipeline_id]]
        if not condition.evaluate({ASSETS[event.asset] for event in events}):
            return False, False  # not even worth reading the queue: nothing to report
        groups: dict[str | None, set[Asset]] = {}
        unmappable = False
        for event in events:
            if (event.partition_key is not None) != definition.partitioned:
                continue
            key = mapped(event.partition_key) if definition.partitioned else None
            if definition.partitioned and key is None:
                unmappable = True
                continue
            groups.setdefault(key, set()).add(ASSETS[event.asset])
        limit = definition.max_events_per_run or len(ASSETS)
        runnable = too_small = False
        for assets in groups.values():
            if condition.evaluate(assets):
                fits = any(
                    condition.evaluate(set(choice))
                    for size in range(1, limit + 1)
                    for choice in itertools.combinations(sorted(assets, key=str), size)
                )
                runnable, too_small = runnable or fits, too_small or not fits
        return runnable, unmappable or too_small

    def tidy(self) -> None:
        if not self.untidied:
            return
        self.untidied = False
        for pipeline_id, definition in self.definitions.items():
            condition_assets = set(CONDITIONS[definition.condition].iter_assets())
            self.pending[pipeline_id] = {
                event_id
                for event_id in self.pending[pipeline_id]
                if ASSETS[self.events[event_id].asset] in condition_assets
                and (self.events[event_id].partition_key is not None) == definition.partitioned
            }

    # -- The store ---------------------------------------------------------------------------

    async def sync(self, definitions: dict[str, Definition]) -> None:
        self.definitions = definitions
        self.untidied = True
        loaded = LoadedPipelines(
            pipelines={pid: d.pipeline(pid) for pid, d in definitions.items()},
            assets={asset: asset for asset in ASSETS.values()},
        )
        async with self.sessions.begin() as session:
            self.registry = await sync_definitions(session, loaded)
        self.asset_ids = {asset.name: asset_id for asset_id, asset in self.registry.assets.items()}

    async def record(self, new: list[NewEvent]) -> list[int]:
        async with self.sessions.begin() as session:
            recorded = await record_events(session, new)
        return [event.id for event in recorded.events]

    async def execute(self, statement: Any) -> None:
        async with self.sessions.begin() as session:
            await session.execute(statement)

    async def queued(self) -> dict[str, set[int]]:
        async with self.sessions() as session:
            rows = await session.execute(
                select(models.QueuedEvent.pipeline_id, models.QueuedEvent.event_id)
            )
            queued: dict[str, set[int]] = {}
            for pipeline_id, event_id in rows.all():
                queued.setdefault(pipeline_id, set()).add(event_id)
            return queued

    async def active_runs(self) -> list[int]:
        async with self.sessions() as session:
            rows = await session.scalars(
                select(models.Run.id)
                .where(models.Run.state.in_(ACTIVE_STATES))
                .order_by(models.Run.id)
            )
            return list(rows.all())

    async def active_counts(self) -> dict[str, int]:
        async with self.sessions() as session:
            rows = await session.scalars(
                select(models.Run.pipeline_id).where(models.Run.state.in_(ACTIVE_STATES))
            )
            counts: dict[str, int] = {}
            for pipeline_id in rows.all():
                counts[pipeline_id] = counts.get(pipeline_id, 0) + 1
            return counts

    async def errors(self) -> dict[str, str | None]:
        async with self.sessions() as session:
            rows = await session.execute(select(models.Pipeline.pipeline_id, models.Pipeline.error))
            return dict(rows.all())

    async def new_runs(self) -> list[tuple[models.Run, list[int]]]:
        async with self.sessions() as session:
            runs = list(
                (
                    await session.scalars(
                        select(models.Run)
                        .where(models.Run.id > self.last_run_pk)
                        .order_by(models.Run.id)
                    )
                ).all()
            )
            result = []
            for run in runs:
                event_ids = await session.scalars(
                    select(models.RunEvent.event_id).where(models.RunEvent.run_pk == run.id)
                )
                result.append((run, list(event_ids.all())))
                self.last_run_pk = run.id
            return result


def test_scheduler_against_the_model(sqlite_template_file: Path) -> None:
    SchedulerModel.template = sqlite_template_file
    run_state_machine_as_test(
        SchedulerModel,
        settings=settings(
            max_examples=40,
            stateful_step_count=50,
            deadline=None,
            database=None,
            # Shrinking replays hundreds of histories on the store, minutes past the test's
            # timeout: a failure is reported as found (at most 30 steps). Add Phase.shrink
            # to minimise one locally.
            phases=(Phase.explicit, Phase.reuse, Phase.generate),
            report_multiple_bugs=False,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
