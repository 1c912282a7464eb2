"""Real ``triggerer run`` processes: kill -9 and SIGTERM while messages flow, and ``check``."""

from __future__ import annotations

import json
import signal
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import pytest
from aiokafka import AIOKafkaConsumer, TopicPartition

from tests.e2e.daemon import (
    DaemonProcess,
    consumed_by,
    daemon_env,
    event_count,
    events_of,
    kafka_asset_source,
    runs,
    settled,
    stat_fields,
    triggerer_cli,
)

if TYPE_CHECKING:
    from tests.e2e.conftest import MakeDeployment
    from tests.e2e.daemon import Deployment

MESSAGES = 5_000
PARTITIONS = 3
STOP_AFTER = 1_000
"""Events committed before the daemon is stopped: well inside the flow of ``MESSAGES``."""
GRACE_S = 20
LOADED_START_S = 90
"""How long a daemon may take to start (and a run to start and end) on a loaded machine."""
"""When ``triggerer check`` and recovery count an instance dead: 3 heartbeats of 0.5 s."""

STREAM = kafka_asset_source("stream")
"""Pipelines source head with the asset ``stream``, fed by the test's topic."""

TALLY = """
    @pipeline(schedule=stream, run_policy="coalesce", max_active_runs=4)
    def tally(spark, context):
        assert len(context.triggering_asset_events[stream]) > 0
"""


async def start_and_send_first(deployment: Deployment, daemon: DaemonProcess) -> None:
    """Start the daemon and, once it has loaded its pipelines, send the message ``{"i": 0}``."""
    daemon.start()
    await daemon.wait_logged("pipelines_loaded")
    await deployment.produce([{"i": 0}])


async def flow(deployment: Deployment, daemon: DaemonProcess, signum: int) -> int:
    """Start the daemon, send ``MESSAGES`` messages, send ``signum`` to the daemon once
    ``STOP_AFTER`` events are committed, wait for its exit and start it again.

    Returns the number of events committed when the signal was sent.
    """
    # The first message tells when the daemon consumes; the rest flows for a few seconds.
    await start_and_send_first(deployment, daemon)
    await deployment.wait_for(lambda s: event_count(s, "stream"), lambda n: n >= 1, timeout_s=60)
    async with anyio.create_task_group() as group:
        group.start_soon(
            partial(
                deployment.produce,
                ({"i": i} for i in range(1, MESSAGES)),
                batch=100,
                pause_s=0.1,
            )
        )
        committed = await deployment.wait_for(
            lambda s: event_count(s, "stream"),
            lambda n: n >= STOP_AFTER,
            timeout_s=60,
        )
        daemon.signal(signum)
        code = await daemon.wait(GRACE_S + 10)
        assert code == (-signal.SIGKILL if signum == signal.SIGKILL else 0), daemon.tail()
        assert committed < MESSAGES
        if signum == signal.SIGTERM:
            logged = await anyio.Path(daemon.log_path).read_text()
            assert '"shutdown_complete"' in logged, daemon.tail()
            # Every stored event's message was acked before the last offset commit: a restart
            # delivers none of them again.
            stored = await deployment.query(lambda s: event_count(s, "stream"))
            assert await committed_offsets(deployment) == stored
        # At once: runs the stopped instance left behind are recovered by the new one.
        daemon.start()
    return committed


async def committed_offsets(deployment: Deployment) -> int:
    """The sum over the topic's partitions of the offsets committed in the group the daemon
    reads the topic in, as ``triggerer watchers list`` names it."""
    listed = await triggerer_cli(deployment.env(), "watchers", "list", "--json")
    [group] = {row["consumer_group"] for row in json.loads(listed.stdout)}
    consumer = AIOKafkaConsumer(bootstrap_servers=deployment.bootstrap, group_id=group)
    await consumer.start()
    try:
        offsets = [
            await consumer.committed(TopicPartition(deployment.topic, partition))
            for partition in range(PARTITIONS)
        ]
    finally:
        await consumer.stop()
    return sum(offset or 0 for offset in offsets)


