"""The metadata schema on SQLite and PostgreSQL: migrations and the invariants it enforces."""

from __future__ import annotations

import asyncio
import datetime as dt
import sys
from asyncio.subprocess import PIPE
from typing import Any
from zoneinfo import ZoneInfo

import pytest
from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.runtime.migration import MigrationContext
from sqlalchemy import Connection, column, delete, func, insert, inspect, select, table
from sqlalchemy.exc import IntegrityError, StatementError
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession

from triggerer.service.store import (
    create_engine,
    current_revision,
    head_revision,
    session_factory,
    upgrade,
)
from triggerer.service.store.keys import asset_identity_key, trigger_key
from triggerer.service.store.migrate import alembic_config
from triggerer.service.store.models import (
    NAME_LENGTH,
    Asset,
    AssetEvent,
    AssetWatcher,
    AuditEntry,
    Base,
    Pipeline,
    PipelineAssetRef,
    QueuedEvent,
    Run,
    RunEvent,
    RunLogChunk,
    Trigger,
)


async def _table_names(url: str) -> set[str]:
    engine = create_engine(url)
    try:
        async with engine.connect() as conn:
            return await conn.run_sync(lambda sync: set(inspect(sync).get_table_names()))
    finally:
        await engine.dispose()


def _diff_to_models(connection: Connection) -> list[Any]:
    context = MigrationContext.configure(connection, opts={"compare_type": True})
    return list(compare_metadata(context, Base.metadata))


async def _add(session: AsyncSession, *rows: Base) -> None:
    session.add_all(rows)
    await session.commit()


async def _old_event(session: AsyncSession, asset_id: int) -> int:
    """An event inserted naming its columns of the first revision (the mapped class has columns
    added since, such as its trace context); its id."""
    event_id = await session.scalar(
        insert(AssetEvent).values(asset_id=asset_id, source="manual").returning(AssetEvent.id)
    )
    assert event_id is not None
    return event_id


def _pipeline(pipeline_id: str) -> Pipeline:
    return Pipeline(
        pipeline_id=pipeline_id,
        fileloc=f"/pipelines/{pipeline_id}.py",
        schedule={"kind": "asset"},
        schedule_text="orders",
    )


def _run(run_id: str, pipeline_id: str, **columns: Any) -> Run:
    return Run(run_id=run_id, pipeline_id=pipeline_id, run_type="asset", **columns)


async def test_upgrade_from_empty_creates_every_table(database_url: str) -> None:
    assert await current_revision(database_url) is None

    await upgrade(database_url)

    assert await current_revision(database_url) == head_revision()
    assert await _table_names(database_url) == set(Base.metadata.tables) | {"alembic_version"}


async def test_upgrade_twice_is_a_noop(database_url: str) -> None:
    await upgrade(database_url)
    engine = create_engine(database_url)
    try:
        async with session_factory(engine)() as session:
            await _add(session, Asset(name="orders", uri="s3://bucket/orders"))

        await upgrade(database_url)

        async with session_factory(engine)() as session:
            assert await session.scalar(select(func.count()).select_from(Asset)) == 1
    finally:
        await engine.dispose()
    assert await current_revision(database_url) == head_revision()


UPGRADE_IN_A_PROCESS = (
    "import asyncio, sys; from triggerer.service.store import upgrade; "
    "asyncio.run(upgrade(sys.argv[1]))"
)


@pytest.mark.parametrize("db_backend", ["postgresql"])
async def test_concurrent_upgrades_from_several_processes_are_serialised(
    database_url: str,
) -> None:
    processes = [
        await asyncio.create_subprocess_exec(
            sys.executable, "-c", UPGRADE_IN_A_PROCESS, database_url, stderr=PIPE
        )
        for _ in range(3)
    ]
    results = [await process.communicate() for process in processes]

    assert [process.returncode for process in processes] == [0, 0, 0], results
    assert await current_revision(database_url) == head_revision()


def _downgrade(connection: Connection, revision: str) -> None:
    config = alembic_config()
    config.attributes["connection"] = connection
    command.downgrade(config, revision)


def _queue_shape(connection: Connection) -> tuple[set[str | None], set[str | None]]:
    inspector = inspect(connection)
    foreign_keys = {key["name"] for key in inspector.get_foreign_keys("queued_event")}
    indexes = {index["name"] for index in inspector.get_indexes("queued_event")}
    return foreign_keys, indexes


