"""Recording asset events and queueing them for every consuming pipeline, in one transaction.

Every path that creates events (watchers, the REST API, the CLI, finished runs) goes through
:func:`record_events`, so the exactly-once key and the queueing rules live in one place.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

from sqlalchemy import Insert, and_, literal, select, union
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from triggerer.store.models import (
    AssetAliasAsset,
    AssetEvent,
    Pipeline,
    PipelineAliasRef,
    PipelineAssetRef,
    QueuedEvent,
    RefRole,
)
from triggerer.store.types import utcnow


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


@dataclasses.dataclass(frozen=True, slots=True)
class RecordedEvent:
    id: int
    asset_id: int
    dedup_key: str | None


@dataclasses.dataclass(frozen=True, slots=True)
class Recorded:
    """What :func:`record_events` wrote: new events, and the pipelines that got queue rows."""

    events: list[RecordedEvent]
    duplicates: int
    queued_pipelines: set[str]


async def record_events(session: AsyncSession, new_events: Sequence[NewEvent]) -> Recorded:
    """Insert ``new_events`` (skipping any whose ``(asset, dedup_key)`` exists) and queue them.

    The caller commits. Queue rows go to every active, unpaused pipeline scheduled on the
    event's asset, directly or through an alias the asset was added to; partitioned events go
    only to partitioned pipelines and plain events only to plain ones.
    """
    if not new_events:
        return Recorded([], 0, set())
    now = utcnow()
    rows = [
        {
            "asset_id": e.asset_id,
            "extra": e.extra,
            "source": e.source,
            "dedup_key": e.dedup_key,
            "partition_key": e.partition_key,
            "source_trigger_id": e.source_trigger_id,
            "source_run_pk": e.source_run_pk,
            "timestamp": now,
        }
        for e in new_events
    ]
    statement = _insert_ignoring_duplicates(session, AssetEvent).returning(
        AssetEvent.id, AssetEvent.asset_id, AssetEvent.dedup_key
    )
    result = await session.execute(statement, rows)
    events = [RecordedEvent(*row) for row in result.all()]
    queued = await _queue(session, [e.id for e in events], now)
    return Recorded(events, len(new_events) - len(events), queued)


async def _queue(session: AsyncSession, event_ids: list[int], now: Any) -> set[str]:
    if not event_ids:
        return set()
    consumer = and_(
        Pipeline.paused.is_(False),
        Pipeline.is_active.is_(True),
        Pipeline.partitioned == AssetEvent.partition_key.is_not(None),
    )
    columns = (
        Pipeline.pipeline_id,
        AssetEvent.asset_id,
        AssetEvent.id,
        AssetEvent.partition_key,
        literal(now, QueuedEvent.created_at.type),
    )
    direct = (
        select(*columns)
        .join(PipelineAssetRef, PipelineAssetRef.asset_id == AssetEvent.asset_id)
        .join(Pipeline, Pipeline.pipeline_id == PipelineAssetRef.pipeline_id)
        .where(AssetEvent.id.in_(event_ids), PipelineAssetRef.role == RefRole.SCHEDULE, consumer)
    )
    through_alias = (
        select(*columns)
        .join(AssetAliasAsset, AssetAliasAsset.asset_id == AssetEvent.asset_id)
        .join(PipelineAliasRef, PipelineAliasRef.alias_id == AssetAliasAsset.alias_id)
        .join(Pipeline, Pipeline.pipeline_id == PipelineAliasRef.pipeline_id)
        .where(AssetEvent.id.in_(event_ids), PipelineAliasRef.role == RefRole.SCHEDULE, consumer)
    )
    statement = (
        _insert_ignoring_duplicates(session, QueuedEvent)
        .from_select(
            ["pipeline_id", "asset_id", "event_id", "partition_key", "created_at"],
            union(direct, through_alias),
        )
        .returning(QueuedEvent.pipeline_id)
    )
    return set((await session.scalars(statement)).all())


def _insert_ignoring_duplicates(session: AsyncSession, table: type[Any]) -> Insert:
    dialect = session.get_bind().dialect.name
    if dialect == "postgresql":
        return postgresql.insert(table).on_conflict_do_nothing()
    if dialect == "sqlite":
        return sqlite.insert(table).on_conflict_do_nothing()
    raise ValueError(f"unsupported database dialect {dialect!r}: use SQLite or PostgreSQL")
