"""``/runs``: runs across pipelines, one run with the events it consumed, and its log;
cancelling a run, and running a finished one again."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, status
from fastapi.responses import PlainTextResponse

from triggerer.service import actions
from triggerer.service.api.context import Context, requires
from triggerer.service.api.responses import CONFLICT, FORBIDDEN, NOT_FOUND, PROTECTED, as_json
from triggerer.service.api.schemas import PIPELINE_ID, Limit, Offset, RunId, Since
from triggerer.service.principals import Permission
from triggerer.service.reads import queries
from triggerer.service.reads.views import RunDetail, RunRow
from triggerer.service.runs import stored_logs as run_logs
from triggerer.service.store.states import RunState

router = APIRouter(
    prefix="/runs",
    tags=["runs"],
    dependencies=[Depends(requires(Permission.READ))],
    responses=PROTECTED,
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


@router.post(
    "/{run_id}/cancel",
    responses={**NOT_FOUND, **CONFLICT, **FORBIDDEN},
    dependencies=[Depends(requires(Permission.OPERATE))],
)
async def cancel_run(context: Context, run_id: RunId) -> RunDetail:
    """Cancel a queued, running or up_for_retry run: one not running is ``cancelled`` at once; a
    running one is ``cancelling`` until the daemon running it has stopped its process group
    (within a second or so), then ``cancelled``. Its events are not queued again, it records
    no outlet events, and retries do not apply. A finished run is a 409."""
    async with context.transaction() as session:
        state = await actions.cancel_run(session, run_id)
        cancelled = await queries.run(session, run_id)
    if state == RunState.CANCELLING:
        context.run_cancelled()
    return cancelled


@router.post(
    "/{run_id}/rerun",
    status_code=status.HTTP_201_CREATED,
    responses={**NOT_FOUND, **CONFLICT, **FORBIDDEN},
    dependencies=[Depends(requires(Permission.OPERATE))],
)
async def rerun(context: Context, run_id: RunId) -> RunDetail:
    """Queue a re-run of a finished run (success, failed or cancelled): a new run of its
    pipeline consuming the same events, with its params, its ``rerun_of`` naming the run. A
    run not finished is a 409."""
    async with context.transaction() as session:
        new_run_id = await actions.rerun(session, run_id)
        created = await queries.run(session, new_run_id)
    context.wake_launcher()
    return created


EMPTY_HEADER = "Triggerer-Log-Empty"
"""The header of an empty log's answer saying why it is empty: a :class:`run_logs.Empty`."""
REASON_HEADER = "Triggerer-Log-Empty-Reason"
"""The header of an empty log's answer saying why in a sentence."""


@router.get(
    "/{run_id}/logs",
    response_class=PlainTextResponse,
    responses={
        **as_json({**PROTECTED, **NOT_FOUND}),
        200: {
            "content": {"text/plain": {"schema": {"type": "string"}}},
            "headers": {
                EMPTY_HEADER: {
                    "description": "Only when the log is empty: why",
                    "schema": {"type": "string", "enum": list(run_logs.Empty)},
                },
                REASON_HEADER: {
                    "description": "Only when the log is empty: why, in a sentence",
                    "schema": {"type": "string"},
                },
            },
        },
    },
)
async def get_run_log(context: Context, run_id: RunId) -> PlainTextResponse:
    """The log of the run's latest try, as text, from the store (whichever daemon ran it); a
    part the size cap cut is one line saying so. An empty log comes with the
    ``Triggerer-Log-Empty`` header saying why (``not_started``, ``cancelled_before_start``,
    ``no_output_yet``, ``no_output``, ``not_kept``) and ``Triggerer-Log-Empty-Reason`` saying it
    in a sentence."""
    async with context.transaction() as session:
        found = await run_logs.read(session, run_id)
    headers = {}
    if found.empty is not None and found.reason is not None:
        headers = {EMPTY_HEADER: found.empty.value, REASON_HEADER: found.reason}
    return PlainTextResponse(found.text, headers=headers)