async def test_queue_migration_keeps_queued_rows_both_ways(database_url: str) -> None:
    await upgrade(database_url, "0001")
    engine = create_engine(database_url)
    try:
        async with session_factory(engine)() as session:
            asset = Asset(name="orders", uri="orders")
            await _add(session, asset)
            # Core, naming its columns: the mapped class has columns revision 0001 lacks.
            pipeline = _pipeline("report")
            await session.execute(
                insert(Pipeline).values(
                    pipeline_id=pipeline.pipeline_id,
                    fileloc=pipeline.fileloc,
                    schedule=pipeline.schedule,
                    schedule_text=pipeline.schedule_text,
                )
            )
            event_id = await _old_event(session, asset.id)
            await session.execute(
                insert(QueuedEvent).values(
                    pipeline_id="report", asset_id=asset.id, event_id=event_id
                )
            )
            await session.commit()

        await upgrade(database_url)
        async with engine.connect() as conn:
            foreign_keys, indexes = await conn.run_sync(_queue_shape)
            assert "fk_queued_event_asset_id_asset" not in foreign_keys
            assert "ix_queued_event_asset_id" not in indexes
            assert await conn.scalar(select(func.count()).select_from(QueuedEvent)) == 1

        async with engine.connect() as conn:
            await conn.run_sync(_downgrade, "0001")
        async with engine.connect() as conn:
            foreign_keys, indexes = await conn.run_sync(_queue_shape)
            assert "fk_queued_event_asset_id_asset" in foreign_keys
            assert "ix_queued_event_asset_id" in indexes
            assert await conn.scalar(select(func.count()).select_from(QueuedEvent)) == 1
    finally:
        await engine.dispose()


async def test_a_stored_last_poll_becomes_the_last_event_and_stays_on_downgrade(
    database_url: str,
) -> None:
    """Until revision 0006 ``last_poll_at`` was the time of the watcher's last event."""
    polled = dt.datetime(2026, 11, 25, 8, 30, tzinfo=dt.UTC)
    await upgrade(database_url, "0005")
    engine = create_engine(database_url)
    try:
        async with engine.begin() as conn:
            # Core, naming its columns: the mapped class has a column revision 0005 lacks.
            await conn.execute(
                insert(Trigger).values(
                    classpath="x.Y", kwargs={}, key="k" * 64, last_poll_at=polled
                )
            )

        await upgrade(database_url)
        async with engine.connect() as conn:
            stored = (await conn.execute(select(Trigger.last_poll_at, Trigger.last_event_at))).one()
            assert tuple(stored) == (polled, polled)
            await conn.run_sync(_downgrade, "0005")
        async with engine.connect() as conn:
            assert await conn.scalar(select(Trigger.last_poll_at)) == polled
    finally:
        await engine.dispose()


async def test_cancelled_runs_and_reruns_go_with_a_downgrade(database_url: str) -> None:
    """Revision 0008 adds the cancelled states and re-runs; before it, neither can be stored."""
    await upgrade(database_url, "0007")
    engine = create_engine(database_url)
    try:
        async with session_factory(engine)() as session:
            asset = Asset(name="orders", uri="orders")
            await _add(session, asset)
            # Core, naming its columns: the mapped classes have columns revision 0007 lacks.
            event_id = await _old_event(session, asset.id)
            await session.execute(
                insert(Pipeline).values(
                    pipeline_id="report", fileloc="/p.py", schedule={}, schedule_text="orders"
                )
            )
            first = await session.scalar(
                insert(Run)
                .values(run_id="r1", pipeline_id="report", run_type="asset", state="success")
                .returning(Run.id)
            )
            links_0007 = table(
                "run_event", column("run_pk"), column("event_id"), column("pipeline_id")
            )
            await session.execute(
                insert(links_0007).values(run_pk=first, event_id=event_id, pipeline_id="report")
            )
            await session.commit()

        await upgrade(database_url)
        async with session_factory(engine)() as session:
            again = _run("r2", "report", state="cancelled", rerun_of="r1")
            await _add(session, again)
            await _add(
                session,
                RunEvent(run_pk=again.id, event_id=event_id, pipeline_id="report", rerun=True),
            )
        async with engine.connect() as conn:
            await conn.run_sync(_downgrade, "0007")
        async with engine.connect() as conn:
            links = await conn.execute(select(RunEvent.run_pk, RunEvent.event_id))
            assert links.all() == [(first, event_id)]
            runs = await conn.execute(select(Run.run_id, Run.state, Run.error).order_by(Run.id))
            assert runs.all() == [("r1", "success", None), ("r2", "failed", "cancelled")]
    finally:
        await engine.dispose()


