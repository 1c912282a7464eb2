"""Writing what the pipelines folder defines into the metadata database.

The folder is the source of truth for pipelines and watchers: a sync upserts assets, aliases,
triggers, watchers and pipelines, and marks pipelines whose file is gone inactive.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import TYPE_CHECKING

from sqlalchemy import delete, select, update
from sqlalchemy.ext.asyncio import AsyncSession

from triggerer.assets import Asset, AssetAlias
from triggerer.schedules import PartitionedAssetTimetable, next_tick
from triggerer.store import models
from triggerer.store.models import RefRole, trigger_key
from triggerer.store.types import utcnow

if TYPE_CHECKING:
    from triggerer.loader import LoadedPipelines
    from triggerer.pipelines import Pipeline
    from triggerer.triggers import BaseEventTrigger


@dataclasses.dataclass(frozen=True)
class WatchedTrigger:
    """One trigger instance and the assets whose watchers share it."""

    trigger_id: int
    trigger: BaseEventTrigger
    asset_ids: tuple[int, ...]


@dataclasses.dataclass(frozen=True)
class Registry:
    """The in-memory view of the synced definitions, keyed by database ids."""

    assets: dict[int, Asset]
    asset_ids: dict[Asset, int]
    alias_ids: dict[AssetAlias, int]
    pipelines: dict[str, Pipeline]
    triggers: dict[int, WatchedTrigger]


async def sync_definitions(session: AsyncSession, loaded: LoadedPipelines) -> Registry:
    """Upsert everything ``loaded`` defines; the caller commits."""
    asset_ids = {asset: await ensure_asset(session, asset) for asset in loaded.assets.values()}
    alias_ids = {alias: await ensure_alias(session, alias) for alias in loaded.aliases}
    triggers = await _sync_watchers(session, loaded, asset_ids)
    await _sync_pipelines(session, loaded.pipelines, asset_ids, alias_ids)
    return Registry(
        assets={asset_id: asset for asset, asset_id in asset_ids.items()},
        asset_ids=asset_ids,
        alias_ids=alias_ids,
        pipelines=dict(loaded.pipelines),
        triggers=triggers,
    )


async def ensure_asset(session: AsyncSession, asset: Asset) -> int:
    """The id of ``asset``, creating its row (or updating extra and group) as needed."""
    row = await session.scalar(
        select(models.Asset).where(models.Asset.name == asset.name, models.Asset.uri == asset.uri)
    )
    if row is None:
        row = models.Asset(name=asset.name, uri=asset.uri, group=asset.group, extra=asset.extra)
        session.add(row)
        await session.flush()
    elif (row.extra, row.group) != (asset.extra, asset.group):
        row.extra, row.group = asset.extra, asset.group
    return row.id


async def ensure_alias(session: AsyncSession, alias: AssetAlias) -> int:
    """The id of ``alias``, creating its row as needed."""
    alias_id = await session.scalar(
        select(models.AssetAlias.id).where(models.AssetAlias.name == alias.name)
    )
    if alias_id is None:
        row = models.AssetAlias(name=alias.name, group=alias.group)
        session.add(row)
        await session.flush()
        alias_id = row.id
    return alias_id


async def _sync_watchers(
    session: AsyncSession, loaded: LoadedPipelines, asset_ids: dict[Asset, int]
) -> dict[int, WatchedTrigger]:
    instances: dict[str, BaseEventTrigger] = {}
    watching: dict[str, list[int]] = {}
    wanted: set[tuple[int, str]] = set()
    trigger_ids: dict[str, int] = {}
    for asset in loaded.assets.values():
        for watcher in asset.watchers:
            classpath, kwargs = watcher.trigger.serialize()
            key = trigger_key(classpath, kwargs)
            instances.setdefault(key, watcher.trigger)
            watching.setdefault(key, []).append(asset_ids[asset])
            if key not in trigger_ids:
                trigger_ids[key] = await _ensure_trigger(session, key, classpath, kwargs)
            wanted.add((asset_ids[asset], watcher.name))
            await session.merge(
                models.AssetWatcher(
                    asset_id=asset_ids[asset], name=watcher.name, trigger_id=trigger_ids[key]
                )
            )
    for asset_id, name in (
        await session.execute(select(models.AssetWatcher.asset_id, models.AssetWatcher.name))
    ).all():
        if (asset_id, name) not in wanted:
            await session.execute(
                delete(models.AssetWatcher).where(
                    models.AssetWatcher.asset_id == asset_id, models.AssetWatcher.name == name
                )
            )
    return {
        trigger_ids[key]: WatchedTrigger(trigger_ids[key], instances[key], tuple(watching[key]))
        for key in instances
    }


async def _ensure_trigger(
    session: AsyncSession, key: str, classpath: str, kwargs: dict[str, object]
) -> int:
    trigger_id = await session.scalar(select(models.Trigger.id).where(models.Trigger.key == key))
    if trigger_id is None:
        row = models.Trigger(classpath=classpath, kwargs=kwargs, key=key)
        session.add(row)
        await session.flush()
        trigger_id = row.id
    return trigger_id


async def _sync_pipelines(
    session: AsyncSession,
    pipelines: dict[str, Pipeline],
    asset_ids: dict[Asset, int],
    alias_ids: dict[AssetAlias, int],
) -> None:
    now = utcnow()
    await session.execute(
        update(models.Pipeline)
        .where(models.Pipeline.pipeline_id.not_in(list(pipelines)))
        .values(is_active=False)
    )
    for pipeline in pipelines.values():
        row = await session.get(models.Pipeline, pipeline.pipeline_id)
        if row is None:
            row = models.Pipeline(pipeline_id=pipeline.pipeline_id, paused=False)
            session.add(row)
        schedule = pipeline.schedule
        row.fileloc = str(pipeline.fileloc)
        row.schedule = {"schedule": schedule.as_json() if schedule is not None else None}
        row.schedule_text = str(schedule) if schedule is not None else "manual"
        row.is_active = True
        row.partitioned = isinstance(schedule, PartitionedAssetTimetable)
        row.max_active_runs = pipeline.max_active_runs
        row.run_policy = pipeline.run_policy
        row.max_events_per_run = pipeline.max_events_per_run
        row.retries = pipeline.retries
        row.next_cron_at = _next_cron_at(pipeline, row.next_cron_at, now)
        await session.flush()
        await _sync_refs(session, pipeline, asset_ids, alias_ids)


def _next_cron_at(pipeline: Pipeline, current: datetime | None, now: datetime) -> datetime | None:
    if pipeline.cron is None:
        return None
    return current if current is not None else next_tick(pipeline.cron, now)


async def _sync_refs(
    session: AsyncSession,
    pipeline: Pipeline,
    asset_ids: dict[Asset, int],
    alias_ids: dict[AssetAlias, int],
) -> None:
    asset_refs: set[tuple[int, str]] = set()
    alias_refs: set[tuple[int, str]] = set()
    condition = pipeline.condition
    if condition is not None:
        asset_refs.update((asset_ids[a], RefRole.SCHEDULE) for a in condition.iter_assets())
        alias_refs.update((alias_ids[a], RefRole.SCHEDULE) for a in condition.iter_aliases())
    asset_refs.update((asset_ids[a], RefRole.INLET) for a in pipeline.inlets)
    for outlet in pipeline.outlets:
        if isinstance(outlet, Asset):
            asset_refs.add((asset_ids[outlet], RefRole.OUTLET))
        else:
            alias_refs.add((alias_ids[outlet], RefRole.OUTLET))
    pipeline_id = pipeline.pipeline_id
    for table in (models.PipelineAssetRef, models.PipelineAliasRef):
        await session.execute(delete(table).where(table.pipeline_id == pipeline_id))
    session.add_all(
        models.PipelineAssetRef(pipeline_id=pipeline_id, asset_id=asset_id, role=role)
        for asset_id, role in asset_refs
    )
    session.add_all(
        models.PipelineAliasRef(pipeline_id=pipeline_id, alias_id=alias_id, role=role)
        for alias_id, role in alias_refs
    )
    await session.flush()
