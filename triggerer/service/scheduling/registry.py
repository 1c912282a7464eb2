"""Writing what the pipelines folder defines into the metadata database.

The folder is the source of truth for pipelines and watchers: a sync upserts assets, aliases,
triggers, watchers and pipelines, marks pipelines whose file is gone inactive, and replaces the
import errors (files that failed to load) with those of this load.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Iterator
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar, cast

import structlog
from sqlalchemy import Table, and_, bindparam, delete, insert, select, update
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from triggerer.assets import Asset, AssetAlias, AssetWatcher
from triggerer.crons import next_tick
from triggerer.schedules import PartitionedAssetTimetable
from triggerer.service.store import models
from triggerer.service.store.keys import asset_identity_key, import_error_key, trigger_key
from triggerer.service.store.states import RefRole, TriggerState
from triggerer.service.store.types import storable_text, utcnow
from triggerer.triggers import UnusableTrigger, check_json, load_trigger

if TYPE_CHECKING:
    from triggerer.pipelines import Pipeline
    from triggerer.service.loader import LoadedPipelines, LoadError
    from triggerer.triggers import BaseEventTrigger

log = structlog.get_logger(__name__)

T = TypeVar("T")


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
    changed: frozenset[str] = frozenset()
    """The pipelines the sync that made it created, changed or brought back: the scheduler
    evaluates them again; the others' queues and due times stand."""


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
    """Write what ``loaded`` defines; the caller commits.

    Every table is read once and only the rows that differ are written, so a reload after a
    change to one file of ten thousand pipelines writes that file's rows alone.
    ``changes``, when given, collects the assets and aliases created and the assets whose
    extra, group or watchers changed.
    """
    changes = DefinitionChanges() if changes is None else changes
    watchers_before = await _watchers_by_asset(session)
    asset_ids = await _ensure_assets(session, list(loaded.assets.values()), changes)
    alias_ids = await _ensure_aliases(session, loaded.aliases, changes)
    triggers = await _sync_watchers(session, loaded, asset_ids, watchers_before)
    watchers_after = await _watchers_by_asset(session)
    reported = set(changes.created_assets) | set(changes.changed_assets)
    changes.changed_assets.extend(
        asset
        for asset, asset_id in asset_ids.items()
        if asset not in reported and watchers_before.get(asset_id) != watchers_after.get(asset_id)
    )
    changed = await _sync_pipelines(session, loaded.pipelines)
    await _sync_refs(session, loaded.pipelines, asset_ids, alias_ids)
    await sync_import_errors(session, loaded.errors)
    return Registry(
        assets={asset_id: asset for asset, asset_id in asset_ids.items()},
        asset_ids=asset_ids,
        alias_ids=alias_ids,
        pipelines=dict(loaded.pipelines),
        triggers=triggers,
        changed=frozenset(changed),
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


async def _ensure_assets(
    session: AsyncSession, assets: list[Asset], changes: DefinitionChanges
) -> dict[Asset, int]:
    """The ids of ``assets`` as the pipelines folder defines them: rows created, and extra and
    group written where they changed (both noted in ``changes``), the rest only read."""
    table = models.Asset
    keys = {asset_identity_key(asset.name, asset.uri): asset for asset in assets}
    known = {}
    for chunk in _chunks(list(keys)):
        rows = await session.execute(
            select(table.identity_key, table.id, table.extra, table.group).where(
                table.identity_key.in_(chunk)
            )
        )
        known.update({key: (asset_id, extra, group) for key, asset_id, extra, group in rows})
    ids, edits = {}, []
    for key, asset in keys.items():
        if key not in known:
            continue
        asset_id, extra, group = known[key]
        ids[asset] = asset_id
        if (extra, group) != (asset.extra, asset.group):
            edits.append({"id": asset_id, "extra": asset.extra, "group": asset.group})
            changes.changed_assets.append(asset)
    if edits:
        await session.execute(update(table), edits)
    new = [asset for key, asset in keys.items() if key not in known]
    if new:
        created = await session.execute(
            insert(table).returning(table.identity_key, table.id),
            [{"name": a.name, "uri": a.uri, "group": a.group, "extra": a.extra} for a in new],
        )
        created_ids = dict(created.all())
        ids.update({asset: created_ids[asset_identity_key(asset.name, asset.uri)] for asset in new})
        changes.created_assets.extend(new)
    return ids


async def _ensure_aliases(
    session: AsyncSession, aliases: set[AssetAlias], changes: DefinitionChanges
) -> dict[AssetAlias, int]:
    """The ids of ``aliases``, rows created as needed (noted in ``changes``)."""
    table = models.AssetAlias
    by_name = {alias.name: alias for alias in aliases}
    ids = {}
    for chunk in _chunks(list(by_name)):
        rows = await session.execute(select(table.name, table.id).where(table.name.in_(chunk)))
        ids.update({by_name[name]: alias_id for name, alias_id in rows})
    new = [alias for alias in aliases if alias not in ids]
    if new:
        created = await session.execute(
            insert(table).returning(table.name, table.id),
            [{"name": alias.name, "group": alias.group} for alias in new],
        )
        ids.update({by_name[name]: alias_id for name, alias_id in created})
        changes.created_aliases.extend(new)
    return ids


def _table(entity: type[models.Base]) -> Table:
    """The table of ``entity``, for Core statements run once per row of a parameter list."""
    return cast("Table", entity.__table__)


def _chunks(values: list[T], size: int = 500) -> Iterator[list[T]]:
    """``values`` in lists of at most ``size``: an ``IN`` list each database takes."""
    for start in range(0, len(values), size):
        yield values[start : start + size]


async def _watchers_by_asset(session: AsyncSession) -> dict[int, set[tuple[str, int]]]:
    """Each asset's watchers as (name, trigger id): a trigger id changes with its options."""
    watchers: dict[int, set[tuple[str, int]]] = {}
    watcher = models.AssetWatcher
    rows = await session.execute(select(watcher.asset_id, watcher.name, watcher.trigger_id))
    for asset_id, name, trigger_id in rows.all():
        watchers.setdefault(asset_id, set()).add((name, trigger_id))
    return watchers


async def _sync_watchers(
    session: AsyncSession,
    loaded: LoadedPipelines,
    asset_ids: dict[Asset, int],
    before: dict[int, set[tuple[str, int]]],
) -> dict[int, WatchedTrigger]:
    """Write each asset's watchers and their triggers; the triggers to run, by id. ``before``
    is what the asset_watcher table held (``_watchers_by_asset``)."""
    instances: dict[str, BaseEventTrigger] = {}
    watching: dict[str, list[int]] = {}
    watcher_names: dict[str, list[str]] = {}
    keys: dict[tuple[int, str], str] = {}  # (asset id, watcher name): its trigger's key
    unusable: dict[tuple[int, str], int] = {}  # the same: the id of its failed trigger row
    definitions: dict[str, tuple[str, dict[str, Any], tuple[str, ...], str]] = {}
    as_run: dict[str, BaseEventTrigger] = {}
    # In the order the assets were registered, then by name: the first watcher of a shared
    # trigger names its instance (for_watcher), and the first trigger on a source keeps it.
    in_order = sorted(
        ((asset, watcher) for asset in loaded.assets.values() for watcher in asset.watchers),
        key=lambda pair: (asset_ids[pair[0]], pair[1].name),
    )
    for asset, watcher in in_order:
        try:
            runnable = _runnable(asset, watcher, as_run)
        except TriggerUnusable as error:
            log.error("watcher_unusable", watcher=watcher.name, asset=asset.name, error=str(error))
            trigger_id = await _failed_trigger(session, asset, watcher.name, str(error))
            unusable[asset_ids[asset], watcher.name] = trigger_id
            continue
        key = trigger_key(runnable.classpath, runnable.kwargs)
        instances.setdefault(key, runnable.trigger)
        watching.setdefault(key, []).append(asset_ids[asset])
        watcher_names.setdefault(key, []).append(f"{asset.name}/{watcher.name}")
        described = f"watcher {watcher.name!r} of asset {asset.name!r}"
        definitions.setdefault(
            key, (runnable.classpath, runnable.kwargs, runnable.exclusive_sources, described)
        )
        keys[asset_ids[asset], watcher.name] = key
    trigger_ids = await _ensure_triggers(session, definitions)
    refused = await _refuse_competing(session, definitions, trigger_ids)
    wanted = unusable | {place: trigger_ids[key] for place, key in keys.items()}
    await _write_watchers(session, wanted, before)
    return {
        trigger_ids[key]: WatchedTrigger(
            trigger_ids[key], instances[key], tuple(watching[key]), tuple(watcher_names[key])
        )
        for key in instances
        if key not in refused
    }


async def _ensure_triggers(
    session: AsyncSession, definitions: dict[str, tuple[str, dict[str, Any], Any, Any]]
) -> dict[str, int]:
    """The id of each trigger of ``definitions`` (by key), rows created as needed."""
    table = models.Trigger
    ids: dict[str, int] = {}
    for chunk in _chunks(list(definitions)):
        rows = await session.execute(select(table.key, table.id).where(table.key.in_(chunk)))
        ids.update(rows.all())
    new = [key for key in definitions if key not in ids]
    if new:
        created = await session.execute(
            insert(table).returning(table.key, table.id),
            [
                {"key": key, "classpath": definitions[key][0], "kwargs": definitions[key][1]}
                for key in new
            ],
        )
        ids.update(created.all())
    return ids


async def _refuse_competing(
    session: AsyncSession,
    definitions: dict[str, tuple[str, dict[str, Any], tuple[str, ...], str]],
    trigger_ids: dict[str, int],
) -> set[str]:
    """The keys of the triggers refused because an earlier, different trigger reads one of
    their exclusive sources; their rows are marked failed with the reason."""
    sources: dict[str, tuple[str, str]] = {}
    refused = set()
    for key, (_classpath, _kwargs, exclusive, described) in definitions.items():
        competing = _competing(exclusive, key, described, sources)
        if competing is None:
            continue
        refused.add(key)
        log.error("watcher_refused", error=competing)
        await session.execute(
            update(models.Trigger)
            .where(models.Trigger.id == trigger_ids[key])
            .values(state=TriggerState.FAILED, last_error=competing, last_error_at=utcnow())
        )
    return refused


async def _write_watchers(
    session: AsyncSession,
    wanted: dict[tuple[int, str], int],
    before: dict[int, set[tuple[str, int]]],
) -> None:
    """Make the asset_watcher rows ``wanted`` (``(asset id, name)`` to trigger id), writing
    only those that differ from ``before``."""
    table = _table(models.AssetWatcher)
    had = {
        (asset_id, name): trigger_id
        for asset_id, watchers in before.items()
        for name, trigger_id in watchers
    }
    gone = [{"a": asset_id, "n": name} for asset_id, name in had if (asset_id, name) not in wanted]
    moved = [
        {"a": place[0], "n": place[1], "t": trigger_id}
        for place, trigger_id in wanted.items()
        if place in had and had[place] != trigger_id
    ]
    new = [
        {"asset_id": place[0], "name": place[1], "trigger_id": trigger_id}
        for place, trigger_id in wanted.items()
        if place not in had
    ]
    at_place = and_(table.c.asset_id == bindparam("a"), table.c.name == bindparam("n"))
    if gone:
        await session.execute(table.delete().where(at_place), gone)
    if moved:
        await session.execute(
            table.update().where(at_place).values(trigger_id=bindparam("t")), moved
        )
    if new:
        await session.execute(table.insert(), new)


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
    [trigger_id] = (await _ensure_triggers(session, {key: (classpath, {}, (), "")})).values()
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


_DEFINED = (
    "fileloc",
    "schedule",
    "schedule_text",
    "is_active",
    "partitioned",
    "max_active_runs",
    "run_policy",
    "max_events_per_run",
    "retries",
)
"""The pipeline columns its definition writes (``next_cron_at`` follows from ``schedule``)."""


async def _sync_pipelines(session: AsyncSession, pipelines: dict[str, Pipeline]) -> set[str]:
    """Write the pipeline rows that differ from their definitions, and mark those whose
    definition is gone inactive; the ids of the pipelines created, changed or brought back."""
    table = models.Pipeline
    columns = [getattr(table, name) for name in ("pipeline_id", "next_cron_at", *_DEFINED)]
    stored = {row.pipeline_id: row for row in await session.execute(select(*columns))}
    gone = [id_ for id_, row in stored.items() if row.is_active and id_ not in pipelines]
    for chunk in _chunks(gone):
        await session.execute(
            update(table).where(table.pipeline_id.in_(chunk)).values(is_active=False)
        )
    now = utcnow()
    created, edits = [], []
    for pipeline_id, pipeline in pipelines.items():
        values = _defined_values(pipeline)
        row = stored.get(pipeline_id)
        if row is None:
            created.append(
                {"pipeline_id": pipeline_id, "paused": False, **values}
                | {"next_cron_at": _next_cron_at(pipeline, None, None, now)}
            )
            continue
        values["next_cron_at"] = _next_cron_at(
            pipeline, (row.schedule or {}).get("cron", pipeline.cron), row.next_cron_at, now
        )
        if any(getattr(row, name) != value for name, value in values.items()):
            edits.append({"pipeline_id": pipeline_id, **values})
    if created:
        await session.execute(insert(table), created)
    if edits:
        await session.execute(update(table), edits)
    return {row["pipeline_id"] for row in created + edits}


def _defined_values(pipeline: Pipeline) -> dict[str, Any]:
    """The values of the :data:`_DEFINED` columns of ``pipeline``'s row, as stored."""
    schedule = pipeline.schedule
    return {
        "fileloc": str(pipeline.fileloc),
        # "cron": the expression next_cron_at follows, so a changed one gets a tick of its own.
        # Through JSON, as the column gives it back: tuples compare to lists then.
        "schedule": json.loads(
            json.dumps(
                {
                    "schedule": schedule.as_json() if schedule is not None else None,
                    "cron": pipeline.cron,
                    # What holds runs back beyond the condition, for explain and replay.
                    "batch": None if pipeline.batch is None else dataclasses.asdict(pipeline.batch),
                    "debounce_s": pipeline.debounce_s,
                    "max_backlog": pipeline.max_backlog,
                }
            )
        ),
        "schedule_text": str(schedule) if schedule is not None else "manual",
        "is_active": True,
        "partitioned": isinstance(schedule, PartitionedAssetTimetable),
        "max_active_runs": pipeline.max_active_runs,
        "run_policy": pipeline.run_policy,
        "max_events_per_run": pipeline.max_events_per_run,
        "retries": pipeline.retries,
    }


def _next_cron_at(
    pipeline: Pipeline, ticks_of: str | None, stored: datetime | None, now: datetime
) -> datetime | None:
    """The next tick of ``pipeline``: the ``stored`` one while the expression it was computed
    for (``ticks_of``) is the same (even when overdue: it is still to run), else the first tick
    of the expression after now. A row written before the expression was recorded keeps its
    tick."""
    if pipeline.cron is None:
        return None
    if stored is not None and ticks_of == pipeline.cron:
        return stored
    return next_tick(pipeline.cron, now)


async def _sync_refs(
    session: AsyncSession,
    pipelines: dict[str, Pipeline],
    asset_ids: dict[Asset, int],
    alias_ids: dict[AssetAlias, int],
) -> None:
    """Make the pipelines' asset and alias references those their definitions name, writing
    only the rows that differ. Rows of pipelines not loaded stay, as their pipeline rows do."""
    asset_refs: set[tuple[str, int, str]] = set()
    alias_refs: set[tuple[str, int, str]] = set()
    for pipeline_id, pipeline in pipelines.items():
        condition = pipeline.condition
        if condition is not None:
            asset_refs.update(
                (pipeline_id, asset_ids[a], RefRole.SCHEDULE) for a in condition.iter_assets()
            )
            alias_refs.update(
                (pipeline_id, alias_ids[a], RefRole.SCHEDULE) for a in condition.iter_aliases()
            )
        for inlet in pipeline.inlets:
            if isinstance(inlet, Asset):
                asset_refs.add((pipeline_id, asset_ids[inlet], RefRole.INLET))
            else:
                alias_refs.add((pipeline_id, alias_ids[inlet], RefRole.INLET))
        for outlet in pipeline.outlets:
            if isinstance(outlet, Asset):
                asset_refs.add((pipeline_id, asset_ids[outlet], RefRole.OUTLET))
            else:
                alias_refs.add((pipeline_id, alias_ids[outlet], RefRole.OUTLET))
    await _write_refs(session, _table(models.PipelineAssetRef), "asset_id", asset_refs, pipelines)
    await _write_refs(session, _table(models.PipelineAliasRef), "alias_id", alias_refs, pipelines)


async def _write_refs(
    session: AsyncSession,
    table: Table,
    column: str,
    wanted: set[tuple[str, int, str]],
    pipelines: dict[str, Pipeline],
) -> None:
    stored = {
        (pipeline_id, ref_id, role)
        for pipeline_id, ref_id, role in await session.execute(
            select(table.c.pipeline_id, table.c[column], table.c.role)
        )
    }
    gone = [
        {"p": ref[0], "r": ref[1], "o": ref[2]} for ref in stored - wanted if ref[0] in pipelines
    ]
    if gone:
        await session.execute(
            table.delete().where(
                table.c.pipeline_id == bindparam("p"),
                table.c[column] == bindparam("r"),
                table.c.role == bindparam("o"),
            ),
            gone,
        )
    new = [{"pipeline_id": p, column: r, "role": o} for p, r, o in wanted - stored]
    if new:
        await session.execute(table.insert(), new)


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
