"""A rolling restart of two daemons on one PostgreSQL, through ``triggerer run``, under a steady
Kafka flow: the stopped instance hands its Kafka partitions and its leases over as soon as its
watchers have committed and acked, while it still drains a run, and the other instance takes
them; started again, it shares the work once more. Every message is one event: nothing lost,
nothing doubled."""

from __future__ import annotations

import signal
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio
import pytest
from sqlalchemy import select

from tests.e2e.daemon import DaemonProcess, event_count, events_of, runs
from triggerer.service.store import models

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable
    from pathlib import Path

    from sqlalchemy.ext.asyncio import AsyncSession

    from tests.e2e.conftest import MakeDeployment
    from tests.e2e.daemon import Deployment

pytestmark = pytest.mark.slow  # two daemons, two restarts: minutes (make test-slow)

MESSAGES = 600
PIPELINES = """
    import time
    from pathlib import Path

    from triggerer import Asset, AssetWatcher, pipeline
    from watchers import FileTrigger, KafkaTrigger

    orders = Asset("orders", watchers=[AssetWatcher("orders_topic", KafkaTrigger(
        bootstrap_servers="{bootstrap}", topics=["{topic}"],
        session_timeout_ms=10000, heartbeat_interval_ms=1000))])
    # A trigger that runs on one instance at a time, under a lease.
    drops = Asset("drops", watchers=[AssetWatcher("drops_folder", FileTrigger(
        {drops!r}, poll_interval_s=0.2))])

    @pipeline(schedule=drops)
    def held(spark, context):
        Path({started!r}).touch()
        while Path({hold!r}).exists():  # the instance that runs it drains it while stopping
            time.sleep(0.2)
"""


@pytest.mark.parametrize("db_backend", ["postgresql"], indirect=True)
@pytest.mark.timeout(300)
async def test_a_rolling_restart_hands_work_over_and_loses_nothing(
    make_deployment: MakeDeployment, database_url: str, tmp_path: Path
) -> None:
    deployment = await make_deployment(database_url, partitions=2)
    drops, started, hold = tmp_path / "drops", tmp_path / "started", tmp_path / "hold"
    drops.mkdir()
    hold.touch()
    source = PIPELINES.replace("{drops!r}", repr(str(drops)))
    deployment.write_pipelines(
        source.replace("{started!r}", repr(str(started))).replace("{hold!r}", repr(str(hold)))
    )
    # Heartbeats of 15 s: a lease left to expire would move after 30 to 45 s, one given up
    # within one heartbeat (the other instance's next try). And a drain as long as the test
    # makes it: an instance that did not leave its consumer group would hold its partitions
    # (its consumer's heartbeat goes on) for all of it.
    settings = {
        "TRIGGERER_DAEMON__HEARTBEAT_INTERVAL_S": "15",
        "TRIGGERER_DAEMON__SHUTDOWN_GRACE_S": "600",
    }
    first = DaemonProcess(deployment.env(**settings), tmp_path / "first.log")
    second = DaemonProcess(deployment.env(**settings), tmp_path / "second.log")
    with first, second:
        first.start()
        await first.wait_logged("pipelines_loaded")
        (drops / "file-1").write_text("x")  # its run starts on the only instance
        await _until(started.exists)
        second.start()
        await second.wait_logged("pipelines_loaded")
        await second.wait_logged("kafka_partitions_assigned")  # the two share the partitions
        async with anyio.create_task_group() as flow:
            flow.start_soon(partial(deployment.produce, range(MESSAGES), batch=10, pause_s=0.05))
            await anyio.sleep(2)

            first.signal(signal.SIGTERM)
            stopped_at = anyio.current_time()
            # Still draining its run, the first instance has left: the second reads every
            # partition and runs the folder's trigger.
            [*_, assigned] = await _logged_with(second, "kafka_partitions_assigned", 2)
            took_partitions_s = anyio.current_time() - stopped_at
            await _until_async(lambda: _lease_owned_by_other(deployment, first), timeout_s=25)
            took_lease_s = anyio.current_time() - stopped_at
            assert first.process is not None
            assert first.process.poll() is None, "the first instance must still be draining"
            (drops / "file-2").write_text("x")
            await _until_async(lambda: _has_events(deployment, "drops", 2))

            hold.unlink()  # its run ends, and so does the first instance
            assert await first.wait(120) == 0, first.tail()
            before = len(await first.wait_logged("kafka_partitions_assigned"))
            first.start()  # the restart: the two share the partitions again
            await first.wait_logged("kafka_partitions_assigned", times=before + 1)

        await deployment.wait_for(
            lambda session: event_count(session, "orders"), lambda n: n >= MESSAGES
        )
        await anyio.sleep(2)  # anything doubled would have landed by now
        orders = await deployment.query(lambda session: events_of(session, "orders"))
        all_runs = await deployment.query(runs)

    sent = sorted(event.extra["payload"]["value"] for event in orders)
    assert sent == list(range(MESSAGES))
    assert len(assigned["partitions"]) == 2, assigned
    assert [r.state for r in all_runs] == ["success", "success"], all_runs
    print(f"partitions moved {took_partitions_s:.1f} s, lease {took_lease_s:.1f} s after SIGTERM")  # noqa: T201


async def _until(done: Callable[[], bool], timeout_s: float = 120) -> None:
    with anyio.fail_after(timeout_s):
        while not done():  # noqa: ASYNC110 - a file another process writes
            await anyio.sleep(0.1)


async def _until_async(done: Callable[[], Awaitable[bool]], timeout_s: float = 60) -> None:
    with anyio.fail_after(timeout_s):
        while not await done():  # noqa: ASYNC110 - rows other processes write
            await anyio.sleep(0.2)


async def _logged_with(daemon: DaemonProcess, event: str, partitions: int) -> list[dict[str, Any]]:
    """The records of ``event`` up to the first that names ``partitions`` partitions."""
    with anyio.fail_after(60):
        while True:
            records = await daemon.wait_logged(event)
            if len(records[-1]["partitions"]) == partitions:
                return records
            await anyio.sleep(0.2)


async def _lease_owned_by_other(deployment: Deployment, first: DaemonProcess) -> bool:
    assert first.process is not None
    pid = first.process.pid

    async def owner_pid(session: AsyncSession) -> int | None:
        return await session.scalar(
            select(models.Instance.pid)
            .join(models.Lease, models.Lease.owner == models.Instance.id)
            .where(models.Lease.name.startswith("trigger:"))
        )

    held_by = await deployment.query(owner_pid)
    return held_by is not None and held_by != pid


async def _has_events(deployment: Deployment, asset: str, count: int) -> bool:
    return await deployment.query(lambda session: event_count(session, asset)) >= count
