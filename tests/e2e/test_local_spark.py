"""The embedded default, ``[spark] mode = "local"``, through ``triggerer run``: the daemon keeps
one Spark Connect server warm on loopback and every run is a client of it; killed, the server is
started again and runs go on; a pipeline that needs classic Spark fails naming the mode that has
it; runs are forks of a run forker, a new one after the server's restart; SIGTERM leaves no
server or forker behind. A local Spark (the server, or a classic run's JVM) listens on loopback
only, and no run's log holds PySpark's warning about pandas 3."""

from __future__ import annotations

import ipaddress
import os
import signal
import socket
from pathlib import Path

import anyio
import pytest

from tests.e2e.daemon import (
    DaemonProcess,
    alive,
    daemon_env,
    events_of,
    local_config,
    query,
    runs,
    sqlite_url,
    stat_fields,
    triggerer_cli,
    wait_for,
    without_triggerer_variables,
    write_pipelines,
)

# Minutes of Spark and processes: make test-slow.
pytestmark = [pytest.mark.slow, pytest.mark.timeout(300)]

START_TIMEOUT_S = 180.0
"""A JVM's start on 2 busy cores, and the first job of a cold server."""
WEB_UI = {"spark.ui.enabled": "true"}
"""Spark's web UI on: it listens too."""

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


def listening(root_pid: int) -> dict[tuple[str, int], int]:
    """The TCP sockets in LISTEN state of process ``root_pid`` and its descendants: the pid
    owning each ``(address, port)``."""
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            children.setdefault(int(stat_fields(stat)[1]), []).append(int(stat.parent.name))
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
    owners: dict[str, int] = {}
    pids = [root_pid]
    while pids:
        pid = pids.pop()
        pids += children.get(pid, [])
        try:
            descriptors = list(Path(f"/proc/{pid}/fd").iterdir())
        except OSError:
            continue
        for descriptor in descriptors:
            try:
                target = os.readlink(descriptor)
            except OSError:
                continue
            if target.startswith("socket:["):
                owners[target.removeprefix("socket:[").removesuffix("]")] = pid
    found = {}
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        for line in Path(f"/proc/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A" or fields[9] not in owners:  # 0A: LISTEN
                continue
            address, port = fields[1].split(":")
            raw = bytes.fromhex(address)  # 32-bit words in host (little-endian) order
            packed = b"".join(raw[at : at + 4][::-1] for at in range(0, len(raw), 4))
            found[socket.inet_ntop(family, packed), int(port, 16)] = owners[fields[9]]
    return found


def beyond_loopback(sockets: dict[tuple[str, int], int]) -> list[tuple[str, int]]:
    beyond = []
    for address, port in sockets:
        ip = ipaddress.ip_address(address)
        if not (getattr(ip, "ipv4_mapped", None) or ip).is_loopback:
            beyond.append((address, port))
    return beyond


async def test_the_local_connect_server_listens_on_loopback_only(tmp_path: Path) -> None:
    """Was: its driver and block manager listened on the machine's external address, its web
    UI on every address; and every run's log began with PySpark's FutureWarning about pandas."""
    write_pipelines(tmp_path / "pipelines", PIPELINES)
    config = local_config(tmp_path, "local", conf=WEB_UI)
    env, url = without_triggerer_variables(), sqlite_url(tmp_path)
    with DaemonProcess(env, tmp_path / "daemon.log", config) as daemon:
        daemon.start()
        [ready] = await daemon.wait_logged("spark_server_ready", START_TIMEOUT_S)
        await trigger(env | {"TRIGGERER_CONFIG": str(config)}, "count")
        assert await ended(url, 1) == {"count": ["success"]}
        assert daemon.process is not None
        sockets = listening(daemon.process.pid)

    server = {where for where, pid in sockets.items() if pid == ready["pid"]}
    # The Connect server, the driver, its block manager and its web UI.
    assert len(server) >= 4, sockets
    assert beyond_loopback(sockets) == [], sockets
    [run] = await query(url, runs)
    assert "FutureWarning" not in await anyio.Path(run.log_path).read_text()
    assert "FutureWarning" not in daemon.log_path.read_text()  # the run forker's output


HELD = """
import pathlib
import time

from triggerer import pipeline

@pipeline()
def held(spark, context):
    spark.range(10).count()
    pathlib.Path({ready!r}).touch()
    while not pathlib.Path({release!r}).exists():  # the test looks at the JVM meanwhile
        time.sleep(0.05)
"""


async def test_a_classic_run_on_a_local_master_listens_on_loopback_only(tmp_path: Path) -> None:
    """Was: the run's JVM listened on the machine's external address, as the server did."""
    ready, release = tmp_path / "ready", tmp_path / "release"
    write_pipelines(tmp_path / "pipelines", HELD.format(ready=str(ready), release=str(release)))
    config = local_config(tmp_path, "classic", conf=WEB_UI, master="local[1]")
    env, url = without_triggerer_variables(), sqlite_url(tmp_path)
    with DaemonProcess(env, tmp_path / "daemon.log", config) as daemon:
        daemon.start()
        await daemon.wait_logged("pipelines_loaded")
        await trigger(env | {"TRIGGERER_CONFIG": str(config)}, "held")
        with anyio.fail_after(START_TIMEOUT_S):
            while not await anyio.Path(ready).exists():  # noqa: ASYNC110
                await anyio.sleep(0.1)
        assert daemon.process is not None
        sockets = listening(daemon.process.pid)
        release.touch()
        assert await ended(url, 1) == {"held": ["success"]}

    # The driver, its block manager, its web UI and the py4j gateway.
    assert len(sockets) >= 4, sockets
    assert beyond_loopback(sockets) == [], sockets
    [run] = await query(url, runs)
    assert "FutureWarning" not in await anyio.Path(run.log_path).read_text()


def run_forkers(daemon_pid: int) -> list[int]:
    """The run forker processes the daemon started."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            parent = int(stat_fields(stat)[1])
            command = (stat.parent / "cmdline").read_bytes()
        except (OSError, IndexError, ValueError):
            continue  # gone meanwhile
        if parent == daemon_pid and b"triggerer.service.runs.forker" in command:
            found.append(int(stat.parent.name))
    return found
