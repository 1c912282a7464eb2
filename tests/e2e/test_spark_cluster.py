"""Runs on a standalone Spark cluster, through ``submit`` and ``connect``, with the daemon
started the way a service manager starts it: its virtualenv not on PATH.

``pytest -m spark_cluster`` runs these alone.
"""

from __future__ import annotations

import json
import os
import signal
import sys
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

import anyio
import pytest

from tests.e2e.daemon import (
    DaemonProcess,
    daemon_env,
    events_of,
    query,
    runs,
    sqlite_url,
    triggerer_cli,
    wait_for,
    write_pipelines,
)

if TYPE_CHECKING:
    from tests.fixtures.spark import SparkCluster

pytestmark = [pytest.mark.slow, pytest.mark.spark_cluster, pytest.mark.timeout(300)]

RUN_TIMEOUT_S = 180.0
"""A run on the cluster: spark-submit's JVM, an executor on the worker, a job; on 2 busy cores."""
ORPHAN_TIMEOUT_S = 30.0
"""How long the processes and the cluster application of a run may outlive its daemon."""

SERVICE_PATH = "/usr/bin:/bin"
"""PATH of a daemon a service manager starts: no virtualenv, no pyspark, no triggerer on it."""

COUNT = """
    import sys

    from triggerer import Asset, Metadata, pipeline

    counted = Asset("counted")

    @pipeline(outlets=[counted])
    def count_on_the_cluster(spark, context):
        # Which Python the executors run: only submit mode sets it (connect's is the server's).
        pythons = (
            spark.range(2).rdd.map(lambda _: sys.executable).distinct().collect()
            if {submit} else []
        )
        yield Metadata(counted, {{
            "count": spark.range(10).count(),
            "master": spark.conf.get("spark.master"),
            "executor_pythons": pythons,
        }})
"""

HOLD = """
    import pathlib
    import time

    from triggerer import pipeline

    @pipeline()
    def hold(spark, context):
        # Its session is up: the run is an application of the cluster, with an executor.
        pathlib.Path({marker!r}).write_text(context.run_id)
        time.sleep(600)  # until the test kills the daemon
"""


def service_env(tmp_path: Path, **spark: str) -> dict[str, str]:
    """A daemon's environment as a service manager gives it: PATH without the virtualenv, no
    VIRTUAL_ENV, no Spark or PySpark variables; ``spark`` sets ``[spark]`` keys."""
    env = daemon_env(tmp_path, sqlite_url(tmp_path), "")
    env = {
        name: value
        for name, value in env.items()
        if name not in ("VIRTUAL_ENV", "TRIGGERER_SPARK__REMOTE")
        and not name.startswith(("SPARK_", "PYSPARK_"))
    }
    overrides = {f"TRIGGERER_SPARK__{key.upper()}": value for key, value in spark.items()}
    return env | {"PATH": SERVICE_PATH} | overrides


async def run_once(tmp_path: Path, env: dict[str, str], pipeline_id: str) -> DaemonProcess:
    """Start the daemon and queue one manual run of ``pipeline_id``."""
    daemon = DaemonProcess(env, tmp_path / "daemon.log")
    daemon.start()
    await daemon.wait_logged("pipelines_loaded")
    triggered = await triggerer_cli(env, "pipelines", "trigger", pipeline_id)
    assert triggered.returncode == 0, triggered.stderr
    return daemon


async def counted_extra(tmp_path: Path, daemon: DaemonProcess) -> dict[str, object]:
    """The extra of the outlet event of the one run, once it succeeded."""
    url = sqlite_url(tmp_path)
    try:
        done = await wait_for(
            url, runs, lambda rs: rs[0].state in ("success", "failed"), timeout_s=RUN_TIMEOUT_S
        )
    except TimeoutError:
        pytest.fail(f"no run ended{daemon.tail()}")
    run_log = (await anyio.Path(done[0].log_path).read_text(errors="replace"))[-3000:]
    assert done[0].state == "success", f"{done[0].error}\n{run_log}"
    events = await query(url, lambda s: events_of(s, "counted"))
    assert len(events) == 1
    return events[0].extra