async def assert_exactly_once(deployment: Deployment, daemon: DaemonProcess) -> None:
    """Every message is one event, and every event is consumed by exactly one run."""
    await deployment.wait_for(
        lambda s: event_count(s, "stream"),
        lambda n: n >= MESSAGES,
        timeout_s=120,
    )
    await deployment.wait_for(lambda s: settled(s, "tally"), lambda r: r == (0, 0), timeout_s=120)
    events = await deployment.query(lambda s: events_of(s, "stream"))
    assert len(events) == MESSAGES, daemon.tail()
    assert len({e.dedup_key for e in events}) == MESSAGES
    assert sorted(e.extra["payload"]["value"]["i"] for e in events) == list(range(MESSAGES))
    consumed = await deployment.query(lambda s: consumed_by(s, "tally"))
    assert len(consumed) == MESSAGES
    assert set(consumed) == {e.id for e in events}
    tally_runs = [r for r in await deployment.query(runs) if r.pipeline_id == "tally"]
    assert {r.state for r in tally_runs} == {"success"}


@pytest.mark.timeout(300)
@pytest.mark.parametrize("db_backend", ["postgresql", "sqlite"], indirect=True)
async def test_kill_9_while_messages_flow_loses_nothing_and_duplicates_nothing(
    database_url: str, make_deployment: MakeDeployment
) -> None:
    deployment = await make_deployment(database_url, partitions=PARTITIONS)
    deployment.write_pipelines(STREAM + TALLY)
    with deployment.process() as daemon:
        await flow(deployment, daemon, signal.SIGKILL)
        await assert_exactly_once(deployment, daemon)


COPY = """
    copy = Asset("copy", watchers=[AssetWatcher("copy_topic", KafkaTrigger(
        bootstrap_servers="{bootstrap}", topics=["{topic}"], session_timeout_ms=6000,
        heartbeat_interval_ms=1000, max_attempts=5))])
"""
"""A second watcher of the topic, with other options: it shares the daemon's consumer."""


@pytest.mark.timeout(300)
@pytest.mark.parametrize("db_backend", ["postgresql"], indirect=True)
async def test_kill_9_while_two_watchers_share_the_topic_loses_nothing_for_either(
    database_url: str, make_deployment: MakeDeployment
) -> None:
    deployment = await make_deployment(database_url, partitions=PARTITIONS)
    deployment.write_pipelines(STREAM + COPY + TALLY)
    with deployment.process() as daemon:
        await flow(deployment, daemon, signal.SIGKILL)
        await assert_exactly_once(deployment, daemon)
        await deployment.wait_for(
            lambda s: event_count(s, "copy"), lambda n: n >= MESSAGES, timeout_s=60
        )
    copies = await deployment.query(lambda s: events_of(s, "copy"))
    assert sorted(e.extra["payload"]["value"]["i"] for e in copies) == list(range(MESSAGES))


@pytest.mark.timeout(300)
@pytest.mark.parametrize("db_backend", ["sqlite"], indirect=True)
async def test_sigterm_drains_and_a_restart_loses_nothing(
    database_url: str, make_deployment: MakeDeployment
) -> None:
    deployment = await make_deployment(database_url, partitions=PARTITIONS)
    deployment.write_pipelines(STREAM + TALLY)
    with deployment.process(TRIGGERER_DAEMON__SHUTDOWN_GRACE_S=str(GRACE_S)) as daemon:
        await flow(deployment, daemon, signal.SIGTERM)
        await assert_exactly_once(deployment, daemon)


@pytest.mark.timeout(300)
@pytest.mark.parametrize("db_backend", ["sqlite"], indirect=True)
async def test_check_passes_while_the_daemon_runs_and_fails_once_it_stopped(
    tmp_path: Path, database_url: str
) -> None:
    (tmp_path / "pipelines").mkdir()
    env = daemon_env(tmp_path, database_url, "sc://127.0.0.1:1")
    with DaemonProcess(env, tmp_path / "daemon.log") as daemon:
        daemon.start()
        # Generous: a daemon starting on a loaded machine (a CPU burner, the suite's other
        # workers) took over 30 s once.
        with anyio.fail_after(LOADED_START_S):
            while (await triggerer_cli(env, "check")).returncode != 0:
                assert daemon.process is not None
                assert daemon.process.poll() is None, daemon.tail()
        daemon.signal(signal.SIGTERM)
        assert await daemon.wait(GRACE_S) == 0, daemon.tail()
        # Its last heartbeat was written on the way out; it turns stale after 3 intervals.
        with anyio.fail_after(15):
            while (checked := await triggerer_cli(env, "check")).returncode == 0:
                pass
    assert checked.returncode == 1
    assert b"stale" in checked.stdout


