"""Recovery of a dead instance's runs, on the real store: the runs of an instance whose heartbeat
is stale run again, but an instance never takes its own runs for a dead one's, however late its
own heartbeat (a loaded machine, a slow store)."""

from __future__ import annotations

import gc
from datetime import timedelta
from typing import TYPE_CHECKING

import pytest
from sqlalchemy import select

from tests.e2e.daemon import daemon_settings
from triggerer.service.daemon.service import Service
from triggerer.service.store import models, session_factory
from triggerer.service.store.types import utcnow

if TYPE_CHECKING:
    from pathlib import Path

    from sqlalchemy.ext.asyncio import AsyncEngine


# A Service made but never run leaves its memory streams unclosed when it is collected.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnraisableExceptionWarning")
async def test_runs_of_a_silent_instance_run_again_but_never_its_own(
    migrated_database_url: str, migrated_engine: AsyncEngine, tmp_path: Path
) -> None:
    settings = daemon_settings(tmp_path, migrated_database_url, "sc://127.0.0.1:1")
    sessions = session_factory(migrated_engine)
    service = Service(settings, sessions)
    long_ago = utcnow() - timedelta(hours=1)
    async with sessions.begin() as session:
        session.add(
            models.Pipeline(pipeline_id="p", fileloc="p.py", schedule={}, schedule_text="manual")
        )
        for owner in (service.instance_id, "dead-instance"):
            session.add(models.Instance(id=owner, hostname="h", pid=1, heartbeat_at=long_ago))
            session.add(
                models.Run(
                    run_id=f"run-of-{owner}",
                    pipeline_id="p",
                    run_type="asset",
                    state="running",
                    try_number=1,
                    owner=owner,
                )
            )

    await service.recover()

    async with sessions() as session:
        rows = (await session.execute(select(models.Run.run_id, models.Run.state))).all()
    own = service.instance_id
    # Collected here, under this test's filter, not during whichever test runs next.
    del service
    gc.collect()
    assert dict(rows) == {
        f"run-of-{own}": "running",  # its own: still running here
        "run-of-dead-instance": "queued",
    }
