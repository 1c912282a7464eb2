"""The API app in-process (httpx over ASGI) on a migrated database with pipelines synced."""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import AsyncIterator
from pathlib import Path

import httpx
import pytest_asyncio
from fastapi import FastAPI
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from triggerer.service.api import ApiContext, create_app
from triggerer.service.config import Settings
from triggerer.service.events import Recorded  # noqa: TC001 - a dataclass field's type, read at run time
from triggerer.service.loader import load_pipelines
from triggerer.service.scheduling.registry import Registry, sync_definitions
from triggerer.service.store import create_engine, models, session_factory

BASE_URL = "http://api/api/v1"
TOKEN = "t0ken-for-tests-only"  # noqa: S105 - a token the tests configure
SECRET = "connection-password-never-shown"  # noqa: S105 - what no response may show
VIEWER_TOKEN = "viewer-t0ken"  # noqa: S105 - tokens of the principals the tests configure
EMITTER_TOKEN = "emitter-t0ken"  # noqa: S105
OPERATOR_TOKEN = "operator-t0ken"  # noqa: S105
PRINCIPALS = [
    {"name": "dashboard", "role": "viewer", "token": VIEWER_TOKEN},
    {"name": "orders-feed", "role": "emitter", "token": EMITTER_TOKEN, "assets": ["orders*"]},
    {
        "name": "on-call",
        "role": "operator",
        "token_sha256": hashlib.sha256(OPERATOR_TOKEN.encode()).hexdigest(),
    },
]
"""Beside ``[api] tokens``, whenever the API has any: a principal of each role but admin."""

PIPELINES = """
from triggerer import (
    Asset, AssetAlias, AssetWatcher, PartitionedAssetTimetable, ToDaily, pipeline,
)
from watchers import FileTrigger

orders = Asset("orders", watchers=[AssetWatcher("orders_files", FileTrigger("{folder}"))])
customers = Asset("customers")
report = Asset("s3://lake/report")
daily = Asset("daily")
found = AssetAlias("found")

@pipeline(schedule=orders & customers, outlets=[report])
def matched(spark, context): ...

@pipeline(schedule=orders)
def count_orders(spark, context): ...

@pipeline(schedule=PartitionedAssetTimetable(assets=daily, partition_key_mapper=ToDaily()))
def by_day(spark, context): ...

@pipeline(schedule=found, outlets=[found])
def via_alias(spark, context): ...

@pipeline(schedule="@daily")
def nightly(spark, context): ...
"""


@dataclasses.dataclass
class Calls:
    """What the routes told the daemon."""

    recorded: list[Recorded] = dataclasses.field(default_factory=list)
    woken: list[set[str]] = dataclasses.field(default_factory=list)
    launcher_woken: int = 0
    cancels: int = 0


@dataclasses.dataclass
class Api:
    """An API client with the token, and what it talks to."""

    client: httpx.AsyncClient
    app: FastAPI
    context: ApiContext
    calls: Calls
    registry: Registry
    database_url: str

    @property
    def sessions(self) -> async_sessionmaker[AsyncSession]:
        return self.context.sessions

    def client_with(self, headers: dict[str, str]) -> httpx.AsyncClient:
        """A client of the same app sending ``headers`` (and no token unless among them)."""
        transport = httpx.ASGITransport(app=self.app)
        return httpx.AsyncClient(transport=transport, base_url=BASE_URL, headers=headers)

    async def trace_context(self, event_id: int) -> tuple[str | None, str | None]:
        """The ``traceparent`` and ``tracestate`` stored with an event."""
        async with self.sessions() as session:
            row = await session.execute(
                select(models.AssetEvent.traceparent, models.AssetEvent.tracestate).where(
                    models.AssetEvent.id == event_id
                )
            )
            parent, state = row.one()
            return parent, state


def api_settings(database_url: str, tmp_path: Path, tokens: tuple[str, ...]) -> Settings:
    return Settings.model_validate(
        {
            "database": {"url": database_url},
            "pipelines": {"dir": tmp_path / "pipelines"},
            "spark": {"logs_dir": tmp_path / "logs"},
            "api": {"tokens": tokens, "principals": PRINCIPALS if tokens else []},
            "connections": {"kafka_prod": {"sasl_plain_password": SECRET}},
        }
    )


def write_pipelines(tmp_path: Path) -> Path:
    folder = tmp_path / "pipelines"
    folder.mkdir(exist_ok=True)
    (tmp_path / "drop").mkdir(exist_ok=True)
    (folder / "pipelines.py").write_text(PIPELINES.replace("{folder}", str(tmp_path / "drop")))
    return folder


async def sync(sessions: async_sessionmaker[AsyncSession], tmp_path: Path) -> Registry:
    async with sessions.begin() as session:
        return await sync_definitions(session, load_pipelines(write_pipelines(tmp_path)))


def make_context(
    settings: Settings,
    sessions: async_sessionmaker[AsyncSession],
    registry: Registry,
    calls: Calls,
) -> ApiContext:
    def wake_launcher() -> None:
        calls.launcher_woken += 1

    def run_cancelled() -> None:
        calls.cancels += 1

    return ApiContext(
        settings=settings,
        sessions=sessions,
        instance_id="test-instance",
        registry=lambda: registry,
        events_recorded=calls.recorded.append,
        wake_scheduler=calls.woken.append,
        wake_launcher=wake_launcher,
        run_cancelled=run_cancelled,
    )


async def _api(
    database_url: str, tmp_path: Path, *, synced: bool, tokens: tuple[str, ...] = (TOKEN,)
) -> AsyncIterator[Api]:
    engine = create_engine(database_url)
    sessions = session_factory(engine)
    registry = await sync(sessions, tmp_path) if synced else Registry({}, {}, {}, {}, {})
    calls = Calls()
    context = make_context(api_settings(database_url, tmp_path, tokens), sessions, registry, calls)
    app = create_app(context)
    headers = {"Authorization": f"Bearer {tokens[0]}"} if tokens else {}
    try:
        async with httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url=BASE_URL, headers=headers
        ) as client:
            yield Api(client, app, context, calls, registry, database_url)
    finally:
        await engine.dispose()


@pytest_asyncio.fixture
async def api(migrated_database_url: str, tmp_path: Path) -> AsyncIterator[Api]:
    """The API on a database holding the pipelines of PIPELINES, as the daemon syncs them."""
    async for value in _api(migrated_database_url, tmp_path, synced=True):
        yield value


@pytest_asyncio.fixture
async def empty_api(migrated_database_url: str, tmp_path: Path) -> AsyncIterator[Api]:
    """The API on a migrated database with nothing in it."""
    async for value in _api(migrated_database_url, tmp_path, synced=False):
        yield value


@pytest_asyncio.fixture
async def open_api(migrated_database_url: str, tmp_path: Path) -> AsyncIterator[Api]:
    """The API without tokens."""
    async for value in _api(migrated_database_url, tmp_path, synced=True, tokens=()):
        yield value
