"""Why a pipeline has or has not run, as data: what ``triggerer explain`` prints and
``GET /api/v1/pipelines/{pipeline_id}/explain`` returns.

The asset condition is read from the schedule the daemon stored with the pipeline (the JSON of
:meth:`triggerer.assets.BaseAsset.as_json`) and evaluated over the assets and aliases that have
queued events, the way the scheduler evaluates it. Under an AND's window, each asset says when
its oldest queued event expires, or which of its events expired last; a batch or a debounce
says until when it holds the run back.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

from triggerer.assets import Asset, AssetAlias, AssetAll, AssetAny, BaseAsset, lifetimes
from triggerer.service.reads import queries
from triggerer.service.reads.views import RunRow, View
from triggerer.service.store import models
from triggerer.service.store.states import ACTIVE_RUN_STATES, RefRole


class QueueState(View):
    """The queued events of one asset (or alias) of the condition."""

    name: str
    uri: str | None
    """Null for an alias."""
    alias: bool
    queued_events: int
    queued_since: dt.datetime | None
    """When the oldest of them was queued."""
    window_s: float | None = None
    """How long its events stay queued, under the windows of the condition (null: until a run
    takes them)."""
    expires_at: dt.datetime | None = None
    """When its oldest queued event leaves the queue, under a window."""
    expired_event_id: int | None = None
    """With nothing queued: its latest event, which expired under the window without a run."""
    expired_at: dt.datetime | None = None


class Explanation(View):
    pipeline_id: str
    schedule: str
    condition: Any
    """The asset condition as a tree (``{"all": [{"asset": {...}}, ...]}``); null without one."""
    condition_met: bool | None
    """Whether the condition holds over the queued events; null without one."""
    assets: list[QueueState]
    """Each asset and alias of the condition: missing (0 queued events) or queued since when."""
    paused: bool
    active: bool
    fileloc: str
    error: str | None
    error_at: dt.datetime | None
    active_runs: int
    max_active_runs: int
    next_cron_at: dt.datetime | None
    batch: dict[str, Any] | None = None
    """``{"max_events", "max_wait_s"}`` of its batching window."""
    debounce_s: float | None = None
    held_until: dt.datetime | None = None
    """While its batch or debounce holds the run back: when it starts at the latest."""
    last_run: RunRow | None
    reasons: list[str]
    """Why it runs or waits, in words."""


async def explain(session: AsyncSession, pipeline_id: str) -> Explanation:
    """Why ``pipeline_id`` has or has not run; :class:`~triggerer.service.errors.NotFound` if
    unknown."""
    pipeline = await queries.pipeline_model(session, pipeline_id)
    states = [
        *await _asset_states(session, pipeline_id),
        *await _alias_states(session, pipeline_id),
    ]
    condition = condition_of(pipeline.schedule.get("schedule"))
    if condition is not None:
        states = await _with_windows(session, pipeline_id, condition_from_tree(condition), states)
    met = None
    if condition is not None:
        met = holds(
            condition,
            {(s.name, s.uri) for s in states if s.queued_events and not s.alias},
            {s.name for s in states if s.queued_events and s.alias},
        )
    active = await session.scalar(
        select(func.count())
        .select_from(models.Run)
        .where(models.Run.pipeline_id == pipeline_id, models.Run.state.in_(ACTIVE_RUN_STATES))
    )
    last = await queries.runs(session, pipeline_id=pipeline_id, limit=1)
    explanation = Explanation(
        pipeline_id=pipeline_id,
        schedule=pipeline.schedule_text,
        condition=condition,
        condition_met=met,
        assets=states,
        paused=pipeline.paused,
        active=pipeline.is_active,
        fileloc=pipeline.fileloc,
        error=pipeline.error,
        error_at=pipeline.error_at,
        active_runs=active or 0,
        max_active_runs=pipeline.max_active_runs,
        next_cron_at=pipeline.next_cron_at,
        batch=pipeline.schedule.get("batch"),
        debounce_s=pipeline.schedule.get("debounce_s"),
        held_until=await _held_until(session, pipeline_id, pipeline.schedule),
        last_run=last[0] if last else None,
        reasons=[],
    )
    return explanation.model_copy(update={"reasons": _reasons(explanation)})


def condition_of(schedule: Any) -> Any:
    """The asset condition tree of a stored schedule, or ``None`` (cron only, manual)."""
    if not isinstance(schedule, dict):
        return None
    if schedule.keys() & {"asset", "alias", "all", "any"}:
        return schedule
    return schedule.get("assets") or schedule.get("partitioned")


def condition_from_tree(tree: Any) -> BaseAsset:
    """The asset condition of a stored condition tree (:meth:`BaseAsset.as_json`)."""
    if "asset" in tree:
        return Asset(tree["asset"]["name"], tree["asset"]["uri"])
    if "alias" in tree:
        return AssetAlias(tree["alias"]["name"])
    items = [condition_from_tree(item) for item in tree.get("all", tree.get("any"))]
    if "any" in tree:
        return AssetAny(*items)
    within = tree.get("within_s")
    return AssetAll(
        *items,
        within=None if within is None else dt.timedelta(seconds=within),
        reset=tree.get("reset"),
        reset_timezone=tree.get("reset_timezone"),
    )


def holds(condition: Any, assets: set[tuple[str, str | None]], aliases: set[str]) -> bool:
    """Whether the condition tree holds when ``assets`` (name, uri) and ``aliases`` (names)
    have queued events."""
    if "asset" in condition:
        return (condition["asset"]["name"], condition["asset"]["uri"]) in assets
    if "alias" in condition:
        return bool(condition["alias"]["name"] in aliases)
    results = (holds(item, assets, aliases) for item in condition.get("all", condition.get("any")))
    return all(results) if "all" in condition else any(results)


def _reasons(explained: Explanation) -> list[str]:
    reasons = []
    if not explained.active:
        reasons.append(f"inactive: its file {explained.fileloc} no longer defines it")
    if explained.paused:
        waiting = sum(s.queued_events for s in explained.assets)
        reasons.append(
            f"paused: no runs start; events are still queued ({waiting} now) and wait for "
            f"'triggerer pipelines unpause {explained.pipeline_id}'"
        )
    if explained.error:
        reasons.append(f"failing since {explained.error_at}: {explained.error}")
    missing = [s.name for s in explained.assets if not s.queued_events]
    for state in explained.assets:
        if state.expired_at is not None:
            reasons.append(
                f"{state.name}: its event {state.expired_event_id} expired at "
                f"{state.expired_at} (window {dt.timedelta(seconds=state.window_s or 0)})"
            )
        elif state.expires_at is not None and state.queued_events:
            reasons.append(f"{state.name}: its oldest queued event expires at {state.expires_at}")
    if explained.condition_met is False:
        reasons.append(f"waiting: no queued event of {', '.join(missing)}")
    if explained.held_until is not None and explained.condition_met:
        holding = "batch" if explained.batch is not None else "debounce"
        if explained.batch is not None and explained.debounce_s is not None:
            holding = "batch and debounce"
        reasons.append(
            f"held back by its {holding}: the run starts at {explained.held_until} at the "
            "latest (sooner if the batch fills)"
            if explained.batch is not None
            else f"held back by its debounce: the run starts at {explained.held_until} if no "
            "event comes before"
        )
    if explained.active_runs >= explained.max_active_runs:
        reasons.append(
            f"at max_active_runs ({explained.max_active_runs}): the next run starts when one ends"
        )
    elif explained.condition_met and not explained.paused and explained.active:
        reasons.append("the condition holds: the scheduler creates a run at its next pass")
    if explained.next_cron_at is not None:
        reasons.append(f"next cron tick at {explained.next_cron_at}")
    last = explained.last_run
    if last is not None and last.error and last.state in ("failed", "up_for_retry"):
        # Its first line says why: "timed out after 600 s (timeout_s), see ...", an exception.
        why = last.error.splitlines()[0]
        tries = f"try {last.try_number} of {last.max_tries}"
        reasons.append(f"last run {last.run_id} {last.state} ({tries}): {why}")
    return reasons


async def _asset_states(session: AsyncSession, pipeline_id: str) -> list[QueueState]:
    rows = await session.execute(
        select(
            models.Asset.name,
            models.Asset.uri,
            func.count(models.QueuedEvent.id),
            func.min(models.QueuedEvent.created_at),
        )
        .join(models.PipelineAssetRef, models.PipelineAssetRef.asset_id == models.Asset.id)
        .outerjoin(
            models.QueuedEvent,
            (models.QueuedEvent.asset_id == models.Asset.id)
            & (models.QueuedEvent.pipeline_id == pipeline_id),
        )
        .where(
            models.PipelineAssetRef.pipeline_id == pipeline_id,
            models.PipelineAssetRef.role == RefRole.SCHEDULE,
        )
        .group_by(models.Asset.id, models.Asset.name, models.Asset.uri)
        .order_by(models.Asset.id)
    )
    return [
        QueueState(name=name, uri=uri, alias=False, queued_events=count, queued_since=since)
        for name, uri, count, since in rows.all()
    ]


async def _alias_states(session: AsyncSession, pipeline_id: str) -> list[QueueState]:
    rows = await session.execute(
        select(
            models.AssetAlias.name,
            func.count(models.QueuedEvent.id),
            func.min(models.QueuedEvent.created_at),
        )
        .join(models.PipelineAliasRef, models.PipelineAliasRef.alias_id == models.AssetAlias.id)
        .outerjoin(models.AssetAliasAsset, models.AssetAliasAsset.alias_id == models.AssetAlias.id)
        .outerjoin(
            models.QueuedEvent,
            (models.QueuedEvent.asset_id == models.AssetAliasAsset.asset_id)
            & (models.QueuedEvent.pipeline_id == pipeline_id),
        )
        .where(
            models.PipelineAliasRef.pipeline_id == pipeline_id,
            models.PipelineAliasRef.role == RefRole.SCHEDULE,
        )
        .group_by(models.AssetAlias.id, models.AssetAlias.name)
        .order_by(models.AssetAlias.id)
    )
    return [
        QueueState(name=name, uri=None, alias=True, queued_events=count, queued_since=since)
        for name, count, since in rows.all()
    ]


async def _with_windows(
    session: AsyncSession, pipeline_id: str, condition: BaseAsset, states: list[QueueState]
) -> list[QueueState]:
    """``states`` with, for each asset under a window, when its oldest queued event expires,
    or (nothing queued) which of its events expired last without a run."""
    spans = {
        (leaf.name, leaf.uri if isinstance(leaf, Asset) else None): span
        for leaf, span in lifetimes(condition).items()
    }
    if not spans:
        return states
    now = dt.datetime.now(dt.UTC)
    updated = []
    for state in states:
        span = spans.get((state.name, state.uri))
        if span is None or state.alias:
            updated.append(state)
            continue
        latest = await _latest_unconsumed(session, pipeline_id, state, queued=state.queued_events)
        changes: dict[str, Any] = {"window_s": span.total_seconds()}
        if latest is not None:
            event_id, at = latest
            if state.queued_events:
                changes["expires_at"] = at + span
            elif at + span <= now:
                changes |= {"expired_event_id": event_id, "expired_at": at + span}
        updated.append(state.model_copy(update=changes))
    return updated


async def _latest_unconsumed(
    session: AsyncSession, pipeline_id: str, state: QueueState, *, queued: int
) -> tuple[int, dt.datetime] | None:
    """With events queued: the oldest queued event of the asset (id, timestamp); without: its
    latest event, unless a run of the pipeline consumed it."""
    event, queue = models.AssetEvent, models.QueuedEvent
    asset = select(models.Asset.id).where(
        models.Asset.name == state.name, models.Asset.uri == state.uri
    )
    if queued:
        statement = (
            select(event.id, event.timestamp)
            .join(queue, queue.event_id == event.id)
            .where(queue.pipeline_id == pipeline_id, queue.asset_id.in_(asset.scalar_subquery()))
            .order_by(event.timestamp)
            .limit(1)
        )
    else:
        consumed = select(models.RunEvent.event_id).where(
            models.RunEvent.pipeline_id == pipeline_id, models.RunEvent.event_id == event.id
        )
        statement = (
            select(event.id, event.timestamp)
            .where(event.asset_id.in_(asset.scalar_subquery()), ~consumed.exists())
            .order_by(event.id.desc())
            .limit(1)
        )
    row = (await session.execute(statement)).first()
    return None if row is None else (row[0], row[1])


async def _held_until(
    session: AsyncSession, pipeline_id: str, schedule: dict[str, Any]
) -> dt.datetime | None:
    """When the pipeline's batch or debounce lets its queued events start a run at the latest,
    counted from when they were queued (``None``: neither holds it, or nothing is queued)."""
    batch, debounce_s = schedule.get("batch"), schedule.get("debounce_s")
    if batch is None and debounce_s is None:
        return None
    queue = models.QueuedEvent
    count, oldest, newest = (
        await session.execute(
            select(func.count(), func.min(queue.created_at), func.max(queue.created_at)).where(
                queue.pipeline_id == pipeline_id
            )
        )
    ).one()
    if not count or (batch is not None and count >= batch["max_events"]):
        return None
    deadlines = []
    if batch is not None:
        deadlines.append(oldest + dt.timedelta(seconds=batch["max_wait_s"]))
    if debounce_s is not None:
        deadlines.append(newest + dt.timedelta(seconds=debounce_s))
    return min(deadlines)
