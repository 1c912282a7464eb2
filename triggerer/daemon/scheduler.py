"""The scheduler: turns queued events (and cron ticks) into runs, never twice.

A run is created in one transaction that inserts the run, records the exact events it consumes
and deletes their queue rows. The unique run key, the unique ``(pipeline, event)`` of consumed
events and a row-count check on the delete make concurrent schedulers (threads, processes or
hosts) safe: the loser rolls back and looks again.
"""

from __future__ import annotations

import dataclasses
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any

import anyio
import structlog
from sqlalchemy import delete, func, insert, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from triggerer.schedules import CronPartitionTimetable, PartitionedAssetTimetable, next_tick
from triggerer.store import models
from triggerer.store.models import RunState, RunType
from triggerer.store.notices import notify_runs
from triggerer.store.types import utcnow

if TYPE_CHECKING:
    from triggerer.assets import AssetAlias, BaseAsset
    from triggerer.daemon.registry import Registry
    from triggerer.pipelines import Pipeline

log = structlog.get_logger(__name__)

ACTIVE_STATES = (RunState.QUEUED, RunState.RUNNING, RunState.UP_FOR_RETRY)
IDLE_WAKE_S = 5.0
"""Without a wake, everything is looked at again this often (events from other processes)."""


class ConsumedElsewhere(Exception):
    """Another scheduler consumed some of the picked events first."""


@dataclasses.dataclass(frozen=True)
class Queued:
    """One queue row: an event waiting for a pipeline."""

    row_id: int
    event_id: int
    asset_id: int
    partition_key: str | None


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
        self._everything = True
        self._woken = anyio.Event()

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
            self._woken = anyio.Event()
            registry = self._registry()
            if self._everything:
                dirty, self._everything = set(registry.pipelines), False
            else:
                dirty = self._dirty
            self._dirty = set()
            for pipeline_id in sorted(dirty):
                pipeline = registry.pipelines.get(pipeline_id)
                if pipeline is not None:
                    await self.schedule(pipeline, registry)
            wait_s = await self._fire_cron(registry)
            with anyio.move_on_after(wait_s) as idle:
                await self._woken.wait()
            self._everything = self._everything or idle.cancelled_caught

    async def schedule(self, pipeline: Pipeline, registry: Registry) -> int:
        """Create every run the queued events of ``pipeline`` allow now; returns how many."""
        created = 0
        while True:
            try:
                async with self._sessions.begin() as session:
                    run_id = await self._create_asset_run(session, pipeline, registry)
            except (IntegrityError, ConsumedElsewhere):
                log.info("run_creation_raced", pipeline_id=pipeline.pipeline_id)
                continue
            if run_id is None:
                break
            created += 1
            log.info("run_created", pipeline_id=pipeline.pipeline_id, run_id=run_id)
            self._on_run_created()
        return created

    async def _create_asset_run(
        self, session: AsyncSession, pipeline: Pipeline, registry: Registry
    ) -> str | None:
        condition = pipeline.condition
        if condition is None or not await _may_start(session, pipeline):
            return None
        alias_members = await _alias_members(session, condition, registry)
        # Cheap first: which assets have any queued event; a backlog waiting for another asset
        # of an AND is not read again on every wake.
        candidates = {registry.asset_ids[a] for a in condition.iter_assets()} | set(alias_members)
        present = await _assets_with_queued(session, pipeline.pipeline_id, candidates)
        if not condition.evaluate(_updated(present, registry, alias_members)):
            return None
        queued = await _queued(session, pipeline.pipeline_id)
        if isinstance(pipeline.schedule, PartitionedAssetTimetable):
            picked, partition_key = _pick_partition(
                pipeline, pipeline.schedule, queued, registry, alias_members
            )
        else:
            picked, partition_key = (
                _pick(pipeline, condition, queued, registry, alias_members),
                None,
            )
        if not picked:
            return None
        run_id = f"{pipeline.pipeline_id}__asset__{picked[0].event_id}"
        await _insert_run(session, pipeline, run_id, RunType.ASSET, partition_key, picked)
        return run_id

    async def _fire_cron(self, registry: Registry) -> float:
        """Create the runs of cron ticks that are due; seconds until the next tick."""
        now = utcnow()
        async with self._sessions.begin() as session:
            due = (
                await session.execute(
                    select(models.Pipeline.pipeline_id, models.Pipeline.next_cron_at).where(
                        models.Pipeline.next_cron_at.is_not(None),
                        models.Pipeline.is_active.is_(True),
                    )
                )
            ).all()
        wait_s = IDLE_WAKE_S
        for pipeline_id, tick in due:
            pipeline = registry.pipelines.get(pipeline_id)
            if pipeline is None or pipeline.cron is None or tick is None:
                continue
            if tick > now:
                wait_s = min(wait_s, (tick - now).total_seconds())
                continue
            await self._create_cron_run(pipeline, tick, next_tick(pipeline.cron, now))
            wait_s = 0.0
        return wait_s

    async def _create_cron_run(self, pipeline: Pipeline, tick: datetime, after: datetime) -> None:
        run_id = f"{pipeline.pipeline_id}__cron__{tick.isoformat()}"
        partition_key = (
            tick.isoformat() if isinstance(pipeline.schedule, CronPartitionTimetable) else None
        )
        try:
            async with self._sessions.begin() as session:
                moved = await session.execute(
                    update(models.Pipeline)
                    .where(
                        models.Pipeline.pipeline_id == pipeline.pipeline_id,
                        models.Pipeline.next_cron_at == tick,
                    )
                    .values(next_cron_at=after)
                )
                if moved.rowcount != 1:  # type: ignore[attr-defined]  # CursorResult
                    return
                paused = await session.scalar(
                    select(models.Pipeline.paused).where(
                        models.Pipeline.pipeline_id == pipeline.pipeline_id
                    )
                )
                if not paused:
                    await _insert_run(session, pipeline, run_id, RunType.CRON, partition_key, [])
        except IntegrityError:
            return
        log.info("run_created", pipeline_id=pipeline.pipeline_id, run_id=run_id, tick=str(tick))
        self._on_run_created()


