"""``/runs``: runs across pipelines, one run with the events it consumed, and its log."""

from __future__ import annotations

from typing import Annotated

import anyio
from fastapi import APIRouter, Depends, Query
from fastapi.responses import PlainTextResponse

from triggerer.service import queries
from triggerer.service.api.context import Context, authorized
from triggerer.service.api.responses import NOT_FOUND, PROTECTED, as_json
from triggerer.service.api.schemas import PIPELINE_ID, Limit, Offset, RunId, Since
from triggerer.service.queries import NotFound
from triggerer.service.store.models import RunState
from triggerer.service.views import RunDetail, RunRow

router = APIRouter(
    prefix="/runs", tags=["runs"], dependencies=[Depends(authorized)], responses=PROTECTED
)


@router.get("")
async def list_runs(
    context: Context,
    pipeline_id: Annotated[str | None, Query(pattern=PIPELINE_ID)] = None,
    state: RunState | None = None,
    since: Since = None,
    limit: Limit = 100,
    offset: Offset = 0,
) -> list[RunRow]:
    """Runs, newest first."""
    async with context.transaction() as session:
        return await queries.runs(
            session, pipeline_id=pipeline_id, state=state, since=since, limit=limit, offset=offset
        )


@router.get("/{run_id}", responses=NOT_FOUND)
async def get_run(context: Context, run_id: RunId) -> RunDetail:
    """A run with its params and the events it consumed."""
    async with context.transaction() as session:
        return await queries.run(session, run_id)


@router.get(
    "/{run_id}/logs",
    response_class=PlainTextResponse,
    responses={
        **as_json({**PROTECTED, **NOT_FOUND}),
        200: {"content": {"text/plain": {"schema": {"type": "string"}}}},
    },
)
async def get_run_log(context: Context, run_id: RunId) -> PlainTextResponse:
    """The log of the run's latest try, as text."""
    async with context.transaction() as session:
        log_path = (await queries.run_model(session, run_id)).log_path
    path = anyio.Path(log_path) if log_path else None
    if path is None or not await path.is_file():
        raise NotFound(f"run {run_id!r} has no log yet")
    return PlainTextResponse(await path.read_text(errors="replace"))
