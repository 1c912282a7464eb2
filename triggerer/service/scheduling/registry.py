"""Writing what the pipelines folder defines into the metadata database.

The folder is the source of truth for pipelines and watchers: a sync upserts assets, aliases,
triggers, watchers and pipelines, marks pipelines whose file is gone inactive, and replaces the
import errors (files that failed to load) with those of this load.
"""

from __future__ import annotations

import dataclasses
from datetime import datetime
from typing import TYPE_CHECKING, Any

import structlog
from sqlalchemy import delete, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from triggerer.assets import Asset, AssetAlias, AssetWatcher
from triggerer.crons import next_tick
from triggerer.schedules import PartitionedAssetTimetable
from triggerer.service.store import models
from triggerer.service.store.keys import import_error_key, trigger_key
from triggerer.service.store.states import RefRole, TriggerState
from triggerer.service.store.types import storable_text, utcnow
from triggerer.triggers import UnusableTrigger, check_json, load_trigger

if TYPE_CHECKING:
    from triggerer.pipelines import Pipeline
    from triggerer.service.loader import LoadedPipelines, LoadError
    from triggerer.triggers import BaseEventTrigger

log = structlog.get_logger(__name__)


@dataclasses.dataclass(frozen=True)
class WatchedTrigger:
    """One trigger instance and the assets whose watchers share it."""

    trigger_id: int
    trigger: BaseEventTrigger
    asset_ids: tuple[int, ...]
    watchers: tuple[str, ...]
    """The names of the watchers sharing it, as ``asset/watcher``, for its log lines."""


@dataclasses.dataclass(frozen=True)
class Registry:
    """The in-memory view of the synced definitions, keyed by database ids."""

    assets: dict[int, Asset]
    asset_ids: dict[Asset, int]
    alias_ids: dict[AssetAlias, int]
    pipelines: dict[str, Pipeline]
    triggers: dict[int, WatchedTrigger]


@dataclasses.dataclass
class DefinitionChanges:
    """Assets and aliases a transaction created or changed: for listeners, after its commit."""

    created_assets: list[Asset] = dataclasses.field(default_factory=list)
    created_aliases: list[AssetAlias] = dataclasses.field(default_factory=list)
    changed_assets: list[Asset] = dataclasses.field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.created_assets or self.created_aliases or self.changed_assets)


async def sync_definitions(
    session: AsyncSession, loaded: LoadedPipelines, changes: DefinitionChanges | None = None
) -> Registry:
    """Upsert everything ``loaded`` defines; the caller commits.

    ``changes``, when given, collects the assets and aliases created and the assets whose
    extra, group or watchers changed.
    """
    changes = DefinitionChanges() if changes is None else changes
    watchers_before = await _watchers_by_asset(session)
    asset_ids = {
        asset: await ensure_asset(session, asset, changes=changes)
        for asset in loaded.assets.values()
    }
    alias_ids = {alias: await ensure_alias(session, alias, changes) for alias in loaded.aliases}
    triggers = await _sync_watchers(session, loaded, asset_ids)
    watchers_after = await _watchers_by_asset(session)
    reported = set(changes.created_assets) | set(changes.changed_assets)
    changes.changed_assets.extend(
        asset
        for asset, asset_id in asset_ids.items()
        if asset not in reported and watchers_before.get(asset_id) != watchers_after.get(asset_id)
    )
    await _sync_pipelines(session, loaded.pipelines, asset_ids, alias_ids)
    await sync_import_errors(session, loaded.errors)
    return Registry(
        assets={asset_id: asset for asset, asset_id in asset_ids.items()},
        asset_ids=asset_ids,
        alias_ids=alias_ids,
        pipelines=dict(loaded.pipelines),
        triggers=triggers,
    )


async def ensure_asset(
    session: AsyncSession, asset: Asset, *, define: bool = True, changes: DefinitionChanges
) -> int:
    """The id of ``asset``, creating its row as needed (noted in ``changes``).

    With ``define`` (the pipelines folder's definition) its extra and group are written too;
    without (an outlet or alias addition that only names the asset) an existing row is kept.
    """
    row = await session.scalar(
        select(models.Asset).where(models.Asset.name == asset.name, models.Asset.uri == asset.uri)
    )
    if row is None:
        row = models.Asset(name=asset.name, uri=asset.uri, group=asset.group, extra=asset.extra)
        session.add(row)
        await session.flush()
        changes.created_assets.append(asset)
    elif define and (row.extra, row.group) != (asset.extra, asset.group):
        row.extra, row.group = asset.extra, asset.group
        changes.changed_assets.append(asset)
    return row.id


async def ensure_alias(session: AsyncSession, alias: AssetAlias, changes: DefinitionChanges) -> int:
    """The id of ``alias``, creating its row as needed (noted in ``changes``)."""
    alias_id = await session.scalar(
        select(models.AssetAlias.id).where(models.AssetAlias.name == alias.name)
    )
    if alias_id is None:
        row = models.AssetAlias(name=alias.name, group=alias.group)
        session.add(row)
        await session.flush()
        alias_id = row.id
        changes.created_aliases.append(alias)
    return alias_id


