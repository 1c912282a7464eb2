"""A store that stays fast when it is large: the same daemon on an empty store and on one
holding a long history, on each store kind.

    python -m tests.benchmarks.bench_large_store --out bench_large_store.json \\
        [--quick | --large-store-events 100000] [--parts sqlite postgresql]

Parts ``sqlite`` / ``postgresql``: two fresh databases with the same pipelines (``consumer`` on
``[orders, never]``, ``on_order`` a run per event of ``latency``, ``hold``, and ``p0``..``p999``
on ``s<i> & t<i>``, each with one queued event of ``s<i>``, so a scheduler pass evaluates 1,000
waiting pipelines). The second is filled first with ``--large-store-events`` events, a tenth as
many runs, their ``run_event`` links and a thousandth as many dead letters, written straight
into the tables (:mod:`tests.benchmarks.large_store`); how long that took is reported. The
first holds a page of the lists that read only history (:func:`_one_page_each`). On each,
with the daemon running in this process (its API on a free port):

- ingest: ``--large-store-ingest`` pre-produced Kafka messages into events and queue rows;
  events/s from the commit that passes 10% to the last one (:class:`~.observe.IngestLog`);
- produce -> run created: ``--large-store-latency`` messages one at a time on ``latency``, each
  waited for (its run's commit, :class:`~.observe.StoreWatch`); the launcher's one slot held by
  ``hold``, so runs are created and stay queued. p50 / p99;
- the API: each list route (events, runs, a pipeline's runs, pipelines, dead letters, lineage)
  and ``/pipelines/{id}/explain``, ``--large-store-requests`` times each, one at a time from a
  client in this process. p50 / p99;
- the UI's first draw in Chromium (``bench_ui.measure``, ``--large-store-ui-loads`` loads,
  the median): its first poll reads ``/lineage``, ``/watchers``, ``/pipelines``, ``/runs``
  and ``/assets/events``, its overview ``/activity/events``; laying out the graph of 1,000
  pipelines (4,000 nodes) takes most of it, whatever the history;

then, with the daemon stopped, scheduler passes over every pipeline with a scheduler of its own
(``Scheduler.run_once`` after a ``wake()`` of everything; the median of 5). ``slowdown`` is each
figure on the filled store over the empty one (a time's ratio, or a rate's inverse). Goal:
every slowdown <= 1.5.
"""

from __future__ import annotations

import argparse
import datetime as dt
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import httpx
from aiokafka import AIOKafkaProducer
from sqlalchemy import func, insert, select

if __package__ in (None, ""):  # run as a script: put the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from deploy.local.services import free_port
from tests.benchmarks import bench_ui
from tests.benchmarks.bench_ingest import prepare_topic
from tests.benchmarks.bench_kafka import create_topics
from tests.benchmarks.harness import (
    DEFAULT_PG_URL,
    GROUP_OPTIONS,
    Bench,
    Daemon,
    daemon_settings,
    database,
    main,
    running,
)
from tests.benchmarks.large_store import (
    HOT_ASSET,
    HOT_PIPELINE,
    SOURCE_PIPELINES,
    Filler,
    pipelines_source,
)
from tests.benchmarks.observe import IngestLog, StoreWatch
from tests.benchmarks.stats import percentile, spread_ms
from tests.e2e.daemon import write_pipelines
from triggerer.service.actions import trigger_run
from triggerer.service.api.server import ApiServer, api_server
from triggerer.service.loader import load_pipelines
from triggerer.service.principals import cli_principal
from triggerer.service.scheduling.registry import Registry, sync_definitions
from triggerer.service.scheduling.scheduler import Scheduler
from triggerer.service.store import create_engine, models, session_factory, upgrade
from triggerer.service.store.types import utcnow

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncConnection

    from triggerer.service.daemon.service import Service

GOALS = {"slowdown": 1.5}
WARM = 0.1
PAGE = 100
"""Rows a list route returns."""
A_PIPELINE = "p7"
"""One of the thousand: its runs are a page of ``/runs`` on the empty store."""
SCHEDULER_PASSES = 5
API_WARMUP = 3
HOLD_TIMEOUT_S = 120.0
RUN_TIMEOUT_S = 60.0
SPARK = {"mode": "connect", "remote": "sc://127.0.0.1:1"}
"""Runs never reach Spark: ``hold`` only sleeps and the measured runs stay queued."""


# -- the stores


