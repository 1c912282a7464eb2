"""Recording asset events and queueing them for every consuming pipeline, in one transaction.

Every path that creates events (watchers, the REST API, the CLI, finished runs) goes through
:func:`record_events`, so the exactly-once key and the queueing rules live in one place. After
the commit, listeners hear of them as :class:`triggerer.context.AssetEvent` (:func:`asset_events`;
the CLI calls :func:`notify_recorded`, the daemon queues them off its ingest path).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from operator import itemgetter
from typing import TYPE_CHECKING, Any

from sqlalchemy import (
    BindParameter,
    CompoundSelect,
    Table,
    bindparam,
    insert,
    select,
    text,
    union,
)
from sqlalchemy.dialects import sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from triggerer import context
from triggerer.assets import Asset
from triggerer.listeners import notify
from triggerer.service.store import models
from triggerer.service.store.engine import json_text
from triggerer.service.store.models import (
    AssetAliasAsset,
    AssetEvent,
    Pipeline,
    PipelineAliasRef,
    PipelineAssetRef,
    QueuedEvent,
)
from triggerer.service.store.states import RefRole
from triggerer.service.store.types import utcnow

if TYPE_CHECKING:
    import pluggy

# Inserts go to the tables, not the mapped classes: the ORM's bulk path costs more per row than
# the database does, and nothing here needs mapped objects.
_EVENTS: Table = AssetEvent.__table__  # type: ignore[assignment]  # a Table for declarative models
_QUEUE: Table = QueuedEvent.__table__  # type: ignore[assignment]

# On PostgreSQL a batch goes as one array per column, unnested by the server: a few parameters
# instead of one per row and column, whose processing was most of the ingest's Python time.
_PG_INSERT_EVENTS = text(
    """
    INSERT INTO asset_event (asset_id, extra, source, dedup_key, partition_key,
                             source_trigger_id, source_run_pk, traceparent, tracestate,
                             timestamp)
    SELECT asset_id, CAST(extra AS jsonb), source, dedup_key, partition_key,
           source_trigger_id, source_run_pk, traceparent, tracestate,
           CAST(:now AS timestamptz)
    FROM unnest(CAST(:asset_ids AS integer[]), CAST(:extras AS text[]),
                CAST(:sources AS text[]), CAST(:dedup_keys AS text[]),
                CAST(:partition_keys AS text[]), CAST(:trigger_ids AS integer[]),
                CAST(:run_pks AS bigint[]), CAST(:traceparents AS text[]),
                CAST(:tracestates AS text[])) WITH ORDINALITY
         AS new (asset_id, extra, source, dedup_key, partition_key,
                 source_trigger_id, source_run_pk, traceparent, tracestate, position)
    ORDER BY position
    ON CONFLICT DO NOTHING
    RETURNING id, asset_id, dedup_key
    """
)
_PG_INSERT_QUEUE = text(
    """
    INSERT INTO queued_event (pipeline_id, asset_id, event_id, partition_key, created_at)
    SELECT pipeline_id, asset_id, event_id, partition_key, CAST(:now AS timestamptz)
    FROM unnest(CAST(:pipeline_ids AS text[]), CAST(:asset_ids AS integer[]),
                CAST(:event_ids AS bigint[]), CAST(:partition_keys AS text[]))
         AS new (pipeline_id, asset_id, event_id, partition_key)
    """
)


@dataclasses.dataclass(frozen=True, slots=True)
class NewEvent:
    """An event to record on the asset with id ``asset_id``."""

    asset_id: int
    extra: dict[str, Any]
    source: str
    dedup_key: str | None = None
    partition_key: str | None = None
    source_trigger_id: int | None = None
    source_run_pk: int | None = None
    traceparent: str | None = None
    """The W3C trace context it carries (:mod:`triggerer.service.trace_context`), checked."""
    tracestate: str | None = None


@dataclasses.dataclass(frozen=True, slots=True)
class RecordedEvent:
    """One event :func:`record_events` stored: its id, and what it was given to store."""

    id: int
    asset_id: int
    dedup_key: str | None
    partition_key: str | None
    extra: dict[str, Any]
    source: str
    timestamp: datetime
    source_run_pk: int | None


@dataclasses.dataclass(frozen=True, slots=True)
class Recorded:
    """What :func:`record_events` wrote: new events, and the pipelines each was queued for."""

    events: list[RecordedEvent]
    absorbed: Sequence[NewEvent]
    """The events given whose ``(asset, dedup_key)`` was stored already: not stored again."""
    queued: Mapping[int, list[str]]
    """By event id, the pipelines that got a queue row for it (events queued nowhere: absent)."""

    @property
    def duplicates(self) -> int:
        """How many events the dedup key absorbed."""
        return len(self.absorbed)

    @property
    def queued_pipelines(self) -> set[str]:
        """The pipelines that got queue rows."""
        return {pipeline_id for pipelines in self.queued.values() for pipeline_id in pipelines}


async def record_events(session: AsyncSession, new_events: Sequence[NewEvent]) -> Recorded:
    """Insert ``new_events`` (skipping any whose ``(asset, dedup_key)`` exists) and queue them.

    The caller commits. Queue rows go to every active pipeline scheduled on the event's asset
    (a paused one holds them until it is unpaused), directly or through an alias the asset was
    added to; partitioned events go only to partitioned pipelines and plain events only to
    plain ones.
    """
    if not new_events:
        return Recorded([], [], {})
    now = utcnow()
    events, absorbed = await _insert_events(session, new_events, now)
    queued = await _queue(session, events, now)
    return Recorded(events, absorbed, queued)


async def _insert_events(
    session: AsyncSession, new_events: Sequence[NewEvent], now: datetime
) -> tuple[list[RecordedEvent], list[NewEvent]]:
    """Insert what is not a duplicate; the events inserted, and the duplicates."""
    if _dialect(session) == "postgresql":
        inserted = await session.execute(
            _PG_INSERT_EVENTS,
            {
                "now": now,
                "asset_ids": [e.asset_id for e in new_events],
                "extras": [json_text(e.extra) for e in new_events],
                "sources": [e.source for e in new_events],
                "dedup_keys": [e.dedup_key for e in new_events],
                "partition_keys": [e.partition_key for e in new_events],
                "trigger_ids": [e.source_trigger_id for e in new_events],
                "run_pks": [e.source_run_pk for e in new_events],
                "traceparents": [e.traceparent for e in new_events],
                "tracestates": [e.tracestate for e in new_events],
            },
        )
    else:
        rows = [
            {
                "asset_id": e.asset_id,
                "extra": e.extra,
                "source": e.source,
                "dedup_key": e.dedup_key,
                "partition_key": e.partition_key,
                "source_trigger_id": e.source_trigger_id,
                "source_run_pk": e.source_run_pk,
                "traceparent": e.traceparent,
                "tracestate": e.tracestate,
                "timestamp": now,
            }
            for e in new_events
        ]
        columns = (_EVENTS.c.id, _EVENTS.c.asset_id, _EVENTS.c.dedup_key)
        statement = sqlite.insert(_EVENTS).on_conflict_do_nothing().returning(*columns)
        inserted = await session.execute(statement, rows)
    return _paired(sorted(inserted.all(), key=itemgetter(0)), new_events, now)


async def stored_extras(
    session: AsyncSession, absorbed: Iterable[NewEvent]
) -> dict[tuple[int, str], tuple[dict[str, Any], datetime]]:
    """The extra and timestamp of the stored event that each of ``absorbed`` (events
    :func:`record_events` did not store again) met, by ``(asset id, dedup key)``."""
    keys = {(event.asset_id, event.dedup_key) for event in absorbed if event.dedup_key}
    if not keys:
        return {}
    rows = await session.execute(
        select(AssetEvent.asset_id, AssetEvent.dedup_key, AssetEvent.extra, AssetEvent.timestamp)
        .where(AssetEvent.asset_id.in_({asset_id for asset_id, _ in keys}))
        .where(AssetEvent.dedup_key.in_({key for _, key in keys}))
    )
    return {
        (asset_id, key): (extra, timestamp)
        for asset_id, key, extra, timestamp in rows.all()
        if (asset_id, key) in keys
    }


def _paired(
    rows: list[tuple[int, int, str | None]], new_events: Sequence[NewEvent], now: datetime
) -> tuple[list[RecordedEvent], list[NewEvent]]:
    """The inserted ``rows`` (id, asset id, dedup key) with the events they store, and the
    events of the batch that were not inserted.

    Ids are assigned in the order of the batch (PostgreSQL inserts the rows ordered by their
    position, SQLite in the order of its VALUES), so ordered by id the rows are the batch minus
    its duplicates, and a duplicate is skipped by its key. Pairing them here keeps the extras
    at hand for listeners without reading them back from the database.
    """
    recorded = []
    absorbed = []
    events = iter(new_events)
    for event_id, asset_id, dedup_key in rows:
        event = next(events)
        while event.asset_id != asset_id or event.dedup_key != dedup_key:
            absorbed.append(event)
            event = next(events)
        recorded.append(
            RecordedEvent(
                event_id,
                asset_id,
                dedup_key,
                event.partition_key,
                event.extra,
                event.source,
                now,
                event.source_run_pk,
            )
        )
    absorbed.extend(events)
    return recorded, absorbed


async def _queue(
    session: AsyncSession, events: list[RecordedEvent], now: datetime
) -> dict[int, list[str]]:
    consumers = await _consumers(session, {event.asset_id for event in events})
    rows = [
        (pipeline_id, event.asset_id, event.id, event.partition_key)
        for event in events
        for pipeline_id, partitioned in consumers.get(event.asset_id, ())
        if partitioned == (event.partition_key is not None)
    ]
    if not rows:
        return {}
    # New events have no queue rows yet: a plain batched insert, nothing to conflict with.
    pipeline_ids, asset_ids, event_ids, partition_keys = zip(*rows, strict=True)
    if _dialect(session) == "postgresql":
        columns = {
            "pipeline_ids": list(pipeline_ids),
            "asset_ids": list(asset_ids),
            "event_ids": list(event_ids),
            "partition_keys": list(partition_keys),
        }
        await session.execute(_PG_INSERT_QUEUE, {"now": now, **columns})
    else:
        await session.execute(
            insert(_QUEUE),
            [
                {
                    "pipeline_id": pipeline_id,
                    "asset_id": asset_id,
                    "event_id": event_id,
                    "partition_key": partition_key,
                    "created_at": now,
                }
                for pipeline_id, asset_id, event_id, partition_key in rows
            ],
        )
    queued: dict[int, list[str]] = {}
    for pipeline_id, _, event_id, _ in rows:
        queued.setdefault(event_id, []).append(pipeline_id)
    return queued


def _consumers_statement() -> CompoundSelect[int, str, bool]:
    """(asset id, pipeline id, partitioned) of the pipelines consuming the assets of the
    expanding parameter ``asset_ids`` now, directly or through an alias."""
    asset_ids: BindParameter[list[int]] = bindparam("asset_ids", expanding=True)
    # Paused pipelines are queued too: pausing holds runs, it does not drop the pipeline's data.
    consuming = Pipeline.is_active.is_(True)
    direct = (
        select(PipelineAssetRef.asset_id, Pipeline.pipeline_id, Pipeline.partitioned)
        .join(Pipeline, Pipeline.pipeline_id == PipelineAssetRef.pipeline_id)
        .where(
            PipelineAssetRef.asset_id.in_(asset_ids),
            PipelineAssetRef.role == RefRole.SCHEDULE,
            consuming,
        )
    )
    through_alias = (
        select(AssetAliasAsset.asset_id, Pipeline.pipeline_id, Pipeline.partitioned)
        .join(PipelineAliasRef, PipelineAliasRef.alias_id == AssetAliasAsset.alias_id)
        .join(Pipeline, Pipeline.pipeline_id == PipelineAliasRef.pipeline_id)
        .where(
            AssetAliasAsset.asset_id.in_(asset_ids),
            PipelineAliasRef.role == RefRole.SCHEDULE,
            consuming,
        )
    )
    return union(direct, through_alias)


# Built once: building the statement cost more than running it, on every batch.
_CONSUMERS = _consumers_statement()


async def _consumers(
    session: AsyncSession, asset_ids: set[int]
) -> dict[int, set[tuple[str, bool]]]:
    """For each asset, the (pipeline id, partitioned) of the pipelines that consume it now."""
    if not asset_ids:
        return {}
    consumers: dict[int, set[tuple[str, bool]]] = {}
    rows = await session.execute(_CONSUMERS, {"asset_ids": list(asset_ids)})
    for asset_id, pipeline_id, partitioned in rows.all():
        consumers.setdefault(asset_id, set()).add((pipeline_id, partitioned))
    return consumers


@dataclasses.dataclass(frozen=True)
class Origins:
    """The assets and runs that recorded events refer to by id, as listeners see them."""

    assets: Mapping[int, Asset]
    run_ids: Mapping[int, str]


async def origins(
    session: AsyncSession, recorded: Iterable[Recorded], known_assets: Mapping[int, Asset]
) -> Origins:
    """The origins of the events of ``recorded``; assets in ``known_assets`` are not read."""
    events = [event for part in recorded for event in part.events]
    missing = {event.asset_id for event in events} - known_assets.keys()
    run_pks = {event.source_run_pk for event in events if event.source_run_pk is not None}
    assets = dict(known_assets)
    if missing:
        rows = await session.scalars(select(models.Asset).where(models.Asset.id.in_(missing)))
        assets.update(
            (row.id, Asset(row.name, row.uri, extra=row.extra, group=row.group))
            for row in rows.all()
        )
    run_ids: dict[int, str] = {}
    if run_pks:
        run_rows = await session.execute(
            select(models.Run.id, models.Run.run_id).where(models.Run.id.in_(run_pks))
        )
        run_ids.update(run_rows.all())
    return Origins(assets, run_ids)


def asset_events(recorded: Recorded, known: Origins) -> list[context.AssetEvent]:
    """The events of ``recorded`` as listeners and pipelines see them."""
    return [
        context.AssetEvent(
            id=event.id,
            asset=known.assets[event.asset_id],
            extra=event.extra,
            timestamp=event.timestamp,
            source=event.source,
            partition_key=event.partition_key,
            source_run_id=known.run_ids.get(event.source_run_pk)
            if event.source_run_pk is not None
            else None,
        )
        for event in recorded.events
    ]


async def notify_recorded(
    manager: pluggy.PluginManager, session: AsyncSession, recorded: Recorded
) -> None:
    """Call ``on_asset_event_emitted`` of every listener for each event of ``recorded``, in
    this task: for a process that records events itself (the CLI), after their commit."""
    if not manager.hook.on_asset_event_emitted.get_hookimpls():
        return
    for asset_event in asset_events(recorded, await origins(session, [recorded], {})):
        notify(manager, "on_asset_event_emitted", asset_event=asset_event)


def _dialect(session: AsyncSession) -> str:
    dialect = session.get_bind().dialect.name
    if dialect not in ("postgresql", "sqlite"):
        raise ValueError(f"unsupported database dialect {dialect!r}: use SQLite or PostgreSQL")
    return dialect