async def test_submit_runs_on_the_cluster_with_the_daemons_python(
    tmp_path: Path, spark_cluster: SparkCluster
) -> None:
    write_pipelines(tmp_path / "pipelines", COUNT.format(submit=True))
    env = service_env(
        tmp_path,
        mode="submit",
        master=spark_cluster.master,
        conf=json.dumps({"spark.executor.memory": "512m"}),
    )
    with await run_once(tmp_path, env, "count_on_the_cluster") as daemon:
        extra = await counted_extra(tmp_path, daemon)

    assert extra == {
        "count": 10,
        "master": spark_cluster.master,
        "executor_pythons": [sys.executable],
    }


async def test_connect_runs_on_the_cluster(
    tmp_path: Path, spark_cluster: SparkCluster, spark_cluster_remote: str
) -> None:
    write_pipelines(tmp_path / "pipelines", COUNT.format(submit=False))
    env = service_env(tmp_path, mode="connect", remote=spark_cluster_remote)
    with await run_once(tmp_path, env, "count_on_the_cluster") as daemon:
        extra = await counted_extra(tmp_path, daemon)

    assert extra == {"count": 10, "master": spark_cluster.master, "executor_pythons": []}


async def test_kill_9_of_the_daemon_ends_its_submit_run_on_the_cluster(
    tmp_path: Path, spark_cluster: SparkCluster
) -> None:
    marker = tmp_path / "holding"
    write_pipelines(tmp_path / "pipelines", HOLD.format(marker=str(marker)))
    env = service_env(tmp_path, mode="submit", master=spark_cluster.master)
    with await run_once(tmp_path, env, "hold") as daemon:
        with anyio.fail_after(RUN_TIMEOUT_S):
            while not marker.exists():
                assert daemon.process is not None
                assert daemon.process.poll() is None, f"triggerer exited{daemon.tail()}"
                await anyio.sleep(0.2)
        run_id = marker.read_text()
        assert daemon.process is not None
        tree = descendants(daemon.process.pid)
        # spark-submit's JVM, and the runner it started: the JVM's child, tied to it.
        assert {"java", "python"} <= set(tree.values()), tree
        assert run_id in spark_cluster.active_apps()

        daemon.signal(signal.SIGKILL)
        await daemon.wait(10)

        assert await settled(lambda: running(tree), ORPHAN_TIMEOUT_S) == {}
        # The cluster lets go of the run's executor once its driver is gone.
        assert run_id not in await settled(spark_cluster.active_apps, ORPHAN_TIMEOUT_S)


# -- waiting for processes to end ---------------------------------------------------------------

T = TypeVar("T")


async def settled(probe: Callable[[], T], timeout_s: float) -> T:
    """What ``probe()`` gives once it is empty, or after ``timeout_s``."""
    with anyio.move_on_after(timeout_s):
        while True:
            if not (value := probe()):
                return value
            await anyio.sleep(0.2)
    return probe()


def _stat(pid: int) -> tuple[str, str, int] | None:
    """(comm, state, parent pid) of a process, from /proc; None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    comm, _, rest = text.partition(" (")[2].rpartition(") ")
    state, ppid = rest.split()[:2]
    return comm, state, int(ppid)


def descendants(pid: int) -> dict[int, str]:
    """Every process below ``pid``: pid → command name."""
    parents: dict[int, tuple[str, int]] = {}
    for entry in os.listdir("/proc"):
        stat = _stat(int(entry)) if entry.isdigit() else None
        if stat is not None:
            parents[int(entry)] = (stat[0], stat[2])
    found: dict[int, str] = {}
    frontier = {pid}
    while frontier:
        children = {p for p, (_, ppid) in parents.items() if ppid in frontier}
        found |= {p: parents[p][0] for p in children}
        frontier = children
    return found


def running(processes: dict[int, str]) -> dict[int, str]:
    """Those of ``processes`` that still run; a zombie has ended (PID 1 of a container may
    never reap the orphans it inherits)."""
    return {
        pid: comm
        for pid, comm in processes.items()
        if (stat := _stat(pid)) is not None and stat[1] != "Z"
    }
