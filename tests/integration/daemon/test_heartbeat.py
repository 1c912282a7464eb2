"""The heartbeat's write of watcher states, on the real store: a state that changes while the
beat writes it reaches the store with the next beat; watchers in one state written together."""

from __future__ import annotations

import datetime as dt
import gc
from typing import TYPE_CHECKING

import pytest
from sqlalchemy import event, select

from tests.e2e.daemon import daemon_settings
from triggerer.service.daemon.service import Service
from triggerer.service.daemon.supervisor import WatcherStatus
from triggerer.service.store import models, session_factory
from triggerer.service.store.states import TriggerState

if TYPE_CHECKING:
    from pathlib import Path

    from sqlalchemy.ext.asyncio import AsyncEngine


# A Service made but never run leaves its memory streams unclosed when it is collected.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_a_state_that_changes_during_the_write_is_written_by_the_next_beat(
    migrated_database_url: str, migrated_engine: AsyncEngine, tmp_path: Path
) -> None:
    """Was: the beat remembered the state as it was after its write, so a watcher that went
    from starting to running meanwhile said "starting" in the store for good."""
    settings = daemon_settings(tmp_path, migrated_database_url, "sc://127.0.0.1:1")
    sessions = session_factory(migrated_engine)
    async with sessions.begin() as session:
        trigger = models.Trigger(classpath="t.Trigger", kwargs={}, key="heartbeat-test")
        session.add(trigger)
    service = Service(settings, sessions)
    status = WatcherStatus(state=TriggerState.STARTING)
    service.supervisor.status[trigger.id] = status

    def started_meanwhile(conn: object, cursor: object, statement: str, *_: object) -> None:
        if statement.replace('"', "").upper().startswith("UPDATE TRIGGER"):
            status.state = TriggerState.RUNNING

    event.listen(migrated_engine.sync_engine, "after_cursor_execute", started_meanwhile)
    try:
        await service.heartbeat()
    finally:
        event.remove(migrated_engine.sync_engine, "after_cursor_execute", started_meanwhile)
    await service.heartbeat()

    async with sessions() as session:
        state = await session.scalar(
            select(models.Trigger.state).where(models.Trigger.id == trigger.id)
        )
    # Collected here, under this test's filter, not during whichever test runs next.
    del service
    gc.collect()
    assert state == TriggerState.RUNNING


# A Service made but never run leaves its memory streams unclosed when it is collected.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_watchers_in_the_same_state_are_written_by_one_statement_and_the_others_each(
    migrated_database_url: str, migrated_engine: AsyncEngine, tmp_path: Path
) -> None:
    """Idle watchers of one shared consumer differ in nothing, their last poll included: their
    rows are written together, and a watcher whose state is its own still gets its own."""
    settings = daemon_settings(tmp_path, migrated_database_url, "sc://127.0.0.1:1")
    sessions = session_factory(migrated_engine)
    async with sessions.begin() as session:
        triggers = [
            models.Trigger(classpath="t.Trigger", kwargs={}, key=f"alike-{number}")
            for number in range(5)
        ]
        session.add_all(triggers)
    service = Service(settings, sessions)
    instance_id = service.instance_id
    polled = dt.datetime(2026, 11, 28, 12, 0, tzinfo=dt.UTC)
    alike = [
        WatcherStatus(state=TriggerState.RUNNING, last_poll_at=polled, lag=0, reads_as="shared")
        for _ in range(3)
    ]
    failing = WatcherStatus(
        state=TriggerState.BACKOFF, last_error="boom", last_error_at=polled, restart_count=2
    )
    lagging = WatcherStatus(state=TriggerState.RUNNING, last_poll_at=polled, lag=7)
    statuses = [*alike, failing, lagging]
    for trigger, status in zip(triggers, statuses, strict=True):
        service.supervisor.status[trigger.id] = status
    updates: list[str] = []

    def count(conn: object, cursor: object, statement: str, *_: object) -> None:
        if statement.replace('"', "").upper().startswith("UPDATE TRIGGER"):
            updates.append(statement)

    async def stored() -> list[tuple[object, ...]]:
        async with sessions() as session:
            rows = await session.execute(
                select(
                    models.Trigger.state,
                    models.Trigger.last_poll_at,
                    models.Trigger.last_error,
                    models.Trigger.restart_count,
                    models.Trigger.lag,
                    models.Trigger.reads_as,
                    models.Trigger.instance_id,
                )
                .where(models.Trigger.id.in_([t.id for t in triggers]))
                .order_by(models.Trigger.id)
            )
            return [tuple(row) for row in rows.all()]

    def expected() -> list[tuple[object, ...]]:
        return [
            (
                s.state,
                s.last_poll_at,
                s.last_error,
                s.restart_count,
                s.lag,
                s.reads_as,
                instance_id,
            )
            for s in statuses
        ]

    event.listen(migrated_engine.sync_engine, "after_cursor_execute", count)
    try:
        await service.heartbeat()
        first_beat = len(updates)
        assert await stored() == expected()

        polled_again = polled + dt.timedelta(seconds=5)
        for status in alike:
            status.last_poll_at = polled_again
        alike[2].lag = 3  # a message arrived for this one
        updates.clear()
        await service.heartbeat()
        second_beat = len(updates)
        assert await stored() == expected()

        updates.clear()
        await service.heartbeat()  # nothing changed
        third_beat = len(updates)
    finally:
        event.remove(migrated_engine.sync_engine, "after_cursor_execute", count)
    del service
    gc.collect()
    # The three alike in one statement, the other two in one bulk update; then the two still
    # alike, and the one that lags in the bulk update; then nothing.
    assert (first_beat, second_beat, third_beat) == (2, 2, 0)