async def create_manual_run(
    session: AsyncSession, pipeline_id: str, params: dict[str, Any] | None = None
) -> str:
    """Insert a queued manual run of a known pipeline; the caller commits, which also wakes
    the launchers of daemons in other processes (PostgreSQL)."""
    row = await session.get(models.Pipeline, pipeline_id)
    if row is None:
        raise LookupError(f"pipeline {pipeline_id!r} does not exist")
    run_id = f"{pipeline_id}__manual__{uuid.uuid4().hex[:12]}"
    session.add(
        models.Run(
            run_id=run_id,
            pipeline_id=pipeline_id,
            run_type=RunType.MANUAL,
            state=RunState.QUEUED,
            try_number=0,
            max_tries=row.retries + 1,
            params=params or {},
        )
    )
    await session.flush()
    await notify_runs(session)
    return run_id


async def _may_start(session: AsyncSession, pipeline: Pipeline) -> bool:
    paused = await session.scalar(
        select(models.Pipeline.paused).where(models.Pipeline.pipeline_id == pipeline.pipeline_id)
    )
    if paused is not False:
        return False
    active = await session.scalar(
        select(func.count())
        .select_from(models.Run)
        .where(models.Run.pipeline_id == pipeline.pipeline_id, models.Run.state.in_(ACTIVE_STATES))
    )
    return (active or 0) < pipeline.max_active_runs


async def _queued(session: AsyncSession, pipeline_id: str) -> list[Queued]:
    statement = (
        select(
            models.QueuedEvent.id,
            models.QueuedEvent.event_id,
            models.QueuedEvent.asset_id,
            models.QueuedEvent.partition_key,
        )
        .where(models.QueuedEvent.pipeline_id == pipeline_id)
        .order_by(models.QueuedEvent.id)
    )
    if session.get_bind().dialect.name == "postgresql":
        # Rows another scheduler is consuming are skipped rather than waited for.
        statement = statement.with_for_update(skip_locked=True)
    return [Queued(*row) for row in (await session.execute(statement)).all()]