async def prepare_store(
    database_url: str, pipelines: Path, events: int
) -> tuple[dict[str, Any], Registry]:
    """Migrate, sync the pipelines, write the history of ``events`` events (none: an empty
    store, but for :func:`_one_page_each`) and queue one event of each ``s<i>`` for ``p<i>``:
    how long each step took, and the synced definitions."""
    started = time.perf_counter()
    await upgrade(database_url)
    engine = create_engine(database_url)
    try:
        loaded = await anyio.to_thread.run_sync(load_pipelines, pipelines)
        async with session_factory(engine).begin() as session:
            registry = await sync_definitions(session, loaded)
    finally:
        await engine.dispose()  # the fill's connection is the only one (SQLite's journal)
    mapping = _fill_map(registry)
    result: dict[str, Any] = {"schema_and_sync_s": round(time.perf_counter() - started, 1)}
    if events:
        latency = next(a for a, asset in registry.assets.items() if asset.name == HOT_ASSET)
        (trigger_id,) = (
            t.trigger_id for t in registry.triggers.values() if t.asset_ids == (latency,)
        )
        filler = Filler(database_url, mapping, trigger_id)
        filled_at = time.perf_counter()
        result["fill_steps_s"] = await anyio.to_thread.run_sync(filler.fill, events)
        result["fill_s"] = round(time.perf_counter() - filled_at, 1)
    engine = create_engine(database_url)
    try:
        async with engine.begin() as connection:
            if not events:
                await _one_page_each(connection)
            for key in range(SOURCE_PIPELINES):
                asset_id, pipeline_id = mapping[key]
                event_id = await connection.scalar(
                    insert(models.AssetEvent)
                    .values(asset_id=asset_id, extra={}, source="rest_api", timestamp=utcnow())
                    .returning(models.AssetEvent.id)
                )
                await connection.execute(
                    insert(models.QueuedEvent).values(
                        pipeline_id=pipeline_id,
                        asset_id=asset_id,
                        event_id=event_id,
                        created_at=utcnow(),
                    )
                )
    finally:
        await engine.dispose()
    return result, registry


async def _one_page_each(connection: AsyncConnection) -> None:
    """What the empty store holds for the lists that read only history to answer a page, as
    the filled one does: :data:`PAGE` dead letters, and as many failed runs of
    :data:`A_PIPELINE`."""
    await connection.execute(
        insert(models.DeadLetter),
        [
            {"source": "rest_api", "dedup_key": f"dead/{n}", "payload": "x" * 100}
            | {"reason": "extra: PostgreSQL cannot store a NUL character"}
            for n in range(PAGE)
        ],
    )
    await connection.execute(
        insert(models.Run),
        [
            {"run_id": f"{A_PIPELINE}__failed{n}", "pipeline_id": A_PIPELINE, "run_type": "asset"}
            | {"state": "failed", "try_number": 1, "end_date": utcnow()}
            | {"error": "the pipeline raised ValueError"}
            for n in range(PAGE)
        ],
    )


def _fill_map(registry: Registry) -> dict[int, tuple[int, str]]:
    """Key ``i`` -> (id of ``s<i>``, ``p<i>``); key 1,000 -> (``latency``, ``on_order``)."""
    by_name = {asset.name: asset_id for asset_id, asset in registry.assets.items()}
    mapping = {n: (by_name[f"s{n}"], f"p{n}") for n in range(SOURCE_PIPELINES)}
    mapping[SOURCE_PIPELINES] = (by_name[HOT_ASSET], HOT_PIPELINE)
    return mapping


# -- the daemon


class ServingDaemon(Daemon):
    """The harness's view of the daemon, which also serves its REST API."""

    def __init__(self, service: Service) -> None:
        super().__init__(service)
        self.api: ApiServer = api_server(service)

    async def run(self) -> None:
        await super().run()
        await self.api.run()

    def stop(self) -> None:
        self.api.stop()


async def measure_daemon(
    args: argparse.Namespace, workdir: Path, database_url: str, topics: dict[str, str]
) -> dict[str, Any]:
    port = free_port()
    settings = daemon_settings(
        workdir,
        database_url,
        spark=SPARK,
        runs={"parallelism": 1},
        api={"port": port},
        daemon={"shutdown_grace_s": 0},  # the held run is stopped at once
    )
    count = args.large_store_ingest
    result: dict[str, Any] = {}
    started = utcnow()
    with StoreWatch() as watch:
        log = IngestLog(watch)
        async with running(settings, ServingDaemon) as daemon:
            async with anyio.create_task_group() as tasks:
                tasks.start_soon(log.run)
                last = await log.wait_recorded(count, timeout_s=max(300, count / 100))
                tasks.cancel_scope.cancel()
            warm = log.first(count * WARM)
            result["ingest_events_per_s"] = round(
                (last.recorded - warm.recorded) / (last.at - warm.at)
            )
            await hold_launcher(daemon)
            await daemon.wait_assigned()
            result["produce_to_run_created_ms"] = await latency(
                args, watch, topics["latency"], args.large_store_latency
            )
            base = f"http://127.0.0.1:{port}"
            async with httpx.AsyncClient(base_url=f"{base}/api/v1", timeout=120) as client:
                result["api_ms"] = await api_latencies(client, args.large_store_requests, started)
            if args.large_store_ui_loads:
                first_draw, _, drawn = await anyio.to_thread.run_sync(
                    bench_ui.measure, base, args.large_store_ui_loads
                )
                result["ui_first_draw_ms"] = {
                    "median": round(statistics.median(first_draw), 1),
                    "worst": round(max(first_draw), 1),
                    "nodes_drawn": drawn,
                }
    return result


