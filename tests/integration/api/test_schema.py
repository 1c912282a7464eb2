"""schemathesis against the OpenAPI document: generated requests to every operation (a bounded
number each) get no 5xx and no response that breaks the document (status, content type, body);
with a viewer's token, no change succeeds (no 2xx) and the store is as it was.

schemathesis serves an ASGI app from an event loop of its own, in a thread; the app is built in
that loop (at its lifespan start) so the database engine's connections belong to it.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import schemathesis
from hypothesis import HealthCheck, given, settings
from schemathesis import GenerationMode, Response, checks
from schemathesis.python import asgi
from schemathesis.specs.openapi.schemas import OpenApiSchema
from sqlalchemy import func, select

from tests.integration.api.conftest import (
    TOKEN,
    VIEWER_TOKEN,
    Calls,
    api_settings,
    make_context,
    sync,
)
from triggerer.service.api import create_app
from triggerer.service.api.app import OPENAPI_PATH
from triggerer.service.store import create_engine, models, session_factory
from triggerer.service.store.types import utcnow

MAX_EXAMPLES = 12
"""Generated requests per operation: a few hundred in all, some seconds a database kind."""
CHANGES = {"POST", "PATCH", "PUT", "DELETE"}
READ_ONLY_POSTS = {"/api/v1/pipelines/{pipeline_id}/simulate"}
"""A POST that changes nothing, which a viewer may make."""
CHECKS = [
    checks.not_a_server_error,
    checks.status_code_conformance,
    checks.content_type_conformance,
    checks.response_schema_conformance,
]


class _BuiltInItsLoop:
    """The API on ``database_url`` with the test pipelines, built at lifespan start."""

    def __init__(self, database_url: str, tmp_path: Path) -> None:
        self._database_url = database_url
        self._tmp_path = tmp_path
        self._app: Any = None

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
        else:
            await self._app(scope, receive, send)

    async def _lifespan(self, receive: Any, send: Any) -> None:
        await receive()  # startup
        engine = create_engine(self._database_url)
        sessions = session_factory(engine)
        registry = await sync(sessions, self._tmp_path)
        settings = api_settings(self._database_url, self._tmp_path, (TOKEN,))
        # A heartbeat that stays fresh for the whole run: /readyz answers 200, not 503.
        settings = settings.model_copy(
            update={"daemon": settings.daemon.model_copy(update={"heartbeat_interval_s": 3600})}
        )
        context = make_context(settings, sessions, registry, Calls())
        async with sessions.begin() as session:
            session.add(
                models.Instance(id=context.instance_id, hostname="h", pid=1, heartbeat_at=utcnow())
            )
        self._app = create_app(context)
        await send({"type": "lifespan.startup.complete"})
        await receive()  # shutdown
        await engine.dispose()
        await send({"type": "lifespan.shutdown.complete"})


@pytest.fixture
def api_schema(migrated_database_url: str, tmp_path: Path) -> Iterator[OpenApiSchema]:
    app = _BuiltInItsLoop(migrated_database_url, tmp_path)
    try:
        yield schemathesis.openapi.from_asgi(
            OPENAPI_PATH, app, headers={"Authorization": f"Bearer {TOKEN}"}
        )
    finally:
        asgi.shutdown_lifespans()


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_no_server_error_and_no_response_breaking_the_document(
    api_schema: OpenApiSchema, mode: GenerationMode
) -> None:
    drive(api_schema, mode, TOKEN)


@pytest.mark.parametrize("mode", [GenerationMode.POSITIVE, GenerationMode.NEGATIVE])
def test_a_viewer_gets_no_server_error_and_changes_nothing(
    api_schema: OpenApiSchema, mode: GenerationMode, migrated_database_url: str
) -> None:
    before = asyncio.run(store_state(migrated_database_url))
    refused = set()

    def changes_nothing(case: schemathesis.Case, response: Response) -> None:
        if case.method.upper() in CHANGES and case.path not in READ_ONLY_POSTS:
            assert not 200 <= response.status_code < 300, (case.method, case.path)
            if response.status_code == 403:
                refused.add((case.method.upper(), case.path))

    drive(api_schema, mode, VIEWER_TOKEN, changes_nothing)
    assert asyncio.run(store_state(migrated_database_url)) == before
    if mode is GenerationMode.POSITIVE:  # every change was tried, and refused for its role
        assert len(refused) == 9, refused


def drive(
    api_schema: OpenApiSchema,
    mode: GenerationMode,
    token: str,
    also: Callable[[schemathesis.Case, Response], None] | None = None,
) -> None:
    """Generated requests to every operation, with ``token``; ``also`` checks each answer
    further."""
    # Driven here rather than by schemathesis' pytest plugin, whose fixture-based schemas
    # do not run on pytest 9.
    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) > 25
    for operation in operations:
        has_input = operation.path_parameters or operation.query or operation.body
        if mode is GenerationMode.NEGATIVE and not has_input:
            continue  # nothing to get wrong

        @given(operation.as_strategy(generation_mode=mode))
        @settings(
            max_examples=MAX_EXAMPLES,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            database=None,
        )
        def check(case: schemathesis.Case) -> None:
            response = case.call_and_validate(
                headers={"Authorization": f"Bearer {token}"}, checks=CHECKS
            )
            if also is not None:
                also(case, response)

        check()


async def store_state(database_url: str) -> tuple[int, ...]:
    """The rows of what a change could add or remove, and the paused pipelines."""
    engine = create_engine(database_url)
    try:
        async with session_factory(engine)() as session:
            counted = [
                await session.scalar(select(func.count()).select_from(table))
                for table in (
                    models.AssetEvent,
                    models.QueuedEvent,
                    models.Run,
                    models.Replay,
                )
            ]
            paused = await session.scalar(
                select(func.count()).select_from(models.Pipeline).where(models.Pipeline.paused)
            )
        return (*(count or 0 for count in counted), paused or 0)
    finally:
        await engine.dispose()
