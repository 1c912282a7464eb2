"""What the CLI and the REST API read from the store: one query per view, shared by both so
that ``triggerer pipelines list --json`` and ``GET /api/v1/pipelines`` never disagree.

Each view is a model of :mod:`triggerer.service.reads.views` (the API's response schemas too).
Lists are newest first where time matters (events, runs, dead letters) and by key otherwise;
``limit`` and ``offset`` page them. A lookup of something that does not exist raises
:class:`~triggerer.service.errors.NotFound` naming it.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Iterable

from sqlalchemy import ColumnElement, case, func, select
from sqlalchemy.ext.asyncio import AsyncSession
from sqlalchemy.orm import InstrumentedAttribute, aliased

from triggerer.service.errors import NotFound
from triggerer.service.reads.views import (
    AliasRow,
    AssetRow,
    DeadLetterRow,
    EventDetail,
    EventRow,
    ImportErrorRow,
    PipelineRow,
    QueuedEventRow,
    RunDetail,
    RunRef,
    RunRow,
)
from triggerer.service.store import models
from triggerer.service.store.states import RefRole

# -- Pipelines -------------------------------------------------------------------------------


async def pipelines(
    session: AsyncSession,
    *,
    name_prefix: str | None = None,
    paused: bool | None = None,
    limit: int = 100,
    offset: int = 0,
) -> list[PipelineRow]:
    """Pipelines by id; ``name_prefix`` filters on the id."""
    query = select(models.Pipeline).order_by(models.Pipeline.pipeline_id)
    if name_prefix:
        query = query.where(models.Pipeline.pipeline_id.startswith(name_prefix, autoescape=True))
    if paused is not None:
        query = query.where(models.Pipeline.paused.is_(paused))
    rows = (await session.scalars(query.limit(limit).offset(offset))).all()
    ids = [row.pipeline_id for row in rows]
    progress, queued = await _progress(session, ids), await _queued_by_asset(session, ids)
    return [
        _pipeline_row(row, progress.get(row.pipeline_id), queued.get(row.pipeline_id, {}))
        for row in rows
    ]


async def pipeline(session: AsyncSession, pipeline_id: str) -> PipelineRow:
    row = await pipeline_model(session, pipeline_id)
    progress = (await _progress(session, [pipeline_id])).get(pipeline_id)
    queued = (await _queued_by_asset(session, [pipeline_id])).get(pipeline_id, {})
    return _pipeline_row(row, progress, queued)


async def pipeline_model(session: AsyncSession, pipeline_id: str) -> models.Pipeline:
    """The row of ``pipeline_id``, or :class:`NotFound`."""
    row = await session.get(models.Pipeline, pipeline_id)
    if row is None:
        raise NotFound(f"pipeline {pipeline_id!r} does not exist (see 'pipelines list')")
    return row


def _pipeline_row(
    row: models.Pipeline, progress: str | None, queued_by_asset: dict[int, int]
) -> PipelineRow:
    return PipelineRow(
        pipeline_id=row.pipeline_id,
        schedule=row.schedule_text,
        progress=progress,
        queued_by_asset=queued_by_asset,
        paused=row.paused,
        active=row.is_active,
        partitioned=row.partitioned,
        max_active_runs=row.max_active_runs,
        run_policy=row.run_policy,
        next_cron_at=row.next_cron_at,
        fileloc=row.fileloc,
        error=row.error,
        error_at=row.error_at,
    )


async def _queued_by_asset(
    session: AsyncSession, pipeline_ids: list[str]
) -> dict[str, dict[int, int]]:
    """Per pipeline, how many queued events each asset has in its queue."""
    if not pipeline_ids:
        return {}
    queue = models.QueuedEvent
    rows = await session.execute(
        select(queue.pipeline_id, queue.asset_id, func.count())
        .where(queue.pipeline_id.in_(pipeline_ids))
        .group_by(queue.pipeline_id, queue.asset_id)
    )
    queued: dict[str, dict[int, int]] = defaultdict(dict)
    for pipeline_id, asset_id, count in rows.all():
        queued[pipeline_id][asset_id] = count
    return queued


async def _progress(session: AsyncSession, pipeline_ids: list[str]) -> dict[str, str]:
    """``N of M assets updated`` per pipeline with an asset condition: of the assets and
    aliases it is scheduled on, how many have queued events for it."""
    if not pipeline_ids:
        return {}
    ref = models.PipelineAssetRef
    asset_queued = (
        select(models.QueuedEvent.id)
        .where(
            models.QueuedEvent.pipeline_id == ref.pipeline_id,
            models.QueuedEvent.asset_id == ref.asset_id,
        )
        .exists()
    )
    alias_ref = models.PipelineAliasRef
    alias_queued = (
        select(models.QueuedEvent.id)
        .join(
            models.AssetAliasAsset, models.AssetAliasAsset.asset_id == models.QueuedEvent.asset_id
        )
        .where(
            models.QueuedEvent.pipeline_id == alias_ref.pipeline_id,
            models.AssetAliasAsset.alias_id == alias_ref.alias_id,
        )
        .exists()
    )
    counts: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    for table, queued in ((ref, asset_queued), (alias_ref, alias_queued)):
        rows = await session.execute(
            select(table.pipeline_id, func.count(), func.sum(case((queued, 1), else_=0)))
            .where(table.pipeline_id.in_(pipeline_ids), table.role == RefRole.SCHEDULE)
            .group_by(table.pipeline_id)
        )
        for pipeline_id, total, updated in rows.all():
            counts[pipeline_id][0] += updated or 0
            counts[pipeline_id][1] += total
    return {
        pipeline_id: f"{updated} of {total} {'asset' if total == 1 else 'assets'} updated"
        for pipeline_id, (updated, total) in counts.items()
    }


async def import_errors(
    session: AsyncSession, *, limit: int = 100, offset: int = 0
) -> list[ImportErrorRow]:
    """Files of the pipelines folder that failed to load at the last load, by path."""
    table = models.PipelineImportError
    rows = await session.scalars(
        select(table).order_by(table.fileloc, table.key).limit(limit).offset(offset)
    )
    return [
        ImportErrorRow(
            fileloc=row.fileloc,
            line=row.line,
            error=row.error,
            traceback=row.traceback,
            error_at=row.error_at,
        )
        for row in rows
    ]


# -- Assets and aliases ----------------------------------------------------------------------


async def assets(
    session: AsyncSession, *, name_prefix: str | None = None, limit: int = 100, offset: int = 0
) -> list[AssetRow]:
    """Assets by id, with the pipelines that consume and produce them and their watchers."""
    query = select(models.Asset).order_by(models.Asset.id)
    if name_prefix:
        query = query.where(models.Asset.name.startswith(name_prefix, autoescape=True))
    rows = (await session.scalars(query.limit(limit).offset(offset))).all()
    return await _asset_rows(session, rows)


async def asset(session: AsyncSession, asset_id: int) -> AssetRow:
    row = await session.get(models.Asset, asset_id)
    if row is None:
        raise missing_asset(asset_id)
    [found] = await _asset_rows(session, [row])
    return found


async def _pipeline_refs(
    session: AsyncSession, referred: InstrumentedAttribute[int], ids: list[int]
) -> dict[tuple[int, str], list[str]]:
    """Pipeline ids by (asset or alias id, role), for the ``referred`` column of
    ``pipeline_asset_ref`` or ``pipeline_alias_ref``."""
    table = referred.class_
    refs: dict[tuple[int, str], list[str]] = defaultdict(list)
    rows = await session.execute(
        select(referred, table.pipeline_id, table.role)
        .where(referred.in_(ids))
        .order_by(table.pipeline_id)
    )
    for referred_id, pipeline_id, role in rows.all():
        refs[referred_id, role].append(pipeline_id)
    return refs


async def _asset_rows(session: AsyncSession, rows: Iterable[models.Asset]) -> list[AssetRow]:
    rows = list(rows)
    ids = [row.id for row in rows]
    refs = await _pipeline_refs(session, models.PipelineAssetRef.asset_id, ids)
    watchers: dict[int, list[str]] = defaultdict(list)
    for asset_id, name in (
        await session.execute(
            select(models.AssetWatcher.asset_id, models.AssetWatcher.name)
            .where(models.AssetWatcher.asset_id.in_(ids))
            .order_by(models.AssetWatcher.name)
        )
    ).all():
        watchers[asset_id].append(name)
    return [
        AssetRow(
            id=row.id,
            name=row.name,
            uri=row.uri,
            group=row.group,
            extra=row.extra,
            created_at=row.created_at,
            consumers=refs[row.id, RefRole.SCHEDULE],
            producers=refs[row.id, RefRole.OUTLET],
            watchers=watchers[row.id],
        )
        for row in rows
    ]


async def aliases(session: AsyncSession, *, limit: int = 100, offset: int = 0) -> list[AliasRow]:
    """Aliases by id, with the assets added through them and the pipelines using them."""
    rows = (
        await session.scalars(
            select(models.AssetAlias).order_by(models.AssetAlias.id).limit(limit).offset(offset)
        )
    ).all()
    ids = [row.id for row in rows]
    members: dict[int, list[int]] = defaultdict(list)
    for alias_id, asset_id in (
        await session.execute(
            select(models.AssetAliasAsset.alias_id, models.AssetAliasAsset.asset_id)
            .where(models.AssetAliasAsset.alias_id.in_(ids))
            .order_by(models.AssetAliasAsset.asset_id)
        )
    ).all():
        members[alias_id].append(asset_id)
    refs = await _pipeline_refs(session, models.PipelineAliasRef.alias_id, ids)
    return [
        AliasRow(
            id=row.id,
            name=row.name,
            group=row.group,
            asset_ids=members[row.id],
            consumers=refs[row.id, RefRole.SCHEDULE],
            producers=refs[row.id, RefRole.OUTLET],
        )
        for row in rows
    ]


def missing_asset(asset_id: int) -> NotFound:
    """What naming an asset id that does not exist raises."""
    return NotFound(f"asset {asset_id} does not exist (see 'assets list')")


async def require_asset(session: AsyncSession, asset_id: int) -> None:
    """:class:`NotFound` unless the asset ``asset_id`` exists."""
    if await session.get(models.Asset, asset_id) is None:
        raise missing_asset(asset_id)


# -- Events ----------------------------------------------------------------------------------

_producer = aliased(models.Run)


_EVENTS = (
    select(models.AssetEvent, models.Asset.uri, _producer.run_id)
    .join(models.Asset, models.Asset.id == models.AssetEvent.asset_id)
    .outerjoin(_producer, _producer.id == models.AssetEvent.source_run_pk)
)
"""Events with their asset's URI and the id of the run that produced them."""


