"""The REST API under ``/api/v1``: the app factory, error answers, OpenAPI and its docs page.

Every route but ``/api/v1/healthz`` is behind the bearer-token check (when ``[api] tokens``
or ``[[api.principals]]`` are set), the OpenAPI document and the docs page included, and each
requires a permission of the caller's role (403 without it). Errors a user can cause answer
4xx with a ``detail`` naming the value; a store that does not answer is a 503.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import structlog
from fastapi import Depends, FastAPI, Request, status
from fastapi.exception_handlers import http_exception_handler
from fastapi.exceptions import RequestValidationError
from fastapi.openapi.docs import get_swagger_ui_html
from fastapi.responses import FileResponse, HTMLResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles
from starlette.exceptions import HTTPException

from triggerer.service.api import (
    activity,
    assets,
    audit,
    cloudevents,
    events,
    health,
    import_errors,
    pipelines,
    runs,
    watchers,
    whoami,
)
from triggerer.service.api.context import ApiContext, requires
from triggerer.service.api.event_posts import EventPosts
from triggerer.service.errors import Conflict, Forbidden, NotFound, Refused
from triggerer.service.principals import Permission
from triggerer.service.store.failures import STORE_ERRORS, is_outage

log = structlog.get_logger(__name__)

PREFIX = "/api/v1"
OPENAPI_PATH = f"{PREFIX}/openapi.json"
STATIC = Path(__file__).parent / "static"
"""The web UI: plain ES modules, the graph libraries in ``vendor/`` (``make ui``)."""
_SHOWN_INPUT_CHARS = 80


def create_app(context: ApiContext) -> FastAPI:
    """The API app serving ``context``'s daemon."""
    app = FastAPI(
        title="triggerer",
        summary="Event-driven trigger daemon for PySpark pipelines",
        version="1",
        # Served below behind the token check instead of FastAPI's open routes.
        openapi_url=None,
        docs_url=None,
        redoc_url=None,
        # The daemon reports through /metrics and its logs. FastAPI's OpenTelemetry hooks,
        # when on, check for a configured provider on every request.
        telemetry={"tracing": False, "metrics": False, "logs": False},
    )
    app.state.context = context
    app.include_router(health.open_router, prefix=PREFIX)
    for module in (
        cloudevents,  # before assets: its route takes the CloudEvents posted to /assets/events
        assets,
        pipelines,
        import_errors,
        runs,
        watchers,
        events,
        activity,
        audit,
        health,
        whoami,
    ):
        app.include_router(module.router, prefix=PREFIX)
    _add_docs(app)
    _add_ui(app)
    app.add_exception_handler(NotFound, _not_found)
    app.add_exception_handler(Refused, _refused)
    app.add_exception_handler(Conflict, _conflict)
    app.add_exception_handler(Forbidden, _forbidden)
    app.add_exception_handler(RequestValidationError, _invalid)
    app.add_exception_handler(HTTPException, _http_error)
    for error in STORE_ERRORS:
        app.add_exception_handler(error, _store_failed)
    # The hot path: posted events that succeed skip FastAPI's routing (event_posts.py).
    app.add_middleware(EventPosts, path=f"{PREFIX}/assets/events", context=context)
    return app


def _add_docs(app: FastAPI) -> None:
    guarded: Any = [Depends(requires(Permission.READ))]

    @app.get(OPENAPI_PATH, include_in_schema=False, dependencies=guarded)
    async def openapi() -> JSONResponse:
        return JSONResponse(app.openapi())

    @app.get(f"{PREFIX}/docs", include_in_schema=False, dependencies=guarded)
    async def docs() -> HTMLResponse:
        return get_swagger_ui_html(openapi_url=OPENAPI_PATH, title="triggerer API")


def _add_ui(app: FastAPI) -> None:
    """The UI at ``/``, open like any static page: it reads the API with the token it asks for."""
    app.mount("/ui", StaticFiles(directory=STATIC), name="ui")

    @app.get("/", include_in_schema=False)
    async def home() -> FileResponse:
        return FileResponse(STATIC / "index.html")


async def _not_found(_: Request, error: Exception) -> JSONResponse:
    return JSONResponse({"detail": str(error)}, status_code=status.HTTP_404_NOT_FOUND)


async def _conflict(_: Request, error: Exception) -> JSONResponse:
    return JSONResponse({"detail": str(error)}, status_code=status.HTTP_409_CONFLICT)


async def _forbidden(_: Request, error: Exception) -> JSONResponse:
    return JSONResponse({"detail": str(error)}, status_code=status.HTTP_403_FORBIDDEN)


async def _refused(_: Request, error: Exception) -> JSONResponse:
    return JSONResponse({"detail": str(error)}, status_code=status.HTTP_422_UNPROCESSABLE_CONTENT)


async def _invalid(_: Request, error: Exception) -> JSONResponse:
    if not isinstance(error, RequestValidationError):  # registered for that class only
        raise error
    detail = "; ".join(_problem(problem) for problem in error.errors())
    return JSONResponse({"detail": detail}, status_code=status.HTTP_422_UNPROCESSABLE_CONTENT)


def _problem(problem: Mapping[str, Any]) -> str:
    """One pydantic error in words, naming where it is and the value given."""
    where = ".".join(str(part) for part in problem["loc"])
    if problem["type"] == "extra_forbidden":
        return f"{where}: unknown field"
    if problem["type"] == "json_invalid":
        return f"body: not valid JSON ({problem.get('ctx', {}).get('error', 'cannot parse')})"
    if problem["type"] == "missing":
        return f"{where}: required"
    shown = repr(problem.get("input"))
    if len(shown) > _SHOWN_INPUT_CHARS:
        shown = shown[: _SHOWN_INPUT_CHARS - 1] + "…"
    return f"{where}: {problem['msg']} (got {shown})"


async def _http_error(request: Request, error: Exception) -> Response:
    if not isinstance(error, HTTPException):  # registered for that class only
        raise error
    if error.status_code == status.HTTP_400_BAD_REQUEST:
        # FastAPI's answer to a body it cannot decode (not UTF-8): bad JSON, as for any other.
        detail = f"body: not valid JSON ({error.detail})"
        return JSONResponse({"detail": detail}, status_code=status.HTTP_422_UNPROCESSABLE_CONTENT)
    return await http_exception_handler(request, error)


async def _store_failed(_: Request, error: Exception) -> JSONResponse:
    if not is_outage(error):
        raise error  # the store refused what a route wrote: a bug, answered 500
    reason = f"{type(error).__name__}: {error}".splitlines()[0]
    log.warning("api_store_unavailable", error=reason)
    return JSONResponse(
        {"detail": f"the store does not answer ({reason})"},
        status_code=status.HTTP_503_SERVICE_UNAVAILABLE,
    )