async def _assets_with_queued(
    session: AsyncSession, pipeline_id: str, asset_ids: set[int]
) -> set[int]:
    present = set()
    for asset_id in asset_ids:
        row = await session.scalar(
            select(models.QueuedEvent.id)
            .where(
                models.QueuedEvent.pipeline_id == pipeline_id,
                models.QueuedEvent.asset_id == asset_id,
            )
            .limit(1)
        )
        if row is not None:
            present.add(asset_id)
    return present


async def _alias_members(
    session: AsyncSession, condition: BaseAsset, registry: Registry
) -> dict[int, set[AssetAlias]]:
    """For each asset id, the aliases of ``condition`` it was ever added through."""
    aliases = {
        registry.alias_ids[a]: a for a in condition.iter_aliases() if a in registry.alias_ids
    }
    members: dict[int, set[AssetAlias]] = defaultdict(set)
    if aliases:
        rows = await session.execute(
            select(models.AssetAliasAsset.asset_id, models.AssetAliasAsset.alias_id).where(
                models.AssetAliasAsset.alias_id.in_(list(aliases))
            )
        )
        for asset_id, alias_id in rows.all():
            members[asset_id].add(aliases[alias_id])
    return members


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


def _pick(
    pipeline: Pipeline,
    condition: BaseAsset,
    queued: list[Queued],
    registry: Registry,
    alias_members: dict[int, set[AssetAlias]],
) -> list[Queued]:
    """The queue rows one run consumes, or none when the condition does not hold."""
    if not condition.evaluate(_updated({row.asset_id for row in queued}, registry, alias_members)):
        return []
    if pipeline.run_policy == "coalesce":
        return queued[: pipeline.max_events_per_run]
    oldest = queued[0]
    if condition.evaluate(_updated([oldest.asset_id], registry, alias_members)):
        return [oldest]
    # per_event under AND: the oldest event of each asset.
    firsts: dict[int, Queued] = {}
    for row in queued:
        firsts.setdefault(row.asset_id, row)
    return sorted(firsts.values(), key=lambda row: row.row_id)


def _pick_partition(
    pipeline: Pipeline,
    schedule: PartitionedAssetTimetable,
    queued: list[Queued],
    registry: Registry,
    alias_members: dict[int, set[AssetAlias]],
) -> tuple[list[Queued], str | None]:
    """The rows of the oldest mapped partition key whose condition holds."""
    by_key: dict[str, list[Queued]] = defaultdict(list)
    for row in queued:
        if row.partition_key is not None:
            by_key[schedule.map_key(row.partition_key)].append(row)
    for key, rows in by_key.items():
        picked = _pick(pipeline, schedule.assets, rows, registry, alias_members)
        if picked:
            return picked, key
    return [], None


async def _insert_run(
    session: AsyncSession,
    pipeline: Pipeline,
    run_id: str,
    run_type: RunType,
    partition_key: str | None,
    picked: list[Queued],
    params: dict[str, Any] | None = None,
) -> None:
    run = models.Run(
        run_id=run_id,
        pipeline_id=pipeline.pipeline_id,
        run_type=run_type,
        logical_date=None,
        partition_key=partition_key,
        state=RunState.QUEUED,
        try_number=0,
        max_tries=pipeline.retries + 1,
        params={**pipeline.params, **(params or {})},
    )
    session.add(run)
    await session.flush()
    if not picked:
        return
    await session.execute(
        insert(models.RunEvent),
        [
            {"run_pk": run.id, "event_id": row.event_id, "pipeline_id": pipeline.pipeline_id}
            for row in picked
        ],
    )
    deleted = await session.execute(
        delete(models.QueuedEvent).where(models.QueuedEvent.id.in_([row.row_id for row in picked]))
    )
    if deleted.rowcount != len(picked):  # type: ignore[attr-defined]  # CursorResult
        raise ConsumedElsewhere(run_id)
