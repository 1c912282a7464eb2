"""Stored positions of sources without acks (Kinesis), on SQLite and PostgreSQL: the migration,
the upsert that never moves a position back, the reads by prefix, and ingest writing each
batch's positions with its events, in the order the batches were formed."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import pytest
from alembic import command
from sqlalchemy import Connection, func, inspect, select
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker

from tests.fixtures.ingest import ingest_all, watched_inbox
from triggerer import checkpoints
from triggerer.service import events as events_module
from triggerer.service.daemon import ingest as ingest_module
from triggerer.service.daemon.ingest import Delivery, Ingest
from triggerer.service.daemon.service import POSTGRESQL_COMMITS_IN_FLIGHT
from triggerer.service.store import create_engine, session_factory, source_checkpoints, upgrade
from triggerer.service.store.migrate import alembic_config
from triggerer.service.store.models import AssetEvent, DeadLetter, SourceCheckpoint
from triggerer.service.store.source_checkpoints import (
    furthest,
    record_checkpoints,
    stored_positions,
)
from triggerer.triggers import TriggerEvent

if TYPE_CHECKING:
    from triggerer.service.events import NewEvent, Recorded
    from triggerer.service.scheduling.registry import WatchedTrigger

LONGEST = "9" * 129  # a Kinesis sequence number has up to 129 digits


async def _tables(engine: AsyncEngine) -> set[str]:
    async with engine.connect() as connection:
        return await connection.run_sync(lambda sync: set(inspect(sync).get_table_names()))


async def test_revision_0012_adds_the_table_and_its_downgrade_removes_it(
    database_url: str,
) -> None:
    await upgrade(database_url, "0011")
    engine = create_engine(database_url)
    try:
        assert "source_checkpoint" not in await _tables(engine)
        await upgrade(database_url)
        assert "source_checkpoint" in await _tables(engine)
        async with session_factory(engine).begin() as session:
            await record_checkpoints(session, {"kinesis/s/app/shardId-0": "42"})
        async with engine.connect() as connection:
            await connection.run_sync(_downgrade, "0011")
        assert "source_checkpoint" not in await _tables(engine)
    finally:
        await engine.dispose()


def _downgrade(connection: Connection, revision: str) -> None:
    config = alembic_config()
    config.attributes["connection"] = connection
    command.downgrade(config, revision)


async def _record(sessions: async_sessionmaker[AsyncSession], positions: dict[str, str]) -> None:
    async with sessions.begin() as session:
        await record_checkpoints(session, positions)


async def _stored(sessions: async_sessionmaker[AsyncSession], prefix: str = "") -> dict[str, str]:
    async with sessions() as session:
        return await stored_positions(session, prefix)


async def test_a_position_moves_only_forward_as_a_number(migrated_engine: AsyncEngine) -> None:
    sessions = session_factory(migrated_engine)
    key = "kinesis/orders/app/shardId-000000000000"
    for position, expected in [
        ("9", "9"),
        ("10", "10"),  # longer: further, although "10" < "9" as text
        ("2", "10"),
        ("0011", "11"),  # leading zeros do not count
        ("10", "11"),
        (LONGEST, LONGEST),
        ("1" + "0" * 127, LONGEST),
    ]:
        await _record(sessions, {key: position})
        assert await _stored(sessions) == {key: expected}, position


async def test_positions_are_read_by_prefix_through_the_sdk(migrated_engine: AsyncEngine) -> None:
    sessions = session_factory(migrated_engine)
    await _record(
        sessions,
        {
            "kinesis/orders/app_1/shardId-0": "1",
            "kinesis/orders/app_1/shardId-1": "2",
            "kinesis/orders/appX1/shardId-0": "3",  # '_' is not a wildcard
            "kinesis/orders/app_10/shardId-0": "4",
            "kinesis/orders/a%/shardId-0": "5",
        },
    )
    previous = checkpoints._reader
    checkpoints.read_from(source_checkpoints.reader(sessions))
    try:
        assert await checkpoints.stored_positions("kinesis/orders/app_1/") == {
            "kinesis/orders/app_1/shardId-0": "1",
            "kinesis/orders/app_1/shardId-1": "2",
        }
        assert await checkpoints.stored_positions("kinesis/orders/a%/") == {
            "kinesis/orders/a%/shardId-0": "5"
        }
        assert await checkpoints.stored_position("kinesis/orders/app_10/shardId-0") == "4"
        assert await checkpoints.stored_position("kinesis/orders/app_10/shardId-9") is None
    finally:
        checkpoints.read_from(previous)


def test_the_furthest_position_of_each_key() -> None:
    assert furthest([("a", "9"), ("b", "1"), ("a", "10"), ("a", "010"), ("b", "0")]) == {
        "a": "10",
        "b": "1",
    }


def test_a_checkpoint_that_is_not_a_key_and_digits_is_refused() -> None:
    for bad in [("k", "-1"), ("k", "1e3"), ("", "1"), ("k\x00", "1"), ("k", "\u0661")]:
        with pytest.raises(ValueError, match="must be \\(key, position\\)"):
            TriggerEvent({}, checkpoint=bad)
    TriggerEvent({}, checkpoint=("k" * 1500, LONGEST))


KEY = "kinesis/orders/app/shardId-000000000000"


def _delivery(watched: WatchedTrigger, n: int, *, dead: bool = False) -> Delivery:
    return watched, TriggerEvent(
        {"n": n},
        dedup_key=f"orders/shardId-000000000000/{n}",
        checkpoint=(KEY, str(n)),
        dead_letter="refused" if dead else None,
    )


async def test_ingest_stores_each_batch_position_with_its_events_never_ahead_of_them(
    migrated_engine: AsyncEngine,
    db_backend: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With two commits in flight (PostgreSQL), a later batch's position is written only once
    every earlier event of its key is stored: checked inside each writing transaction."""
    sessions = session_factory(migrated_engine)
    watched = await watched_inbox(sessions, tmp_path)
    checks: list[tuple[str, int]] = []

    async def checked(session: AsyncSession, positions: Mapping[str, str]) -> None:
        (position,) = positions.values()
        stored = await session.scalar(select(func.count()).select_from(AssetEvent)) or 0
        letters = await session.scalar(select(func.count()).select_from(DeadLetter)) or 0
        checks.append((position, stored + letters))
        await record_checkpoints(session, positions)

    monkeypatch.setattr(ingest_module, "record_checkpoints", checked)
    in_flight = POSTGRESQL_COMMITS_IN_FLIGHT if db_backend == "postgresql" else 1
    ingest = Ingest(sessions, lambda _: None, batch_size=50, commits_in_flight=in_flight)
    send, receive = anyio.create_memory_object_stream[Delivery](1000)
    with send:
        for n in range(1, 501):
            # Each tenth batch holds a dead letter: its position goes with the letters.
            send.send_nowait(_delivery(watched, n, dead=n % 500 == 250))
    with anyio.fail_after(60):
        await ingest.run(receive)

    assert await _stored(sessions) == {KEY: "500"}
    assert len(checks) == 10
    # Position n was written in a transaction that saw all n events (or dead letters) up to it.
    assert all(int(position) <= seen for position, seen in checks), checks
    async with sessions() as session:
        assert await session.scalar(select(func.count()).select_from(SourceCheckpoint)) == 1


