"""The CLI, another process, wakes a running daemon at once, not at its sweep: over NOTIFY on
PostgreSQL, through the notice rows on SQLite."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tests.e2e.daemon import ORDERS, runs, triggerer_cli
from triggerer.service.runs import launcher
from triggerer.service.scheduling import scheduler

if TYPE_CHECKING:
    from tests.e2e.conftest import MakeDeployment

PIPELINES = """
    manual = Asset("manual")

    @pipeline(schedule=manual)
    def on_manual(spark, context):
        pass

    @pipeline()
    def by_hand(spark, context):
        pass
"""
WAKE_TIMEOUT_S = 30.0
"""Well under the sweeps this test sets, and ample for two Spark Connect runs."""


@pytest.mark.parametrize("db_backend", ["sqlite", "postgresql"], indirect=True)
async def test_cli_emit_and_trigger_wake_the_daemon_without_waiting_for_its_sweep(
    database_url: str, make_deployment: MakeDeployment, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Only a notice can wake the scheduler or the launcher within the test's timeout.
    monkeypatch.setattr(scheduler, "SWEEP_S", 600.0)
    monkeypatch.setattr(launcher, "POLL_S", 600.0)
    deployment = await make_deployment(database_url)
    deployment.write_pipelines(ORDERS + PIPELINES)
    env = deployment.env()

    async with deployment.running():
        emitted = await triggerer_cli(env, "events", "emit", "manual", "--extra", '{"n": 1}')
        assert emitted.returncode == 0, emitted.stderr
        triggered = await triggerer_cli(env, "pipelines", "trigger", "by_hand")
        assert triggered.returncode == 0, triggered.stderr
        finished = await deployment.wait_for(
            runs,
            lambda rs: (
                sorted((r.pipeline_id, r.state) for r in rs)
                == [("by_hand", "success"), ("on_manual", "success")]
            ),
            timeout_s=WAKE_TIMEOUT_S,
        )

    assert {r.run_type for r in finished} == {"asset", "manual"}


@pytest.mark.parametrize("db_backend", ["sqlite"], indirect=True)
async def test_the_cli_wakes_triggerer_run_on_sqlite_through_its_notice_rows(
    database_url: str, make_deployment: MakeDeployment
) -> None:
    """As a user runs it: ``triggerer run --config FILE`` on SQLite, events emitted, a run
    triggered and a pipeline unpaused by the CLI. Its sweep is 60 s away; only the notice rows
    wake it within the timeout."""
    deployment = await make_deployment(database_url)
    deployment.write_pipelines(ORDERS + PIPELINES)
    env = deployment.env()
    daemon = deployment.process_with_config(deployment.config_file())
    with daemon:
        daemon.start()
        await daemon.wait_logged("pipelines_loaded")
        paused = await triggerer_cli(env, "pipelines", "pause", "on_manual")
        assert paused.returncode == 0, paused.stderr
        emitted = await triggerer_cli(env, "events", "emit", "manual", "--extra", '{"n": 1}')
        assert emitted.returncode == 0, emitted.stderr
        triggered = await triggerer_cli(env, "pipelines", "trigger", "by_hand")
        assert triggered.returncode == 0, triggered.stderr
        await deployment.wait_for(
            runs, lambda rs: [r.pipeline_id for r in rs] == ["by_hand"], timeout_s=WAKE_TIMEOUT_S
        )
        unpaused = await triggerer_cli(env, "pipelines", "unpause", "on_manual")
        assert unpaused.returncode == 0, unpaused.stderr
        finished = await deployment.wait_for(
            runs,
            lambda rs: (
                sorted((r.pipeline_id, r.state) for r in rs)
                == [("by_hand", "success"), ("on_manual", "success")]
            ),
            timeout_s=WAKE_TIMEOUT_S,
        )
    assert {r.run_type for r in finished} == {"asset", "manual"}
