"""Conditions with time in them through ``triggerer run --config FILE``, on SQLite and
PostgreSQL: a windowed AND, a batch (at its size, at its deadline, and across a restart in the
middle of its window), a debounce, and a reset missed while no daemon ran.

Events come as users send them: messages on a Kafka topic (those that must arrive together
or close together), ``triggerer events emit`` against the daemon's config (the others). Each
time the test checks is a time the daemon stored (an event's timestamp, a run's creation), so a
busy machine makes it slower, not wrong.
"""

from __future__ import annotations

import json
from datetime import timedelta
from typing import TYPE_CHECKING

import anyio
import httpx
import pytest
from sqlalchemy import select, update

from tests.e2e.daemon import DaemonProcess, triggerer_cli
from tests.e2e.test_api import api_url
from triggerer.service.store import models

if TYPE_CHECKING:
    from pathlib import Path

    from sqlalchemy.ext.asyncio import AsyncSession

    from tests.e2e.conftest import MakeDeployment
    from tests.e2e.daemon import Deployment

WINDOW_S = 6
BATCH_WAIT_S = 8
DEBOUNCE_S = 4
TIMEOUT_S = 90.0

PIPELINES = (
    """
from datetime import timedelta

from triggerer import Asset, AssetAll, AssetWatcher, Batch, pipeline
from watchers import KafkaTrigger


def fed(name):  # the asset, fed by the messages of the test's topic that name it
    return Asset(name, watchers=[AssetWatcher(f"{{name}}_feed", KafkaTrigger(
        bootstrap_servers="{bootstrap}", topics=["{topic}"], group_id=f"{topic}-{{name}}",
        filter={{"path": "$.value.asset", "equals": name}},
        session_timeout_ms=6000, heartbeat_interval_ms=1000))])


orders, customers, clicks, edits = fed("orders"), fed("customers"), fed("clicks"), fed("edits")
left, right = Asset("left"), Asset("right")


@pipeline(schedule=(orders & customers).within(timedelta(seconds=WINDOW_S)))
def paired(spark, context):
    pass


@pipeline(schedule=clicks, batch=Batch(max_events=3, max_wait_s=BATCH_WAIT_S))
def batched(spark, context):
    pass


@pipeline(schedule=edits, debounce_s=DEBOUNCE_S)
def debounced(spark, context):
    pass


@pipeline(schedule=AssetAll(left, right, reset="0 0 * * *"))
def daily_pair(spark, context):
    pass
""".replace("WINDOW_S", str(WINDOW_S))
    .replace("BATCH_WAIT_S", str(BATCH_WAIT_S))
    .replace("DEBOUNCE_S", str(DEBOUNCE_S))
)


class Triggerer:
    """The ``triggerer`` command on the test's config file."""

    def __init__(self, deployment: Deployment, config: Path) -> None:
        self._env = {k: v for k, v in deployment.env().items() if not k.startswith("TRIGGERER_")}
        self._config = str(config)

    async def __call__(self, *arguments: str) -> str:
        done = await triggerer_cli(self._env, "--config", self._config, *arguments)
        assert done.returncode == 0, (arguments, done.stderr.decode())
        return done.stdout.decode()

    async def explain_until(self, pipeline_id: str, text: str) -> str:
        """``triggerer explain PIPELINE`` once it says ``text``."""
        with anyio.fail_after(TIMEOUT_S):
            while True:
                explained = await self("explain", pipeline_id)
                if text in explained:
                    return explained
                await anyio.sleep(0.5)

    async def emit(self, asset: str, count: int = 1) -> None:
        for _ in range(count):
            await self("events", "emit", asset)


async def runs_of(session: AsyncSession, pipeline_id: str) -> list[tuple[models.Run, list[int]]]:
    """The pipeline's runs, oldest first, each with the ids of the events it consumed."""
    runs = list(
        await session.scalars(
            select(models.Run).where(models.Run.pipeline_id == pipeline_id).order_by(models.Run.id)
        )
    )
    consumed = {run.id: [] for run in runs}
    for run_pk, event_id in await session.execute(
        select(models.RunEvent.run_pk, models.RunEvent.event_id)
        .where(models.RunEvent.pipeline_id == pipeline_id)
        .order_by(models.RunEvent.event_id)
    ):
        if run_pk in consumed:  # not a run committed after the first read
            consumed[run_pk].append(event_id)
    return [(run, consumed[run.id]) for run in runs]


async def events_on(session: AsyncSession, asset: str) -> list[models.AssetEvent]:
    return list(
        await session.scalars(
            select(models.AssetEvent)
            .join(models.Asset, models.Asset.id == models.AssetEvent.asset_id)
            .where(models.Asset.name == asset)
            .order_by(models.AssetEvent.id)
        )
    )


