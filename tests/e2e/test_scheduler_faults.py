"""A pipeline whose schedule cannot be evaluated fails alone: the daemon and the others go on."""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING

from tests.e2e.daemon import (
    DaemonProcess,
    daemon_env,
    pipeline_row,
    query,
    queued_events,
    runs,
    triggerer_cli,
    wait_for,
    write_pipelines,
)

if TYPE_CHECKING:
    from pathlib import Path

    from sqlalchemy.ext.asyncio import AsyncSession

    from triggerer.service.store import models

PIPELINES = """
    from triggerer import Asset, PartitionedAssetTimetable, ToDaily, pipeline

    regions = Asset("regions")
    orders = Asset("orders")

    @pipeline(schedule=PartitionedAssetTimetable(assets=regions, partition_key_mapper=ToDaily()))
    def daily(spark, context):
        assert spark.range(3).count() == 3

    @pipeline(schedule=orders)
    def witness(spark, context):
        assert spark.range(3).count() == 3
"""
RUNS_TIMEOUT_S = 90.0


async def daily(session: AsyncSession) -> models.Pipeline | None:
    return await pipeline_row(session, "daily")


async def test_a_partition_key_the_mapper_cannot_map_fails_only_its_pipeline(
    tmp_path: Path, database_url: str, spark_remote: str
) -> None:
    write_pipelines(tmp_path / "pipelines", PIPELINES)
    env = daemon_env(tmp_path, database_url, spark_remote)
    with DaemonProcess(env, tmp_path / "daemon.log") as daemon:
        daemon.start()
        await daemon.wait_logged("pipelines_loaded")
        for arguments in (
            ("regions", "--partition-key", "eu-west"),
            ("orders",),
            ("regions", "--partition-key", "2026-03-16T09:37:51"),
        ):
            emitted = await triggerer_cli(env, "events", "emit", *arguments)
            assert emitted.returncode == 0, emitted.stderr

        finished = await wait_for(
            database_url,
            runs,
            lambda rs: (
                sorted((r.pipeline_id, r.state) for r in rs)
                == [("daily", "success"), ("witness", "success")]
            ),
            timeout_s=RUNS_TIMEOUT_S,
        )
        row = await query(database_url, daily)
        poison = await query(database_url, lambda session: queued_events(session, "daily"))
        assert daemon.process is not None
        assert daemon.process.poll() is None, daemon.tail()
        daemon.signal(signal.SIGTERM)
        assert await daemon.wait(30) == 0, daemon.tail()

    assert [r.partition_key for r in finished if r.pipeline_id == "daily"] == ["2026-03-16"]
    # The event it cannot map stays queued, named in the pipeline's error.
    assert len(poison) == 1
    assert row is not None
    assert row.error is not None
    assert row.error_at is not None
    for part in ("'eu-west'", f"event {poison[0]}", "asset 'regions'", "ToDaily()"):
        assert part in row.error
