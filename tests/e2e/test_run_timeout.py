"""A pipeline's ``timeout_s``, through ``triggerer run --config``: a run that outlives it is
stopped (its process gone), the try fails naming the timeout, and ``retries`` apply. The run's
spec is readable by its owner alone and gone when the try ends."""

from __future__ import annotations

import os
import stat
from typing import TYPE_CHECKING

import anyio
import pytest

from tests.e2e.daemon import ORDERS, alive, runs, triggerer_cli

if TYPE_CHECKING:
    from pathlib import Path

    from tests.e2e.daemon import Deployment

pytestmark = pytest.mark.slow  # waits out a run's timeout: make test-slow

SLOW = """
    import os, time
    from pathlib import Path

    # Long enough for a try to reach the pipeline on a busy machine (the timeout counts its
    # start too).
    @pipeline(schedule=orders, timeout_s=15, retries=1, retry_delay_s=0)
    def slow(spark, context):
        Path({pids!r}, str(os.getpid())).touch()  # which process each try ran in
        time.sleep(300)
"""


@pytest.mark.timeout(240)
async def test_a_run_past_its_timeout_is_stopped_and_retried(
    deployment: Deployment, tmp_path: Path
) -> None:
    pids = tmp_path / "pids"
    pids.mkdir()
    deployment.write_pipelines(ORDERS + SLOW.replace("{pids!r}", repr(str(pids))))
    config = deployment.config_file()
    with deployment.process_with_config(config) as daemon:
        daemon.start()
        await daemon.wait_logged("pipelines_loaded")
        await deployment.produce([{"n": 1}])
        with anyio.fail_after(120):
            while not os.listdir(pids):  # noqa: ASYNC110 - the first try's pipeline has begun
                await anyio.sleep(0.1)
        [spec] = (tmp_path / "logs" / "slow").glob("*/spec.json")
        spec_mode = stat.S_IMODE(spec.stat().st_mode)
        [run] = await deployment.wait_for(
            runs, lambda rows: [r.state for r in rows] == ["failed"], timeout_s=180
        )
        timed_out = await daemon.wait_logged("run_timed_out", times=2)
        explained = await triggerer_cli(daemon.env, "explain", "slow", "--config", str(config))

    assert run.try_number == 2, daemon.tail()  # the first try timed out, and its retry too
    assert run.error is not None
    assert run.error.startswith("timed out after 15 s (timeout_s)"), run.error
    assert [record["timeout_s"] for record in timed_out] == [15, 15]
    tries = [int(name) for name in os.listdir(pids)]
    assert len(tries) == 2
    assert not any(alive(pid) for pid in tries)  # each try's process was stopped
    assert explained.returncode == 0, explained.stderr
    # The explanation names the timeout that ended the last run.
    assert f"last run {run.run_id} failed (try 2 of 2): timed out after 15 s (timeout_s)" in (
        explained.stdout.decode()
    )
    assert spec_mode == 0o600
    assert not spec.exists()
