"""The store goes away while messages flow and runs execute: the daemon waits it out."""

from __future__ import annotations

from typing import TYPE_CHECKING

import anyio
from sqlalchemy import func, select

from tests.e2e.daemon import ORDERS, consumed_by, event_count, settled, triggerer_cli
from triggerer.service.store import models

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

    from tests.e2e.conftest import MakeDeployment
    from tests.fixtures.postgres_cluster import PostgresCluster

OUTAGE_S = 20.0
BATCHES = 3
PER_BATCH = 60

CONSUMER = """
    @pipeline(schedule=orders)
    def tally(spark, context):
        assert spark.range(1).count() == 1
"""


async def distinct_offsets(session: AsyncSession) -> int:
    count = await session.scalar(select(func.count(func.distinct(models.AssetEvent.dedup_key))))
    return count or 0


async def test_store_outage_while_messages_flow_and_runs_execute(
    make_deployment: MakeDeployment, postgres_cluster: PostgresCluster
) -> None:
    deployment = await make_deployment(postgres_cluster.url)
    deployment.write_pipelines(ORDERS + CONSUMER)
    config = deployment.config_file()
    env = deployment.env()
    total = BATCHES * PER_BATCH

    async def check() -> tuple[int, str]:
        done = await triggerer_cli(env, "--config", str(config), "check")
        return done.returncode, done.stdout.decode()

    with deployment.process_with_config(config) as daemon:
        daemon.start()
        await daemon.wait_logged("pipelines_loaded")
        await deployment.produce(range(PER_BATCH), batch=10, pause_s=0.2)
        await deployment.wait_for(lambda s: event_count(s, "orders"), lambda n: n > 0)

        await anyio.to_thread.run_sync(postgres_cluster.stop)
        stopped = anyio.current_time()
        await deployment.produce(range(PER_BATCH, 2 * PER_BATCH), batch=10, pause_s=0.2)
        code, said = await check()
        assert code == 1
        assert said.startswith("degraded: the store at"), said
        await anyio.sleep(OUTAGE_S - (anyio.current_time() - stopped))  # the outage itself
        await anyio.to_thread.run_sync(postgres_cluster.start)

        with anyio.fail_after(60):
            while (status := await check())[0] != 0:  # noqa: ASYNC110 - another process
                await anyio.sleep(0.5)
        assert status[1].startswith("healthy"), status
        await deployment.produce(range(2 * PER_BATCH, total), batch=10, pause_s=0.2)
        await deployment.wait_for(lambda s: event_count(s, "orders"), lambda n: n == total)
        await deployment.wait_for(lambda s: settled(s, "tally"), lambda t: t == (0, 0))
        assert daemon.process is not None
        assert daemon.process.poll() is None, daemon.tail()

    # Exactly once: one event per message, each consumed by one run.
    assert await deployment.query(lambda s: event_count(s, "orders")) == total
    assert await deployment.query(distinct_offsets) == total
    consumed = await deployment.query(lambda s: consumed_by(s, "tally"))
    assert len(consumed) == len(set(consumed)) == total
    log = daemon.log_path.read_text()
    assert '"event": "store_unavailable"' in log