async def _watchers_by_asset(session: AsyncSession) -> dict[int, set[tuple[str, int]]]:
    """Each asset's watchers as (name, trigger id): a trigger id changes with its options."""
    watchers: dict[int, set[tuple[str, int]]] = {}
    watcher = models.AssetWatcher
    rows = await session.execute(select(watcher.asset_id, watcher.name, watcher.trigger_id))
    for asset_id, name, trigger_id in rows.all():
        watchers.setdefault(asset_id, set()).add((name, trigger_id))
    return watchers


async def _sync_watchers(
    session: AsyncSession, loaded: LoadedPipelines, asset_ids: dict[Asset, int]
) -> dict[int, WatchedTrigger]:
    instances: dict[str, BaseEventTrigger] = {}
    watching: dict[str, list[int]] = {}
    watcher_names: dict[str, list[str]] = {}
    wanted: set[tuple[int, str]] = set()
    trigger_ids: dict[str, int] = {}
    as_run: dict[str, BaseEventTrigger] = {}
    sources: dict[str, tuple[str, str]] = {}
    refused: set[str] = set()
    # In the order the assets were registered, then by name: the first watcher of a shared
    # trigger names its instance (for_watcher), and the first trigger on a source keeps it.
    in_order = sorted(
        ((asset, watcher) for asset in loaded.assets.values() for watcher in asset.watchers),
        key=lambda pair: (asset_ids[pair[0]], pair[1].name),
    )
    for asset, watcher in in_order:
        wanted.add((asset_ids[asset], watcher.name))
        try:
            runnable = _runnable(asset, watcher, as_run)
        except TriggerUnusable as error:
            log.error("watcher_unusable", watcher=watcher.name, asset=asset.name, error=str(error))
            trigger_id = await _failed_trigger(session, asset, watcher.name, str(error))
            await session.merge(
                models.AssetWatcher(
                    asset_id=asset_ids[asset], name=watcher.name, trigger_id=trigger_id
                )
            )
            continue
        key = trigger_key(runnable.classpath, runnable.kwargs)
        instances.setdefault(key, runnable.trigger)
        watching.setdefault(key, []).append(asset_ids[asset])
        watcher_names.setdefault(key, []).append(f"{asset.name}/{watcher.name}")
        if key not in trigger_ids:
            trigger_ids[key] = await _ensure_trigger(
                session, key, runnable.classpath, runnable.kwargs
            )
            described = f"watcher {watcher.name!r} of asset {asset.name!r}"
            competing = _competing(runnable.exclusive_sources, key, described, sources)
            if competing is not None:
                refused.add(key)
                log.error("watcher_refused", error=competing)
                await session.execute(
                    update(models.Trigger)
                    .where(models.Trigger.id == trigger_ids[key])
                    .values(state=TriggerState.FAILED, last_error=competing, last_error_at=utcnow())
                )
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
        trigger_ids[key]: WatchedTrigger(
            trigger_ids[key], instances[key], tuple(watching[key]), tuple(watcher_names[key])
        )
        for key in instances
        if key not in refused
    }


class TriggerUnusable(Exception):
    """A watcher's trigger cannot be identified or rebuilt: that watcher fails, no other."""


@dataclasses.dataclass(frozen=True)
class _Runnable:
    """The trigger the daemon runs for a watcher, with what its user-written methods said."""

    trigger: BaseEventTrigger
    classpath: str
    kwargs: dict[str, Any]
    exclusive_sources: tuple[str, ...]


def _runnable(
    asset: Asset, watcher: AssetWatcher, as_run: dict[str, BaseEventTrigger]
) -> _Runnable:
    """The trigger of ``watcher`` as the daemon runs it: one instance per equal trigger, bound
    to its first watcher (``as_run`` keeps them), whose ``serialize()`` is strict JSON that
    rebuilds an equal trigger."""
    if isinstance(watcher.trigger, UnusableTrigger):
        raise TriggerUnusable(watcher.trigger.error)
    try:
        shared = trigger_key(*watcher.trigger.serialize())
        if shared not in as_run:
            as_run[shared] = watcher.trigger.for_watcher(asset, watcher.name)
        trigger = as_run[shared]
        classpath, kwargs = trigger.serialize()
        check_json(kwargs, f"the kwargs of {classpath}")
        if trigger_key(*load_trigger(classpath, kwargs).serialize()) != trigger_key(
            classpath, kwargs
        ):
            raise ValueError("load_trigger(*serialize()).serialize() differs from serialize()")
        return _Runnable(trigger, classpath, kwargs, tuple(trigger.exclusive_sources()))
    # serialize(), for_watcher(), exclusive_sources() and __init__ are user code: whatever they
    # raise fails this watcher alone.
    except Exception as error:
        name = f"{type(watcher.trigger).__module__}.{type(watcher.trigger).__qualname__}"
        raise TriggerUnusable(
            f"{name} cannot be serialised and rebuilt: {type(error).__name__}: {error}"
        ) from error