async def test_a_runs_log_chunks_go_with_the_run_and_with_a_downgrade(database_url: str) -> None:
    """Revision 0015 keeps runs' logs in the store; deleting a run deletes its log, and a
    downgrade the table (an older build reads the files)."""
    await upgrade(database_url)
    engine = create_engine(database_url)
    try:
        async with session_factory(engine)() as session:
            await _add(session, _pipeline("report"))
            gone, kept = _run("r1", "report"), _run("r2", "report")
            await _add(session, gone, kept)
            await _add(
                session,
                *(
                    RunLogChunk(run_pk=run.id, try_number=1, seq=seq, position=seq, data=b"x")
                    for run in (gone, kept)
                    for seq in range(3)
                ),
                RunLogChunk(run_pk=kept.id, try_number=2, seq=0, position=0, data=b"\x00\xff"),
            )
            await session.execute(delete(Run).where(Run.id == gone.id))
            await session.commit()
            left = await session.execute(
                select(RunLogChunk.run_pk, RunLogChunk.try_number, RunLogChunk.data)
            )
            assert sorted(tuple(row) for row in left.all()) == [
                (kept.id, 1, b"x"),
                (kept.id, 1, b"x"),
                (kept.id, 1, b"x"),
                (kept.id, 2, b"\x00\xff"),  # bytes as the run wrote them, NUL included
            ]
        async with engine.connect() as conn:
            await conn.run_sync(_downgrade, "0014")
        assert "run_log_chunk" not in await _table_names(database_url)
        assert await current_revision(database_url) == "0014"
    finally:
        await engine.dispose()


async def test_the_audit_log_holds_known_actions_and_goes_with_a_downgrade(
    database_url: str,
) -> None:
    """Revision 0020 adds the audit log: a row per change, its action one of the known ones;
    a downgrade drops it (an older build writes none)."""
    await upgrade(database_url, "0019")
    assert "audit" not in await _table_names(database_url)
    await upgrade(database_url)
    engine = create_engine(database_url)
    try:
        async with session_factory(engine)() as session:
            at = dt.datetime(2026, 12, 8, 9, 30, tzinfo=dt.UTC)
            entry = AuditEntry(
                time=at,
                actor="cli:alice",
                action="replay",
                target="asset:s3://lake/orders/",
                details={"since": "2026-12-01T00:00:00+00:00", "queued": {"report": 3}},
            )
            await _add(session, entry)
            stored = (await session.execute(select(AuditEntry.time, AuditEntry.details))).one()
            assert tuple(stored) == (
                at,
                {"since": "2026-12-01T00:00:00+00:00", "queued": {"report": 3}},
            )
            session.add(
                AuditEntry(actor="cli:alice", action="explode", target="database", details={})
            )
            with pytest.raises(IntegrityError):
                await session.commit()
        async with engine.connect() as conn:
            await conn.run_sync(_downgrade, "0019")
        assert "audit" not in await _table_names(database_url)
        assert await current_revision(database_url) == "0019"
    finally:
        await engine.dispose()


async def test_migration_head_matches_models(migrated_engine: AsyncEngine) -> None:
    async with migrated_engine.connect() as conn:
        assert await conn.run_sync(_diff_to_models) == []


async def test_asset_identity_is_name_and_uri_up_to_their_longest(
    migrated_engine: AsyncEngine,
) -> None:
    longest_name, longest_uri = "n" * NAME_LENGTH, "s3://bucket/" + "k" * (NAME_LENGTH - 12)
    sessions = session_factory(migrated_engine)
    async with sessions() as session:
        await _add(
            session,
            Asset(name=longest_name, uri=longest_uri),
            Asset(name=longest_name, uri="s3://bucket/other"),
            Asset(name="other", uri=longest_uri),
        )
        stored = await session.scalar(select(Asset).where(Asset.uri == longest_uri).limit(1))
        assert stored is not None
        assert stored.identity_key == asset_identity_key(stored.name, stored.uri)

        session.add(Asset(name=longest_name, uri=longest_uri, extra={"differs": True}))
        with pytest.raises(IntegrityError):
            await session.commit()


async def test_dedup_key_is_unique_per_asset_and_null_keys_never_conflict(
    migrated_engine: AsyncEngine,
) -> None:
    sessions = session_factory(migrated_engine)
    async with sessions() as session:
        orders, customers = Asset(name="orders", uri="o"), Asset(name="customers", uri="c")
        await _add(session, orders, customers)
        await _add(
            session,
            AssetEvent(asset_id=orders.id, source="trigger", dedup_key="queue/m-1"),
            AssetEvent(asset_id=customers.id, source="trigger", dedup_key="queue/m-1"),
            *(AssetEvent(asset_id=orders.id, source="rest_api") for _ in range(3)),
        )

        session.add(AssetEvent(asset_id=orders.id, source="trigger", dedup_key="queue/m-1"))
        with pytest.raises(IntegrityError):
            await session.commit()
        await session.rollback()

        assert await session.scalar(select(func.count()).select_from(AssetEvent)) == 5