def _event_row(event: models.AssetEvent, uri: str, source_run_id: str | None) -> EventRow:
    return EventRow(
        id=event.id,
        asset_id=event.asset_id,
        uri=uri,
        source=event.source,
        timestamp=event.timestamp,
        partition_key=event.partition_key,
        extra=event.extra,
        source_run_id=source_run_id,
        source_trigger_id=event.source_trigger_id,
    )


async def events(
    session: AsyncSession,
    *,
    asset_id: int | None = None,
    uri: str | None = None,
    source: str | None = None,
    since: dt.datetime | None = None,
    limit: int = 100,
    offset: int = 0,
) -> list[EventRow]:
    """Events, newest first; filtered by asset (id or URI), source, and time."""
    query = _EVENTS.order_by(models.AssetEvent.id.desc())
    if asset_id is not None:
        query = query.where(models.AssetEvent.asset_id == asset_id)
    if uri is not None:
        query = query.where(models.Asset.uri == uri)
    if source is not None:
        query = query.where(models.AssetEvent.source == source)
    if since is not None:
        query = query.where(
            await _since(session, models.AssetEvent.id, models.AssetEvent.timestamp, since)
        )
    rows = await session.execute(query.limit(limit).offset(offset))
    return [_event_row(e, uri, run_id) for e, uri, run_id in rows.all()]


