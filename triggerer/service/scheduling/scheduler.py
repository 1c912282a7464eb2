"""The scheduler: turns queued events (and cron ticks) into runs, never twice.

A run is created in one transaction that inserts the run, records the exact events it consumes
and deletes their queue rows. The unique run key, the unique ``(pipeline, event)`` of consumed
events and a row-count check on the delete make concurrent schedulers (threads, processes or
hosts) safe: the loser rolls back and looks again.

Each pipeline is a fault boundary. When evaluating it fails (a condition or partition mapper
that raises, a partition key its mapper cannot map, a ``max_events_per_run`` too small for its
condition, a run the store refuses) the reason goes to ``pipeline.error`` and the log, and the
other pipelines go on; the error is cleared once the pipeline evaluates cleanly. The store being
unavailable (``is_outage``) is no pipeline's fault: that propagates to the caller, which retries
the whole loop.

The statements it runs are in :mod:`triggerer.service.scheduling.schedule_queries`.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import TYPE_CHECKING

import anyio
import structlog
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from triggerer.crons import next_tick
from triggerer.schedules import CronPartitionTimetable
from triggerer.service import metrics
from triggerer.service.scheduling.picking import Pick, Queued, describe, is_timed, pick_run
from triggerer.service.scheduling.schedule_queries import (
    NO_ROW,
    ConsumedElsewhere,
    NewRun,
    PipelineState,
    asset_run_id,
    assets_with_queued,
    compose_run_id,
    drop_foreign_rows,
    drop_queued,
    due_cron_ticks,
    failing_pipelines,
    insert_run,
    insert_runs,
    members_of_aliases,
    move_cron_tick,
    pipeline_state,
    pipeline_states,
    pipelines_with_queued,
    queued_rows_of,
    queued_schedule_assets,
    record_error,
)
from triggerer.service.store.failures import is_outage
from triggerer.service.store.states import RunType
from triggerer.service.store.types import storable_text, utcnow

if TYPE_CHECKING:
    from triggerer.assets import AssetAlias, BaseAsset
    from triggerer.pipelines import Pipeline
    from triggerer.service.scheduling.registry import Registry

log = structlog.get_logger(__name__)

SWEEP_S = 60.0
"""The safety net: this often, every pipeline an evaluation could do something for is looked at
whatever the wakes said (a wake lost with a notice). The wakes and due times do the work."""
PASS_SPACING_S = 0.01
"""Passes start at most this often: under a stream of commits, the wakes of that time make one
pass instead of a pass each (a lone event, coming after a quiet moment, waits for nothing)."""
TOGETHER = 50
"""Pipelines evaluated in one transaction, their runs committed together: one commit for the
ten pipelines one event starts, where each commit costs as much as a run's rows; few enough
that ingest, which waits for SQLite's one writer, waits for no more than a few milliseconds."""