SLOW = """
    import os
    import time

    done = Asset("done")

    @pipeline(schedule=stream, outlets=[done])
    def slow(spark, context):
        print("run process", os.getpid(), flush=True)
        time.sleep(3)
        yield Metadata(done, {{"rows": spark.range(5).count()}})
"""


def running(pid: int) -> bool:
    """Whether process ``pid`` exists and is not a zombie waiting to be reaped."""
    try:
        state = stat_fields(Path(f"/proc/{pid}/stat"))[0]
    except (OSError, IndexError):
        return False
    return state != "Z"


async def start_with_a_running_run(deployment: Deployment, daemon: DaemonProcess) -> None:
    """Start the daemon with the ``SLOW`` pipelines and wait until its run is running."""
    await start_and_send_first(deployment, daemon)
    await deployment.wait_for(runs, lambda rs: [r.state for r in rs] == ["running"])


@pytest.mark.parametrize("db_backend", ["sqlite"], indirect=True)
async def test_sigterm_records_a_run_that_ends_within_the_grace_period(
    database_url: str, make_deployment: MakeDeployment
) -> None:
    deployment = await make_deployment(database_url)
    deployment.write_pipelines(STREAM + SLOW)
    # A grace a busy machine's run needs: its process and Spark session start, then 3 s.
    grace_s = 90
    with deployment.process(TRIGGERER_DAEMON__SHUTDOWN_GRACE_S=str(grace_s)) as daemon:
        await start_with_a_running_run(deployment, daemon)
        await daemon.wait_logged("run_started")
        daemon.signal(signal.SIGTERM)
        assert await daemon.wait(grace_s + 10) == 0, daemon.tail()
    (run,) = await deployment.query(runs)
    assert run.state == "success", daemon.tail()
    assert [e.extra for e in await deployment.query(lambda s: events_of(s, "done"))] == [
        {"rows": 5}
    ]


@pytest.mark.timeout(300)
@pytest.mark.parametrize("db_backend", ["sqlite"], indirect=True)
async def test_killed_daemon_runs_run_again_after_an_immediate_restart(
    database_url: str, make_deployment: MakeDeployment
) -> None:
    deployment = await make_deployment(database_url)
    deployment.write_pipelines(STREAM + SLOW)
    # Heartbeats every 2 s: the restart below surely comes before the instance is 6 s stale.
    with deployment.process(TRIGGERER_DAEMON__HEARTBEAT_INTERVAL_S="2") as daemon:
        await start_with_a_running_run(deployment, daemon)
        (started,) = await deployment.query(runs)
        folder = deployment.tmp_path / "logs" / started.pipeline_id / started.run_id
        log = anyio.Path(folder / f"try-{started.try_number}.log")
        with anyio.fail_after(30):
            while not await log.exists() or "run process" not in (text := await log.read_text()):  # noqa: ASYNC110
                await anyio.sleep(0.05)
        run_pid = int(text.split("run process", 1)[1].split()[0])
        daemon.signal(signal.SIGKILL)
        assert await daemon.wait(10) == -signal.SIGKILL
        # The run's process went with the daemon (and its run forker), not on unrecorded.
        with anyio.fail_after(10):
            while running(run_pid):  # noqa: ASYNC110  # a process of its own
                await anyio.sleep(0.05)
        daemon.start()
        # Long enough for a dead instance's runs to be taken over after it turned stale, and
        # for the run to start and finish on a loaded machine.
        finished = await deployment.wait_for(
            runs,
            lambda rs: [r.state for r in rs] == ["success"],
            timeout_s=LOADED_START_S,
        )
    assert finished[0].try_number == 1
    assert [e.extra for e in await deployment.query(lambda s: events_of(s, "done"))] == [
        {"rows": 5}
    ]
