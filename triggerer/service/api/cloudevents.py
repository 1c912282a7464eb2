"""``POST /assets/events`` of a CloudEvent, on the asset the ``uri`` or ``asset_id`` query
parameter names: in structured mode (``Content-Type: application/cloudevents+json``, the body
in the JSON event format) or in binary mode (``ce-*`` headers, the body the event's data and
its ``Content-Type`` the data's), read by the HTTP binding (:data:`watchers.cloudevents.HTTP`).

Its event's ``extra`` is ``{"cloudevent": {...}, "from_rest_api": true}`` and its dedup key the
CloudEvent's (``source`` and ``id``), as a watcher's of the same CloudEvent: posted again, or
read from a broker before, it is no second event, and the answer is 200 with the event stored
before. A malformed CloudEvent is a 422 naming the attribute. As a plain post's, its event is
created by the group commit (:mod:`.group_commit`): an emitter only on the assets its globs
match (403), one audit row naming the caller for an event created (none for a copy answered
200), and the trace context of the request's ``traceparent`` header, else the CloudEvent's
``traceparent`` extension.

This is a route of its own, tried before the route of plain posts and matching only a request
that is a CloudEvent by its form (:class:`CloudEventRoute`), so that route, and its fast path
(:mod:`.event_posts`, which passes every such request on), stay as they are. It is left out
of the OpenAPI document, where the plain route's operation describes both (:data:`OPENAPI`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Any

from fastapi import APIRouter, Depends, Query, Request, status
from fastapi.responses import Response
from fastapi.routing import APIRoute
from pydantic import ValidationError
from starlette.routing import Match

from triggerer.cloudevents import SPECVERSION, STRUCTURED_JSON, MalformedCloudEvent
from triggerer.service.api.context import Caller, Context, requires
from triggerer.service.api.group_commit import AlreadyStored
from triggerer.service.api.schemas import INT4_MAX, NO_NUL, NewAssetEvent
from triggerer.service.errors import Refused
from triggerer.service.principals import Permission
from triggerer.service.store.models import NAME_LENGTH
from triggerer.service.trace_context import of_cloudevent, of_http_headers
from watchers import cloudevents

if TYPE_CHECKING:
    from starlette.types import Scope

_JSON = "application/json"


class CloudEventRoute(APIRoute):
    """A route that matches only requests that are CloudEvents by their form (a CloudEvents
    content type, or a required attribute among ``ce-*`` headers); the others go on to the
    routes after it."""

    def matches(self, scope: Scope) -> tuple[Match, Scope]:
        match, child_scope = super().matches(scope)
        if match is Match.FULL and not cloudevents.HTTP.claims(*_headers(scope)):
            return Match.NONE, {}
        return match, child_scope


router = APIRouter(
    prefix="/assets",
    route_class=CloudEventRoute,
    dependencies=[Depends(requires(Permission.EMIT))],
)

AssetIdQuery = Annotated[int | None, Query(ge=1, le=INT4_MAX)]
UriQuery = Annotated[str | None, Query(min_length=1, max_length=NAME_LENGTH, pattern=NO_NUL)]


@router.post("/events", include_in_schema=False)
async def create_cloudevent_event(
    request: Request,
    context: Context,
    caller: Caller,
    asset_id: AssetIdQuery = None,
    uri: UriQuery = None,
) -> Response:
    """An event of the CloudEvent posted (201), or the event of the same CloudEvent stored
    before (200)."""
    headers, content_type = _headers(request.scope)
    try:
        cloudevent = cloudevents.HTTP.recognise(headers, await request.body(), content_type)
    except MalformedCloudEvent as error:
        raise Refused(str(error)) from None
    if cloudevent is None:  # a CloudEvents content type, of a format not read
        raise Refused(
            f"Content-Type {content_type!r}: triggerer reads CloudEvents in JSON format "
            f"({STRUCTURED_JSON}) or in binary mode (ce-* headers)"
        )
    try:
        new = NewAssetEvent(asset_id=asset_id, uri=uri, extra={"cloudevent": cloudevent.extra})
    except ValidationError:
        raise Refused(
            "name the asset of a CloudEvent by the query parameter asset_id or uri, not both "
            "and not neither"
        ) from None
    # The request's own trace context, as a plain post's; else the CloudEvent's extension.
    trace = of_http_headers(request.scope["headers"]) or of_cloudevent(new.extra)
    try:
        created = await context.new_events.create(
            new, caller, trace, dedup_key=cloudevent.dedup_key
        )
    except AlreadyStored as stored:
        return _answer(stored.event.model_dump_json(by_alias=True), status.HTTP_200_OK)
    return _answer(created.model_dump_json(by_alias=True), status.HTTP_201_CREATED)


def _answer(body: str, status_code: int) -> Response:
    return Response(body, status_code=status_code, media_type=_JSON)


def _headers(scope: Scope) -> tuple[list[tuple[str, bytes]], str | None]:
    """A request's headers as the binding reads them (names in lower case, values as sent:
    the binding decodes them as UTF-8), and its ``Content-Type``."""
    headers = [(name.decode("latin-1"), value) for name, value in scope["headers"]]
    content_type = next(
        (value.decode("latin-1") for name, value in headers if name == "content-type"), None
    )
    return headers, content_type


def _header(name: str, description: str, schema: dict[str, Any]) -> dict[str, Any]:
    return {
        "name": name,
        "in": "header",
        "required": False,
        "description": description,
        "schema": schema,
    }


_STRING = {"type": "string", "minLength": 1}

OPENAPI: dict[str, Any] = {
    "parameters": [
        {
            "name": "asset_id",
            "in": "query",
            "required": False,
            "description": "a CloudEvent's asset, by id (or `uri`)",
            "schema": {"type": "integer", "minimum": 1, "maximum": INT4_MAX},
        },
        {
            "name": "uri",
            "in": "query",
            "required": False,
            "description": "a CloudEvent's asset, by URI (or `asset_id`)",
            "schema": {"type": "string", "minLength": 1, "maxLength": NAME_LENGTH},
        },
        _header(
            "ce-specversion",
            "binary mode: the CloudEvents version",
            {"type": "string", "enum": [SPECVERSION]},
        ),
        _header("ce-id", "binary mode: the event's id, unique for its source", _STRING),
        _header("ce-source", "binary mode: the context the event happened in", _STRING),
        _header("ce-type", "binary mode: the kind of event", _STRING),
        _header("ce-subject", "binary mode: what the event is about, in its source", _STRING),
        _header(
            "ce-time",
            "binary mode: when it happened (RFC 3339)",
            {"type": "string", "format": "date-time"},
        ),
    ],
    "requestBody": {
        "content": {
            STRUCTURED_JSON: {
                "schema": {
                    "title": "CloudEvent",
                    "description": (
                        "A CloudEvent in the JSON event format; members other than those "
                        "below are extension attributes (text, integers or booleans)"
                    ),
                    "type": "object",
                    "required": ["specversion", "id", "source", "type"],
                    "properties": {
                        "specversion": {"type": "string", "enum": [SPECVERSION]},
                        "id": _STRING,
                        "source": _STRING,
                        "type": _STRING,
                        "subject": _STRING,
                        "time": {"type": "string", "format": "date-time"},
                        "datacontenttype": _STRING,
                        "dataschema": _STRING,
                        "data": {"description": "JSON, unless datacontenttype says otherwise"},
                        "data_base64": {"type": "string", "format": "byte"},
                    },
                }
            }
        }
    },
    "responses": {
        "200": {
            "description": "a CloudEvent of the same source and id was stored before: its event",
            "content": {_JSON: {"schema": {"$ref": "#/components/schemas/CreatedEvent"}}},
        }
    },
}
"""What the OpenAPI operation of ``POST /assets/events`` says of CloudEvents (FastAPI merges it
into the plain route's)."""
