"""What the CLI and the REST API change in the store: emit an event, pause a pipeline, clear
queued events, queue a manual run. The caller commits; what is named must exist
(:class:`~triggerer.queries.NotFound`) and what is given must be usable
(:class:`~triggerer.queries.Refused`).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import delete, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from triggerer import queries
from triggerer.daemon.scheduler import create_manual_run
from triggerer.dead_letters import unstorable
from triggerer.events import NewEvent, Recorded, record_events
from triggerer.queries import NotFound, Refused
from triggerer.store import models
from triggerer.store.notices import notify_queued
from triggerer.triggers import check_json
from triggerer.uri import normalize_uri


async def find_asset(session: AsyncSession, *, asset_id: int | None, uri: str | None) -> int:
    """The id of the asset named by its id or its URI (as assets store it: ``s3://b`` is
    ``s3://b/``)."""
    if asset_id is not None:
        await queries.require_asset(session, asset_id)
        return asset_id
    if uri is None:
        raise Refused("name the asset by its asset_id or its uri")
    try:
        normalized = normalize_uri(uri)
    except ValueError as error:
        raise Refused(f"{uri!r} is not an asset URI: {error}") from None
    ids = list(
        (
            await session.scalars(
                select(models.Asset.id)
                .where(models.Asset.uri == normalized)
                .order_by(models.Asset.id)
                .limit(5)
            )
        ).all()
    )
    if not ids:
        raise NotFound(f"no asset with URI {normalized!r} (see 'assets list')")
    if len(ids) > 1:
        raise Refused(
            f"several assets have URI {normalized!r} (ids {', '.join(map(str, ids))}): "
            "name one by its asset_id"
        )
    return ids[0]


async def emit_event(
    session: AsyncSession,
    asset_id: int,
    extra: dict[str, Any],
    *,
    source: str,
    partition_key: str | None = None,
) -> Recorded:
    """Record an event on ``asset_id`` and queue it for its consumers; daemons in other
    processes hear of it when the caller commits (PostgreSQL)."""
    try:
        check_json(extra, "extra")
    except TypeError as error:
        raise Refused(str(error)) from None
    new = NewEvent(asset_id=asset_id, extra=extra, source=source, partition_key=partition_key)
    reason = unstorable(new)
    if reason is not None:
        raise Refused(f"the event cannot be stored: {reason}")
    recorded = await record_events(session, [new])
    await notify_queued(session, recorded.queued_pipelines)
    return recorded


async def set_paused(session: AsyncSession, pipeline_id: str, paused: bool) -> None:
    """Pause (no events are queued, no runs start) or unpause a pipeline."""
    changed = await session.execute(
        update(models.Pipeline)
        .where(models.Pipeline.pipeline_id == pipeline_id)
        .values(paused=paused)
    )
    if changed.rowcount != 1:  # type: ignore[attr-defined]  # CursorResult
        raise NotFound(f"pipeline {pipeline_id!r} does not exist (see 'pipelines list')")
    if not paused:
        # Events queued before the pause may be enough for a run now.
        await notify_queued(session, [pipeline_id])


async def delete_queued_events(
    session: AsyncSession,
    *,
    asset_id: int | None = None,
    pipeline_id: str | None = None,
    before: dt.datetime | None = None,
) -> int:
    """Remove events from pipelines' queues (by asset, pipeline or both; queued before
    ``before``); how many queue rows went. The events themselves are kept."""
    if asset_id is not None:
        await queries.require_asset(session, asset_id)
    if pipeline_id is not None:
        await queries.pipeline_model(session, pipeline_id)
    statement = delete(models.QueuedEvent)
    if asset_id is not None:
        statement = statement.where(models.QueuedEvent.asset_id == asset_id)
    if pipeline_id is not None:
        statement = statement.where(models.QueuedEvent.pipeline_id == pipeline_id)
    if before is not None:
        statement = statement.where(models.QueuedEvent.created_at < before)
    deleted = await session.execute(statement)
    return int(deleted.rowcount)  # type: ignore[attr-defined]  # CursorResult


async def trigger_run(
    session: AsyncSession, pipeline_id: str, params: dict[str, Any] | None = None
) -> str:
    """Queue a manual run of ``pipeline_id``; its run id."""
    await queries.pipeline_model(session, pipeline_id)
    try:
        check_json(params or {}, "params")
    except TypeError as error:
        raise Refused(str(error)) from None
    return await create_manual_run(session, pipeline_id, params)
