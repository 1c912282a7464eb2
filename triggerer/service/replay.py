"""Replaying stored events: the events of an asset in a time range queued again for the
pipelines that consume it, and the runs their conditions would start; what
``triggerer events replay`` and ``POST /api/v1/assets/{asset_id}/replay`` do.

A replay covers each event of the range once per pipeline: it queues the event again unless it
is queued for the pipeline still (then it is left as it is, to be consumed once). Each covered
event is recorded in ``replay_event`` under the key ``(pipeline_id, event_id)``, so an event is
replayed for a pipeline at most once: replaying a range twice, or a range overlapping one
replayed before, queues nothing new for what was covered. A dry run reads the same events and
predicts from the pipeline's queue as it would be, with the scheduler's own picking, without
writing anything.

The caller commits; that wakes the daemons of other processes on PostgreSQL (a ``queued``
notice); on SQLite their scheduler's sweep finds the rows within seconds. A replay (not a dry
run) is a row of the audit log, in the same transaction.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from typing import TYPE_CHECKING, Any, cast

from sqlalchemy import ColumnElement, and_, exists, func, literal, or_, select
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.ext.asyncio import AsyncSession

from triggerer.partitions import (
    PartitionKeyMapper,
    ToDaily,
    ToHourly,
    ToMonthly,
    ToQuarterly,
    ToWeekly,
    ToYearly,
)
from triggerer.schedules import Batch, PartitionedAssetTimetable
from triggerer.service import audit
from triggerer.service.errors import Conflict, NotFound, Refused
from triggerer.service.reads import queries
from triggerer.service.reads.explain import condition_from_tree, condition_of
from triggerer.service.reads.views import View
from triggerer.service.scheduling.picking import Queued, pick_run
from triggerer.service.scheduling.registry import Registry
from triggerer.service.scheduling.schedule_queries import asset_run_id, members_of_aliases
from triggerer.service.store import models
from triggerer.service.store.keys import asset_identity_key
from triggerer.service.store.notices import notify_queued
from triggerer.service.store.states import AuditAction, RefRole
from triggerer.service.store.types import utcnow
from triggerer.uri import normalize_uri

if TYPE_CHECKING:
    from triggerer.assets import BaseAsset
    from triggerer.pipelines import RunPolicy
    from triggerer.schedules import Schedule
    from triggerer.service.principals import Principal

LISTED = 1000
"""Most event ids an answer lists (of the events queued, of a run's events); counts say all."""
PREDICTED_RUNS = 100
"""Most runs a replay predicts per pipeline; ``more_runs`` says whether others would follow."""
_MAPPERS: dict[str, PartitionKeyMapper] = {
    repr(mapper): mapper
    for mapper in (ToHourly(), ToDaily(), ToWeekly(), ToMonthly(), ToQuarterly(), ToYearly())
}
"""The built-in partition key mappers by their stored text; a pipeline's own mapper is known
to the daemon alone (it is code in the pipeline's file)."""


class PredictedRun(View):
    """A run the pipeline's condition would start from its queue, in the order the scheduler
    would create them (as many at once as ``max_active_runs`` allows)."""

    run_id: str
    events: int
    event_ids: list[int]
    """Its events' ids, ascending (the first :data:`LISTED`)."""
    partition_key: str | None


class PipelineReplay(View):
    """What a replay queued (or would queue) for one pipeline."""

    pipeline_id: str
    replay_id: int | None
    """Null in a dry run."""
    events: int
    """The asset's events in the range this pipeline can consume (partitioned ones for a
    partitioned pipeline, plain ones for the others)."""
    queued: int
    """Queued again."""
    already_queued: int
    """Still queued for the pipeline: left as they are, consumed once."""
    already_replayed: int
    """Covered by an earlier replay for the pipeline: skipped."""
    event_ids: list[int]
    """The ids of the events queued again (the first :data:`LISTED`)."""
    runs: list[PredictedRun] | None
    """The runs its condition would start from its queue once the replay is queued (its
    events queued before included); null when they cannot be told outside the daemon."""
    more_runs: bool
    """More runs would follow the :data:`PREDICTED_RUNS` listed."""
    note: str | None


class SkippedPipeline(View):
    pipeline_id: str
    reason: str


class ReplayResult(View):
    """A replay of an asset's events from ``since`` (included) to ``until`` (excluded)."""

    asset_id: int
    name: str
    uri: str
    since: dt.datetime
    until: dt.datetime
    dry_run: bool
    pipelines: list[PipelineReplay]
    skipped: list[SkippedPipeline]
    """Consumers left out (paused), when no pipeline was named."""


def parse_time(option: str, text: str) -> dt.datetime:
    """An ISO date (midnight) or date and time, UTC unless it names its offset; else
    :class:`Refused` naming it."""
    try:
        moment = dt.datetime.fromisoformat(text)
    except ValueError:
        raise Refused(
            f"{option} {text!r} is not an ISO date or date and time, e.g. 2026-01-31 or "
            "2026-01-31T12:00:00+02:00"
        ) from None
    return moment.replace(tzinfo=dt.UTC) if moment.tzinfo is None else moment.astimezone(dt.UTC)


async def find_asset(session: AsyncSession, named: str) -> int:
    """The id of the one asset whose name, or else URI, is ``named``."""
    ids = list(await session.scalars(select(models.Asset.id).where(models.Asset.name == named)))
    if not ids:
        try:
            uri = normalize_uri(named)
        except ValueError:
            uri = named
        ids = list(await session.scalars(select(models.Asset.id).where(models.Asset.uri == uri)))
    if not ids:
        raise NotFound(f"no asset named {named!r}, nor with that URI (see 'assets list')")
    if len(ids) > 1:
        raise Refused(
            f"several assets are named {named!r} (ids {', '.join(map(str, sorted(ids)[:5]))}): "
            "name one by its URI"
        )
    return ids[0]


async def replay(
    session: AsyncSession,
    asset_id: int,
    *,
    since: dt.datetime,
    until: dt.datetime | None = None,
    pipeline_id: str | None = None,
    dry_run: bool = False,
    actor: Principal,
) -> ReplayResult:
    """Queue the events of ``asset_id`` stored in ``[since, until)`` (``until``: now) again for
    ``pipeline_id``, or for every consumer of the asset that is not paused, as ``actor``'s
    change; with ``dry_run``, only say what would be queued and which runs would start. The
    caller commits."""
    asset = await session.get(models.Asset, asset_id)
    if asset is None:
        raise queries.missing_asset(asset_id)
    until = utcnow() if until is None else until
    if since >= until:
        raise Refused(
            f"since {since.isoformat()} is not before until {until.isoformat()}: the range "
            "[since, until) holds no event"
        )
    pipelines, skipped = await _pipelines(session, asset, pipeline_id)
    done = [
        await _replay_for(session, asset, pipeline, since, until, dry_run=dry_run)
        for pipeline in pipelines
    ]
    if not dry_run:
        await notify_queued(session, [p.pipeline_id for p in done if p.queued])
        details = {
            "since": since.isoformat(),
            "until": until.isoformat(),
            "pipeline_id": pipeline_id,
            "queued": {p.pipeline_id: p.queued for p in done},
        }
        target = audit.asset_target(asset.uri)
        await audit.record(session, actor, AuditAction.REPLAY, target, details)
    return ReplayResult(
        asset_id=asset.id,
        name=asset.name,
        uri=asset.uri,
        since=since,
        until=until,
        dry_run=dry_run,
        pipelines=done,
        skipped=skipped,
    )


async def _pipelines(
    session: AsyncSession, asset: models.Asset, pipeline_id: str | None
) -> tuple[list[models.Pipeline], list[SkippedPipeline]]:
    """The pipelines to replay for (``pipeline_id``, or every consumer not paused), and the
    consumers left out."""
    consumers = await _consumers(session, asset.id)
    if pipeline_id is not None:
        pipeline = await queries.pipeline_model(session, pipeline_id)
        if pipeline.pipeline_id not in {c.pipeline_id for c in consumers}:
            raise Refused(
                f"pipeline {pipeline_id!r} does not consume asset {asset.name!r}: it is "
                f"scheduled on {pipeline.schedule_text}"
            )
        if not pipeline.is_active:
            raise Refused(f"pipeline {pipeline_id!r} is inactive: its file no longer defines it")
        if pipeline.paused:
            raise Conflict(
                f"pipeline {pipeline_id!r} is paused: unpause it first (a replay predicts the "
                "runs it starts, and a paused pipeline starts none)"
            )
        return [pipeline], []
    active = [c for c in consumers if c.is_active]
    if not active:
        raise Refused(f"asset {asset.name!r} has no pipeline scheduled on it (see 'assets list')")
    skipped = [
        SkippedPipeline(pipeline_id=c.pipeline_id, reason="paused") for c in active if c.paused
    ]
    return [c for c in active if not c.paused], skipped


async def _consumers(session: AsyncSession, asset_id: int) -> list[models.Pipeline]:
    """The pipelines scheduled on the asset, directly or through an alias it was added to."""
    direct = select(models.PipelineAssetRef.pipeline_id).where(
        models.PipelineAssetRef.asset_id == asset_id,
        models.PipelineAssetRef.role == RefRole.SCHEDULE,
    )
    through_alias = (
        select(models.PipelineAliasRef.pipeline_id)
        .join(
            models.AssetAliasAsset,
            models.AssetAliasAsset.alias_id == models.PipelineAliasRef.alias_id,
        )
        .where(
            models.AssetAliasAsset.asset_id == asset_id,
            models.PipelineAliasRef.role == RefRole.SCHEDULE,
        )
    )
    rows = await session.scalars(
        select(models.Pipeline)
        .where(
            or_(
                models.Pipeline.pipeline_id.in_(direct),
                models.Pipeline.pipeline_id.in_(through_alias),
            )
        )
        .order_by(models.Pipeline.pipeline_id)
    )
    return list(rows.all())


def _in_range(
    asset_id: int, since: dt.datetime, until: dt.datetime, partitioned: bool
) -> ColumnElement[bool]:
    """The asset's events in ``[since, until)`` of the kind a pipeline consumes."""
    event = models.AssetEvent
    kind = event.partition_key.is_not(None) if partitioned else event.partition_key.is_(None)
    return and_(event.asset_id == asset_id, event.timestamp >= since, event.timestamp < until, kind)


def _replayed(pipeline_id: str) -> ColumnElement[bool]:
    """Whether a replay covered the event for ``pipeline_id`` already."""
    covered = models.ReplayEvent
    return exists().where(
        covered.pipeline_id == pipeline_id, covered.event_id == models.AssetEvent.id
    )


def _queued(pipeline_id: str) -> ColumnElement[bool]:
    """Whether the event is queued for ``pipeline_id``."""
    queue = models.QueuedEvent
    return exists().where(queue.pipeline_id == pipeline_id, queue.event_id == models.AssetEvent.id)


async def _replay_for(
    session: AsyncSession,
    asset: models.Asset,
    pipeline: models.Pipeline,
    since: dt.datetime,
    until: dt.datetime,
    *,
    dry_run: bool,
) -> PipelineReplay:
    pipeline_id = pipeline.pipeline_id
    in_range = _in_range(asset.id, since, until, pipeline.partitioned)
    events = (
        await session.scalar(select(func.count()).select_from(models.AssetEvent).where(in_range))
        or 0
    )
    if dry_run:
        replay_id = None
        candidates = (
            await session.execute(
                select(
                    models.AssetEvent.id,
                    models.AssetEvent.partition_key,
                    models.AssetEvent.timestamp,
                    _queued(pipeline_id),
                )
                .where(in_range, ~_replayed(pipeline_id))
                .order_by(models.AssetEvent.id)
            )
        ).all()
        covered = len(candidates)
        new = [(event_id, key, at) for event_id, key, at, queued in candidates if not queued]
        queued_ids = [event_id for event_id, _, _ in new]
        queued = len(new)
    else:
        replay_id, covered, queued = await _record(
            session, asset, pipeline_id, in_range, since, until
        )
        queued_ids = list(
            await session.scalars(
                select(models.QueuedEvent.event_id)
                .where(models.QueuedEvent.replay_id == replay_id)
                .where(models.QueuedEvent.pipeline_id == pipeline_id)
                .order_by(models.QueuedEvent.event_id)
                .limit(LISTED)
            )
        )
        new = []
    predicted, more, note = await _predict(session, pipeline, asset.id, new)
    return PipelineReplay(
        pipeline_id=pipeline_id,
        replay_id=replay_id,
        events=events,
        queued=queued,
        already_queued=covered - queued,
        already_replayed=events - covered,
        event_ids=queued_ids[:LISTED],
        runs=predicted,
        more_runs=more,
        note=note,
    )


async def _record(
    session: AsyncSession,
    asset: models.Asset,
    pipeline_id: str,
    in_range: ColumnElement[bool],
    since: dt.datetime,
    until: dt.datetime,
) -> tuple[int, int, int]:
    """Record the replay and the events it covers, queue those not queued; the replay's id,
    how many events it covered and how many it queued."""
    replay = models.Replay(asset_id=asset.id, pipeline_id=pipeline_id, since=since, until=until)
    session.add(replay)
    await session.flush()
    insert = postgresql.insert if _dialect(session) == "postgresql" else sqlite.insert
    # A concurrent replay may cover some of the same events first: its rows stand.
    covered = await session.execute(
        insert(models.ReplayEvent)
        .from_select(
            ["pipeline_id", "event_id", "replay_id"],
            select(literal(pipeline_id), models.AssetEvent.id, literal(replay.id)).where(
                in_range, ~_replayed(pipeline_id)
            ),
        )
        .on_conflict_do_nothing()
    )
    now = utcnow()
    # In event order, so the scheduler picks them oldest first.
    queued = await session.execute(
        insert(models.QueuedEvent)
        .from_select(
            ["pipeline_id", "asset_id", "event_id", "partition_key", "created_at", "replay_id"],
            select(
                literal(pipeline_id),
                models.AssetEvent.asset_id,
                models.AssetEvent.id,
                models.AssetEvent.partition_key,
                literal(now, models.QueuedEvent.created_at.type),
                literal(replay.id),
            )
            .join(models.ReplayEvent, models.ReplayEvent.event_id == models.AssetEvent.id)
            .where(
                models.ReplayEvent.replay_id == replay.id,
                models.ReplayEvent.pipeline_id == pipeline_id,
                ~_queued(pipeline_id),
            )
            .order_by(models.AssetEvent.id),
        )
        .on_conflict_do_nothing()
    )
    return replay.id, _count(covered), _count(queued)


def _count(result: Any) -> int:
    return int(result.rowcount)


@dataclasses.dataclass(frozen=True)
class _StoredPipeline:
    """What picking reads of a pipeline, from its stored definition (the daemon has the
    pipeline's code; a process of the CLI has only the store)."""

    schedule: Schedule | None
    run_policy: RunPolicy
    max_events_per_run: int | None
    batch: Batch | None
    debounce_s: float | None


async def _predict(
    session: AsyncSession,
    pipeline: models.Pipeline,
    asset_id: int,
    new: list[tuple[int, str | None, dt.datetime]],
) -> tuple[list[PredictedRun] | None, bool, str | None]:
    """The runs the pipeline's queue (plus the ``new`` rows a dry run would queue: event id,
    partition key) would start, as the scheduler picks them; whether more would follow; and
    why they cannot be told, when they cannot."""
    stored = pipeline.schedule.get("schedule")
    tree = condition_of(stored)
    if tree is None:
        return [], False, "its schedule has no asset condition"
    condition = condition_from_tree(tree)
    schedule: Schedule = condition
    if isinstance(stored, dict) and "partitioned" in stored:
        mapper_text = stored.get("mapper")
        mapper = None if mapper_text is None else _MAPPERS.get(mapper_text)
        if mapper_text is not None and mapper is None:
            return (
                None,
                False,
                f"its partition key mapper {mapper_text} is known to the daemon only",
            )
        schedule = PartitionedAssetTimetable(assets=condition, partition_key_mapper=mapper)
    batch = pipeline.schedule.get("batch")
    picking = _StoredPipeline(
        schedule,
        cast("RunPolicy", pipeline.run_policy),
        pipeline.max_events_per_run,
        None if batch is None else Batch(**batch),
        pipeline.schedule.get("debounce_s"),
    )
    registry = await _registry(session, condition)
    members = await members_of_aliases(session, condition, registry)
    queue = models.QueuedEvent
    rows = [
        Queued(*row)
        for row in await session.execute(
            select(
                queue.id,
                queue.event_id,
                queue.asset_id,
                queue.partition_key,
                models.AssetEvent.timestamp,
                queue.created_at,
                queue.replay_id.is_not(None),
            )
            .join(models.AssetEvent, models.AssetEvent.id == queue.event_id)
            .where(queue.pipeline_id == pipeline.pipeline_id)
            .order_by(queue.id)
        )
    ]
    last = rows[-1].row_id if rows else 0
    now = utcnow()
    rows.extend(
        Queued(last + n, event_id, asset_id, key, at, now, replayed=True)
        for n, (event_id, key, at) in enumerate(new, start=1)
    )
    runs: list[PredictedRun] = []
    while True:
        pick = pick_run(picking, condition, rows, registry, members, now)
        if not pick.rows:
            problems = list(pick.problems)
            if pick.dropped and not runs:
                problems.append(
                    f"{len(pick.dropped)} queued event(s) would leave the queue at once, "
                    f"{pick.dropped[0].reason} (see docs/scheduling.md)"
                )
            return runs, False, "; ".join(problems) or None
        if len(runs) == PREDICTED_RUNS:
            return runs, True, None
        runs.append(
            PredictedRun(
                run_id=asset_run_id(pipeline.pipeline_id, pick.rows),
                events=len(pick.rows),
                event_ids=sorted(row.event_id for row in pick.rows)[:LISTED],
                partition_key=pick.partition_key,
            )
        )
        taken = {row.row_id for row in pick.rows}
        rows = [row for row in rows if row.row_id not in taken]


async def _registry(session: AsyncSession, condition: BaseAsset) -> Registry:
    """The ids of the condition's assets and aliases, as the daemon's registry holds them."""
    assets = {asset_identity_key(a.name, a.uri): a for a in condition.iter_assets()}
    asset_rows = await session.execute(
        select(models.Asset.id, models.Asset.identity_key).where(
            models.Asset.identity_key.in_(list(assets))
        )
    )
    asset_ids = {assets[key]: asset_id for asset_id, key in asset_rows.all()}
    aliases = {alias.name: alias for alias in condition.iter_aliases()}
    alias_rows = await session.execute(
        select(models.AssetAlias.id, models.AssetAlias.name).where(
            models.AssetAlias.name.in_(list(aliases))
        )
    )
    alias_ids = {aliases[name]: alias_id for alias_id, name in alias_rows.all()}
    return Registry(
        assets={asset_id: asset for asset, asset_id in asset_ids.items()},
        asset_ids=asset_ids,
        alias_ids=alias_ids,
        pipelines={},
        triggers={},
    )


def _dialect(session: AsyncSession) -> str:
    return session.get_bind().dialect.name


def summary(result: ReplayResult) -> list[str]:
    """The lines ``events replay`` prints."""
    would = "would " if result.dry_run else ""
    lines = [
        f"replay of {result.name} (asset {result.asset_id}, {result.uri}) from "
        f"{result.since.isoformat()} until {result.until.isoformat()}"
        + (" (dry run: nothing changed)" if result.dry_run else "")
    ]
    for done in result.pipelines:
        listed = f" ({_ranges(done.event_ids)})" if done.event_ids else ""
        replay = "" if done.replay_id is None else f" as replay {done.replay_id}"
        lines.append(
            f"  {done.pipeline_id}: {would}queue {done.queued} of {done.events} event(s)"
            f"{listed}{replay}; {done.already_queued} queued still, {done.already_replayed} "
            "replayed before"
        )
        if done.runs is not None:
            start = "would start" if result.dry_run else "to start"
            lines.extend(
                f"    {start} {run.run_id} ({run.events} event(s)"
                + (f", partition {run.partition_key}" if run.partition_key else "")
                + ")"
                for run in done.runs
            )
            if done.more_runs:
                lines.append(f"    and more runs after these {len(done.runs)}")
            if not done.runs:
                lines.append("    would start no run" if result.dry_run else "    starts no run")
        if done.note:
            lines.append(f"    {done.note}")
    lines.extend(f"  {skip.pipeline_id}: skipped ({skip.reason})" for skip in result.skipped)
    return lines


def _ranges(ids: list[int]) -> str:
    """Event ids as ``1-3, 7``, ``…`` at the end when the list was cut."""
    spans: list[list[int]] = []
    for event_id in ids:
        if spans and spans[-1][1] == event_id - 1:
            spans[-1][1] = event_id
        else:
            spans.append([event_id, event_id])
    text = ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)
    return "events " + text + (", …" if len(ids) == LISTED else "")
