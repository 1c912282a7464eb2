"""Ingest on the real store: commit before ack, full batches, duplicates, a database outage."""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import anyio
import psycopg
import pytest
from psycopg import sql
from sqlalchemy import URL, func, make_url, select
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from triggerer.daemon.ingest import Delivery, Ingest
from triggerer.daemon.registry import WatchedTrigger, sync_definitions
from triggerer.daemon.service import POSTGRESQL_COMMITS_IN_FLIGHT
from triggerer.loader import load_pipelines
from triggerer.store import models, session_factory
from triggerer.triggers import Ack, TriggerEvent

PIPELINES = """
from triggerer import Asset, AssetWatcher, pipeline
from watchers import FileTrigger

orders = Asset("orders", watchers=[AssetWatcher("inbox", FileTrigger({inbox!r}))])

@pipeline(schedule=orders)
def report(spark, context): ...
"""


async def _watched(sessions: async_sessionmaker[AsyncSession], tmp_path: Path) -> WatchedTrigger:
    folder = tmp_path / "pipelines"
    folder.mkdir()
    (folder / "orders.py").write_text(PIPELINES.format(inbox=str(tmp_path / "inbox")))
    loaded = load_pipelines(folder)
    assert loaded.errors == []
    async with sessions.begin() as session:
        registry = await sync_definitions(session, loaded)
    (watched,) = registry.triggers.values()
    return watched


async def _events(sessions: async_sessionmaker[AsyncSession]) -> int:
    async with sessions() as session:
        return await session.scalar(select(func.count()).select_from(models.AssetEvent)) or 0


def _delivery(watched: WatchedTrigger, n: int, ack: Callable[[str], Ack]) -> Delivery:
    key = f"orders/0/{n}"
    return watched, TriggerEvent({"n": n}, dedup_key=key, ack=ack(key))


async def test_every_event_is_committed_before_its_ack_batches_stay_full_and_duplicates_ack(
    migrated_engine: AsyncEngine, db_backend: str, tmp_path: Path
) -> None:
    sessions = session_factory(migrated_engine)
    watched = await _watched(sessions, tmp_path)
    acked: list[str] = []

    def ack(key: str) -> Ack:
        async def committed_then_acked() -> None:
            async with sessions() as session:
                stored = await session.scalar(
                    select(func.count())
                    .select_from(models.AssetEvent)
                    .where(models.AssetEvent.dedup_key == key)
                )
            assert stored == 1, f"{key} acked before its event was committed"
            acked.append(key)

        return committed_then_acked

    commits: list[set[str]] = []
    in_flight = POSTGRESQL_COMMITS_IN_FLIGHT if db_backend == "postgresql" else 1
    ingest = Ingest(sessions, commits.append, batch_size=100, commits_in_flight=in_flight)
    # 600 messages, then the first 200 again (a redelivery), all waiting before ingest starts.
    send, receive = anyio.create_memory_object_stream[Delivery](1000)
    with send:
        for n in [*range(600), *range(200)]:
            send.send_nowait(_delivery(watched, n, ack))

    with anyio.fail_after(60):
        await ingest.run(receive)

    assert sorted(acked) == sorted(f"orders/0/{n}" for n in [*range(600), *range(200)])
    assert await _events(sessions) == 600
    assert (ingest.events_recorded, ingest.duplicates) == (600, 200)
    # Full batches of 100: the last two hold only redeliveries, which queue nothing.
    assert commits == [{"report"}] * 6


def _allow_connections(server: URL, database: str, allowed: bool) -> None:
    libpq = server.set(drivername="postgresql", database="postgres")
    with psycopg.connect(libpq.render_as_string(hide_password=False), autocommit=True) as admin:
        admin.execute(
            sql.SQL("ALTER DATABASE {} ALLOW_CONNECTIONS {}").format(
                sql.Identifier(database), sql.Literal(allowed)
            )
        )
        if not allowed:
            # What a server restart does to the daemon's pooled connections.
            admin.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = %s",
                (database,),
            )


@pytest.mark.parametrize("db_backend", ["postgresql"])
async def test_database_outage_holds_every_ack_until_its_commit_and_loses_nothing(
    migrated_engine: AsyncEngine, migrated_database_url: str, tmp_path: Path
) -> None:
    sessions = session_factory(migrated_engine)
    watched = await _watched(sessions, tmp_path)
    acked: list[str] = []

    def ack(key: str) -> Ack:
        async def record() -> None:
            acked.append(key)

        return record

    url = make_url(migrated_database_url)
    assert url.database is not None
    ingest = Ingest(sessions, lambda _: None, batch_size=10, commits_in_flight=2)
    send, receive = anyio.create_memory_object_stream[Delivery](100)
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(ingest.run, receive)
        await anyio.to_thread.run_sync(_allow_connections, url, url.database, False)
        try:
            with send:
                for n in range(50):
                    await send.send(_delivery(watched, n, ack))
                # Nothing can be committed, so nothing may be acked; the window is the test.
                await anyio.sleep(2)
                assert acked == []
        finally:
            await anyio.to_thread.run_sync(_allow_connections, url, url.database, True)
        with anyio.fail_after(60):
            while len(acked) < 50:  # noqa: ASYNC110 - ingest retries on its own backoff
                await anyio.sleep(0.05)

    assert sorted(acked) == sorted(f"orders/0/{n}" for n in range(50))
    assert await _events(sessions) == 50
