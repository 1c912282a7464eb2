"""Ingest on the real store: commit before ack, full batches, duplicates, a database outage,
events the store cannot hold."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import psycopg
import pytest
from psycopg import sql
from sqlalchemy import URL, func, make_url, select, text
from sqlalchemy.ext.asyncio import AsyncEngine, AsyncSession, async_sessionmaker
from structlog.testing import capture_logs

from tests.fixtures.ingest import watched_inbox
from triggerer.cloudevents import of_json
from triggerer.service.daemon.ingest import Delivery, Ingest
from triggerer.service.daemon.service import POSTGRESQL_COMMITS_IN_FLIGHT
from triggerer.service.store import models, session_factory
from triggerer.triggers import Ack, TriggerEvent

if TYPE_CHECKING:
    from triggerer.service.events import Recorded
    from triggerer.service.scheduling.registry import WatchedTrigger

PIPELINES = """
from triggerer import Asset, AssetWatcher, pipeline
from watchers import FileTrigger

orders = Asset("orders", watchers=[AssetWatcher("inbox", FileTrigger({inbox!r}))])

@pipeline(schedule=orders)
def report(spark, context): ...
"""


async def _events(sessions: async_sessionmaker[AsyncSession]) -> int:
    async with sessions() as session:
        return await session.scalar(select(func.count()).select_from(models.AssetEvent)) or 0


def _delivery(
    watched: WatchedTrigger, n: int, ack: Callable[[str], Ack], poison: frozenset[int] = frozenset()
) -> Delivery:
    """The message ``n``; one in ``poison`` has a payload the store refuses (see
    :func:`_refuse_poison`)."""
    key = f"orders/0/{n}"
    payload = {"n": n, "poison": True} if n in poison else {"n": n}
    return watched, TriggerEvent(payload, dedup_key=key, ack=ack(key))


async def _refuse_poison(engine: AsyncEngine) -> None:
    """Make the database itself refuse events whose payload has a "poison" key, as it refuses
    a value it cannot hold, and as no check before writing can tell."""
    async with engine.begin() as connection:
        if connection.dialect.name == "postgresql":
            await connection.execute(
                text(
                    "ALTER TABLE asset_event ADD CONSTRAINT poison"
                    " CHECK (extra -> 'payload' ->> 'poison' IS NULL)"
                )
            )
        else:
            await connection.execute(
                text(
                    "CREATE TRIGGER poison BEFORE INSERT ON asset_event"
                    " WHEN json_extract(NEW.extra, '$.payload.poison') IS NOT NULL"
                    " BEGIN SELECT RAISE(ABORT, 'poison payload'); END"
                )
            )


async def _dead_letters(sessions: async_sessionmaker[AsyncSession]) -> list[models.DeadLetter]:
    async with sessions() as session:
        rows = await session.scalars(select(models.DeadLetter).order_by(models.DeadLetter.id))
        return list(rows.all())


async def test_every_event_is_committed_before_its_ack_batches_stay_full_and_duplicates_ack(
    migrated_engine: AsyncEngine, db_backend: str, tmp_path: Path
) -> None:
    sessions = session_factory(migrated_engine)
    watched = await watched_inbox(sessions, tmp_path, PIPELINES)
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

    commits: list[tuple[int, int, set[str]]] = []

    def recorded(part: Recorded) -> None:
        commits.append((len(part.events), part.duplicates, part.queued_pipelines))

    in_flight = POSTGRESQL_COMMITS_IN_FLIGHT if db_backend == "postgresql" else 1
    ingest = Ingest(sessions, recorded, batch_size=100, commits_in_flight=in_flight)
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
    assert commits == [(100, 0, {"report"})] * 6 + [(0, 100, set())] * 2


async def test_a_stored_key_met_by_another_message_is_logged_and_a_redelivery_is_not(
    migrated_engine: AsyncEngine, tmp_path: Path
) -> None:
    sessions = session_factory(migrated_engine)
    watched = await watched_inbox(sessions, tmp_path, PIPELINES)
    send, receive = anyio.create_memory_object_stream[Delivery](10)

    def no_ack(_: str) -> Ack:
        async def nothing() -> None: ...

        return nothing

    with send:
        send.send_nowait(_delivery(watched, 1, no_ack))
        send.send_nowait(_delivery(watched, 2, no_ack))
    with anyio.fail_after(30), capture_logs() as first_logs:
        await Ingest(sessions, lambda _: None, batch_size=100).run(receive)
    send, receive = anyio.create_memory_object_stream[Delivery](10)
    with send:
        send.send_nowait(_delivery(watched, 1, no_ack))  # the same message again
        reused = TriggerEvent({"n": "another"}, dedup_key="orders/0/2")
        send.send_nowait((watched, reused))
    again = Ingest(sessions, lambda _: None, batch_size=100)
    with anyio.fail_after(30), capture_logs() as logs:
        await again.run(receive)

    assert (await _events(sessions), again.duplicates) == (2, 2)
    assert not [log for log in first_logs if log["log_level"] == "warning"]
    [warning] = [log for log in logs if log["event"] == "duplicate_key_other_message"]
    assert warning["watchers"] == ["orders/inbox"]
    assert warning["dedup_key"] == "orders/0/2"
    assert warning["stored_at"] < warning["received_at"]


async def test_a_cloudevent_is_in_the_extra_and_its_copies_are_one_event(
    migrated_engine: AsyncEngine, tmp_path: Path
) -> None:
    sessions = session_factory(migrated_engine)
    watched = await watched_inbox(sessions, tmp_path, PIPELINES)
    document = {"specversion": "1.0", "id": "7", "source": "/shop", "type": "order", "data": 1}
    cloudevent = of_json(document)
    # The same CloudEvent in three messages (their payloads differ), then another one that
    # reuses its source and id.
    events = [
        TriggerEvent({"offset": n}, dedup_key=cloudevent.dedup_key, cloudevent=cloudevent)
        for n in range(3)
    ]
    reused = of_json({**document, "data": 2})
    events.append(TriggerEvent({"offset": 3}, dedup_key=reused.dedup_key, cloudevent=reused))
    send, receive = anyio.create_memory_object_stream[Delivery](10)
    with send:
        for event in events:
            send.send_nowait((watched, event))
    ingest = Ingest(sessions, lambda _: None, batch_size=2)
    with anyio.fail_after(30), capture_logs() as logs:
        await ingest.run(receive)

    assert (await _events(sessions), ingest.duplicates) == (1, 3)
    async with sessions() as session:
        [stored] = (await session.scalars(select(models.AssetEvent))).all()
    assert stored.extra == {
        "from_trigger": True,
        "payload": {"offset": 0},
        "cloudevent": cloudevent.extra,
    }
    assert stored.dedup_key == 'cloudevent:["/shop","7"]'
    [warning] = [log for log in logs if log["event"] == "duplicate_key_other_message"]
    assert warning["dedup_key"] == stored.dedup_key


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


async def test_events_the_store_cannot_hold_are_dead_lettered_once_and_acked_with_the_rest(
    migrated_engine: AsyncEngine, db_backend: str, tmp_path: Path
) -> None:
    sessions = session_factory(migrated_engine)
    watched = await watched_inbox(sessions, tmp_path, PIPELINES)
    await _refuse_poison(migrated_engine)
    acked: list[str] = []

    def ack(key: str) -> Ack:
        async def record() -> None:
            acked.append(key)

        return record

    def deliveries() -> list[Delivery]:
        batch = [_delivery(watched, n, ack, poison=frozenset({21})) for n in range(30)]
        too_long = "k" * (models.ID_LENGTH + 1)
        batch[7] = (
            watched,
            TriggerEvent(
                {"n": 7}, dedup_key="orders/0/7", ack=ack("orders/0/7"), partition_key=too_long
            ),
        )
        # Only a trigger that skips the payload check can yield this one; jsonb cannot hold it.
        batch[13] = (
            watched,
            TriggerEvent.of_decoded_json(
                {"n": 13, "text": "a\x00b"}, dedup_key="orders/0/13", ack=ack("orders/0/13")
            ),
        )
        return batch

    refused = 'check constraint "poison"' if db_backend == "postgresql" else "poison payload"
    reasons = {
        "orders/0/7": "partition key is 251 characters long; the store holds at most 250",
        "orders/0/13": "$.payload.text holds a NUL character (U+0000)",
        "orders/0/21": refused,
    }
    # The same 30 messages twice: a redelivered poison message is one dead letter.
    for delivery, recorded in ((1, (27, 3)), (2, (0, 0))):
        ingest = Ingest(sessions, lambda _: None, batch_size=30)
        send, receive = anyio.create_memory_object_stream[Delivery](30)
        with send:
            for item in deliveries():
                send.send_nowait(item)
        with capture_logs() as logs, anyio.fail_after(60):
            await ingest.run(receive)

        assert sorted(acked) == sorted(f"orders/0/{n}" for n in range(30)), delivery
        acked.clear()
        dead = [entry for entry in logs if entry["event"] == "event_dead_lettered"]
        assert {entry["dedup_key"] for entry in dead} == set(reasons)
        for entry in dead:
            assert reasons[entry["dedup_key"]] in entry["reason"]
            assert entry["trigger_id"] == watched.trigger_id
        assert (ingest.events_recorded, ingest.dead_letters) == recorded

    async with sessions() as session:
        stored = await session.scalars(select(models.AssetEvent.extra))
        assert sorted(extra["payload"]["n"] for extra in stored) == sorted(
            set(range(30)) - {7, 13, 21}
        )
    payloads = {event.dedup_key: event.payload for _, event in deliveries()}
    letters = {letter.dedup_key: letter for letter in await _dead_letters(sessions)}
    assert letters.keys() == reasons.keys()
    for key, letter in letters.items():
        assert reasons[key] in letter.reason
        assert (letter.asset_id, letter.trigger_id, letter.source) == (
            watched.asset_ids[0],
            watched.trigger_id,
            "trigger",
        )
        # The payload as text, with nothing lost: the NUL character included.
        assert json.loads(letter.payload) == {"from_trigger": True, "payload": payloads[key]}
    assert letters["orders/0/7"].partition_key == "k" * 251


@pytest.mark.parametrize("db_backend", ["postgresql"])
async def test_database_outage_holds_every_ack_until_its_commit_and_loses_nothing(
    migrated_engine: AsyncEngine, migrated_database_url: str, tmp_path: Path
) -> None:
    sessions = session_factory(migrated_engine)
    watched = await watched_inbox(sessions, tmp_path, PIPELINES)
    # A refused connection is no reason to dead-letter: the event the store refuses waits too.
    await _refuse_poison(migrated_engine)
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
                    await send.send(_delivery(watched, n, ack, poison=frozenset({25})))
                # Nothing can be committed, so nothing may be acked; the window is the test.
                await anyio.sleep(2)
                assert acked == []
        finally:
            await anyio.to_thread.run_sync(_allow_connections, url, url.database, True)
        with anyio.fail_after(60):
            while len(acked) < 50:  # noqa: ASYNC110 - ingest retries on its own backoff
                await anyio.sleep(0.05)

    assert sorted(acked) == sorted(f"orders/0/{n}" for n in range(50))
    assert await _events(sessions) == 49
    assert [letter.dedup_key for letter in await _dead_letters(sessions)] == ["orders/0/25"]
