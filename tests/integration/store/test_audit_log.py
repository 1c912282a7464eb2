"""The audit log's store, on SQLite and PostgreSQL: rows written in the caller's transaction
(gone with its rollback), in their order; read newest first with filters; pruned oldest first,
in batches; events recorded as the watchers and runs record them are no row."""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import func, select, update
from sqlalchemy.ext.asyncio import AsyncEngine

from triggerer.service import audit
from triggerer.service.events import NewEvent, record_events
from triggerer.service.principals import Principal
from triggerer.service.store import models, session_factory
from triggerer.service.store.states import AuditAction, EventSource

ALICE = Principal("cli:alice", "admin")


def entry(actor: str, action: AuditAction, target: str, n: int) -> audit.Entry:
    return audit.Entry(actor, action, target, {"n": n})


async def test_rows_are_written_in_order_and_read_newest_first_with_filters(
    migrated_engine: AsyncEngine,
) -> None:
    sessions = session_factory(migrated_engine)
    written = [
        entry("api-token-1", AuditAction.EMIT, "asset:s3://lake/orders/", 0),
        entry("api-token-2", AuditAction.EMIT, "asset:s3://lake/orders/", 1),
        entry("api-token-1", AuditAction.PAUSE, "pipeline:report", 2),
    ]
    async with sessions.begin() as session:
        await audit.record_all(session, written)
        await audit.record(session, ALICE, AuditAction.UNPAUSE, "pipeline:report", {"n": 3})

    async with sessions() as session:
        rows = await audit.entries(session)
        assert [(r.actor, r.action, r.target, r.details) for r in rows] == [
            ("cli:alice", "unpause", "pipeline:report", {"n": 3}),
            *((e.actor, e.action, e.target, e.details) for e in reversed(written)),
        ]
        assert len({row.time for row in rows[1:]}) == 1  # one statement, one time
        assert [r.details["n"] for r in await audit.entries(session, actor="api-token-1")] == [2, 0]
        picked = await audit.entries(session, action=AuditAction.EMIT, limit=1, offset=1)
        assert [r.details["n"] for r in picked] == [0]
        by_target = await audit.entries(session, target="pipeline:report")
        assert [r.details["n"] for r in by_target] == [3, 2]
        later = rows[0].time + dt.timedelta(microseconds=1)
        assert await audit.entries(session, since=later) == []
        assert len(await audit.entries(session, since=rows[0].time)) == 1
        assert len(await audit.entries(session, since=rows[1].time)) == 4


async def test_a_pipelines_changes_are_its_own_and_those_naming_it(
    migrated_engine: AsyncEngine,
) -> None:
    sessions = session_factory(migrated_engine)
    async with sessions.begin() as session:
        await audit.record_all(
            session,
            [
                audit.Entry(ALICE.name, AuditAction.PAUSE, "pipeline:report", {}),
                audit.Entry(ALICE.name, AuditAction.CANCEL, "run:r1", {"pipeline_id": "report"}),
                audit.Entry(ALICE.name, AuditAction.RERUN, "run:r2", {"pipeline_id": "reports"}),
                audit.Entry(ALICE.name, AuditAction.TRIGGER, "pipeline:reports", {}),
                audit.Entry(ALICE.name, AuditAction.EMIT, "asset:report", {"event_id": 1}),
            ],
        )
    async with sessions() as session:
        rows = await audit.entries(session, pipeline_id="report")
    assert [(row.action, row.target) for row in rows] == [
        ("cancel", "run:r1"),
        ("pause", "pipeline:report"),
    ]


async def test_a_rolled_back_change_leaves_no_row(migrated_engine: AsyncEngine) -> None:
    sessions = session_factory(migrated_engine)

    async def failing_change() -> None:
        async with sessions.begin() as session:
            await audit.record(session, ALICE, AuditAction.PAUSE, "pipeline:report", {})
            raise LookupError("the change failed after its row was written")

    with pytest.raises(LookupError):
        await failing_change()

    async with sessions() as session:
        assert await audit.entries(session) == []


async def test_prune_deletes_the_oldest_before_the_cutoff_in_batches(
    migrated_engine: AsyncEngine,
) -> None:
    sessions = session_factory(migrated_engine)
    now = dt.datetime.now(dt.UTC)
    async with sessions.begin() as session:
        await audit.record_all(
            session, [entry("cli:alice", AuditAction.TRIGGER, "pipeline:r", n) for n in range(5)]
        )
        # Ages of days 5, 4, 3, 2 and 1 ago, in the order of the rows.
        for n in range(5):
            await session.execute(
                update(models.AuditEntry)
                .where(models.AuditEntry.details["n"].as_integer() == n)
                .values(time=now - dt.timedelta(days=5 - n))
            )
    cutoff = now - dt.timedelta(days=2, hours=12)

    async with sessions.begin() as session:
        assert await audit.count_before(session, cutoff) == 3
        assert await audit.prune(session, cutoff, limit=2) == 2
    async with sessions.begin() as session:
        assert await audit.prune(session, cutoff, limit=2) == 1
        assert await audit.prune(session, cutoff, limit=2) == 0
        assert [row.details["n"] for row in await audit.entries(session)] == [4, 3]


async def test_events_recorded_as_watchers_and_runs_record_them_are_no_row(
    migrated_engine: AsyncEngine,
) -> None:
    sessions = session_factory(migrated_engine)
    async with sessions.begin() as session:
        asset = models.Asset(name="orders", uri="orders")
        session.add(asset)
        await session.flush()
        await record_events(
            session,
            [
                NewEvent(asset.id, {"payload": 1}, EventSource.TRIGGER, dedup_key="orders/0/1"),
                NewEvent(asset.id, {}, EventSource.RUN),
            ],
        )

    async with sessions() as session:
        events = await session.scalar(select(func.count()).select_from(models.AssetEvent))
        rows = await session.scalar(select(func.count()).select_from(models.AuditEntry))
        assert (events, rows) == (2, 0)