async def test_run_without_logical_date_and_run_id_unique(migrated_engine: AsyncEngine) -> None:
    sessions = session_factory(migrated_engine)
    async with sessions() as session:
        await _add(session, _pipeline("report"))
        await _add(session, _run("asset__1", "report", logical_date=None, params={"k": [1, 2]}))

        stored = (await session.execute(select(Run.logical_date, Run.state, Run.params))).one()
        assert tuple(stored) == (None, "queued", {"k": [1, 2]})

        session.add(_run("asset__1", "report"))
        with pytest.raises(IntegrityError):
            await session.commit()


async def test_queue_rows_reference_existing_events(migrated_engine: AsyncEngine) -> None:
    sessions = session_factory(migrated_engine)
    async with sessions() as session:
        asset = Asset(name="orders", uri="orders")
        await _add(session, asset, _pipeline("report"))
        event = AssetEvent(asset_id=asset.id, source="manual")
        await _add(session, event)
        # A rollback expires loaded objects, and reloading them is I/O: keep plain values.
        asset_id, event_id = asset.id, event.id
        await _add(session, QueuedEvent(pipeline_id="report", asset_id=asset_id, event_id=event_id))

        session.add(QueuedEvent(pipeline_id="report", asset_id=asset_id, event_id=event_id + 1))
        with pytest.raises(IntegrityError):
            await session.commit()
        await session.rollback()

        session.add(QueuedEvent(pipeline_id="report", asset_id=asset_id, event_id=event_id))
        with pytest.raises(IntegrityError):
            await session.commit()


async def test_an_event_is_consumed_by_at_most_one_run_per_pipeline(
    migrated_engine: AsyncEngine,
) -> None:
    sessions = session_factory(migrated_engine)
    async with sessions() as session:
        asset = Asset(name="orders", uri="orders")
        await _add(session, asset, _pipeline("report"), _pipeline("audit"))
        event = AssetEvent(asset_id=asset.id, source="trigger")
        first, second, other = _run("r1", "report"), _run("r2", "report"), _run("a1", "audit")
        await _add(session, event, first, second, other)
        await _add(
            session,
            RunEvent(run_pk=first.id, event_id=event.id, pipeline_id="report"),
            RunEvent(run_pk=other.id, event_id=event.id, pipeline_id="audit"),
        )

        second_pk, event_id = second.id, event.id

        session.add(RunEvent(run_pk=second_pk, event_id=event_id, pipeline_id="report"))
        with pytest.raises(IntegrityError):
            await session.commit()
        await session.rollback()

        # A re-run links the events of the run it runs again.
        session.add(RunEvent(run_pk=second_pk, event_id=event_id, pipeline_id="report", rerun=True))
        await session.commit()
        await session.execute(delete(RunEvent).where(RunEvent.run_pk == second_pk))
        await session.commit()

        # The pipeline of a run_event row must be its run's pipeline.
        session.add(RunEvent(run_pk=second_pk, event_id=event_id, pipeline_id="audit"))
        with pytest.raises(IntegrityError):
            await session.commit()


async def test_check_constraints_reject_unknown_states(migrated_engine: AsyncEngine) -> None:
    sessions = session_factory(migrated_engine)
    async with sessions() as session:
        await _add(session, _pipeline("report"))
        session.add(_run("r1", "report", state="exploded"))
        with pytest.raises(IntegrityError):
            await session.commit()


