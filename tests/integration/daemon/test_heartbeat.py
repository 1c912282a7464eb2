"""The heartbeat's write of watcher states, on the real store: a state that changes while the
beat writes it reaches the store with the next beat."""

from __future__ import annotations

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
