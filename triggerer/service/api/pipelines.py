"""``/pipelines``: pipelines, pausing, their queued events, runs and explanations."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Body, Depends, Query, status

from triggerer.service import actions
from triggerer.service.api.context import Context, requires
from triggerer.service.api.responses import FORBIDDEN, INVALID, NOT_FOUND, PROTECTED
from triggerer.service.api.schemas import (
    AssetId,
    Deleted,
    Limit,
    NamePrefix,
    NewRun,
    Offset,
    PipelineId,
    PipelinePatch,
    Since,
    UtcTime,
)
from triggerer.service.errors import NotFound
from triggerer.service.principals import Permission
from triggerer.service.reads import queries
from triggerer.service.reads.explain import Explanation, explain
from triggerer.service.reads.views import PipelineRow, QueuedEventRow, RunDetail, RunRow
from triggerer.service.scheduling.simulation import SimulatedEvent, Simulation, simulate
from triggerer.service.store.states import RunState

router = APIRouter(
    prefix="/pipelines",
    tags=["pipelines"],
    dependencies=[Depends(requires(Permission.READ))],
    responses=PROTECTED,
)


@router.get("")
async def list_pipelines(
    context: Context,
    name_prefix: NamePrefix = None,
    paused: bool | None = None,
    limit: Limit = 100,
    offset: Offset = 0,
) -> list[PipelineRow]:
    """Pipelines by id, with their schedule and how far its assets are updated."""
    async with context.transaction() as session:
        return await queries.pipelines(
            session, name_prefix=name_prefix, paused=paused, limit=limit, offset=offset
        )


@router.get("/{pipeline_id}", responses=NOT_FOUND)
async def get_pipeline(context: Context, pipeline_id: PipelineId) -> PipelineRow:
    async with context.transaction() as session:
        return await queries.pipeline(session, pipeline_id)


@router.patch(
    "/{pipeline_id}",
    responses={**NOT_FOUND, **FORBIDDEN},
    dependencies=[Depends(requires(Permission.OPERATE))],
)
async def patch_pipeline(
    context: Context, pipeline_id: PipelineId, patch: PipelinePatch
) -> PipelineRow:
    """Pause (no runs start; its events are still queued, and wait) or unpause."""
    async with context.transaction() as session:
        await actions.set_paused(session, pipeline_id, patch.paused)
        row = await queries.pipeline(session, pipeline_id)
    if not patch.paused:
        context.wake_scheduler({pipeline_id})
    return row


@router.get("/{pipeline_id}/explain", responses=NOT_FOUND)
async def explain_pipeline(context: Context, pipeline_id: PipelineId) -> Explanation:
    """Why it has or has not run: each asset of its condition, queued or missing and since
    when; paused; active runs against the limit; the next cron tick; the last run."""
    async with context.transaction() as session:
        return await explain(session, pipeline_id)


@router.post("/{pipeline_id}/simulate", responses={**NOT_FOUND, **INVALID})
async def simulate_pipeline(
    context: Context,
    pipeline_id: PipelineId,
    events: Annotated[
        list[dict[str, Any]], Body(description="events: asset, at, extra?, partition_key?")
    ],
) -> Simulation:
    """The runs its schedule (condition, windows, resets, batch, debounce) starts for these
    events, with the scheduler's picking and no store: each run's time and the numbers of the
    events it takes (0-based, as given); the events that expired, that no asset of the
    schedule names, and that would still wait."""
    pipeline = context.registry().pipelines.get(pipeline_id)
    if pipeline is None:
        raise NotFound(f"pipeline {pipeline_id!r} is not loaded by this daemon: see GET /pipelines")
    fed = [SimulatedEvent.of_json(event, f"event {n}") for n, event in enumerate(events)]
    return simulate(pipeline, fed)


@router.get("/{pipeline_id}/assets/queuedEvents", responses=NOT_FOUND)
async def list_queued_events(
    context: Context, pipeline_id: PipelineId, limit: Limit = 100, offset: Offset = 0
) -> list[QueuedEventRow]:
    """The events waiting in the pipeline's queue, oldest first."""
    async with context.transaction() as session:
        return await queries.queued_events(
            session, pipeline_id=pipeline_id, limit=limit, offset=offset
        )


@router.delete(
    "/{pipeline_id}/assets/queuedEvents",
    responses={**NOT_FOUND, **FORBIDDEN},
    dependencies=[Depends(requires(Permission.OPERATE))],
)
async def delete_queued_events(
    context: Context, pipeline_id: PipelineId, before: Annotated[UtcTime | None, Query()] = None
) -> Deleted:
    """Empty the pipeline's queue (of what was queued before ``before``)."""
    async with context.transaction() as session:
        deleted = await actions.delete_queued_events(
            session, pipeline_id=pipeline_id, before=before
        )
    return Deleted(deleted=deleted)


@router.get("/{pipeline_id}/assets/{asset_id}/queuedEvents", responses=NOT_FOUND)
async def list_asset_queued_events(
    context: Context,
    pipeline_id: PipelineId,
    asset_id: AssetId,
    limit: Limit = 100,
    offset: Offset = 0,
) -> list[QueuedEventRow]:
    """The events of one asset waiting in the pipeline's queue, oldest first."""
    async with context.transaction() as session:
        return await queries.queued_events(
            session, pipeline_id=pipeline_id, asset_id=asset_id, limit=limit, offset=offset
        )


@router.delete(
    "/{pipeline_id}/assets/{asset_id}/queuedEvents",
    responses={**NOT_FOUND, **FORBIDDEN},
    dependencies=[Depends(requires(Permission.OPERATE))],
)
async def delete_asset_queued_events(
    context: Context,
    pipeline_id: PipelineId,
    asset_id: AssetId,
    before: Annotated[UtcTime | None, Query()] = None,
) -> Deleted:
    """Remove one asset's events from the pipeline's queue."""
    async with context.transaction() as session:
        deleted = await actions.delete_queued_events(
            session, pipeline_id=pipeline_id, asset_id=asset_id, before=before
        )
    return Deleted(deleted=deleted)


@router.post(
    "/{pipeline_id}/runs",
    status_code=status.HTTP_201_CREATED,
    responses={**NOT_FOUND, **FORBIDDEN},
    dependencies=[Depends(requires(Permission.OPERATE))],
)
async def trigger_run(
    context: Context, pipeline_id: PipelineId, new: NewRun | None = None
) -> RunDetail:
    """Queue a manual run (``params`` over the pipeline's defaults)."""
    async with context.transaction() as session:
        run_id = await actions.trigger_run(session, pipeline_id, new.params if new else None)
        created = await queries.run(session, run_id)
    context.wake_launcher()
    return created


@router.get("/{pipeline_id}/runs", responses=NOT_FOUND)
async def list_runs(
    context: Context,
    pipeline_id: PipelineId,
    state: RunState | None = None,
    since: Since = None,
    limit: Limit = 100,
    offset: Offset = 0,
) -> list[RunRow]:
    """The pipeline's runs, newest first."""
    async with context.transaction() as session:
        await queries.pipeline_model(session, pipeline_id)
        return await queries.runs(
            session, pipeline_id=pipeline_id, state=state, since=since, limit=limit, offset=offset
        )
