"""``POST /api/v1/assets/events`` answered ahead of FastAPI's routing, for the posts that
succeed.

The route is the API's hot path: clients post events one request each, thousands a second.
Through FastAPI, routing (a match against every route), dependency solving (the token check,
the context, the body) and the response's validation cost the daemon about as much CPU per
event as the group commit that stores it. This middleware serves the same route with the same
parts, without that machinery: it finds the caller by its token with
:func:`~.context.bearer_of`, parses the body as FastAPI would (``json.loads``, then
:class:`NewAssetEvent`), hands the event and the caller to the group commit, answers its
errors with the app's own exception handlers and its event as FastAPI serializes it.

A post it would answer with an error of its own (no or a wrong token, a caller whose role may
not emit, a body that is not JSON or not a valid event, a content type FastAPI reads
differently) goes on to the FastAPI route, with the body it read, and so does a CloudEvent
(its content type is not JSON, or it has ``ce-*`` headers), which only the route of
:mod:`.cloudevents` answers: so a 401, a 403 or a 422
naming the field is FastAPI's, word for word, and the OpenAPI document still comes from the
route. An emitter's post to an asset outside its globs is refused by the group commit, which
reads the asset's name and URI, as the route's is: a 403 from the app's handler.
"""

from __future__ import annotations

import json
from typing import TYPE_CHECKING, Any

from fastapi import status
from starlette.requests import Request
from starlette.responses import Response

from triggerer.service.api.context import ApiContext, bearer_of
from triggerer.service.api.schemas import NewAssetEvent
from triggerer.service.principals import Permission
from triggerer.service.trace_context import of_http_headers

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Mapping

    from starlette.types import ASGIApp, Message, Receive, Scope, Send

    Handler = Callable[[Request, Exception], Awaitable[Response]]

_JSON = "application/json"


class EventPosts:
    """Pure ASGI middleware serving ``POST {path}`` when it succeeds, passing on the rest."""

    def __init__(self, app: ASGIApp, *, path: str, context: ApiContext) -> None:
        self._app = app
        self._path = path
        self._context = context
        self._handlers: Mapping[Any, Handler] | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope["path"] != self._path or scope["method"] != "POST":
            await self._app(scope, receive, send)
            return
        authorization, content_type, cloudevent = _headers(scope)
        caller = bearer_of(self._context.keyring, authorization)
        if (
            cloudevent
            or caller is None
            or not caller.may(Permission.EMIT)
            or content_type is None
            or content_type.partition(";")[0].strip().lower() != _JSON
        ):
            await self._app(scope, receive, send)
            return
        body, more = await _body(receive)
        new = _event(body) if not more else None
        if new is None:
            await self._app(scope, _replaying(body, more, receive), send)
            return
        try:
            trace = of_http_headers(scope["headers"])
            created = await self._context.new_events.create(new, caller, trace)
        except Exception as error:
            handler = self._handler(scope, error)
            if handler is None:
                raise  # no answer of the app's own: ServerErrorMiddleware's 500, as for a route
            response = await handler(Request(scope, receive), error)
        else:
            # As FastAPI answers a route's model: pydantic's JSON of it, by alias.
            response = Response(
                created.model_dump_json(by_alias=True),
                status_code=status.HTTP_201_CREATED,
                media_type=_JSON,
            )
        await response(scope, receive, send)

    def _handler(self, scope: Scope, error: Exception) -> Handler | None:
        """The app's exception handler for ``error`` (by its class's MRO, as Starlette looks
        one up), or None."""
        if self._handlers is None:
            self._handlers = scope["app"].exception_handlers
        for kind in type(error).__mro__:
            if kind in self._handlers:
                return self._handlers[kind]
        return None


def _headers(scope: Scope) -> tuple[str | None, str | None, bool]:
    """The first ``Authorization`` and ``Content-Type`` headers, as Starlette decodes them, and
    whether there are ``ce-*`` headers (a CloudEvent in binary mode)."""
    authorization = content_type = None
    cloudevent = False
    for name, value in scope["headers"]:
        if name == b"authorization" and authorization is None:
            authorization = value.decode("latin-1")
        elif name == b"content-type" and content_type is None:
            content_type = value.decode("latin-1")
        elif name.startswith(b"ce-"):
            cloudevent = True
    return authorization, content_type, cloudevent


async def _body(receive: Receive) -> tuple[bytes, Message | None]:
    """The request's body, and the message that is not part of it (a disconnect), if any."""
    chunks: list[bytes] = []
    while True:
        message = await receive()
        if message["type"] != "http.request":
            return b"".join(chunks), message
        chunks.append(message.get("body", b""))
        if not message.get("more_body", False):
            return b"".join(chunks), None


def _event(body: bytes) -> NewAssetEvent | None:
    """The event in ``body`` as FastAPI reads it (``Request.json()``, then the model), or None
    where FastAPI would answer an error."""
    try:
        return NewAssetEvent.model_validate(json.loads(body))
    # ValueError: not JSON (JSONDecodeError), not UTF-8 (UnicodeDecodeError), not an event
    # (pydantic's ValidationError); RecursionError: JSON nested too deep for json.loads.
    except (ValueError, RecursionError):
        return None


def _replaying(body: bytes, more: Message | None, receive: Receive) -> Receive:
    """``receive`` with ``body`` (and then ``more``) given back first."""
    pending: list[Message] = [{"type": "http.request", "body": body, "more_body": False}]
    if more is not None:
        pending.append(more)

    async def replayed() -> Message:
        if pending:
            return pending.pop(0)
        return await receive()

    return replayed