async def queued_for(session: AsyncSession, pipeline_id: str) -> list[int]:
    return list(
        await session.scalars(
            select(models.QueuedEvent.event_id)
            .where(models.QueuedEvent.pipeline_id == pipeline_id)
            .order_by(models.QueuedEvent.event_id)
        )
    )


async def wait_runs(deployment: Deployment, pipeline_id: str, count: int) -> list[tuple]:
    return await deployment.wait_for(
        lambda session: runs_of(session, pipeline_id),
        lambda runs: len(runs) >= count,
        timeout_s=TIMEOUT_S,
    )


@pytest.mark.timeout(300)
async def test_windows_batches_debounce_and_resets_through_the_daemon(
    make_deployment: MakeDeployment, database_url: str
) -> None:
    deployment = await make_deployment(database_url)
    deployment.write_pipelines(PIPELINES)
    config = deployment.config_file(api={"enabled": True, "port": 0})
    triggerer = Triggerer(deployment, config)
    daemon = deployment.process_with_config(config)
    with daemon:
        daemon.start()
        await daemon.wait_logged("pipelines_loaded")
        await daemon.wait_logged("api_listening")
        # The REST API tries the schedule on events given in advance.
        async with httpx.AsyncClient(base_url=api_url(daemon), timeout=30) as client:
            answer = await client.post(
                "/pipelines/paired/simulate",
                json=[
                    {"asset": "orders", "at": "2026-01-01T00:00:00+00:00"},
                    {"asset": "customers", "at": "2026-01-01T00:00:03+00:00"},
                    {"asset": "orders", "at": "2026-01-01T01:00:00+00:00"},
                ],
            )
            assert answer.status_code == 200, answer.text
            simulated = answer.json()
            assert [run["events"] for run in simulated["runs"]] == [[0, 1]]
            assert simulated["expired"] == [2]
            refused = await client.post("/pipelines/paired/simulate", json=[{"asset": "orders"}])
            assert refused.status_code == 422
            assert "event 0: 'at' must be an ISO time" in refused.json()["detail"]
        await deployment.wait_for(
            _watcher_states, lambda states: states == {"running"}, timeout_s=TIMEOUT_S
        )

        # A lone order expires WINDOW_S after it happened, and explain names it; meanwhile a
        # batch fills to its size, and a burst of edits, a second apart, is debounced.
        await deployment.produce([{"asset": "orders"}, *[{"asset": "clicks"}] * 3])
        await deployment.produce([{"asset": "edits"}] * 3, pause_s=1.0)
        explained = await triggerer.explain_until("paired", "expired at")
        assert "waiting: no queued event of orders, customers" in explained

        # Customers and orders together: one run of those two, the expired order not.
        await deployment.produce([{"asset": "customers"}, {"asset": "orders"}])
        await deployment.produce([{"asset": "clicks"}])  # a batch at its deadline
        [(run, consumed)] = await wait_runs(deployment, "paired", 1)
        orders = await deployment.query(lambda s: events_on(s, "orders"))
        customers = await deployment.query(lambda s: events_on(s, "customers"))
        assert consumed == sorted([customers[0].id, orders[1].id])
        assert f"its event {orders[0].id} expired at" in explained
        assert await deployment.query(lambda s: queued_for(s, "paired")) == []

        [(_, three), (second, one)] = await wait_runs(deployment, "batched", 2)
        clicks = await deployment.query(lambda s: events_on(s, "clicks"))
        assert (three, one) == ([e.id for e in clicks[:3]], [clicks[3].id])
        assert second.created_at >= clicks[3].timestamp + timedelta(seconds=BATCH_WAIT_S)

        [(run, consumed)] = await wait_runs(deployment, "debounced", 1)
        edits = await deployment.query(lambda s: events_on(s, "edits"))
        assert consumed == [e.id for e in edits]
        assert run.created_at >= edits[-1].timestamp + timedelta(seconds=DEBOUNCE_S)

        # A batch's deadline holds across a kill -9: the click waits while no daemon runs.
        await deployment.produce([{"asset": "clicks"}])
        await deployment.wait_for(
            lambda s: queued_for(s, "batched"), lambda queued: len(queued) == 1
        )
        daemon.stop()
    # While no daemon runs: a left queued before the last midnight (its queue row dated back,
    # as if the daemon had been stopped over midnight), and the batch's deadline passes.
    await triggerer.emit("left")
    await deployment.query(_queued_before_midnight)
    await anyio.sleep(BATCH_WAIT_S)
    with deployment.process_with_config(config) as restarted:
        restarted.start()
        runs = await wait_runs(deployment, "batched", 3)
        clicks = await deployment.query(lambda s: events_on(s, "clicks"))
        assert runs[2][1] == [clicks[4].id]
        await deployment.wait_for(
            lambda s: queued_for(s, "daily_pair"), lambda queued: queued == [], timeout_s=TIMEOUT_S
        )
        dropped = await restarted.wait_logged("queued_event_dropped")
        assert [r["reason"] for r in dropped if r["pipeline_id"] == "daily_pair"] == ["reset"]
        await triggerer.emit("right")
        explained = await triggerer("explain", "daily_pair")
        assert "waiting: no queued event of left" in explained
        assert await deployment.query(lambda s: runs_of(s, "daily_pair")) == []

    # `pipelines simulate`, fed the events the daemon stored, starts the runs it started.
    names = await deployment.query(_asset_names)
    for pipeline_id in ("paired", "batched", "debounced"):
        stored = await deployment.query(lambda s, p=pipeline_id: _scheduled_events(s, p))
        feed = deployment.tmp_path / f"{pipeline_id}.jsonl"
        feed.write_text(
            "".join(
                json.dumps({"asset": names[e.asset_id], "at": e.timestamp.isoformat()}) + "\n"
                for e in stored
            )
        )
        simulated = await triggerer("pipelines", "simulate", pipeline_id, str(feed), "--json")
        daemon_runs = await deployment.query(lambda s, p=pipeline_id: runs_of(s, p))
        assert [[stored[n].id for n in run["events"]] for run in json.loads(simulated)] == [
            consumed for _, consumed in daemon_runs
        ], pipeline_id


