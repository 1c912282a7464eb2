"""Backpressure through ``triggerer run --config FILE``, on SQLite and PostgreSQL: a topic
holding 20,000 messages feeds a pipeline with ``max_backlog=200``. The store never holds more
than 200 events waiting (plus one ingest batch), the rest stays in the topic while the watcher
is held back (``watchers list`` names the pipeline), and in the end every message is exactly one
event, consumed by exactly one run."""

from __future__ import annotations

import json
from typing import TYPE_CHECKING

import anyio
import pytest
from sqlalchemy import func, select

from tests.e2e.daemon import ORDERS, triggerer_cli
from triggerer.service.store import models
from triggerer.service.store.states import RunState

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

    from tests.e2e.conftest import MakeDeployment

pytestmark = pytest.mark.slow  # a hundred runs of 200 events each, on both stores: minutes

MESSAGES = 20_000
MAX_BACKLOG = 200
ONE_BATCH = 500
"""Ingest's batch size ([daemon] ingest_batch_size): what may be in hand past the limit."""

DRAIN = (
    ORDERS
    + f"""
    @pipeline(schedule=orders, max_backlog={MAX_BACKLOG})
    def drain(spark, context):
        pass
"""
)


async def backlog(session: AsyncSession) -> int:
    """Events waiting for ``drain``: queued, or taken by its runs that have not started."""
    queued = await session.scalar(
        select(func.count())
        .select_from(models.QueuedEvent)
        .where(models.QueuedEvent.pipeline_id == "drain")
    )
    held = await session.scalar(
        select(func.count())
        .select_from(models.RunEvent)
        .join(models.Run, models.Run.id == models.RunEvent.run_pk)
        .where(models.Run.pipeline_id == "drain", models.Run.state == RunState.QUEUED)
    )
    return (queued or 0) + (held or 0)


async def totals(session: AsyncSession) -> tuple[int, int, int, set[str]]:
    """Events stored; event links of runs; distinct events linked; the runs' states."""
    events = await session.scalar(select(func.count()).select_from(models.AssetEvent))
    links = await session.scalar(select(func.count()).select_from(models.RunEvent))
    linked = await session.scalar(select(func.count(models.RunEvent.event_id.distinct())))
    states = set(await session.scalars(select(models.Run.state).distinct()))
    return events or 0, links or 0, linked or 0, states


@pytest.mark.timeout(600)
async def test_a_full_backlog_holds_the_watcher_and_the_burst_stays_in_the_topic(
    make_deployment: MakeDeployment, database_url: str
) -> None:
    deployment = await make_deployment(database_url)
    deployment.write_pipelines(DRAIN)
    await deployment.produce({"n": n} for n in range(MESSAGES))
    config = deployment.config_file()
    env = {k: v for k, v in deployment.env().items() if not k.startswith("TRIGGERER_")}
    peak, held_by = 0, set()
    with deployment.process_with_config(config) as daemon:
        daemon.start()
        await daemon.wait_logged("pipelines_loaded")
        with anyio.fail_after(400):
            while True:
                peak = max(peak, await deployment.query(backlog))
                listed = await triggerer_cli(
                    env, "--config", str(config), "watchers", "list", "--json"
                )
                held_by |= {row["held_by"] for row in json.loads(listed.stdout)}
                stored, links, linked, states = await deployment.query(totals)
                if linked == MESSAGES and states == {RunState.SUCCESS}:
                    break
                await anyio.sleep(0.2)
        held = (await daemon.wait_logged("watcher_held_back"))[0]
    assert (stored, links, linked) == (MESSAGES, MESSAGES, MESSAGES), daemon.tail()
    assert peak <= MAX_BACKLOG + ONE_BATCH, peak
    assert held["pipeline_id"] == "drain"
    assert "drain" in held_by