async def _failed_trigger(session: AsyncSession, asset: Asset, watcher: str, error: str) -> int:
    """A trigger row in state ``failed`` that shows ``error`` for the watcher of ``asset``."""
    classpath = "<unusable>"
    key = trigger_key(classpath, {"asset": [asset.name, asset.uri], "watcher": watcher})
    trigger_id = await _ensure_trigger(session, key, classpath, {})
    await session.execute(
        update(models.Trigger)
        .where(models.Trigger.id == trigger_id)
        .values(state=TriggerState.FAILED, last_error=error, last_error_at=utcnow())
    )
    return trigger_id


def _competing(
    exclusive: tuple[str, ...], key: str, described: str, sources: dict[str, tuple[str, str]]
) -> str | None:
    """Why the trigger ``key`` may not run: an earlier, different trigger reads one of its
    ``exclusive`` sources; else ``None``, and its sources are claimed."""
    for source in exclusive:
        first_key, first = sources.get(source, (key, described))
        if first_key != key:
            return (
                f"{described} is refused: it reads {source} like {first} with different "
                "options, and each would take messages the other needs; give both assets one "
                "trigger with equal options, or read separate sources"
            )
    sources.update(dict.fromkeys(exclusive, (key, described)))
    return None


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
        row.next_cron_at = _next_cron_at(pipeline, row, now)
        # "cron": the expression next_cron_at follows, so a changed one gets a tick of its own.
        row.schedule = {
            "schedule": schedule.as_json() if schedule is not None else None,
            "cron": pipeline.cron,
            # What holds runs back beyond the condition, for the CLI's explain and replay.
            "batch": None if pipeline.batch is None else dataclasses.asdict(pipeline.batch),
            "debounce_s": pipeline.debounce_s,
            "max_backlog": pipeline.max_backlog,
        }
        row.schedule_text = str(schedule) if schedule is not None else "manual"
        row.is_active = True
        row.partitioned = isinstance(schedule, PartitionedAssetTimetable)
        row.max_active_runs = pipeline.max_active_runs
        row.run_policy = pipeline.run_policy
        row.max_events_per_run = pipeline.max_events_per_run
        row.retries = pipeline.retries
        await session.flush()
        await _sync_refs(session, pipeline, asset_ids, alias_ids)


def _next_cron_at(pipeline: Pipeline, row: models.Pipeline, now: datetime) -> datetime | None:
    """The next tick of ``pipeline``: the one ``row`` has while its cron expression is the same
    (even when overdue: it is still to run), else the first tick of the expression after now.
    A row written before the expression was recorded keeps its tick."""
    if pipeline.cron is None:
        return None
    ticks_of = (row.schedule or {}).get("cron", pipeline.cron)
    if row.next_cron_at is not None and ticks_of == pipeline.cron:
        return row.next_cron_at
    return next_tick(pipeline.cron, now)


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


async def sync_import_errors(session: AsyncSession, errors: list[LoadError]) -> None:
    """Make the ``import_error`` rows those of ``errors``, one per file (the messages of a
    file with several joined); the caller commits.

    A file that kept its error (message and line) keeps its ``error_at``. Text is made
    storable (a message or path may hold a NUL character or a lone surrogate), and the write
    is an upsert, so daemons loading one folder at once do not conflict.
    """
    rows: dict[str, dict[str, Any]] = {}
    for error in errors:
        fileloc = storable_text(error.path)
        message = storable_text(error.message)
        row = rows.get(fileloc)
        if row is None:
            rows[fileloc] = {
                "key": import_error_key(fileloc),
                "fileloc": fileloc,
                "line": error.line,
                "error": message,
                "traceback": None if error.traceback is None else storable_text(error.traceback),
            }
            continue
        row["error"] = f"{row['error']}; {message}"
        if row["line"] is None:
            row["line"] = error.line
        if row["traceback"] is None and error.traceback is not None:
            row["traceback"] = storable_text(error.traceback)
    table = models.PipelineImportError
    keys = [row["key"] for row in rows.values()]
    await session.execute(delete(table).where(table.key.not_in(keys)))
    if not rows:
        return
    known = {
        key: (line, message, error_at)
        for key, line, message, error_at in await session.execute(
            select(table.key, table.line, table.error, table.error_at).where(table.key.in_(keys))
        )
    }
    now = utcnow()
    for row in rows.values():
        before = known.get(row["key"])
        kept = before is not None and before[:2] == (row["line"], row["error"])
        row["error_at"] = before[2] if before is not None and kept else now
        row["updated_at"] = now
    dialect = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
    statement = dialect.insert(table)
    await session.execute(
        statement.on_conflict_do_update(
            index_elements=[table.key],
            set_={
                column: statement.excluded[column]
                for column in ("fileloc", "line", "error", "traceback", "error_at", "updated_at")
            },
        ),
        list(rows.values()),
    )