class Scheduler:
    """Evaluates pipelines when woken (by ingest, finished runs, or the clock)."""

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        registry: Callable[[], Registry],
        on_run_created: Callable[[], None],
    ) -> None:
        self._sessions = sessions
        self._registry = registry
        self._on_run_created = on_run_created
        self._dirty: set[str] = set()
        #: When each pipeline is to be evaluated again though nothing else changes: an event
        #: expiring, a reset tick, a batch's or a debounce's deadline.
        self._due: dict[str, datetime] = {}
        self._everything = True
        self._swept_at = -math.inf
        # The earliest cron tick not due when last read (None: read again).
        self._next_tick: datetime | None = None
        self._woken = anyio.Event()
        # The definitions the queue was last tidied for; a reload brings new ones.
        self._tidied_for: Registry | None = None
        # The due cron tick each pipeline waits with (at max_active_runs), logged once a tick.
        self._waiting_ticks: dict[str, datetime] = {}

    def wake(self, pipeline_ids: Iterable[str] | None = None) -> None:
        """Ask for an evaluation of ``pipeline_ids`` (all pipelines when ``None``)."""
        if pipeline_ids is None:
            self._everything = True
        else:
            self._dirty.update(pipeline_ids)
        self._woken.set()

    async def run(self) -> None:
        """Evaluate until cancelled; everything on start, then what each wake names."""
        while True:
            started = anyio.current_time()
            wait_s = await self.run_once()
            metrics.SCHEDULER_PASS.observe(anyio.current_time() - started)
            with anyio.move_on_after(wait_s):
                await self._woken.wait()
            await anyio.sleep_until(started + PASS_SPACING_S)

    async def run_once(self) -> float:
        """One pass: the pipelines named by the wakes since the last pass and those whose due
        time came (on the first pass and each sweep, every one an evaluation could do
        something for), then the cron ticks that are due. Returns the seconds until the next
        due time, tick or sweep."""
        self._woken = anyio.Event()
        registry = self._registry()
        if registry is not self._tidied_for:
            await self._drop_foreign_rows()
            self._tidied_for, self._next_tick = registry, None
        now = anyio.current_time()
        if self._everything or now - self._swept_at >= SWEEP_S:
            self._everything, self._swept_at = False, now
            self._dirty |= await self._worth_a_look(registry)
        dirty, self._dirty = self._dirty | self._take_due(), set()
        await self._schedule_all(sorted(dirty), registry)
        wait_s = min(await self._fire_cron(registry), self._swept_at + SWEEP_S - now)
        if self._due:
            wait_s = min(wait_s, (min(self._due.values()) - utcnow()).total_seconds())
        return max(wait_s, 0.0)

    def _take_due(self) -> set[str]:
        """The pipelines whose due time has come, no longer due."""
        now = utcnow()
        due = {pipeline_id for pipeline_id, at in self._due.items() if at <= now}
        for pipeline_id in due:
            del self._due[pipeline_id]
        return due

    async def _worth_a_look(self, registry: Registry) -> set[str]:
        """The pipelines an evaluation could do something for: those whose queue may satisfy
        their condition (the assets with queued events read in one statement, the condition
        evaluated here), those whose queue time changes or an alias feeds, and those with an
        error recorded (an evaluation may clear it). The others wait for a change."""
        async with self._sessions() as session:
            with_queued = await pipelines_with_queued(session, set(registry.pipelines))
            plain = {
                pipeline_id
                for pipeline_id in with_queued
                if (condition := registry.pipelines[pipeline_id].condition) is not None
                and not is_timed(registry.pipelines[pipeline_id], condition)
                and not any(condition.iter_aliases())
            }
            present = await queued_schedule_assets(session, plain)
            failing = await failing_pipelines(session)
        worth = (with_queued - plain) | (failing & registry.pipelines.keys())
        worth.update(
            pipeline_id
            for pipeline_id in plain
            if _may_hold(registry.pipelines[pipeline_id], present[pipeline_id], registry)
        )
        return worth

    async def _schedule_all(self, pipeline_ids: list[str], registry: Registry) -> None:
        """Evaluate ``pipeline_ids``, :data:`TOGETHER` to a transaction; pipelines woken
        meanwhile go before the next group, not after the rest of a pass over thousands."""
        for start in range(0, len(pipeline_ids), TOGETHER):
            await self._schedule_together(pipeline_ids[start : start + TOGETHER], registry)
            while self._dirty:
                woken, self._dirty = sorted(self._dirty), set()
                for group in range(0, len(woken), TOGETHER):
                    await self._schedule_together(woken[group : group + TOGETHER], registry)

    async def _schedule_together(self, pipeline_ids: list[str], registry: Registry) -> None:
        """Evaluate ``pipeline_ids`` in one transaction. Should any of them fail (a fault of
        its own, a race with another scheduler), the transaction is rolled back and each is
        evaluated alone (:meth:`schedule`), where the fault stays its own."""
        pipelines = [registry.pipelines[i] for i in pipeline_ids if i in registry.pipelines]
        if not pipelines:
            return
        if len(pipelines) == 1:
            await self.schedule(pipelines[0], registry)
            return
        try:
            async with self._sessions.begin() as session:
                made = await self._create_runs(session, pipelines, registry)
        # Whatever one of them raised: each is evaluated again alone, which records a fault
        # of its own on it, or lets an outage propagate.
        except Exception:  # noqa: BLE001
            for pipeline in pipelines:
                await self.schedule(pipeline, registry)
            return
        self._created(made)

    def _created(self, made: dict[str, list[str]]) -> None:
        """Log the runs ``made`` (by pipeline id) and wake who starts them."""
        for pipeline_id, run_ids in made.items():
            for run_id in run_ids:
                log.info("run_created", pipeline_id=pipeline_id, run_id=run_id)
        if any(made.values()):
            self._on_run_created()

    async def schedule(self, pipeline: Pipeline, registry: Registry) -> int:
        """Create every run the queued events of ``pipeline`` allow now; returns how many.

        Never raises for a fault of the pipeline (it is recorded on the pipeline instead);
        database errors propagate.
        """
        self._due.pop(pipeline.pipeline_id, None)
        try:
            while True:
                try:
                    async with self._sessions.begin() as session:
                        made = await self._create_runs(session, [pipeline], registry)
                    break
                except (IntegrityError, ConsumedElsewhere):
                    log.info("run_creation_raced", pipeline_id=pipeline.pipeline_id)
        # The pipeline's fault boundary: its condition and mapper are user code, the store may
        # refuse what its definition puts in a run, and one pipeline must not stop the others.
        except Exception as error:
            if is_outage(error):
                raise  # the store's weather, no fault of the pipeline: the loop retries
            await self._set_error(
                pipeline.pipeline_id, f"evaluating its schedule failed: {describe(error)}", error
            )
            return 0
        self._created(made)
        return len(made.get(pipeline.pipeline_id, ()))

    async def _create_runs(
        self, session: AsyncSession, pipelines: list[Pipeline], registry: Registry
    ) -> dict[str, list[str]]:
        """The runs the queues of ``pipelines`` allow now, by pipeline id, created in the
        caller's transaction with a few statements for all of them: their states and queues
        read once, each run's rows taken out of what its pipeline's next run may pick, the
        runs inserted together. The queue rows time took out (expired, reset) are dropped, and
        when to look again without a change is noted."""
        states = await pipeline_states(session, [p.pipeline_id for p in pipelines])
        looked: list[tuple[Pipeline, PipelineState, bool]] = []
        for pipeline in pipelines:
            state = states.get(pipeline.pipeline_id, NO_ROW)
            if pipeline.condition is None:
                if pipeline.cron is None:
                    # Manual only: nothing to evaluate, so an error of an earlier schedule is
                    # gone.
                    await _report(session, pipeline.pipeline_id, state.error, None)
                continue
            # Paused or at max_active_runs: no run now, so its error (if any) stands; time
            # still takes its expired and reset events out of the queue.
            held = state.paused is not False or state.active_runs >= pipeline.max_active_runs
            if not held or is_timed(pipeline, pipeline.condition):
                looked.append((pipeline, state, held))
        queues = await _queues_of(session, [pipeline for pipeline, _, _ in looked], registry)
        runs: list[NewRun] = []
        for pipeline, state, held in looked:
            queue = queues.get(pipeline.pipeline_id)
            runs += await self._picked_runs(session, pipeline, state, held, queue)
        await insert_runs(session, runs)
        made: dict[str, list[str]] = {}
        for run in runs:
            made.setdefault(run.pipeline.pipeline_id, []).append(run.run_id)
        return made

    async def _picked_runs(
        self,
        session: AsyncSession,
        pipeline: Pipeline,
        state: PipelineState,
        held: bool,
        queue: _Queue | None,
    ) -> list[NewRun]:
        """The runs ``queue`` allows ``pipeline`` now (none while ``held``), pick after pick."""
        pick = Pick() if queue is None else queue.pick(utcnow())
        runs: list[NewRun] = []
        while True:
            await self._drop(session, pipeline.pipeline_id, pick)
            if pick.due is None:
                self._due.pop(pipeline.pipeline_id, None)
            else:
                self._due[pipeline.pipeline_id] = pick.due
            if held or queue is None or not pick.rows:
                break
            run_id = asset_run_id(pipeline.pipeline_id, pick.rows)
            runs.append(NewRun(pipeline, run_id, RunType.ASSET, pick.partition_key, pick.rows))
            if state.active_runs + len(runs) >= pipeline.max_active_runs:
                break
            queue.taken(pick)
            try:
                pick = queue.pick(utcnow())
            # User code (a condition, a mapper) that fails after runs were picked keeps those:
            # the pipeline is evaluated again on its own, where the failure is recorded.
            except Exception:  # noqa: BLE001
                self._dirty.add(pipeline.pipeline_id)
                break
        if not held and not pick.rows:  # it evaluated to the end: what stands in the way
            problems = "; ".join(pick.problems) or None
            await _report(session, pipeline.pipeline_id, state.error, problems)
        return runs

    @staticmethod
    async def _drop(session: AsyncSession, pipeline_id: str, pick: Pick) -> None:
        """Take the rows ``pick`` drops (expired, reset) out of the queue, logged and counted."""
        if not pick.dropped:
            return
        await drop_queued(session, [drop.row.row_id for drop in pick.dropped])
        for drop in pick.dropped:
            metrics.QUEUE_DROPS.labels(pipeline_id, drop.reason).inc()
            log.info(
                "queued_event_dropped",
                pipeline_id=pipeline_id,
                event_id=drop.row.event_id,
                reason=drop.reason,
                at=drop.at.isoformat(),
            )

    async def _set_error(
        self, pipeline_id: str, error: str | None, cause: BaseException | None = None
    ) -> None:
        async with self._sessions.begin() as session:
            was = (await pipeline_state(session, pipeline_id)).error
            await _report(session, pipeline_id, was, error, cause)

    async def _drop_foreign_rows(self) -> None:
        """Delete the queue rows no run can consume under the current definitions (see
        :func:`~triggerer.service.scheduling.schedule_queries.drop_foreign_rows`)."""
        async with self._sessions.begin() as session:
            count = await drop_foreign_rows(session)
        if count:
            log.info("queued_events_dropped", count=count, reason="not in the schedule any more")

    async def _fire_cron(self, registry: Registry) -> float:
        """Create the runs of cron ticks that are due; seconds until the next tick. Before the
        earliest tick last read nothing is read: a tick only moves later (a run made, by any
        scheduler), or comes with a reload, which reads again."""
        now = utcnow()
        if self._next_tick is not None and self._next_tick > now:
            return (self._next_tick - now).total_seconds()
        async with self._sessions() as session:
            due, self._next_tick = await due_cron_ticks(session, now)
        made = False
        for pipeline_id, tick in due:
            pipeline = registry.pipelines.get(pipeline_id)
            if pipeline is None or pipeline.cron is None or tick is None:
                continue
            try:
                made |= await self._create_cron_run(pipeline, pipeline.cron, tick, now)
            except Exception as error:  # the pipeline's boundary, as in schedule()
                if is_outage(error):
                    raise
                message = f"its cron tick {tick.isoformat()} failed: {describe(error)}"
                await self._set_error(pipeline_id, message, error)
        next_tick = self._next_tick
        if due:  # ticks moved, or wait for a run to end: read again on the next pass
            self._next_tick = None
        if made:
            return 0.0
        return math.inf if next_tick is None else (next_tick - now).total_seconds()

    async def _create_cron_run(
        self, pipeline: Pipeline, cron: str, tick: datetime, now: datetime
    ) -> bool:
        """Create the run of the due ``tick``; whether one was created.

        While ``max_active_runs`` runs are active the tick waits, as Airflow's runs do: a run
        ending wakes the scheduler, which then creates it. Ticks that passed meanwhile are not
        run one by one: the next tick is the first one after now. A paused pipeline's ticks
        pass without runs.
        """
        pipeline_id = pipeline.pipeline_id
        run_id = compose_run_id(pipeline_id, "cron", tick.isoformat())
        partition_key = (
            tick.isoformat() if isinstance(pipeline.schedule, CronPartitionTimetable) else None
        )
        after = next_tick(cron, now)
        try:
            async with self._sessions.begin() as session:
                paused, error, active_runs = await pipeline_state(session, pipeline_id)
                if not paused and active_runs >= pipeline.max_active_runs:
                    if self._waiting_ticks.get(pipeline_id) != tick:
                        self._waiting_ticks[pipeline_id] = tick
                        log.info(
                            "cron_tick_waits",
                            pipeline_id=pipeline_id,
                            tick=tick.isoformat(),
                            max_active_runs=pipeline.max_active_runs,
                        )
                    return False
                moved = await move_cron_tick(session, pipeline_id, tick, after)
                if not moved or paused:
                    return False
                await insert_run(session, pipeline, run_id, RunType.CRON, partition_key, [])
                if pipeline.condition is None:
                    # The tick is all a cron pipeline evaluates: it works again.
                    await _report(session, pipeline_id, error, None)
        except IntegrityError:
            return False
        self._waiting_ticks.pop(pipeline_id, None)
        log.info("run_created", pipeline_id=pipeline_id, run_id=run_id, tick=tick.isoformat())
        self._on_run_created()
        return True


