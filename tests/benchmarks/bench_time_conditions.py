"""Time in conditions: what windows cost the scheduler, and what backpressure saves the store.

    python -m tests.benchmarks.bench_time_conditions --out bench_time_conditions.json [--quick]

Part ``scheduler_pass``: N pipelines each waiting on a partial AND (one event queued on its
first asset, none on its second), as plain ANDs and as windowed ANDs (``within`` one hour);
the median of a full pass of the scheduler over all of them (every pipeline evaluated, as after
a reload), on SQLite, and the ratio windowed / plain. A windowed pipeline reads its queue rows
(they may expire) where a plain one asks only which assets have rows.

Part ``burst_peak``: M messages already in a Kafka topic feed a pipeline, once without a limit
and once with ``max_backlog``; the daemon runs (in this process, local Spark) until every event
is consumed. The most events waiting in the store at once (queued, or taken by runs not yet
started, sampled every 50 ms), the seconds until all are consumed, and the runs.
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import anyio
from sqlalchemy import func, select

if __package__ in (None, ""):  # run as a script: put the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.benchmarks.bench_kafka import create_topics
from tests.benchmarks.harness import Bench, daemon_settings, import_providers, main, running
from tests.benchmarks.stats import percentile
from tests.e2e.daemon import produce_json, write_pipelines
from triggerer.service.events import NewEvent, record_events
from triggerer.service.loader import load_pipelines
from triggerer.service.scheduling.registry import sync_definitions
from triggerer.service.scheduling.scheduler import Scheduler
from triggerer.service.store import create_engine, models, session_factory, upgrade
from triggerer.service.store.states import EventSource, RunState

PASSES = 5
CONSUMED_TIMEOUT_S = 900.0

WAITING = """
    from datetime import timedelta

    from triggerer import Asset, pipeline

    def make(number):
        first, second = Asset(f"first_{{number}}"), Asset(f"second_{{number}}")
        condition = first & second
        @pipeline(pipeline_id=f"waits_{{number}}", schedule={schedule})
        def waits(spark, context):
            pass
        return waits

    for number in range({count}):  # the loader takes module-level pipelines
        globals()[f"waits_{{number}}"] = make(number)
"""

BURST = """
    from triggerer import Asset, AssetWatcher, pipeline
    from watchers import KafkaTrigger

    orders = Asset("orders", watchers=[AssetWatcher("orders_topic", KafkaTrigger(
        bootstrap_servers={bootstrap!r}, topics=[{topic!r}],
        session_timeout_ms=6000, heartbeat_interval_ms=1000))])

    @pipeline(schedule=orders, max_backlog={limit})
    def drain(spark, context):
        pass
"""


async def part_scheduler_pass(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    count = args.pipelines
    results = {}
    for kind, schedule in (
        ("plain", "condition"),
        ("windowed", "condition.within(timedelta(hours=1))"),
    ):
        folder = workdir / kind
        write_pipelines(folder, WAITING.format(schedule=schedule, count=count))
        url = f"sqlite:///{workdir / f'{kind}.db'}"
        await upgrade(url)
        engine = create_engine(url)
        sessions = session_factory(engine)
        try:
            loaded = await anyio.to_thread.run_sync(load_pipelines, folder)
            async with sessions.begin() as session:
                registry = await sync_definitions(session, loaded)
            firsts = [
                registry.asset_ids[asset]
                for asset in registry.asset_ids
                if asset.name.startswith("first_")
            ]
            async with sessions.begin() as session:
                await record_events(
                    session,
                    [NewEvent(asset_id=a, extra={}, source=EventSource.CLI) for a in firsts],
                )
            scheduler = Scheduler(sessions, lambda registry=registry: registry, lambda: None)
            passes = []
            for _ in range(PASSES):
                scheduler.wake()  # every pipeline, as after a reload
                started = time.perf_counter()
                await scheduler.run_once()
                passes.append(time.perf_counter() - started)
        finally:
            await engine.dispose()
        results[f"{kind}_pass_ms"] = round(percentile(passes, 50) * 1000, 1)
    return {
        "pipelines": count,
        **results,
        "windowed_to_plain": round(results["windowed_pass_ms"] / results["plain_pass_ms"], 2),
    }


async def part_burst_peak(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    import_providers()
    results = {}
    for name, limit in (("unbounded", None), ("max_backlog", args.max_backlog)):
        topic = f"bench-burst-{uuid.uuid4().hex[:8]}"
        await create_topics(args.bootstrap, [topic], 1)
        await produce_json(args.bootstrap, topic, ({"n": n} for n in range(args.burst_messages)))
        folder = workdir / name
        write_pipelines(
            folder / "pipelines",
            BURST.format(bootstrap=args.bootstrap, topic=topic, limit=limit),
        )
        settings = daemon_settings(folder, f"sqlite:///{folder / 'triggerer.db'}")
        peak, started = 0, time.perf_counter()
        async with running(settings) as daemon:
            sessions = daemon.service.sessions
            with anyio.fail_after(CONSUMED_TIMEOUT_S):
                while True:
                    async with sessions() as session:
                        waiting, consumed, runs = await _drain_state(session)
                    peak = max(peak, waiting)
                    if consumed == args.burst_messages:
                        break
                    await anyio.sleep(0.05)
        results[name] = {
            "max_backlog": limit,
            "peak_waiting_events": peak,
            "seconds_to_all_consumed": round(time.perf_counter() - started, 1),
            "runs": runs,
        }
    return {"messages": args.burst_messages, **results}


async def _drain_state(session: Any) -> tuple[int, int, int]:
    """Events waiting for ``drain`` (queued, or held by runs not started), events consumed by
    its runs that ended, and its runs."""
    queued = await session.scalar(select(func.count()).select_from(models.QueuedEvent))
    run, held = models.Run, models.RunEvent
    waiting = await session.scalar(
        select(func.count())
        .select_from(held)
        .join(run, run.id == held.run_pk)
        .where(run.state == RunState.QUEUED)
    )
    consumed = await session.scalar(
        select(func.count())
        .select_from(held)
        .join(run, run.id == held.run_pk)
        .where(run.state == RunState.SUCCESS)
    )
    runs = await session.scalar(select(func.count()).select_from(run))
    return (queued or 0) + (waiting or 0), consumed or 0, runs or 0


BENCH = Bench(
    module="tests.benchmarks.bench_time_conditions",
    description="windows in the scheduler's pass; a burst's peak in the store with backpressure",
    parts={"scheduler_pass": part_scheduler_pass, "burst_peak": part_burst_peak},
    full={"pipelines": 1000, "burst_messages": 20_000, "max_backlog": 200},
    quick={"pipelines": 200, "burst_messages": 2000, "max_backlog": 200},
)

if __name__ == "__main__":
    main(BENCH)