async def hold_launcher(daemon: Daemon) -> None:
    """Queue a manual run of ``hold`` and wait until it runs: it keeps the launcher's slot
    (its Spark session waits for a server that is not there)."""
    async with daemon.service.sessions.begin() as session:
        run_id = await trigger_run(session, "hold", actor=cli_principal())
    with anyio.fail_after(HOLD_TIMEOUT_S):
        while True:
            async with daemon.service.sessions() as session:
                state = await session.scalar(
                    select(models.Run.state).where(models.Run.run_id == run_id)
                )
            if state == models.RunState.RUNNING:
                return
            await anyio.sleep(0.1)  # polled: a run's start is not notified to this process


async def latency(
    args: argparse.Namespace, watch: StoreWatch, topic: str, messages: int
) -> dict[str, float]:
    """Produce -> run created, one message at a time (the first three left out)."""
    producer = AIOKafkaProducer(bootstrap_servers=args.bootstrap)
    await producer.start()
    delays = []
    try:
        for index in range(API_WARMUP + messages):
            runs_before = len(watch.runs)
            produced = time.time()
            await producer.send_and_wait(topic, b'{"i": %d}' % index)
            await watch.wait_runs(runs_before + 1, RUN_TIMEOUT_S)
            created = max(watch.runs.values())
            if index >= API_WARMUP:
                delays.append(created - produced)
            await anyio.sleep(0.05)
    finally:
        await producer.stop()
    return spread_ms(delays)


def routes(started: str, now: str) -> dict[str, str]:
    """What the API is asked, by a name for the table: ``started`` is a time before the
    daemon's start (the events since are this run's), ``now`` one after its last event."""
    return {
        "events": "/assets/events?limit=100",
        "events_of_asset": "/assets/events?asset_id={latency}&limit=100",
        "events_since_start": f"/assets/events?since={started}&limit=100",
        "events_since_now": f"/assets/events?since={now}&limit=100",
        "events_by_source": "/assets/events?source=cli&limit=100",
        "runs": "/runs?limit=100",
        "runs_failed": "/runs?state=failed&limit=100",
        "runs_of_hot_pipeline": f"/pipelines/{HOT_PIPELINE}/runs?limit=20",
        "runs_of_a_pipeline": f"/pipelines/{A_PIPELINE}/runs?limit=20",
        "pipelines": "/pipelines?limit=1000",
        "dead_letters": f"/dead-letters?limit={PAGE}",
        "lineage": "/lineage",
        "explain_hot_pipeline": f"/pipelines/{HOT_PIPELINE}/explain",
        "explain_a_pipeline": f"/pipelines/{A_PIPELINE}/explain",
    }


def _iso(moment: dt.datetime) -> str:
    return moment.replace(microsecond=0).isoformat().replace("+00:00", "Z")


async def api_latencies(
    client: httpx.AsyncClient, requests: int, started: dt.datetime
) -> dict[str, dict[str, float]]:
    assets = (await client.get("/assets?limit=1000")).json()
    latency_id = next(a["id"] for a in assets if a["name"] == HOT_ASSET)
    now = utcnow() + dt.timedelta(seconds=1)
    figures = {}
    for name, path in routes(_iso(started), _iso(now)).items():
        path = path.format(latency=latency_id)
        samples = []
        for index in range(API_WARMUP + requests):
            sent = time.perf_counter()
            (await client.get(path)).raise_for_status()
            if index >= API_WARMUP:
                samples.append(time.perf_counter() - sent)
        figures[name] = spread_ms(samples)
    return figures


async def scheduler_passes(database_url: str, registry: Registry) -> dict[str, float]:
    """A scheduler of its own over every pipeline (1,003) of ``registry`` (as synced, the
    daemon stopped): the first pass (which also tidies the queue) and the median of
    :data:`SCHEDULER_PASSES` after it."""
    engine = create_engine(database_url)
    sessions = session_factory(engine)
    try:
        scheduler = Scheduler(sessions, lambda: registry, lambda: None)
        passes = []
        for _ in range(1 + SCHEDULER_PASSES):
            scheduler.wake()
            started = time.perf_counter()
            await scheduler.run_once()
            passes.append(time.perf_counter() - started)
    finally:
        await engine.dispose()
    return {
        "first_ms": round(passes[0] * 1000, 1),
        "median_ms": round(percentile(passes[1:], 50) * 1000, 1),
    }