FEW_SINCE = 1000
"""At most this many rows at or after a ``since`` are read by their ids, through the index of
their time (see :func:`_since`)."""


async def _since(
    session: AsyncSession,
    key: InstrumentedAttribute[int],
    time: InstrumentedAttribute[dt.datetime],
    since: dt.datetime,
) -> ColumnElement[bool]:
    """``time >= since`` (``time`` is never NULL), written for the way a list newest first by
    ``key`` is best read: when at most :data:`FEW_SINCE` rows match, their keys, read first
    through the index of ``time``; when more do, backwards by key until the page is full.

    A database left to choose chooses wrong at size: SQLite (no statistics) always reads
    backwards by key, every row when few are that recent; PostgreSQL, whose statistics are
    older than the newest rows until autovacuum's next ANALYZE, reads every recent row through
    the time's index and sorts them (50,000 rows: a second).
    """
    recent = time >= since
    keys = (await session.scalars(select(key).where(recent).limit(FEW_SINCE + 1))).all()
    if len(keys) <= FEW_SINCE:
        return recent & key.in_(keys)
    # The same condition, out of reach of the time's index.
    return func.coalesce(time, since) >= since


async def _event_by_id(session: AsyncSession, event_id: int) -> EventRow:
    """One event, or :class:`NotFound`."""
    found = (await session.execute(_EVENTS.where(models.AssetEvent.id == event_id))).one_or_none()
    if found is None:
        raise NotFound(f"event {event_id} does not exist (see 'events list')")
    return _event_row(found[0], found[1], found[2])


