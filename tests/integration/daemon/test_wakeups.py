"""Notices over PostgreSQL LISTEN/NOTIFY and SQLite's notice rows: sent on commit only, heard by
each driver, and the listener survives its connection being killed."""

from __future__ import annotations

import contextlib
from collections.abc import AsyncIterator
from datetime import timedelta

import anyio
import pytest
from sqlalchemy import func, make_url, select, text, update
from sqlalchemy.ext.asyncio import AsyncEngine

from triggerer.service.daemon import wakeups
from triggerer.service.daemon.wakeups import listen
from triggerer.service.store import create_engine, models, session_factory
from triggerer.service.store.notices import KEPT_S, notify_queued, notify_runs, parse_queued
from triggerer.service.store.types import utcnow

postgresql_only = pytest.mark.parametrize("db_backend", ["postgresql"])


@pytest.fixture(params=["asyncpg", "psycopg"])
async def listening_engine(
    request: pytest.FixtureRequest, migrated_database_url: str
) -> AsyncIterator[AsyncEngine]:
    url = make_url(migrated_database_url).set(drivername=f"postgresql+{request.param}")
    engine = create_engine(url.render_as_string(hide_password=False))
    try:
        yield engine
    finally:
        await engine.dispose()


async def _heard(received: list[str], payload: str, send: AsyncEngine) -> None:
    """Send ``payload``'s notice until the listener has heard it (it may not listen yet)."""
    sessions = session_factory(send)
    with anyio.fail_after(20):
        while payload not in received:
            async with sessions.begin() as session:
                if payload == "runs":
                    await notify_runs(session)
                else:
                    await notify_queued(session, payload.split(" ")[1:])
            await anyio.sleep(0.05)


@contextlib.asynccontextmanager
async def listening(listener: AsyncEngine, sender: AsyncEngine) -> AsyncIterator[list[str]]:
    """The payloads ``listen`` hears in the background, from its first ``queued a b`` on."""
    received: list[str] = []
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(listen, listener, received.append)
        await _heard(received, "queued a b", sender)
        yield received
        tasks.cancel_scope.cancel()


@postgresql_only
async def test_notices_arrive_on_commit_and_never_from_a_rollback(
    listening_engine: AsyncEngine, migrated_engine: AsyncEngine
) -> None:
    async with listening(listening_engine, migrated_engine) as received:
        assert parse_queued(received[-1]) == {"a", "b"}

        async with session_factory(migrated_engine)() as session:
            await notify_queued(session, ["ghost"])
            await session.rollback()
        await _heard(received, "runs", migrated_engine)

    assert "queued ghost" not in received


@postgresql_only
async def test_listener_reconnects_after_its_connection_is_killed_and_asks_for_a_full_look(
    listening_engine: AsyncEngine, migrated_engine: AsyncEngine
) -> None:
    async with listening(listening_engine, migrated_engine) as received:
        async with migrated_engine.connect() as connection:
            killed = await connection.scalar(
                text(
                    "SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity "
                    "WHERE datname = current_database() AND query LIKE 'LISTEN%'"
                )
            )
        assert killed == 1
        # Notices sent while it was away are lost: a bare "queued" makes the scheduler look
        # at every pipeline once it listens again.
        with anyio.fail_after(20):
            while "queued" not in received:  # noqa: ASYNC110 - the listener's own reconnect
                await anyio.sleep(0.05)
        await _heard(received, "queued b", migrated_engine)

    assert parse_queued("queued") is None


sqlite_only = pytest.mark.parametrize("db_backend", ["sqlite"])


@sqlite_only
async def test_notice_rows_are_read_on_commit_and_never_from_a_rollback(
    migrated_engine: AsyncEngine,
) -> None:
    async with listening(migrated_engine, migrated_engine) as received:
        async with session_factory(migrated_engine)() as session:
            await notify_queued(session, ["ghost"])
            await session.rollback()
        await _heard(received, "runs", migrated_engine)
        # Each row is read once: the notices heard are the rows written (no more, no fewer).
        async with session_factory(migrated_engine)() as session:
            written = await session.scalar(select(func.count()).select_from(models.Notice))
        with anyio.fail_after(20):
            while len(received) < written:  # noqa: ASYNC110 - the reader polls on its own
                await anyio.sleep(0.05)
        await anyio.sleep(3 * wakeups.READ_INTERVAL_S)

    assert "queued ghost" not in received
    assert len(received) == written


@sqlite_only
async def test_notice_rows_older_than_kept_s_are_deleted(
    migrated_engine: AsyncEngine, monkeypatch: pytest.MonkeyPatch
) -> None:
    sessions = session_factory(migrated_engine)
    async with sessions.begin() as session:
        await notify_runs(session)
        await session.execute(
            update(models.Notice).values(created_at=utcnow() - timedelta(seconds=KEPT_S + 1))
        )
    async with listening(migrated_engine, migrated_engine) as received:
        assert received[0] == "runs", "a daemon starting reads the rows of the last KEPT_S"
        async with sessions() as session:
            payloads = (await session.scalars(select(models.Notice.payload))).all()

    assert "runs" not in payloads
