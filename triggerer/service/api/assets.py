"""``/assets``: assets, aliases, events (listed and created), the queued events of an asset,
and replaying its stored events."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Query, Request, status

from triggerer.service import actions, replay
from triggerer.service.api import cloudevents
from triggerer.service.api.context import Caller, Context, requires
from triggerer.service.api.responses import CONFLICT, FORBIDDEN, NOT_FOUND, PROTECTED
from triggerer.service.api.schemas import (
    INT4_MAX,
    AssetId,
    CreatedEvent,
    Deleted,
    Limit,
    NamePrefix,
    NewAssetEvent,
    Offset,
    ReplayRequest,
    Since,
    UtcTime,
)
from triggerer.service.principals import Permission
from triggerer.service.reads import queries
from triggerer.service.reads.views import AliasRow, AssetRow, EventRow, QueuedEventRow
from triggerer.service.store.states import EventSource
from triggerer.service.trace_context import of_http_headers

router = APIRouter(
    prefix="/assets",
    tags=["assets"],
    dependencies=[Depends(requires(Permission.READ))],
    responses=PROTECTED,
)


@router.get("")
async def list_assets(
    context: Context, name_prefix: NamePrefix = None, limit: Limit = 100, offset: Offset = 0
) -> list[AssetRow]:
    """Assets by id, with the pipelines consuming and producing them and their watchers."""
    async with context.transaction() as session:
        return await queries.assets(session, name_prefix=name_prefix, limit=limit, offset=offset)


@router.get("/aliases")
async def list_aliases(context: Context, limit: Limit = 100, offset: Offset = 0) -> list[AliasRow]:
    """Asset aliases, with the assets added through them."""
    async with context.transaction() as session:
        return await queries.aliases(session, limit=limit, offset=offset)


@router.get("/events")
async def list_events(
    context: Context,
    asset_id: Annotated[int | None, Query(ge=1, le=INT4_MAX)] = None,
    source: Annotated[EventSource | None, Query()] = None,
    since: Since = None,
    limit: Limit = 100,
    offset: Offset = 0,
) -> list[EventRow]:
    """Events, newest first."""
    async with context.transaction() as session:
        return await queries.events(
            session,
            asset_id=asset_id,
            source=source,
            since=since,
            limit=limit,
            offset=offset,
        )


@router.post(
    "/events",
    status_code=status.HTTP_201_CREATED,
    responses={**NOT_FOUND, **FORBIDDEN},
    dependencies=[Depends(requires(Permission.EMIT))],
    openapi_extra=cloudevents.OPENAPI,
)
async def create_event(
    context: Context, caller: Caller, new: NewAssetEvent, request: Request
) -> CreatedEvent:
    """Create an event (``extra`` gains ``"from_rest_api": true``) and queue it for the
    pipelines scheduled on its asset; the scheduler looks at them at once. A partition key the
    partition mapper of a consumer cannot map is refused. An emitter may create events only
    of the assets its globs match (403 for the others). A W3C ``traceparent`` header (and
    ``tracestate``) is kept with the event; an invalid one is ignored.

    A CloudEvent is posted to the asset named by the query parameter `asset_id` or `uri`: in
    structured mode with `Content-Type: application/cloudevents+json`, or in binary mode with
    its attributes as `ce-*` headers (percent-encoded) and the body its data (answered by
    :mod:`~triggerer.service.api.cloudevents`). Its event's extra is `{"cloudevent": {...},
    "from_rest_api": true}` and its dedup key the CloudEvent's `source` and `id`: the same
    CloudEvent posted again, or read by a watcher of the asset before, is no second event (200,
    the event stored before). A malformed CloudEvent is a 422 naming the attribute. Its trace
    context is the request's ``traceparent`` header, else the CloudEvent's ``traceparent``
    extension."""
    trace = of_http_headers(request.scope["headers"])
    return await context.new_events.create(new, caller, trace)


@router.get("/{asset_id}", responses=NOT_FOUND)
async def get_asset(context: Context, asset_id: AssetId) -> AssetRow:
    async with context.transaction() as session:
        return await queries.asset(session, asset_id)


@router.get("/{asset_id}/queuedEvents", responses=NOT_FOUND)
async def list_queued_events(
    context: Context, asset_id: AssetId, limit: Limit = 100, offset: Offset = 0
) -> list[QueuedEventRow]:
    """The events of the asset waiting in pipelines' queues, oldest first."""
    async with context.transaction() as session:
        return await queries.queued_events(session, asset_id=asset_id, limit=limit, offset=offset)


@router.delete(
    "/{asset_id}/queuedEvents",
    responses={**NOT_FOUND, **FORBIDDEN},
    dependencies=[Depends(requires(Permission.OPERATE))],
)
async def delete_queued_events(
    context: Context,
    caller: Caller,
    asset_id: AssetId,
    before: Annotated[UtcTime | None, Query()] = None,
) -> Deleted:
    """Remove the asset's events from every pipeline's queue (those queued before ``before``);
    the events themselves are kept."""
    async with context.transaction() as session:
        deleted = await actions.delete_queued_events(
            session, actor=caller, asset_id=asset_id, before=before
        )
    return Deleted(deleted=deleted)


@router.post(
    "/{asset_id}/replay",
    responses={**NOT_FOUND, **CONFLICT, **FORBIDDEN},
    dependencies=[Depends(requires(Permission.OPERATE))],
)
async def replay_events(
    context: Context, caller: Caller, asset_id: AssetId, asked: ReplayRequest
) -> replay.ReplayResult:
    """Queue the asset's events stored in ``[since, until)`` again for ``pipeline_id``, or every
    consumer not paused, so their conditions see them again; the scheduler looks at once. An
    event is replayed for a pipeline at most once: an event queued still, or covered by an
    earlier replay, is not queued again. With ``dry_run``, nothing changes: the answer says
    what would be queued and which runs would start. A pipeline that does not consume the
    asset, or ``since`` not before ``until``, is a 422; a paused pipeline a 409."""
    async with context.transaction() as session:
        result = await replay.replay(
            session,
            asset_id,
            since=asked.since,
            until=asked.until,
            pipeline_id=asked.pipeline_id,
            dry_run=asked.dry_run,
            actor=caller,
        )
    if not result.dry_run:
        context.wake_scheduler({done.pipeline_id for done in result.pipelines if done.queued})
    return result