async def event_with_key(session: AsyncSession, asset_id: int, dedup_key: str) -> EventRow | None:
    """The event of the asset ``asset_id`` stored under ``dedup_key``, if there is one."""
    rows = await session.execute(
        _EVENTS.where(
            models.AssetEvent.asset_id == asset_id, models.AssetEvent.dedup_key == dedup_key
        )
    )
    found = rows.first()
    return None if found is None else _event_row(*found)


async def event(session: AsyncSession, event_id: int) -> EventDetail:
    """One event with the run that produced it, the runs that consumed it, and the pipelines
    it is still queued for."""
    row = await _event_by_id(session, event_id)
    produced_by = None
    if row.source_run_id is not None:
        producer = await run_model(session, row.source_run_id)
        produced_by = RunRef(
            run_id=producer.run_id, pipeline_id=producer.pipeline_id, state=producer.state
        )
    consumers = await session.execute(
        select(models.Run.run_id, models.Run.pipeline_id, models.Run.state)
        .join(models.RunEvent, models.RunEvent.run_pk == models.Run.id)
        .where(models.RunEvent.event_id == event_id)
        .order_by(models.Run.id)
    )
    queued_for = await session.scalars(
        select(models.QueuedEvent.pipeline_id)
        .where(models.QueuedEvent.event_id == event_id)
        .order_by(models.QueuedEvent.pipeline_id)
    )
    return EventDetail(
        **row.model_dump(),
        produced_by=produced_by,
        consumed_by=[
            RunRef(run_id=run_id, pipeline_id=pipeline_id, state=state)
            for run_id, pipeline_id, state in consumers.all()
        ],
        queued_for=list(queued_for.all()),
    )


async def queued_events(
    session: AsyncSession,
    *,
    asset_id: int | None = None,
    pipeline_id: str | None = None,
    limit: int = 100,
    offset: int = 0,
) -> list[QueuedEventRow]:
    """Events waiting in the queues of pipelines, oldest first; by asset, pipeline or both.

    The asset and the pipeline named must exist (:class:`NotFound`).
    """
    await _require(session, asset_id, pipeline_id)
    query = (
        select(models.QueuedEvent, models.Asset.uri)
        .join(models.Asset, models.Asset.id == models.QueuedEvent.asset_id)
        .order_by(models.QueuedEvent.id)
    )
    if asset_id is not None:
        query = query.where(models.QueuedEvent.asset_id == asset_id)
    if pipeline_id is not None:
        query = query.where(models.QueuedEvent.pipeline_id == pipeline_id)
    rows = await session.execute(query.limit(limit).offset(offset))
    return [
        QueuedEventRow(
            pipeline_id=queued.pipeline_id,
            asset_id=queued.asset_id,
            uri=uri,
            event_id=queued.event_id,
            partition_key=queued.partition_key,
            created_at=queued.created_at,
        )
        for queued, uri in rows.all()
    ]


async def _require(session: AsyncSession, asset_id: int | None, pipeline_id: str | None) -> None:
    if asset_id is not None:
        await require_asset(session, asset_id)
    if pipeline_id is not None:
        await pipeline_model(session, pipeline_id)