async def test_a_batch_of_dead_letters_alone_moves_the_position(
    migrated_engine: AsyncEngine, tmp_path: Path
) -> None:
    sessions = session_factory(migrated_engine)
    watched = await watched_inbox(sessions, tmp_path)
    ingest = Ingest(sessions, lambda _: None, batch_size=10)
    send, receive = anyio.create_memory_object_stream[Delivery](10)
    with send:
        send.send_nowait(_delivery(watched, 7, dead=True))
    with anyio.fail_after(30):
        await ingest.run(receive)
    assert await _stored(sessions) == {KEY: "7"}
    assert ingest.dead_letters == 1


async def test_a_checkpoint_alone_moves_its_position_and_is_no_event(
    migrated_engine: AsyncEngine, tmp_path: Path
) -> None:
    """What a trigger yields for records it filtered out, or to keep when it first started."""
    sessions = session_factory(migrated_engine)
    watched = await watched_inbox(sessions, tmp_path)
    started = "kinesis/orders/app/@started"
    alone = TriggerEvent.checkpoint_only(KEY, "3")
    assert (alone.is_checkpoint_only, alone.payload, alone.ack) == (True, None, None)
    ingest = Ingest(sessions, lambda _: None, batch_size=10)
    await ingest_all(
        ingest,
        [
            (watched, TriggerEvent.checkpoint_only(started, "1764000000000")),
            _delivery(watched, 1),
            (watched, alone),
        ],
    )
    assert await _stored(sessions) == {KEY: "3", started: "1764000000000"}
    assert (ingest.events_recorded, ingest.dead_letters) == (1, 0)
    # A batch of checkpoints alone.
    ingest = Ingest(sessions, lambda _: None, batch_size=10)
    await ingest_all(ingest, [(watched, TriggerEvent.checkpoint_only(KEY, "5"))])
    assert (await _stored(sessions))[KEY] == "5"
    assert (ingest.events_recorded, ingest.dead_letters) == (0, 0)
    async with sessions() as session:
        assert await session.scalar(select(func.count()).select_from(AssetEvent)) == 1
        assert await session.scalar(select(func.count()).select_from(DeadLetter)) == 0


async def test_after_a_batch_fails_the_next_of_its_key_stores_its_events_not_its_position(
    migrated_engine: AsyncEngine, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Two commits in flight: batch A (records 1-5) fails with an error that is not the
    store's (a bug) once batch B (6-10), waiting for it, is formed. B stores its events but not
    position 10: a watcher starting again must read 1-5 again."""
    sessions = session_factory(migrated_engine)
    watched = await watched_inbox(sessions, tmp_path)

    async def failing_for_a(session: AsyncSession, events: list[NewEvent]) -> Recorded:
        if any(event.extra["payload"]["n"] <= 5 for event in events):
            await anyio.sleep(0.5)  # batch B is formed meanwhile
            raise RuntimeError("a bug in batch A")
        return await events_module.record_events(session, events)

    monkeypatch.setattr(ingest_module, "record_events", failing_for_a)
    ingest = Ingest(sessions, lambda _: None, batch_size=5, commits_in_flight=2)
    with pytest.raises(ExceptionGroup) as raised:
        await ingest_all(ingest, [_delivery(watched, n) for n in range(1, 11)])
    assert raised.group_contains(RuntimeError, match="a bug in batch A")

    assert await _stored(sessions) == {}
    async with sessions() as session:
        stored = set(await session.scalars(select(AssetEvent.dedup_key)))
        assert stored == {f"orders/shardId-000000000000/{n}" for n in range(6, 11)}
