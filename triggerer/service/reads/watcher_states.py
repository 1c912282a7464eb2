"""The watchers as the CLI and the REST API list them, and whether each is failing now or has
recovered from its last error (the lineage graph says the same)."""

from __future__ import annotations

from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from triggerer.service.reads.views import WatcherRow
from triggerer.service.store import models
from triggerer.service.store.states import TriggerState


def watcher_failing(state: str) -> bool:
    """Whether a watcher in ``state`` is failing now: backing off before its next attempt, or
    failed for good (an unusable or refused trigger)."""
    return state in (TriggerState.BACKOFF, TriggerState.FAILED)


def watcher_recovered(trigger: models.Trigger) -> bool:
    """Whether the watcher of ``trigger`` has run since its last error: running, and its last
    poll (an event counts as one) came after the error. Its error is then history."""
    return (
        trigger.state == TriggerState.RUNNING
        and trigger.last_error_at is not None
        and trigger.last_poll_at is not None
        and trigger.last_poll_at > trigger.last_error_at
    )


async def watchers(session: AsyncSession, *, limit: int = 100, offset: int = 0) -> list[WatcherRow]:
    """Each watcher with its trigger's state as last reported: polls, restarts, lag, errors."""
    rows = await session.execute(
        select(models.AssetWatcher.name, models.Asset.id, models.Asset.uri, models.Trigger)
        .join(models.Asset, models.Asset.id == models.AssetWatcher.asset_id)
        .join(models.Trigger, models.Trigger.id == models.AssetWatcher.trigger_id)
        .order_by(models.AssetWatcher.name, models.Asset.id)
        .limit(limit)
        .offset(offset)
    )
    return [
        WatcherRow(
            watcher=name,
            asset_id=asset_id,
            asset=uri,
            trigger=trigger.classpath.rpartition(".")[2],
            classpath=trigger.classpath,
            state=trigger.state,
            last_poll_at=trigger.last_poll_at,
            last_event_at=trigger.last_event_at,
            restarts=trigger.restart_count,
            lag=trigger.lag,
            consumer_group=trigger.reads_as,
            held_by=trigger.held_by,
            last_error=trigger.last_error,
            last_error_at=trigger.last_error_at,
            failing=watcher_failing(trigger.state),
            recovered=watcher_recovered(trigger),
            instance_id=trigger.instance_id,
        )
        for name, asset_id, uri, trigger in rows.all()
    ]