async def _report(
    session: AsyncSession,
    pipeline_id: str,
    was: str | None,
    error: str | None,
    cause: BaseException | None = None,
) -> None:
    """Record ``error`` (``None``: the pipeline works) on the pipeline, and log it, when it
    changed from ``was``."""
    if error is not None:
        error = storable_text(error)  # user code's messages may hold what text columns cannot
    if error == was:
        return
    if error is None:
        log.info("pipeline_recovered", pipeline_id=pipeline_id)
    else:
        log.error("pipeline_failing", pipeline_id=pipeline_id, error=error, exc_info=cause)
    await record_error(session, pipeline_id, error, newly_failing=was is None)


@dataclasses.dataclass
class _Queue:
    """A pipeline's queue as read once in a transaction, picked from run after run."""

    pipeline: Pipeline
    condition: BaseAsset
    rows: list[Queued]
    registry: Registry
    alias_members: dict[int, set[AssetAlias]]

    def pick(self, now: datetime) -> Pick:
        """The next run's pick from the rows left."""
        return pick_run(
            self.pipeline, self.condition, self.rows, self.registry, self.alias_members, now
        )

    def taken(self, pick: Pick) -> None:
        """The rows ``pick`` put into a run or dropped are gone: no later pick sees them."""
        gone = {row.row_id for row in pick.rows} | {drop.row.row_id for drop in pick.dropped}
        self.rows = [row for row in self.rows if row.row_id not in gone]


