"""The lists' ``since``: the same rows, newest first, whether few rows are that recent (read
through the time's index first) or many, and when ids and times disagree (clocks)."""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy.ext.asyncio import AsyncEngine

from triggerer.service.reads import queries
from triggerer.service.store import models, session_factory

T0 = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
MINUTES = [0, 1, 2, 3, 9, 4, 5, 6, 7, 8]
"""The time of each row, in minutes after ``T0``, by id: the fifth is newer than those after it
(written by an instance whose clock is ahead)."""
FEW = 3


@pytest.fixture
def few_since(monkeypatch: pytest.MonkeyPatch) -> None:
    """A small threshold, so that both ways are taken with a few rows."""
    monkeypatch.setattr(queries, "FEW_SINCE", FEW)


def _expected(since_minute: int, limit: int, offset: int) -> list[int]:
    ids = [index + 1 for index, minute in enumerate(MINUTES) if minute >= since_minute]
    return sorted(ids, reverse=True)[offset : offset + limit]


@pytest.mark.usefixtures("few_since")
@pytest.mark.parametrize("since_minute", [0, 5, 7, 9, 10])
@pytest.mark.parametrize(("limit", "offset"), [(100, 0), (2, 1)])
async def test_events_since(
    migrated_engine: AsyncEngine, since_minute: int, limit: int, offset: int
) -> None:
    sessions = session_factory(migrated_engine)
    async with sessions.begin() as session:
        asset = models.Asset(name="orders", uri="orders")
        session.add(asset)
        await session.flush()
        session.add_all(
            models.AssetEvent(
                id=index + 1,
                asset_id=asset.id,
                source="rest_api",
                timestamp=T0 + dt.timedelta(minutes=minute),
            )
            for index, minute in enumerate(MINUTES)
        )
    since = T0 + dt.timedelta(minutes=since_minute)

    async with sessions() as session:
        listed = await queries.events(session, since=since, limit=limit, offset=offset)

    assert [row.id for row in listed] == _expected(since_minute, limit, offset)


@pytest.mark.usefixtures("few_since")
@pytest.mark.parametrize("since_minute", [0, 5, 7, 9, 10])
async def test_runs_since(migrated_engine: AsyncEngine, since_minute: int) -> None:
    sessions = session_factory(migrated_engine)
    async with sessions.begin() as session:
        session.add(
            models.Pipeline(
                pipeline_id="daily", fileloc="/p.py", schedule={}, schedule_text="manual"
            )
        )
        await session.flush()
        session.add_all(
            models.Run(
                id=index + 1,
                run_id=f"daily__manual__{index + 1}",
                pipeline_id="daily",
                run_type="manual",
                created_at=T0 + dt.timedelta(minutes=minute),
            )
            for index, minute in enumerate(MINUTES)
        )
    since = T0 + dt.timedelta(minutes=since_minute)

    async with sessions() as session:
        listed = await queries.runs(session, since=since)
        of_pipeline = await queries.runs(session, pipeline_id="daily", since=since, limit=2)

    expected = [f"daily__manual__{i}" for i in _expected(since_minute, 100, 0)]
    assert [row.run_id for row in listed] == expected
    assert [row.run_id for row in of_pipeline] == expected[:2]