async def test_deletes_cascade_to_dependent_rows_and_keep_history(
    migrated_engine: AsyncEngine,
) -> None:
    sessions = session_factory(migrated_engine)
    async with sessions() as session:
        orders, report = Asset(name="orders", uri="orders"), Asset(name="report", uri="report")
        trigger = Trigger(classpath="watchers.FileTrigger", kwargs={}, key=trigger_key("x", {}))
        await _add(session, orders, report, trigger, _pipeline("report"))
        run = _run("r1", "report")
        await _add(
            session,
            run,
            AssetWatcher(asset_id=orders.id, name="inbox", trigger_id=trigger.id),
            PipelineAssetRef(pipeline_id="report", asset_id=orders.id, role="schedule"),
        )
        consumed = AssetEvent(asset_id=orders.id, source="trigger", source_trigger_id=trigger.id)
        produced = AssetEvent(asset_id=report.id, source="run", source_run_pk=run.id)
        await _add(session, consumed, produced)
        await _add(
            session,
            RunEvent(run_pk=run.id, event_id=consumed.id, pipeline_id="report"),
            QueuedEvent(pipeline_id="report", asset_id=orders.id, event_id=consumed.id),
        )

        await session.execute(delete(Trigger))
        await session.execute(delete(Pipeline))
        await session.commit()

        # Events outlive the trigger and the run that produced them; the links are cleared.
        sources = await session.execute(
            select(AssetEvent.source_trigger_id, AssetEvent.source_run_pk).order_by(AssetEvent.id)
        )
        assert [tuple(row) for row in sources] == [(None, None), (None, None)]
        for table in (AssetWatcher, Run, RunEvent, QueuedEvent, PipelineAssetRef):
            assert await session.scalar(select(func.count()).select_from(table)) == 0, table

        await session.execute(delete(Asset).where(Asset.id == orders.id))
        await session.commit()
        remaining = await session.scalars(select(AssetEvent.asset_id))
        assert list(remaining) == [report.id]


async def test_timestamps_round_trip_as_aware_utc(migrated_engine: AsyncEngine) -> None:
    paris = dt.datetime(2026, 3, 16, 10, 37, 51, 123456, tzinfo=ZoneInfo("Europe/Paris"))
    sessions = session_factory(migrated_engine)
    async with sessions() as session:
        await _add(session, _pipeline("report"))
        await _add(session, _run("r1", "report", created_at=paris, next_try_at=None))

    async with sessions() as session:
        created, next_try = (await session.execute(select(Run.created_at, Run.next_try_at))).one()
        pipeline_updated = await session.scalar(select(Pipeline.updated_at))
        later = await session.scalar(
            select(func.count()).select_from(Run).where(Run.created_at > paris - dt.timedelta(1))
        )

    assert created == paris
    assert created.tzinfo is dt.UTC
    assert created.isoformat() == "2026-03-16T09:37:51.123456+00:00"
    assert next_try is None
    assert pipeline_updated is not None
    assert pipeline_updated.tzinfo is dt.UTC
    assert later == 1


async def test_naive_timestamps_are_rejected(migrated_engine: AsyncEngine) -> None:
    sessions = session_factory(migrated_engine)
    async with sessions() as session:
        session.add(_pipeline("report"))
        naive = dt.datetime(2026, 3, 16)  # noqa: DTZ001 -- the value under test
        session.add(_run("r1", "report", created_at=naive))
        with pytest.raises(StatementError, match="naive datetime '2026-03-16T00:00:00'"):
            await session.commit()


async def test_kafka_dedup_keys_gain_the_record_timestamp(database_url: str) -> None:
    """Migration 0004: a Kafka event stored before the upgrade keeps matching its message when
    that message is delivered again after it (the key the watcher makes now holds the record's
    timestamp); keys it cannot rewrite, and other triggers' keys, stay as they were."""
    await upgrade(database_url, "0003")
    payload = {"topic": "orders", "partition": 0, "offset": 7, "timestamp": 1_790_000_000_123}
    rows = [  # (asset, trigger, dedup key, payload)
        ("orders", "watchers.kafka.KafkaTrigger", "orders/0/7", payload),
        ("orders", "watchers.kafka.KafkaTrigger", "orders/0/8", {"order": 8}),  # apply_function
        ("refunds", "plugins.MyTrigger", "orders/0/7", payload),
    ]
    engine = create_engine(database_url)
    try:
        async with session_factory(engine)() as session:
            assets = {name: Asset(name=name, uri=name) for name in ("orders", "refunds")}
            await _add(session, *assets.values())
            # Core, naming its columns: the mapped classes have columns revision 0003 lacks.
            triggers = {
                classpath: await session.scalar(
                    insert(Trigger)
                    .values(classpath=classpath, kwargs={}, key=classpath[:64], state="running")
                    .returning(Trigger.id)
                )
                for classpath in ("watchers.kafka.KafkaTrigger", "plugins.MyTrigger")
            }
            for asset, classpath, key, stored in rows:
                await session.execute(
                    insert(AssetEvent).values(
                        asset_id=assets[asset].id,
                        extra={"from_trigger": True, "payload": stored},
                        source="trigger",
                        dedup_key=key,
                        source_trigger_id=triggers[classpath],
                    )
                )
            await session.commit()

        await upgrade(database_url)

        async with engine.connect() as conn:
            keys = (await conn.scalars(select(AssetEvent.dedup_key).order_by(AssetEvent.id))).all()
    finally:
        await engine.dispose()
    assert keys == ["orders/0/7@1790000000123", "orders/0/8", "orders/0/7"]
