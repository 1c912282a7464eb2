"""``/events/{event_id}`` and ``/dead-letters``: one event's story, and what was not stored."""

from __future__ import annotations

from fastapi import APIRouter, Depends

from triggerer.service.api.context import Context, requires
from triggerer.service.api.responses import NOT_FOUND, PROTECTED
from triggerer.service.api.schemas import EventId, Limit, Offset, Since
from triggerer.service.principals import Permission
from triggerer.service.reads import queries
from triggerer.service.reads.views import DeadLetterRow, EventDetail

router = APIRouter(
    tags=["events"], dependencies=[Depends(requires(Permission.READ))], responses=PROTECTED
)


@router.get("/events/{event_id}", responses=NOT_FOUND)
async def get_event(context: Context, event_id: EventId) -> EventDetail:
    """An event with the run that produced it, the runs that consumed it and the pipelines it
    is still queued for."""
    async with context.transaction() as session:
        return await queries.event(session, event_id)


@router.get("/dead-letters")
async def list_dead_letters(
    context: Context, since: Since = None, limit: Limit = 100, offset: Offset = 0
) -> list[DeadLetterRow]:
    """Events the store could not hold, newest first, with the reason and the payload."""
    async with context.transaction() as session:
        return await queries.dead_letters(session, since=since, limit=limit, offset=offset)