# -- the parts


async def measure_store(
    args: argparse.Namespace, workdir: Path, backend: str, events: int
) -> dict[str, Any]:
    """One store, empty (``events`` 0) or filled, and the daemon on it."""
    name = f"{'filled' if events else 'empty'}-{uuid.uuid4().hex[:6]}"
    workdir = workdir / name
    workdir.mkdir(parents=True)
    ingest_topic = await prepare_topic(args.bootstrap, args.large_store_ingest)
    latency_topic = f"bench-large-latency-{uuid.uuid4().hex[:8]}"
    await create_topics(args.bootstrap, [latency_topic], 1)
    pipelines = workdir / "pipelines"
    write_pipelines(
        pipelines,
        pipelines_source(args.bootstrap, ingest_topic, latency_topic, GROUP_OPTIONS),
    )
    with database(backend, workdir, args.pg_url, "store") as database_url:
        result, registry = await prepare_store(database_url, pipelines, events)
        result |= await measure_daemon(args, workdir, database_url, {"latency": latency_topic})
        result["scheduler_pass"] = await scheduler_passes(database_url, registry)
        result["rows"] = await _rows(database_url)
    return result


async def _rows(database_url: str) -> dict[str, int]:
    engine = create_engine(database_url)
    try:
        async with session_factory(engine)() as session:
            return {
                table.__tablename__: int(
                    await session.scalar(select(func.count()).select_from(table)) or 0
                )
                for table in (models.AssetEvent, models.Run, models.RunEvent, models.DeadLetter)
            }
    finally:
        await engine.dispose()


def slowdowns(empty: dict[str, Any], filled: dict[str, Any]) -> dict[str, Any]:
    """Each figure of the filled store over the empty one's (a rate's inverse)."""
    ratios: dict[str, Any] = {
        "ingest_events_per_s": round(
            empty["ingest_events_per_s"] / filled["ingest_events_per_s"], 2
        ),
        "produce_to_run_created_p50": _ratio(
            filled["produce_to_run_created_ms"]["p50"], empty["produce_to_run_created_ms"]["p50"]
        ),
        "produce_to_run_created_p99": _ratio(
            filled["produce_to_run_created_ms"]["p99"], empty["produce_to_run_created_ms"]["p99"]
        ),
        "scheduler_pass": _ratio(
            filled["scheduler_pass"]["median_ms"], empty["scheduler_pass"]["median_ms"]
        ),
    }
    for route, figures in filled["api_ms"].items():
        ratios[f"api_{route}_p99"] = _ratio(figures["p99"], empty["api_ms"][route]["p99"])
    if "ui_first_draw_ms" in filled:
        ratios["ui_first_draw"] = _ratio(
            filled["ui_first_draw_ms"]["median"], empty["ui_first_draw_ms"]["median"]
        )
    worst = max(ratios.items(), key=lambda item: item[1])
    ratios["worst"] = f"{worst[0]} {worst[1]}"
    ratios["meets_goal"] = worst[1] <= GOALS["slowdown"]
    return ratios


def _ratio(filled: float, empty: float) -> float:
    return round(filled / max(empty, 0.1), 2)


async def part(args: argparse.Namespace, workdir: Path, backend: str) -> dict[str, Any]:
    empty = await measure_store(args, workdir, backend, 0)
    filled = await measure_store(args, workdir, backend, args.large_store_events)
    return {
        "events": args.large_store_events,
        "empty": empty,
        "filled": filled,
        "slowdown": slowdowns(empty, filled),
    }


async def part_sqlite(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    return await part(args, workdir, "sqlite")


async def part_postgresql(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    return await part(args, workdir, "postgresql")


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pg-url", default=DEFAULT_PG_URL, help="server to create databases on")


BENCH = Bench(
    module="tests.benchmarks.bench_large_store",
    description="the daemon on an empty store and on one holding a long history",
    parts={"sqlite": part_sqlite, "postgresql": part_postgresql},
    # The fill takes PostgreSQL 10-20 minutes of a 2-core machine, SQLite a few.
    full={
        "large_store_events": 10_000_000,
        "large_store_ingest": 50_000,
        # A p99 of fewer samples is one or two pauses of a shared machine.
        "large_store_latency": 300,
        "large_store_requests": 1000,
        "large_store_ui_loads": 3,
    },
    quick={
        "large_store_events": 100_000,
        "large_store_ingest": 10_000,
        "large_store_latency": 30,
        "large_store_requests": 20,
        "large_store_ui_loads": 0,
    },
    goals=GOALS,
    options=options,
)

if __name__ == "__main__":
    main(BENCH)
