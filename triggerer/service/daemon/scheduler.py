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
"""

from __future__ import annotations

import hashlib
import math
import uuid
from collections import defaultdict
from collections.abc import Callable, Iterable
from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

import anyio
import structlog
from sqlalchemy import (
    ColumnElement,
    Select,
    and_,
    bindparam,
    delete,
    exists,
    func,
    insert,
    or_,
    select,
    update,
)
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from triggerer.schedules import CronPartitionTimetable, next_tick
from triggerer.service import metrics
from triggerer.service.daemon.picking import Pick, Queued, describe, pick_run
from triggerer.service.store import models
from triggerer.service.store.failures import is_outage
from triggerer.service.store.models import ID_LENGTH, RefRole, RunState, RunType
from triggerer.service.store.notices import notify_runs
from triggerer.service.store.types import storable_text, utcnow

if TYPE_CHECKING:
    from triggerer.assets import AssetAlias, BaseAsset
    from triggerer.pipelines import Pipeline
    from triggerer.service.daemon.registry import Registry

log = structlog.get_logger(__name__)

K = TypeVar("K", int, str)
"""A key of pipelines or assets, as :func:`_queued_keys` takes them."""

ACTIVE_STATES = (RunState.QUEUED, RunState.RUNNING, RunState.UP_FOR_RETRY)
IDLE_WAKE_S = 5.0
"""Without a wake, everything is looked at again this often (events from other processes)."""
PASS_SPACING_S = 0.01
"""Passes start at most this often: under a stream of commits, the wakes of that time make one
pass instead of a pass each (a lone event, coming after a quiet moment, waits for nothing)."""


class ConsumedElsewhere(Exception):
    """Another scheduler consumed some of the picked events first."""


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
        self._swept_at = -math.inf
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
        """One pass: the pipelines named by the wakes since the last pass (all of them on the
        first pass, after a reload or an idle period), then the cron ticks that are due.
        Returns the seconds until the next tick (or the idle sweep)."""
        self._woken = anyio.Event()
        registry = self._registry()
        if registry is not self._tidied_for:
            await self._drop_foreign_rows()
            self._tidied_for, self._everything = registry, True
        # A look at least every IDLE_WAKE_S, however often wakes come: events queued by other
        # processes wake no one here on SQLite, and must not wait for a quiet moment. That
        # sweep needs only the pipelines with queued events: no other can start a run.
        now = anyio.current_time()
        if self._everything:
            dirty, self._everything, self._swept_at = set(registry.pipelines), False, now
        elif now - self._swept_at >= IDLE_WAKE_S:
            queued = await self._with_queued(registry)
            dirty, self._swept_at = self._dirty | queued, now  # with the wakes of meanwhile
        else:
            dirty = self._dirty
        self._dirty = set()
        for pipeline_id in sorted(dirty):
            pipeline = registry.pipelines.get(pipeline_id)
            if pipeline is not None:
                await self.schedule(pipeline, registry)
        return await self._fire_cron(registry)

    async def _with_queued(self, registry: Registry) -> set[str]:
        async with self._sessions() as session:
            return await _queued_keys(session, _PIPELINES_WITH_QUEUED, set(registry.pipelines))

    async def schedule(self, pipeline: Pipeline, registry: Registry) -> int:
        """Create every run the queued events of ``pipeline`` allow now; returns how many.

        Never raises for a fault of the pipeline (it is recorded on the pipeline instead);
        database errors propagate.
        """
        created = 0
        try:
            while (run_id := await self._next_asset_run(pipeline, registry)) is not None:
                created += 1
                log.info("run_created", pipeline_id=pipeline.pipeline_id, run_id=run_id)
                self._on_run_created()
        # The pipeline's fault boundary: its condition and mapper are user code, the store may
        # refuse what its definition puts in a run, and one pipeline must not stop the others.
        except Exception as error:
            if is_outage(error):
                raise  # the store's weather, no fault of the pipeline: the loop retries
            await self._set_error(
                pipeline.pipeline_id, f"evaluating its schedule failed: {describe(error)}", error
            )
        return created

    async def _next_asset_run(self, pipeline: Pipeline, registry: Registry) -> str | None:
        while True:
            try:
                async with self._sessions.begin() as session:
                    return await self._create_asset_run(session, pipeline, registry)
            except (IntegrityError, ConsumedElsewhere):
                log.info("run_creation_raced", pipeline_id=pipeline.pipeline_id)

    async def _create_asset_run(
        self, session: AsyncSession, pipeline: Pipeline, registry: Registry
    ) -> str | None:
        paused, error, active_runs = await _pipeline_state(session, pipeline.pipeline_id)
        if pipeline.condition is None:
            if pipeline.cron is None:
                # Manual only: nothing to evaluate, so an error of an earlier schedule is gone.
                await _report(session, pipeline.pipeline_id, error, None)
            return None
        # Paused or at max_active_runs: not evaluated, so its error (if any) stands.
        if paused is not False or active_runs >= pipeline.max_active_runs:
            return None
        pick = await _pick_queued(session, pipeline, pipeline.condition, registry)
        if not pick.rows:
            await _report(session, pipeline.pipeline_id, error, "; ".join(pick.problems) or None)
            return None
        run_id = _run_id(pipeline.pipeline_id, "asset", str(pick.rows[0].event_id))
        await _insert_run(session, pipeline, run_id, RunType.ASSET, pick.partition_key, pick.rows)
        return run_id

    async def _set_error(
        self, pipeline_id: str, error: str | None, cause: BaseException | None = None
    ) -> None:
        async with self._sessions.begin() as session:
            was = (await _pipeline_state(session, pipeline_id)).error
            await _report(session, pipeline_id, was, error, cause)

    async def _drop_foreign_rows(self) -> None:
        """Delete the queue rows no run can consume under the current definitions: of assets a
        changed schedule no longer names, or plain rows of a pipeline now partitioned (and the
        reverse). Rows of pipelines whose file is gone stay, in case it comes back."""
        queue, pipeline = models.QueuedEvent, models.Pipeline
        direct = select(models.PipelineAssetRef.pipeline_id).where(
            models.PipelineAssetRef.pipeline_id == queue.pipeline_id,
            models.PipelineAssetRef.asset_id == queue.asset_id,
            models.PipelineAssetRef.role == RefRole.SCHEDULE,
        )
        through_alias = (
            select(models.PipelineAliasRef.pipeline_id)
            .join(
                models.AssetAliasAsset,
                models.AssetAliasAsset.alias_id == models.PipelineAliasRef.alias_id,
            )
            .where(
                models.PipelineAliasRef.pipeline_id == queue.pipeline_id,
                models.AssetAliasAsset.asset_id == queue.asset_id,
                models.PipelineAliasRef.role == RefRole.SCHEDULE,
            )
        )
        other_kind = select(pipeline.pipeline_id).where(
            pipeline.pipeline_id == queue.pipeline_id,
            or_(
                and_(pipeline.partitioned.is_(True), queue.partition_key.is_(None)),
                and_(pipeline.partitioned.is_(False), queue.partition_key.is_not(None)),
            ),
        )
        active = select(pipeline.pipeline_id).where(pipeline.is_active.is_(True))
        async with self._sessions.begin() as session:
            dropped = await session.execute(
                delete(queue).where(
                    queue.pipeline_id.in_(active),
                    or_(and_(~exists(direct), ~exists(through_alias)), exists(other_kind)),
                )
            )
        count: int = dropped.rowcount  # type: ignore[attr-defined]  # CursorResult
        if count:
            log.info("queued_events_dropped", count=count, reason="not in the schedule any more")

    async def _fire_cron(self, registry: Registry) -> float:
        """Create the runs of cron ticks that are due; seconds until the next tick."""
        if not any(pipeline.cron for pipeline in registry.pipelines.values()):
            return IDLE_WAKE_S
        now = utcnow()
        async with self._sessions.begin() as session:
            due = (await session.execute(_CRON_TICKS)).all()
        wait_s = IDLE_WAKE_S
        for pipeline_id, tick in due:
            pipeline = registry.pipelines.get(pipeline_id)
            if pipeline is None or pipeline.cron is None or tick is None:
                continue
            if tick > now:
                wait_s = min(wait_s, (tick - now).total_seconds())
                continue
            try:
                created = await self._create_cron_run(pipeline, pipeline.cron, tick, now)
            except Exception as error:  # the pipeline's boundary, as in schedule()
                if is_outage(error):
                    raise
                message = f"its cron tick {tick.isoformat()} failed: {describe(error)}"
                await self._set_error(pipeline_id, message, error)
                continue
            if created:
                wait_s = 0.0
        return wait_s

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
        run_id = _run_id(pipeline_id, "cron", tick.isoformat())
        partition_key = (
            tick.isoformat() if isinstance(pipeline.schedule, CronPartitionTimetable) else None
        )
        after = next_tick(cron, now)
        try:
            async with self._sessions.begin() as session:
                paused, error, active_runs = await _pipeline_state(session, pipeline_id)
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
                moved = await session.execute(
                    update(models.Pipeline)
                    .where(
                        models.Pipeline.pipeline_id == pipeline_id,
                        models.Pipeline.next_cron_at == tick,
                    )
                    .values(next_cron_at=after)
                )
                if moved.rowcount != 1 or paused:  # type: ignore[attr-defined]  # CursorResult
                    return False
                await _insert_run(session, pipeline, run_id, RunType.CRON, partition_key, [])
                if pipeline.condition is None:
                    # The tick is all a cron pipeline evaluates: it works again.
                    await _report(session, pipeline_id, error, None)
        except IntegrityError:
            return False
        self._waiting_ticks.pop(pipeline_id, None)
        log.info("run_created", pipeline_id=pipeline_id, run_id=run_id, tick=tick.isoformat())
        self._on_run_created()
        return True


async def create_manual_run(
    session: AsyncSession, pipeline_id: str, params: dict[str, Any] | None = None
) -> str:
    """Insert a queued manual run of a known pipeline; the caller commits, which also wakes
    the launchers of daemons in other processes (PostgreSQL)."""
    row = await session.get(models.Pipeline, pipeline_id)
    if row is None:
        raise LookupError(f"pipeline {pipeline_id!r} does not exist")
    run_id = _run_id(pipeline_id, "manual", uuid.uuid4().hex[:12])
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


def _run_id(pipeline_id: str, kind: str, suffix: str) -> str:
    """``{pipeline_id}__{kind}__{suffix}``, cut to fit the column: a pipeline id may be as long
    as the column, so a long one is shortened and a digest of it keeps run ids apart."""
    run_id = f"{pipeline_id}__{kind}__{suffix}"
    if len(run_id) <= ID_LENGTH:
        return run_id
    tail = f"~{hashlib.sha256(pipeline_id.encode()).hexdigest()[:16]}__{kind}__{suffix}"
    return pipeline_id[: ID_LENGTH - len(tail)] + tail


# The statements of every pass are built once: building them cost more than running them.
# The active states as one comparison each, not IN: an IN list is rendered on every execution.
_ACTIVE_RUNS = (
    select(func.count())
    .select_from(models.Run)
    .where(
        models.Run.pipeline_id == models.Pipeline.pipeline_id,
        or_(*(models.Run.state == state for state in ACTIVE_STATES)),
    )
    .scalar_subquery()
)
_PIPELINE_STATE = select(models.Pipeline.paused, models.Pipeline.error, _ACTIVE_RUNS).where(
    models.Pipeline.pipeline_id == bindparam("pipeline_id")
)


def _with_queued_rows(key: Any, *match: ColumnElement[bool]) -> Select[Any]:
    """Each ``key`` in the bound list ``keys``, with the id of a queue row ``match`` finds for
    it (NULL when none): a scalar subquery with LIMIT 1 runs as one index probe per key, in one
    round trip however many keys, where an EXISTS may be planned as a join over the backlog."""
    first = select(models.QueuedEvent.id).where(*match).limit(1).scalar_subquery()
    return select(key, first).where(key.in_(bindparam("keys", expanding=True)))


_ASSETS_WITH_QUEUED = _with_queued_rows(
    models.Asset.id,
    models.QueuedEvent.pipeline_id == bindparam("pipeline_id"),
    models.QueuedEvent.asset_id == models.Asset.id,
)
_PIPELINES_WITH_QUEUED = _with_queued_rows(
    models.Pipeline.pipeline_id, models.QueuedEvent.pipeline_id == models.Pipeline.pipeline_id
)
_CRON_TICKS = select(models.Pipeline.pipeline_id, models.Pipeline.next_cron_at).where(
    models.Pipeline.next_cron_at.is_not(None), models.Pipeline.is_active.is_(True)
)


class _PipelineState(NamedTuple):
    """What the scheduler reads of a pipeline's row before evaluating it, in one statement."""

    paused: bool | None
    """``None`` when there is no row."""
    error: str | None
    active_runs: int


