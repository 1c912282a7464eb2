"""The embedded default, ``[spark] mode = "local"``, through ``triggerer run``: the daemon keeps
one Spark Connect server warm on loopback and every run is a client of it; killed, the server is
started again and runs go on; a pipeline that needs classic Spark fails naming the mode that has
it; runs are forks of a run forker, a new one after the server's restart; SIGTERM leaves no
server or forker behind."""

from __future__ import annotations

import os
import signal
from pathlib import Path

import anyio
import pytest

from tests.e2e.daemon import (
    DaemonProcess,
    alive,
    daemon_env,
    events_of,
    query,
    runs,
    sqlite_url,
    stat_fields,
    triggerer_cli,
    wait_for,
    write_pipelines,
)

pytestmark = pytest.mark.timeout(300)

START_TIMEOUT_S = 180.0
"""A JVM's start on 2 busy cores, and the first job of a cold server."""

PIPELINES = """
from triggerer import Asset, Metadata, pipeline

counted = Asset("counted")

@pipeline(outlets=[counted])
def count(spark, context):
    yield Metadata(counted, {"count": spark.range(10).count()})

@pipeline()
def needs_classic(spark, context):
    spark.sparkContext.parallelize([1]).count()
"""


def local_env(tmp_path: Path) -> dict[str, str]:
    """The daemon's environment with the default Spark mode: no server given to it."""
    env = daemon_env(tmp_path, sqlite_url(tmp_path), "", TRIGGERER_SPARK__MODE="local")
    del env["TRIGGERER_SPARK__REMOTE"]
    return env


async def trigger(env: dict[str, str], pipeline_id: str) -> None:
    triggered = await triggerer_cli(env, "pipelines", "trigger", pipeline_id)
    assert triggered.returncode == 0, triggered.stderr


async def ended(url: str, count: int) -> dict[str, list[str]]:
    """Once ``count`` runs ended: the states of each pipeline's runs."""
    done = await wait_for(
        url,
        runs,
        lambda rs: sum(r.state in ("success", "failed") for r in rs) >= count,
        timeout_s=START_TIMEOUT_S,
    )
    by_pipeline: dict[str, list[str]] = {}
    for run in done:
        by_pipeline.setdefault(run.pipeline_id, []).append(run.state)
    return by_pipeline


async def test_runs_use_the_daemons_warm_connect_server_which_is_restarted_and_stopped(
    tmp_path: Path,
) -> None:
    write_pipelines(tmp_path / "pipelines", PIPELINES)
    env, url = local_env(tmp_path), sqlite_url(tmp_path)
    with DaemonProcess(env, tmp_path / "daemon.log") as daemon:
        daemon.start()
        [first] = await daemon.wait_logged("spark_server_ready", START_TIMEOUT_S)
        assert first["remote"].startswith("sc://localhost:")
        for pipeline_id in ("count", "count", "needs_classic"):
            await trigger(env, pipeline_id)
        assert await ended(url, 3) == {"count": ["success"] * 2, "needs_classic": ["failed"]}
        events = await query(url, lambda s: events_of(s, "counted"))
        assert [event.extra for event in events] == [{"count": 10}] * 2
        [classic] = [run for run in await query(url, runs) if run.pipeline_id == "needs_classic"]
        classic_log = await anyio.Path(classic.log_path).read_text()
        assert "Pipeline 'needs_classic' uses what only classic Spark has" in classic_log
        assert '[spark] mode = "classic"' in classic_log

        # The server dies: it is started again, on a port of its own, and runs go on.
        os.kill(first["pid"], signal.SIGKILL)
        await daemon.wait_logged("spark_server_exited")
        second = (await daemon.wait_logged("spark_server_ready", START_TIMEOUT_S, times=2))[1]
        assert second["pid"] != first["pid"]
        await trigger(env, "count")
        assert (await ended(url, 4))["count"] == ["success"] * 3
        # That run needed the new server's token: a new run forker forked it, and the one of
        # before, its runs ended, is gone.
        assert daemon.process is not None
        with anyio.fail_after(30):
            while len(forkers := run_forkers(daemon.process.pid)) != 1:  # noqa: ASYNC110
                await anyio.sleep(0.1)

        daemon.signal(signal.SIGTERM)
        assert await daemon.wait(60) == 0
    assert not alive(first["pid"])
    assert not alive(second["pid"])
    assert not alive(forkers[0])


def run_forkers(daemon_pid: int) -> list[int]:
    """The run forker processes the daemon started."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat_fields(stat)[1])
            command = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        if parent == daemon_pid and b"triggerer.run_forker" in command:
            found.append(int(stat.parent.name))
    return found
