"""``/activity``: what happened over time, aggregated in the store for the UI's charts:
events per minute, the runs of a window with their durations, watchers' lag per minute."""

from __future__ import annotations

import datetime as dt
from typing import Annotated

from fastapi import APIRouter, Depends, Query

from triggerer.service.api.context import Context, requires
from triggerer.service.api.responses import PROTECTED
from triggerer.service.api.schemas import INT4_MAX, PIPELINE_ID, Limit, Since
from triggerer.service.principals import Permission
from triggerer.service.reads import activity
from triggerer.service.reads.activity import Window
from triggerer.service.reads.views import EventActivity, LagActivity, RunTimeline
from triggerer.service.store.states import RunState
from triggerer.service.store.types import utcnow

router = APIRouter(
    prefix="/activity",
    tags=["activity"],
    dependencies=[Depends(requires(Permission.READ))],
    responses=PROTECTED,
)

RUNS_SINCE_DEFAULT = dt.timedelta(days=1)
Top = Annotated[int, Query(ge=1, le=100, description="most series to return")]


@router.get("/events")
async def event_activity(
    context: Context,
    window: Window = "hour",
    asset_id: Annotated[int | None, Query(ge=1, le=INT4_MAX)] = None,
    top: Top = 10,
) -> EventActivity:
    """Events per minute over the last hour or day: in total (of ``asset_id`` alone when
    given) and for the ``top`` assets with the most events."""
    async with context.transaction() as session:
        return await activity.events(session, window=window, asset_id=asset_id, top=top)


@router.get("/runs")
async def run_activity(
    context: Context,
    since: Since = None,
    pipeline_id: Annotated[str | None, Query(pattern=PIPELINE_ID)] = None,
    state: RunState | None = None,
    limit: Limit = 1000,
) -> RunTimeline:
    """Runs created since ``since`` (default: a day ago), newest first, with their start, end
    and duration, and how many runs of the window are in each state."""
    async with context.transaction() as session:
        return await activity.runs(
            session,
            since=since or utcnow() - RUNS_SINCE_DEFAULT,
            pipeline_id=pipeline_id,
            state=state,
            limit=limit,
        )


@router.get("/watcherLag")
async def watcher_lag(context: Context, window: Window = "hour", top: Top = 20) -> LagActivity:
    """Watchers' lag per minute over the last hour or day (the highest sampled at the
    heartbeats of each minute), for the ``top`` watchers with the highest lag."""
    async with context.transaction() as session:
        return await activity.watcher_lag(session, window=window, top=top)