async def _pipeline_state(session: AsyncSession, pipeline_id: str) -> _PipelineState:
    row = (await session.execute(_PIPELINE_STATE, {"pipeline_id": pipeline_id})).one_or_none()
    return _PipelineState(None, None, 0) if row is None else _PipelineState(*row)


async def _report(
    session: AsyncSession,
    pipeline_id: str,
    was: str | None,
    error: str | None,
    cause: BaseException | None = None,
) -> None:
    """Record ``error`` (``None``: the pipeline works) on the pipeline when it changed;
    ``error_at`` keeps the time it started failing."""
    if error is not None:
        error = storable_text(error)  # user code's messages may hold what text columns cannot
    if error == was:
        return
    values: dict[str, Any] = {"error": error}
    if error is None:
        values["error_at"] = None
        log.info("pipeline_recovered", pipeline_id=pipeline_id)
    else:
        if was is None:
            values["error_at"] = utcnow()
        log.error("pipeline_failing", pipeline_id=pipeline_id, error=error, exc_info=cause)
    await session.execute(
        update(models.Pipeline).where(models.Pipeline.pipeline_id == pipeline_id).values(values)
    )


async def _pick_queued(
    session: AsyncSession, pipeline: Pipeline, condition: BaseAsset, registry: Registry
) -> Pick:
    """The queue rows of the next run of ``pipeline``, if its condition allows one now."""
    alias_members = await _alias_members(session, condition, registry)
    # Cheap first: which assets have any queued event; a backlog waiting for another asset
    # of an AND is not read again on every wake.
    candidates = {registry.asset_ids[a] for a in condition.iter_assets()} | set(alias_members)
    present = await _assets_with_queued(session, pipeline.pipeline_id, candidates)
    if not condition.evaluate(_updated(present, registry, alias_members)):
        return Pick()
    rows = await _queued(session, pipeline.pipeline_id)
    return pick_run(pipeline, condition, rows, registry, alias_members)


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
    return await _queued_keys(session, _ASSETS_WITH_QUEUED, asset_ids, pipeline_id=pipeline_id)


async def _queued_keys(
    session: AsyncSession, probes: Select[Any], keys: set[K], **parameters: object
) -> set[K]:
    """The ``keys`` that ``probes`` (made by :func:`_with_queued_rows`) finds queue rows for."""
    if not keys:
        return set()
    rows = await session.execute(probes, {"keys": sorted(keys), **parameters})
    return {key for key, queued in rows.all() if queued is not None}


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
