"""Running the daemon in-process for end-to-end tests, and reading what it stored."""

from __future__ import annotations

import textwrap
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import anyio
from sqlalchemy import select
from sqlalchemy.ext.asyncio import AsyncSession

from triggerer.config import Settings
from triggerer.daemon.service import serve
from triggerer.store import create_engine, models, session_factory

T = TypeVar("T")


def write_pipelines(folder: Path, source: str, name: str = "pipelines.py") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / name
    path.write_text(textwrap.dedent(source))
    return path


def daemon_settings(tmp_path: Path, database_url: str, spark_remote: str) -> Settings:
    return Settings.model_validate(
        {
            "database": {"url": database_url},
            "pipelines": {"dir": tmp_path / "pipelines", "reload_interval_s": 0.2},
            "spark": {"mode": "connect", "remote": spark_remote, "logs_dir": tmp_path / "logs"},
            "daemon": {"heartbeat_interval_s": 0.5, "shutdown_grace_s": 30},
        }
    )


@asynccontextmanager
async def running_daemon(settings: Settings) -> AsyncIterator[None]:
    """The daemon runs in the background of the ``async with`` body, then shuts down."""
    stop = anyio.Event()
    async with anyio.create_task_group() as group:
        await group.start(partial(serve, settings, shutdown_trigger=stop.wait))
        try:
            yield
        finally:
            stop.set()


async def query(database_url: str, work: Callable[[AsyncSession], Awaitable[T]]) -> T:
    engine = create_engine(database_url)
    try:
        async with session_factory(engine)() as session:
            return await work(session)
    finally:
        await engine.dispose()


async def wait_for(
    database_url: str,
    work: Callable[[AsyncSession], Awaitable[T]],
    done: Callable[[T], bool],
    *,
    timeout_s: float = 120.0,
) -> T:
    """Poll ``work`` until ``done(result)``; fail after ``timeout_s``."""
    with anyio.fail_after(timeout_s):
        while True:
            result = await query(database_url, work)
            if done(result):
                return result
            await anyio.sleep(0.2)


async def runs(session: AsyncSession) -> list[models.Run]:
    return list((await session.scalars(select(models.Run).order_by(models.Run.id))).all())


async def events_of(session: AsyncSession, name: str) -> list[models.AssetEvent]:
    rows = await session.scalars(
        select(models.AssetEvent)
        .join(models.Asset, models.Asset.id == models.AssetEvent.asset_id)
        .where(models.Asset.name == name)
        .order_by(models.AssetEvent.id)
    )
    return list(rows.all())


async def consumed(session: AsyncSession) -> dict[str, list[int]]:
    rows = await session.execute(
        select(models.Run.run_id, models.RunEvent.event_id)
        .join(models.RunEvent, models.RunEvent.run_pk == models.Run.id)
        .order_by(models.RunEvent.event_id)
    )
    result: dict[str, list[int]] = {}
    for run_id, event_id in rows.all():
        result.setdefault(run_id, []).append(event_id)
    return result


def states(all_runs: list[models.Run]) -> dict[str, Any]:
    return {run.run_id: run.state for run in all_runs}