# -- Runs ------------------------------------------------------------------------------------


async def runs(
    session: AsyncSession,
    *,
    pipeline_id: str | None = None,
    state: str | None = None,
    since: dt.datetime | None = None,
    limit: int = 100,
    offset: int = 0,
) -> list[RunRow]:
    """Runs, newest first; by pipeline, state, and creation time."""
    query = select(models.Run).order_by(models.Run.id.desc())
    if pipeline_id is not None:
        query = query.where(models.Run.pipeline_id == pipeline_id)
    if state is not None:
        query = query.where(models.Run.state == state)
    if since is not None:
        query = query.where(await _since(session, models.Run.id, models.Run.created_at, since))
    found = (await session.scalars(query.limit(limit).offset(offset))).all()
    consumed = await _consumed_counts(session, [run.id for run in found])
    return [_run_row(run, consumed.get(run.id, 0)) for run in found]


async def run(session: AsyncSession, run_id: str) -> RunDetail:
    """One run with its params and the events it consumed, oldest first."""
    found = await run_model(session, run_id)
    consumed = await session.execute(
        _EVENTS.join(models.RunEvent, models.RunEvent.event_id == models.AssetEvent.id)
        .where(models.RunEvent.run_pk == found.id)
        .order_by(models.AssetEvent.id)
    )
    events_consumed = [_event_row(e, uri, run_id) for e, uri, run_id in consumed.all()]
    return RunDetail(
        **_run_row(found, len(events_consumed)).model_dump(),
        params=found.params,
        consumed=events_consumed,
    )


async def run_model(session: AsyncSession, run_id: str) -> models.Run:
    """The row of ``run_id``, or :class:`NotFound`."""
    found = await session.scalar(select(models.Run).where(models.Run.run_id == run_id))
    if found is None:
        raise NotFound(f"run {run_id!r} does not exist (see 'runs list')")
    return found


def _run_row(run: models.Run, events_consumed: int) -> RunRow:
    return RunRow(
        run_id=run.run_id,
        pipeline_id=run.pipeline_id,
        state=run.state,
        run_type=run.run_type,
        try_number=run.try_number,
        max_tries=run.max_tries,
        events=events_consumed,
        partition_key=run.partition_key,
        created_at=run.created_at,
        start_date=run.start_date,
        end_date=run.end_date,
        error=run.error,
        rerun_of=run.rerun_of,
    )


async def _consumed_counts(session: AsyncSession, run_pks: list[int]) -> dict[int, int]:
    rows = await session.execute(
        select(models.RunEvent.run_pk, func.count())
        .where(models.RunEvent.run_pk.in_(run_pks))
        .group_by(models.RunEvent.run_pk)
    )
    return {run_pk: count for run_pk, count in rows.all()}  # noqa: C416 - rows are Row objects


# -- Dead letters ----------------------------------------------------------------------------


async def dead_letters(
    session: AsyncSession, *, since: dt.datetime | None = None, limit: int = 100, offset: int = 0
) -> list[DeadLetterRow]:
    """Events the store could not hold, newest first, with the reason."""
    query = (
        select(models.DeadLetter, models.Asset.uri)
        .outerjoin(models.Asset, models.Asset.id == models.DeadLetter.asset_id)
        .order_by(models.DeadLetter.id.desc())
    )
    if since is not None:
        query = query.where(models.DeadLetter.created_at >= since)
    rows = await session.execute(query.limit(limit).offset(offset))
    return [
        DeadLetterRow(
            id=letter.id,
            created_at=letter.created_at,
            asset_id=letter.asset_id,
            asset=uri,
            trigger_id=letter.trigger_id,
            source=letter.source,
            dedup_key=letter.dedup_key,
            partition_key=letter.partition_key,
            reason=letter.reason,
            payload=letter.payload,
        )
        for letter, uri in rows.all()
    ]


async def latest_heartbeat(
    session: AsyncSession, instance_id: str | None = None
) -> dt.datetime | None:
    """The newest heartbeat of ``instance_id`` (of any instance when ``None``)."""
    query = select(func.max(models.Instance.heartbeat_at))
    if instance_id is not None:
        query = query.where(models.Instance.id == instance_id)
    return await session.scalar(query)