async def _queues_of(
    session: AsyncSession, pipelines: list[Pipeline], registry: Registry
) -> dict[str, _Queue]:
    """The queues of those ``pipelines`` whose condition can hold over them, read in one
    statement. Cheap first: which assets have any queued event, so a backlog waiting for
    another asset of an AND is not read again on every wake. Where time changes the queue
    (windows, resets, batches, debounce) its rows are read: they may expire or come due."""
    members = {}
    plain, read = set(), []
    for pipeline in pipelines:
        condition = pipeline.condition
        assert condition is not None  # noqa: S101 - the caller looks only at these
        members[pipeline.pipeline_id] = await members_of_aliases(session, condition, registry)
        if is_timed(pipeline, condition):
            read.append(pipeline)
        elif members[pipeline.pipeline_id] or any(condition.iter_aliases()):
            # Through aliases: which of their members have queued events, for this one.
            candidates = {registry.asset_ids[a] for a in condition.iter_assets()}
            candidates |= set(members[pipeline.pipeline_id])
            present = await assets_with_queued(session, pipeline.pipeline_id, candidates)
            if condition.evaluate(_updated(present, registry, members[pipeline.pipeline_id])):
                read.append(pipeline)
        else:
            plain.add(pipeline.pipeline_id)
    queued = await queued_schedule_assets(session, plain)
    read += [
        pipeline
        for pipeline in pipelines
        if pipeline.pipeline_id in plain
        and pipeline.condition is not None
        and pipeline.condition.evaluate(
            _updated(queued.get(pipeline.pipeline_id, ()), registry, {})
        )
    ]
    rows = await queued_rows_of(session, [pipeline.pipeline_id for pipeline in read])
    return {
        pipeline.pipeline_id: _Queue(
            pipeline,
            pipeline.condition,  # type: ignore[arg-type]  # checked above
            rows.get(pipeline.pipeline_id, []),
            registry,
            members[pipeline.pipeline_id],
        )
        for pipeline in read
    }


def _may_hold(pipeline: Pipeline, queued: set[int], registry: Registry) -> bool:
    """Whether the condition of ``pipeline`` may hold with events queued on the assets
    ``queued``; a condition that raises (user code) may: its evaluation records the fault."""
    try:
        return pipeline.condition is not None and pipeline.condition.evaluate(
            _updated(queued, registry, {})
        )
    except Exception:  # noqa: BLE001
        return True


def _updated(
    asset_ids: Iterable[int], registry: Registry, alias_members: dict[int, set[AssetAlias]]
) -> set[BaseAsset]:
    """The assets, and the aliases they were added through, that have queued events."""
    updated: set[BaseAsset] = set()
    for asset_id in asset_ids:
        asset = registry.assets.get(asset_id)
        if asset is not None:
            updated.add(asset)
        updated.update(alias_members.get(asset_id, ()))
    return updated