async def _scheduled_events(session: AsyncSession, pipeline_id: str) -> list[models.AssetEvent]:
    """The events of the assets the pipeline is scheduled on, oldest first."""
    refs = models.PipelineAssetRef
    return list(
        await session.scalars(
            select(models.AssetEvent)
            .join(refs, refs.asset_id == models.AssetEvent.asset_id)
            .where(refs.pipeline_id == pipeline_id, refs.role == "schedule")
            .order_by(models.AssetEvent.id)
        )
    )


async def _asset_names(session: AsyncSession) -> dict[int, str]:
    return dict((await session.execute(select(models.Asset.id, models.Asset.name))).all())


async def _watcher_states(session: AsyncSession) -> set[str]:
    return set(await session.scalars(select(models.Trigger.state)))


async def _queued_before_midnight(session: AsyncSession) -> None:
    queue = models.QueuedEvent
    [row] = await session.scalars(select(queue).where(queue.pipeline_id == "daily_pair"))
    midnight = row.created_at.replace(hour=0, minute=0, second=0, microsecond=0)
    await session.execute(
        update(queue).where(queue.id == row.id).values(created_at=midnight - timedelta(minutes=1))
    )
    await session.commit()


TWO_DAEMONS = """
from datetime import timedelta

from triggerer import Asset, AssetWatcher, Batch, pipeline
from watchers import KafkaTrigger


def fed(name):  # the asset, fed by the messages of the test's topic that name it
    return Asset(name, watchers=[AssetWatcher(f"{{name}}_feed", KafkaTrigger(
        bootstrap_servers="{bootstrap}", topics=["{topic}"], group_id=f"{topic}-{{name}}",
        filter={{"path": "$.value.asset", "equals": name}},
        session_timeout_ms=6000, heartbeat_interval_ms=1000))])


orders, customers, clicks = fed("orders"), fed("customers"), fed("clicks")


@pipeline(
    schedule=(orders & customers).within(timedelta(minutes=10)), run_policy="per_event"
)
def paired(spark, context):
    pass


@pipeline(schedule=clicks, batch=Batch(max_events=10, max_wait_s=600))
def batched(spark, context):
    pass
"""


@pytest.mark.timeout(300)
@pytest.mark.parametrize("db_backend", ["postgresql"], indirect=True)
async def test_two_daemons_start_one_run_per_window_and_per_batch(
    make_deployment: MakeDeployment, database_url: str
) -> None:
    deployment = await make_deployment(database_url, partitions=2)
    deployment.write_pipelines(TWO_DAEMONS)
    first = deployment.process()
    second = DaemonProcess(deployment.env(), deployment.tmp_path / "second.log")
    with first, second:
        first.start()
        second.start()
        await first.wait_logged("pipelines_loaded")
        await second.wait_logged("pipelines_loaded")
        await deployment.wait_for(
            _watcher_states, lambda states: states == {"running"}, timeout_s=TIMEOUT_S
        )
        pairs = [{"asset": asset} for _ in range(10) for asset in ("orders", "customers")]
        await deployment.produce([*pairs, *[{"asset": "clicks"}] * 30])
        paired = await wait_runs(deployment, "paired", 10)
        batched = await wait_runs(deployment, "batched", 3)
        await anyio.sleep(2)  # a doubled run would come now
        assert len(await deployment.query(lambda s: runs_of(s, "paired"))) == 10
        assert len(await deployment.query(lambda s: runs_of(s, "batched"))) == 3
    consumed = [event for _, events in paired for event in events]
    assert len(consumed) == len(set(consumed)) == 20
    assert sorted(len(events) for _, events in batched) == [10, 10, 10]
    assert len({event for _, events in batched for event in events}) == 30
