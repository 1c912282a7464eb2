"""The daemon end to end: Kafka message to run, ingest throughput, and the cost of idle watchers.

    python -m tests.benchmarks.bench_daemon --out bench_daemon.json [--quick] [--parts ...]

Starts its own tansu broker, then runs each part in a child process of its own (clean memory
and CPU figures, and no part's instrumentation leaks into the next). Each part runs the daemon
in that process with ``serve()``, as the e2e tests do, through a subclass of ``Service`` that
only records timestamps; the daemon code runs unchanged except where a part says so. Logging is
at WARNING. Sizes: ``--quick`` or one option per size; the defaults are the full run.

Clock: ``time.time()`` everywhere, so the run's child process can share it. The stages:

- produce: taken just before ``send_and_wait``;
- consumed: when ``KafkaTrigger`` turns the record into an event (its ``_event``, wrapped);
- committed: when ``Ingest._commit`` returns (the transaction committed, before the ack);
- run created: when the scheduler calls ``on_run_created``, right after the run's transaction;
- child started: the run process's start time from ``/proc/self/stat`` (10 ms resolution);
- function entered: the pipeline function's first statement stamps ``time.time()`` into a file.

The ``asset_event.timestamp`` and ``run.created_at`` columns are read back as a cross-check:
both are set in Python just before the INSERT, so they come slightly before the commit.

Parts:

- ``latency``: messages produced one at a time; each is waited for (its run created), then a
  random 0..``--max-gap-ms`` pause, so messages land at random points of the consumer's long
  poll. The launcher is replaced by a no-op, so runs are created and stay queued (the pipeline's
  ``max_active_runs`` is high) and no run process adds CPU noise. Run twice: as shipped, and with
  the KafkaTrigger option ``fetch_max_wait_ms=10``, which separates what the broker's long poll
  costs (tansu answers a waiting fetch late) from the daemon's own cost; a plain aiokafka
  consumer (50 messages, both settings) gives the broker's floor. The first three messages warm
  up and are left out. Goal: produce to run created p50 <= 20 ms, p99 <= 100 ms.
- ``spark_local`` / ``spark_classic`` / ``spark_connect``: the same with the real launcher,
  waiting for each run to end before the next message. Local is the default mode (the daemon's
  own warm Spark Connect server: its start time and memory are reported); classic starts a JVM
  per run; connect uses a server started here (``deploy.local.services``). Local and connect
  leave out their first run (a cold server's first session). Local then produces
  ``--burst-runs`` messages at once to a per-event pipeline and times them until every run
  ended. Goals (local): produce to function entered p50 <= 1 s, p99 <= 2 s; 100 runs <= 60 s.
- ``throughput_sqlite`` / ``throughput_postgresql``: pre-produced messages (4 partitions) into
  committed events with queue rows; the consumer pipeline is scheduled on ``[orders, never]``,
  so no run starts. Rate from the commit that passes 10% of the events to the last one (also
  per half, since the queue grows), and how busy ingest and the scheduler were; then the median
  scheduler pass over the full queue, measured on its own. Baselines on fresh databases, same
  rows and batch size, one transaction per batch: ``record_events`` alone (the ingest SQL,
  without Kafka or the rest of the daemon; at most 30 s), and plain Core INSERTs of
  ``asset_event`` rows (no dedup, RETURNING or queue rows): one multi-row
  ``insert().values(rows)`` per batch, and ``execute(insert(), rows)``. Goal: >= 10,000
  events/s on PostgreSQL.
- ``idle_kafka`` / ``idle_file``: N assets, each with its own trigger (KafkaTrigger on its own
  topic, read through the daemon's shared consumer, or FileTrigger on its own folder), in one
  daemon; RSS and CPU of
  the daemon's process (not the broker) over an idle period once every trigger runs, and how
  long the daemon's heartbeat transaction takes (``triggerer check`` calls a heartbeat older
  than three intervals stale). ``idle_kafka`` also measures the floor alongside: one plain
  aiokafka consumer of the same topics (the shared consumer's own cost: every fetch names
  every partition), as a ratio.
- ``idle_demo``: ``triggerer run`` on the demo configuration (``config/triggerer.toml``: local
  Spark, SQLite, the API, the demo's Kafka, SQS and file watchers; its moto server started here),
  left alone once it settled: CPU of the daemon's process (its Spark server and run forker are
  processes of their own) and how often each of its threads woke. Goal: under 1 % of a core.
- ``fanout_kafka``: N watchers of one topic with different filters, on pre-produced messages,
  first through the shared consumer, then each with a consumer of its own: messages fetched
  from the broker, time until every event is stored, and the daemon's CPU seconds.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import itertools
import json
import os
import random
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import anyio
import psycopg
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from psycopg import sql
from sqlalchemy import func, insert, select
from sqlalchemy.ext.asyncio import AsyncSession

if __package__ in (None, ""):  # run as a script: put the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from deploy.local import demo
from deploy.local.services import DUMMY_AWS_ENV, moto, spark_connect, tansu
from tests.benchmarks.bench_kafka import MESSAGE_BYTES, PARTITIONS, create_topics, produce, rss_mb
from tests.benchmarks.daemon_probe import (
    Probe,
    cpu_s,
    cpu_ticks,
    daemon,
    machine_busy_percent,
    percentile,
    process_status,
    spread_ms,
    wait_assigned,
)
from tests.benchmarks.report import publish
from tests.e2e.daemon import stat_fields, write_pipelines
from triggerer.service.config import LoggingSettings, Settings
from triggerer.service.daemon.registry import sync_definitions
from triggerer.service.daemon.scheduler import Scheduler
from triggerer.service.events import NewEvent, record_events
from triggerer.service.loader import load_pipelines
from triggerer.service.logs import configure_logging
from triggerer.service.store import create_engine, models, session_factory, upgrade
from triggerer.service.store.models import EventSource
from triggerer.service.store.types import utcnow
from watchers.kafka import KafkaTrigger

PARTS = (
    "idle_kafka",
    "idle_file",
    "idle_demo",
    "fanout_kafka",
    "latency",
    "spark_local",
    "spark_classic",
    "spark_connect",
    "throughput_sqlite",
    "throughput_postgresql",
)
FULL = {
    "latency_messages": 200,
    "local_messages": 5,
    "connect_messages": 20,
    "burst_runs": 100,
    "throughput_messages": 100_000,
    "idle_watchers": 1000,
    "idle_seconds": 20.0,
    "fanout_watchers": 50,
    "fanout_messages": 2000,
}
QUICK = {
    "latency_messages": 50,
    "local_messages": 2,
    "connect_messages": 5,
    "burst_runs": 20,
    "throughput_messages": 10_000,
    "idle_watchers": 200,
    "idle_seconds": 10.0,
    "fanout_watchers": 10,
    "fanout_messages": 500,
}
GOALS = {
    "demo_idle_cpu_percent": 1.0,
    "run_created_p50_ms": 20.0,
    "run_created_p99_ms": 100.0,
    "pg_events_per_s": 10_000,
}
LATENCY_WARMUP = 3
RAW_LATENCY_MESSAGES = 50
GAP_SEED = 20_260_316
FAST_FETCH_MAX_WAIT_MS = 10
WARM = 0.1
HEARTBEAT_WAIT_S = 60.0
SETTLE_S = 5.0
RECORD_EVENTS_MAX_S = 30.0
SCHEDULER_PASSES = 5
GROUP_OPTIONS = "session_timeout_ms=6000, heartbeat_interval_ms=1000"
DEFAULT_PG_URL = "postgresql://postgres@127.0.0.1:5432/postgres"

LATENCY_PIPELINES = """
    import json
    import time
    from pathlib import Path

    from triggerer import Asset, AssetWatcher, pipeline
    from watchers import KafkaTrigger

    MARKS = Path({marks!r})
    orders = Asset("orders", watchers=[AssetWatcher("orders_topic", KafkaTrigger(
        bootstrap_servers={bootstrap!r}, topics=[{topic!r}], {options}))])


    @pipeline(schedule=orders, run_policy="per_event", max_active_runs=1_000_000)
    def on_order(spark, context):
        entered = time.time()
        offset = context.triggering_asset_events[orders][0].extra["payload"]["offset"]
        stamps = {{"entered": entered}}
        (MARKS / f"{{offset}}.tmp").write_text(json.dumps(stamps))
        (MARKS / f"{{offset}}.tmp").rename(MARKS / str(offset))
"""

THROUGHPUT_PIPELINES = """
    from triggerer import Asset, AssetWatcher, pipeline
    from watchers import KafkaTrigger

    orders = Asset("orders", watchers=[AssetWatcher("orders_topic", KafkaTrigger(
        bootstrap_servers={bootstrap!r}, topics=[{topic!r}], {options}))])
    never = Asset("never")

    @pipeline(schedule=[orders, never])
    def consumer(spark, context):
        raise AssertionError("never runs: the asset 'never' gets no events")
"""

IDLE_PIPELINES = """
    from triggerer import Asset, AssetAny, AssetWatcher, pipeline
    from watchers import FileTrigger, KafkaTrigger

    idle = [
        Asset(f"idle_{{number}}", watchers=[AssetWatcher("watcher", {trigger})])
        for number, source in enumerate({sources!r})
    ]

    @pipeline(schedule=AssetAny(*idle))
    def any_idle(spark, context):
        raise AssertionError("never runs: the watched sources stay empty")
"""
FANOUT_KINDS = 5
FANOUT_PIPELINES = """
    from triggerer import Asset, AssetAny, AssetWatcher, pipeline
    from watchers import KafkaTrigger

    readers = [
        Asset(f"reader_{{number}}", watchers=[AssetWatcher("watcher", KafkaTrigger(
            bootstrap_servers={bootstrap!r}, topics=[{topic!r}],
            filter={{"path": "$.value.kind", "equals": number % {kinds}}}{group}))])
        for number in range({count})
    ]
    never = Asset("never")

    @pipeline(schedule=[AssetAny(*readers), never])
    def fan_in(spark, context):
        raise AssertionError("never runs: the asset 'never' gets no events")
"""
KAFKA_IDLE_TRIGGER = "KafkaTrigger(bootstrap_servers={bootstrap!r}, topics=[source])"
FILE_IDLE_TRIGGER = "FileTrigger(source)"


def make_settings(workdir: Path, database_url: str, **spark: Any) -> Settings:
    return Settings.model_validate(
        {
            "database": {"url": database_url},
            "pipelines": {"dir": workdir / "pipelines"},
            "spark": {"logs_dir": workdir / "logs", **spark},
            "logging": {"level": "WARNING"},
            "api": {"enabled": False},  # a fixed port would clash between daemons
        }
    )


# -- latency


def latency_message(index: int) -> bytes:
    return json.dumps({"i": index, "type": "order"}).encode()


async def raw_consumer_latency(
    bootstrap: str, messages: int, fetch_max_wait_ms: int | None, max_gap_s: float
) -> dict[str, Any]:
    """The broker and client floor: produce to ``getmany`` returning, plain aiokafka."""
    topic = f"bench-raw-latency-{uuid.uuid4().hex[:8]}"
    await create_topics(bootstrap, [topic], 1)
    options = {} if fetch_max_wait_ms is None else {"fetch_max_wait_ms": fetch_max_wait_ms}
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=f"{topic}-group",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=6000,
        heartbeat_interval_ms=1000,
        **options,
    )
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    await consumer.start()
    produced: list[float] = []
    received: list[float] = []
    arrived = anyio.Event()
    gaps = random.Random(GAP_SEED)  # noqa: S311 - benchmark jitter, not security

    async def consume() -> None:
        nonlocal arrived
        while True:
            batch = await consumer.getmany(timeout_ms=1000)
            now = time.time()
            for records in batch.values():
                received.extend(now for _ in records)
            if batch:
                arrived.set()
                arrived = anyio.Event()

    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(consume)
            total = LATENCY_WARMUP + messages
            for index in range(total):
                produced.append(time.time())
                await producer.send_and_wait(topic, latency_message(index))
                with anyio.fail_after(60):
                    while len(received) <= index:
                        await arrived.wait()
                await anyio.sleep(gaps.uniform(0, max_gap_s))
            tasks.cancel_scope.cancel()
    finally:
        await consumer.stop()
        await producer.stop()
    delays = [received[i] - produced[i] for i in range(LATENCY_WARMUP, total)]
    return {
        "messages": messages,
        "fetch_max_wait_ms": fetch_max_wait_ms or 500,
        "produce_to_consumed_ms": spread_ms(delays),
    }


async def daemon_latency(
    bootstrap: str,
    workdir: Path,
    messages: int,
    max_gap_s: float,
    fetch_max_wait_ms: int | None,
) -> dict[str, Any]:
    options = GROUP_OPTIONS + f", fetch_max_wait_ms={fetch_max_wait_ms or 500}"
    topic, database_url, _ = await _latency_deployment(bootstrap, workdir, "latency", options)
    settings = make_settings(workdir, database_url)
    probe = Probe(launch_runs=False, per_message=True)
    gaps = random.Random(GAP_SEED)  # noqa: S311 - benchmark jitter, not security
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    produced: list[float] = []
    total = LATENCY_WARMUP + messages
    try:
        async with daemon(settings, probe):
            await wait_assigned(probe)
            cpu_before, wall_before, machine = cpu_s(), time.time(), cpu_ticks()
            for index in range(total):
                produced.append(time.time())
                await producer.send_and_wait(topic, latency_message(index))
                await probe.wait_created(index + 1, timeout_s=60)
                await anyio.sleep(gaps.uniform(0, max_gap_s))
            cpu_percent = 100 * (cpu_s() - cpu_before) / (time.time() - wall_before)
            machine_percent = machine_busy_percent(machine)
    finally:
        await producer.stop()
    rows = await _runs_with_events(database_url)
    offsets = [row["offset"] for row in rows]
    if offsets != list(range(total)):
        raise AssertionError(f"expected one run per message in order, got offsets {offsets}")
    measured = range(LATENCY_WARMUP, total)
    consumed = [probe.consumed[(0, i)] - produced[i] for i in measured]
    committed = [probe.committed[(0, i)] - produced[i] for i in measured]
    created = [probe.created[i] - produced[i] for i in measured]
    return {
        "kafka_fetch_max_wait_ms": fetch_max_wait_ms or "500 (the default)",
        "messages": messages,
        "produce_to_committed_ms": spread_ms(committed),
        "produce_to_run_created_ms": spread_ms(created),
        "breakdown_p50_ms": {
            "produce_to_consumed": round(percentile(consumed, 50) * 1000, 1),
            "consumed_to_committed": round(
                percentile([c - k for c, k in zip(committed, consumed, strict=True)], 50) * 1000, 1
            ),
            "committed_to_run_created": round(
                percentile([r - c for r, c in zip(created, committed, strict=True)], 50) * 1000, 1
            ),
        },
        "db_columns_ms": {
            "produce_to_asset_event_timestamp": spread_ms(
                [rows[i]["event_at"] - produced[i] for i in measured]
            ),
            "produce_to_run_created_at": spread_ms(
                [rows[i]["created_at"] - produced[i] for i in measured]
            ),
        },
        "daemon_cpu_percent": round(cpu_percent, 1),
        "machine_cpu_busy_percent": machine_percent,
        "meets_goal": (
            percentile(created, 50) * 1000 <= GOALS["run_created_p50_ms"]
            and percentile(created, 99) * 1000 <= GOALS["run_created_p99_ms"]
        ),
    }


async def _runs_with_events(database_url: str) -> list[dict[str, Any]]:
    """Each run in creation order, with the one event it consumed (its Kafka offset)."""
    engine = create_engine(database_url)
    try:
        async with session_factory(engine)() as session:
            result = await session.execute(
                select(
                    models.Run.created_at,
                    models.Run.start_date,
                    models.Run.state,
                    models.AssetEvent.timestamp,
                    models.AssetEvent.extra,
                )
                .join(models.RunEvent, models.RunEvent.run_pk == models.Run.id)
                .join(models.AssetEvent, models.AssetEvent.id == models.RunEvent.event_id)
                .order_by(models.Run.id, models.AssetEvent.id)
            )
            return [
                {
                    "created_at": created_at.timestamp(),
                    "started_at": start_date.timestamp() if start_date else None,
                    "state": state,
                    "event_at": event_at.timestamp(),
                    "offset": extra["payload"]["offset"],
                }
                for created_at, start_date, state, event_at, extra in result.all()
            ]
    finally:
        await engine.dispose()


async def part_latency(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    gap_s = args.max_gap_ms / 1000
    messages = args.latency_messages
    raw_messages = min(messages, RAW_LATENCY_MESSAGES)
    return {
        "method": "in-process stamps; Launcher.run replaced by a no-op: runs created, not started",
        "raw_aiokafka": await raw_consumer_latency(args.bootstrap, raw_messages, None, gap_s),
        "raw_aiokafka_fast_fetch": await raw_consumer_latency(
            args.bootstrap, raw_messages, FAST_FETCH_MAX_WAIT_MS, gap_s
        ),
        "daemon": await daemon_latency(args.bootstrap, workdir / "a", messages, gap_s, None),
        "daemon_fast_fetch": await daemon_latency(
            args.bootstrap, workdir / "b", messages, gap_s, FAST_FETCH_MAX_WAIT_MS
        ),
    }


# -- spark


def process_rss_mb(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


async def part_spark(args: argparse.Namespace, workdir: Path, mode: str) -> dict[str, Any]:
    # A JVM per run is slow and every run is cold: fewer messages, none left out.
    messages = args.local_messages if mode == "classic" else args.connect_messages
    warmup = 0 if mode == "classic" else 1  # the first session of a Connect server is cold
    burst = args.burst_runs if mode == "local" else 0
    with contextlib.ExitStack() as stack:
        spark: dict[str, Any] = {"mode": mode}
        if mode == "connect":
            server = spark_connect(workdir, master="local[2]")
            server.start(timeout_s=180)
            stack.callback(server.stop)
            spark["remote"] = f"sc://{server.address}"
        return await _spark_runs(args.bootstrap, workdir, spark, messages, warmup, burst)


async def _latency_deployment(
    bootstrap: str, workdir: Path, name: str, options: str
) -> tuple[str, str, Path]:
    """A new topic, a SQLite database and LATENCY_PIPELINES on them: (topic, url, marks dir)."""
    topic = f"bench-{name}-{uuid.uuid4().hex[:8]}"
    await create_topics(bootstrap, [topic], 1)
    marks = workdir / "marks"
    marks.mkdir(parents=True)
    write_pipelines(
        workdir / "pipelines",
        LATENCY_PIPELINES.format(
            marks=str(marks),
            bootstrap=bootstrap,
            topic=topic,
            options=options,
        ),
    )
    return topic, f"sqlite:///{workdir / 'triggerer.db'}", marks


async def _spark_runs(
    bootstrap: str, workdir: Path, spark: dict[str, Any], messages: int, warmup: int, burst: int
) -> dict[str, Any]:
    topic, database_url, marks = await _latency_deployment(
        bootstrap, workdir, "spark", GROUP_OPTIONS
    )
    settings = make_settings(workdir, database_url, **spark)
    probe = Probe(per_message=True)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    produced: list[float] = []
    entered: list[float] = []
    total = warmup + messages
    server: dict[str, Any] = {}
    burst_s = None
    try:
        async with daemon(settings, probe) as service:
            await wait_assigned(probe)
            for index in range(total):
                produced.append(time.time())
                await producer.send_and_wait(topic, latency_message(index))
                mark = anyio.Path(marks / str(index))
                with anyio.fail_after(300):
                    while not await mark.exists():  # noqa: ASYNC110 - another process writes it
                        await anyio.sleep(0.02)  # the stamp is in the file, not the poll time
                    stamps = json.loads(await mark.read_text())
                    entered.append(stamps["entered"])
                    await _until_finished(database_url, index + 1)
            if service.spark_server is not None and service.spark_server.pid is not None:
                server = {
                    "start_s": round(service.spark_server.start_s or 0, 1),
                    "rss_mb": round(process_rss_mb(service.spark_server.pid)),
                }
            if burst:
                started = time.perf_counter()
                for index in range(total, total + burst):
                    await producer.send(topic, latency_message(index))
                await producer.flush()
                await _until_finished(database_url, total + burst)
                burst_s = round(time.perf_counter() - started, 1)
    finally:
        await producer.stop()
    rows = (await _runs_with_events(database_url))[:total]
    measured = range(warmup, total)
    created = [probe.created[i] - produced[i] for i in measured]
    claimed = [rows[i]["started_at"] - produced[i] for i in measured]
    function = [entered[i] - produced[i] for i in measured]
    return {
        "spark": {k: v for k, v in spark.items() if k != "remote"},
        "messages": messages,
        "cold_first_run_ms": (
            round((entered[0] - produced[0]) * 1000) if warmup else "not excluded (local)"
        ),
        "produce_to_run_created_ms": spread_ms(created),
        "produce_to_run_claimed_ms": spread_ms(claimed),
        "produce_to_function_entered_ms": spread_ms(function),
        "run_created_to_function_entered_ms": spread_ms(
            [f - c for f, c in zip(function, created, strict=True)]
        ),
        "each_produce_to_function_ms": [round(f * 1000) for f in function],
        "server": server or "none of the daemon's",
        f"{burst}_runs_at_once_s": burst_s,
    }


async def _until_finished(database_url: str, count: int) -> None:
    """Until ``count`` runs ended; a failed run stops the benchmark with its error."""
    engine = create_engine(database_url)
    try:
        while True:
            async with session_factory(engine)() as session:
                ended = (
                    await session.execute(
                        select(models.Run.state, models.Run.error).where(
                            models.Run.state.in_(("success", "failed"))
                        )
                    )
                ).all()
            failed = [error for state, error in ended if state == "failed"]
            if failed:
                raise RuntimeError(f"a benchmark run failed: {failed[0]}")
            if len(ended) >= count:
                return
            await anyio.sleep(0.1)
    finally:
        await engine.dispose()


# -- throughput


@contextlib.contextmanager
def database(backend: str, workdir: Path, pg_url: str, name: str) -> Iterator[str]:
    """A fresh, empty database URL: a SQLite file, or a ``bench_<uuid>`` PostgreSQL database
    dropped afterwards."""
    if backend == "sqlite":
        yield f"sqlite:///{workdir / f'{name}.db'}"
        return
    database_name = f"bench_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(pg_url, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(database_name)))
    try:
        yield pg_url.rsplit("/", 1)[0] + f"/{database_name}"
    finally:
        with psycopg.connect(pg_url, autocommit=True) as admin:
            admin.execute(
                sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(
                    sql.Identifier(database_name)
                )
            )


async def part_throughput(args: argparse.Namespace, workdir: Path, backend: str) -> dict[str, Any]:
    count = args.throughput_messages
    with database(backend, workdir, args.pg_url, "daemon") as database_url:
        result = await _daemon_throughput(args, workdir, database_url, count)
        result["scheduler_pass_ms_with_full_queue"] = await scheduler_pass_ms(
            database_url, workdir / "pipelines"
        )
    batch_size = result["batch_size"]
    with database(backend, workdir, args.pg_url, "record") as database_url:
        result["record_events_alone"] = await record_events_loop(
            database_url, workdir / "pipelines", count, args.topic, batch_size
        )
    baselines: dict[str, float] = {}
    for name, many in (("raw_multi_values_insert", False), ("raw_executemany_insert", True)):
        with database(backend, workdir, args.pg_url, name) as database_url:
            baselines[name] = await raw_insert(database_url, count, args.topic, batch_size, many)
    result["baselines_events_per_s"] = {name: round(rate) for name, rate in baselines.items()}
    raw = max(baselines["raw_multi_values_insert"], baselines["raw_executemany_insert"])
    result["ratio_to_best_raw_insert"] = round(result["events_per_s"] / raw, 3)
    if backend == "postgresql":
        result["meets_goal"] = result["events_per_s"] >= GOALS["pg_events_per_s"]
    return result


async def _daemon_throughput(
    args: argparse.Namespace, workdir: Path, database_url: str, count: int
) -> dict[str, Any]:
    write_pipelines(
        workdir / "pipelines",
        THROUGHPUT_PIPELINES.format(
            bootstrap=args.bootstrap,
            topic=args.topic,
            options=GROUP_OPTIONS,
        ),
    )
    settings = make_settings(workdir, database_url)
    probe = Probe()
    async with daemon(settings, probe) as service:
        started, machine = time.time(), cpu_ticks()
        await probe.wait_until(
            lambda: service.ingest.events_recorded >= count, timeout_s=max(300, count / 200)
        )
        machine_percent = machine_busy_percent(machine)
        duplicates = service.ingest.duplicates
    commits = probe.commits
    warm = next(c for c in commits if c.recorded >= count * WARM)
    half = next(c for c in commits if c.recorded >= count / 2)
    last = commits[-1]
    steady_s = last.ended - warm.ended
    counts = await _counts(database_url)
    if counts != {"asset_event": count, "queued_event": count, "run": 0}:
        raise AssertionError(f"expected {count} events and queue rows and no run, got {counts}")
    return {
        "messages": count,
        "partitions": PARTITIONS,
        "message_bytes": MESSAGE_BYTES,
        "batch_size": settings.daemon.ingest_batch_size,
        "events_per_s": round((last.recorded - warm.recorded) / steady_s),
        "events_per_s_10_to_50pct": round(
            (half.recorded - warm.recorded) / (half.ended - warm.ended)
        ),
        "events_per_s_50_to_100pct": round(
            (last.recorded - half.recorded) / (last.ended - half.ended)
        ),
        "wall_s_from_started": round(last.ended - started, 1),
        "commits": len(commits),
        "mean_events_per_commit": round(count / len(commits), 1),
        "ingest_busy_percent": round(
            100 * sum(c.ended - c.started for c in commits if c.started >= warm.ended) / steady_s,
            1,
        ),
        "scheduler_passes": probe.scheduler_passes,
        "daemon_cpu_percent": round(100 * (last.cpu - warm.cpu) / steady_s, 1),
        # Less at the mercy of other load on the machine than a rate.
        "daemon_cpu_us_per_event": round(
            1e6 * (last.cpu - warm.cpu) / (last.recorded - warm.recorded), 1
        ),
        "machine_cpu_busy_percent": machine_percent,
        "duplicates": duplicates,
    }


async def _counts(database_url: str) -> dict[str, int]:
    engine = create_engine(database_url)
    try:
        async with session_factory(engine)() as session:
            return {
                table.__tablename__: await _count(session, table)
                for table in (models.AssetEvent, models.QueuedEvent, models.Run)
            }
    finally:
        await engine.dispose()


async def _count(session: AsyncSession, table: type[models.Base]) -> int:
    return int(await session.scalar(select(func.count()).select_from(table)) or 0)


def kafka_extra(topic: str, index: int) -> dict[str, Any]:
    """The ``extra`` the daemon stores for message ``index`` of the pre-produced topic."""
    head = json.dumps({"id": index, "type": "order", "pad": ""})
    value = {"id": index, "type": "order", "pad": "x" * (MESSAGE_BYTES - len(head))}
    payload = {
        "topic": topic,
        "partition": index % PARTITIONS,
        "offset": index // PARTITIONS,
        "key": None,
        "value": value,
        "timestamp": 1_700_000_000_000 + index,
        "headers": {},
    }
    return {"from_trigger": True, "payload": payload}


def dedup_key(extra: dict[str, Any]) -> str:
    payload = extra["payload"]
    return f"{payload['topic']}/{payload['partition']}/{payload['offset']}"


async def record_events_loop(
    database_url: str, pipelines: Path, count: int, topic: str, batch_size: int
) -> dict[str, Any]:
    """``record_events`` alone (the ingest transaction without Kafka, the memory stream, acks
    or the scheduler), one transaction per batch, on the same pipelines; stops after
    ``RECORD_EVENTS_MAX_S``. The rate of the last tenth shows how it scales with table size."""
    await upgrade(database_url)
    engine = create_engine(database_url)
    sessions = session_factory(engine)
    extras = [kafka_extra(topic, index) for index in range(count)]
    try:
        loaded = await anyio.to_thread.run_sync(load_pipelines, pipelines)
        async with sessions.begin() as session:
            registry = await sync_definitions(session, loaded)
        (watched,) = registry.triggers.values()
        done: list[tuple[float, int]] = [(time.perf_counter(), 0)]
        for first in range(0, count, batch_size):
            events = [
                NewEvent(
                    asset_id=watched.asset_ids[0],
                    extra=extra,
                    source=EventSource.TRIGGER,
                    dedup_key=dedup_key(extra),
                    source_trigger_id=watched.trigger_id,
                )
                for extra in extras[first : first + batch_size]
            ]
            async with sessions.begin() as session:
                await record_events(session, events)
            done.append((time.perf_counter(), first + len(events)))
            if done[-1][0] - done[0][0] > RECORD_EVENTS_MAX_S:
                break
    finally:
        await engine.dispose()
    (started, _), (ended, events_done) = done[0], done[-1]
    tenth = done[-max(2, len(done) // 10)]
    return {
        "events": events_done,
        "events_per_s": round(events_done / (ended - started)),
        "last_tenth_events_per_s": round((events_done - tenth[1]) / (ended - tenth[0])),
    }


async def scheduler_pass_ms(database_url: str, pipelines: Path) -> float:
    """Median time of a scheduler pass over the consumer pipeline, whose queue is full and
    whose condition does not hold (what each ingest commit wakes the scheduler to do)."""
    engine = create_engine(database_url)
    sessions = session_factory(engine)
    try:
        loaded = await anyio.to_thread.run_sync(load_pipelines, pipelines)
        async with sessions.begin() as session:
            registry = await sync_definitions(session, loaded)
        scheduler = Scheduler(sessions, lambda: registry, lambda: None)
        pipeline = registry.pipelines["consumer"]
        passes = []
        for _ in range(SCHEDULER_PASSES):
            started = time.perf_counter()
            await scheduler.schedule(pipeline, registry)
            passes.append(time.perf_counter() - started)
    finally:
        await engine.dispose()
    return round(percentile(passes, 50) * 1000, 1)


async def raw_insert(
    database_url: str, count: int, topic: str, batch_size: int, executemany: bool
) -> float:
    """Rows per second of plain Core INSERTs of ``asset_event`` rows, one transaction per
    batch (no dedup, no RETURNING, no queue rows, no Kafka): one multi-row
    ``insert().values(rows)`` per batch, or ``execute(insert(), rows)``, which SQLAlchemy
    sends as the driver's executemany."""
    await upgrade(database_url)
    engine = create_engine(database_url)
    extras = [kafka_extra(topic, index) for index in range(count)]
    try:
        async with engine.begin() as connection:
            asset_id = await connection.scalar(
                insert(models.Asset).values(name="orders", uri="orders").returning(models.Asset.id)
            )
        started = time.perf_counter()
        for first in range(0, count, batch_size):
            now = utcnow()
            rows = [
                {
                    "asset_id": asset_id,
                    "extra": extra,
                    "source": "trigger",
                    "dedup_key": dedup_key(extra),
                    "partition_key": None,
                    "source_trigger_id": None,
                    "source_run_pk": None,
                    "timestamp": now,
                }
                for extra in extras[first : first + batch_size]
            ]
            async with engine.begin() as connection:
                if executemany:
                    await connection.execute(insert(models.AssetEvent), rows)
                else:
                    await connection.execute(insert(models.AssetEvent).values(rows))
        return count / (time.perf_counter() - started)
    finally:
        await engine.dispose()


# -- idle watchers


async def part_idle(args: argparse.Namespace, workdir: Path, kind: str) -> dict[str, Any]:
    count = args.idle_watchers
    if kind == "kafka":
        prefix = f"bench-idle-{uuid.uuid4().hex[:8]}"
        sources = [f"{prefix}-{number}" for number in range(count)]
        for first in range(0, count, 250):
            await create_topics(args.bootstrap, sources[first : first + 250], 1)
        trigger = KAFKA_IDLE_TRIGGER.format(bootstrap=args.bootstrap)
    else:
        sources = [str(workdir / "folders" / str(number)) for number in range(count)]
        for source in sources:
            await anyio.Path(source).mkdir(parents=True)
        trigger = FILE_IDLE_TRIGGER
    write_pipelines(workdir / "pipelines", IDLE_PIPELINES.format(trigger=trigger, sources=sources))
    settings = make_settings(workdir, f"sqlite:///{workdir / 'triggerer.db'}")
    probe = Probe()
    rss_before = rss_mb()
    started = time.time()
    async with daemon(settings, probe) as service:
        serving = time.time()
        if kind == "kafka":
            await wait_assigned(probe, timeout_s=300)
        ready = time.time()
        # Settle past the first FileTrigger poll and consumer heartbeats before measuring.
        await anyio.sleep(SETTLE_S)
        rss_started, wall, cpu, machine = rss_mb(), time.time(), cpu_s(), cpu_ticks()
        await anyio.sleep(args.idle_seconds)
        ended = time.time()
        cpu_percent = 100 * (cpu_s() - cpu) / (ended - wall)
        machine_percent = machine_busy_percent(machine)
        rss_idle = rss_mb()
        status = process_status()
        watchers_running = len(service.registry.triggers)
        restarts = sum(s.restart_count for s in service.supervisor.status.values())
        # Two heartbeats after startup give one staleness figure, however long they take.
        with anyio.move_on_after(HEARTBEAT_WAIT_S):
            await probe.wait_until(
                lambda: sum(start >= ready for start, _ in probe.heartbeats) >= 2, HEARTBEAT_WAIT_S
            )
        stopping = time.time()
    heartbeats = [(a, b) for a, b in probe.heartbeats if a >= ready and b <= stopping]
    durations = [b - a for a, b in heartbeats]
    renewals = [b - a for a, b in probe.lease_renewals if a >= ready and b <= stopping]
    window = [b - a for a, b in heartbeats if a >= wall and b <= ended]
    floor = {}
    if kind == "kafka":
        raw = await raw_idle_cpu_percent(args.bootstrap, sources, args.idle_seconds)
        floor = {
            "raw_consumer_cpu_percent": round(raw, 2),
            "cpu_ratio_to_raw_consumer": round(cpu_percent / raw, 2),
        }
    return {
        "trigger": "KafkaTrigger (own topic)" if kind == "kafka" else "FileTrigger",
        "watchers": watchers_running,
        "idle_seconds": args.idle_seconds,
        "startup_s_to_serving": round(serving - started, 1),
        "startup_s_to_all_ready": round(ready - started, 1),
        "rss_mb_before_serve": round(rss_before, 1),
        "rss_mb_started": round(rss_started, 1),
        "rss_mb_after_idle": round(rss_idle, 1),
        "rss_kb_per_watcher": round((rss_idle - rss_before) * 1024 / count, 1),
        "cpu_percent": round(cpu_percent, 2),
        **floor,
        "machine_cpu_busy_percent": machine_percent,
        "restarts": restarts,
        **status,
        "heartbeat_interval_s": settings.daemon.heartbeat_interval_s,
        "heartbeats_measured": len(durations),
        "heartbeats_in_idle_window": len(window),
        "heartbeat_mean_ms": round(1000 * sum(durations) / len(durations)) if durations else None,
        "of_which_lease_renewal_mean_ms": round(1000 * sum(renewals) / len(renewals))
        if renewals
        else None,
        "heartbeat_max_staleness_s": round(
            max((b2 - a1 for (a1, _), (_, b2) in itertools.pairwise(heartbeats)), default=0), 1
        ),
        "check_stale_after_s": settings.daemon.dead_after_s,
    }


async def raw_idle_cpu_percent(bootstrap: str, topics: list[str], seconds: float) -> float:
    """The floor: CPU of one plain aiokafka consumer of ``topics`` (one group, the default
    500 ms fetch wait, a getmany loop) over ``seconds`` of idleness, in this process."""
    consumer = AIOKafkaConsumer(
        *topics,
        bootstrap_servers=bootstrap,
        group_id=f"bench-idle-raw-{uuid.uuid4().hex[:8]}",
        enable_auto_commit=False,
    )
    await consumer.start()
    try:
        async with anyio.create_task_group() as tasks:

            async def poll() -> None:
                while True:
                    await consumer.getmany(timeout_ms=1000)

            tasks.start_soon(poll)
            with anyio.fail_after(300):
                while not consumer.assignment():  # noqa: ASYNC110 - joins are not notified
                    await anyio.sleep(0.1)
            await anyio.sleep(SETTLE_S)
            wall, cpu = time.time(), cpu_s()
            await anyio.sleep(seconds)
            percent = 100 * (cpu_s() - cpu) / (time.time() - wall)
            tasks.cancel_scope.cancel()
    finally:
        await consumer.stop()
    return percent


# -- the demo's daemon, idle

DEMO_SETTLE_S = 30.0
"""Its Spark server's start, the watchers' joins and the first heartbeats, before measuring."""


async def part_idle_demo(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    sqs = moto(workdir)
    sqs.start()
    endpoint = f"http://{sqs.address}"
    env = {
        **os.environ,
        **DUMMY_AWS_ENV,
        "TRIGGERER_CONFIG": str(demo.ROOT / "config" / "triggerer.toml"),
        "TRIGGERER_DEMO_KAFKA": args.bootstrap,
        "TRIGGERER_DEMO_SQS": f"sqs://customers?region=us-east-1&endpoint_url={endpoint}",
        "TRIGGERER_DATABASE__URL": f"sqlite:///{workdir / 'triggerer.db'}",
        "TRIGGERER_SPARK__LOGS_DIR": str(workdir / "logs"),
        "TRIGGERER_API__PORT": "0",
    }
    try:
        os.environ.update(DUMMY_AWS_ENV)  # the SQS client's region and credentials
        await demo.create_queue_and_topic(endpoint, args.bootstrap)
        with (workdir / "daemon.log").open("ab") as log:
            daemon_process = await anyio.open_process(
                [str(demo.TRIGGERER), "run"], cwd=demo.ROOT, env=env, stderr=log
            )
        try:
            await anyio.sleep(DEMO_SETTLE_S)
            before, wall = thread_activity(daemon_process.pid), time.time()
            # Three times the watchers' window: a fraction of a percent is a few clock ticks.
            await anyio.sleep(3 * args.idle_seconds)
            after, seconds = thread_activity(daemon_process.pid), time.time() - wall
        finally:
            daemon_process.terminate()
            with anyio.fail_after(60):
                await daemon_process.wait()
    finally:
        sqs.stop()
    busy_s = sum(after[t][1] - before[t][1] for t in after if t in before) / os.sysconf(
        "SC_CLK_TCK"
    )
    wakes = sorted(
        (round((after[t][0] - before[t][0]) / seconds, 1) for t in after if t in before),
        reverse=True,
    )
    return {
        "idle_seconds": round(seconds, 1),
        "cpu_percent": round(100 * busy_s / seconds, 2),
        "wakes_per_s_by_thread": wakes,
        "goal_cpu_percent": GOALS["demo_idle_cpu_percent"],
    }


def thread_activity(pid: int) -> dict[str, tuple[int, int]]:
    """For each thread of ``pid``: (context switches, CPU ticks) so far."""
    activity = {}
    for task in Path(f"/proc/{pid}/task").iterdir():
        with contextlib.suppress(OSError):  # a thread that ended meanwhile
            status = (task / "status").read_text()
            switches = sum(
                int(line.split()[1]) for line in status.splitlines() if "ctxt_switches" in line
            )
            fields = stat_fields(task / "stat")
            activity[task.name] = (switches, int(fields[11]) + int(fields[12]))
    return activity


# -- many watchers of one topic


async def part_fanout(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """``fanout_watchers`` watchers of one topic with different filters: read through the
    shared consumer, then each with a consumer of its own (``group_id`` set), on the same
    pre-produced messages; how many messages the daemon fetched and what it cost."""
    topic = f"bench-fanout-{uuid.uuid4().hex[:8]}"
    await create_topics(args.bootstrap, [topic], 1)
    messages = args.fanout_messages
    await produce_kinds(args.bootstrap, topic, messages)
    results = {}
    for name, group in (("shared", ""), ("own_consumers", ", group_id=f'fanout-{number}'")):
        folder = workdir / name
        write_pipelines(
            folder / "pipelines",
            FANOUT_PIPELINES.format(
                bootstrap=args.bootstrap,
                topic=topic,
                count=args.fanout_watchers,
                kinds=FANOUT_KINDS,
                group=group,
            ),
        )
        settings = make_settings(folder, f"sqlite:///{folder / 'triggerer.db'}")
        expected = args.fanout_watchers * messages // FANOUT_KINDS
        probe = Probe(launch_runs=False)
        started, cpu = time.time(), cpu_s()
        async with daemon(settings, probe) as service:
            await probe.wait_until(
                lambda want=expected: service.ingest.events_recorded >= want, 600
            )
            elapsed, used = time.time() - started, cpu_s() - cpu
            kafka = [t for t in probe.triggers() if isinstance(t, KafkaTrigger)]
            shared = sum(fetcher.fetched for fetcher in service.kafka)
            results[name] = {
                "events": service.ingest.events_recorded,
                "messages_fetched": shared or sum(t.messages for t in kafka),
                "seconds_to_all_events": round(elapsed, 2),
                "cpu_s": round(used, 2),
            }
    return {
        "watchers": args.fanout_watchers,
        "messages": messages,
        **results,
        "fetched_ratio_shared_to_own": round(
            results["shared"]["messages_fetched"] / results["own_consumers"]["messages_fetched"],
            3,
        ),
        "cpu_ratio_shared_to_own": round(
            results["shared"]["cpu_s"] / results["own_consumers"]["cpu_s"], 2
        ),
    }


async def produce_kinds(bootstrap: str, topic: str, count: int) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20)
    await producer.start()
    try:
        sent = [
            await producer.send(topic, json.dumps({"n": n, "kind": n % FANOUT_KINDS}).encode())
            for n in range(count)
        ]
        await asyncio.gather(*sent)
    finally:
        await producer.stop()


# -- running the parts


async def run_part(args: argparse.Namespace) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="bench-daemon-") as folder:
        workdir = Path(folder)
        part = args.part
        if part == "latency":
            return await part_latency(args, workdir)
        if part.startswith("spark_"):
            return await part_spark(args, workdir, part.removeprefix("spark_"))
        if part.startswith("throughput_"):
            return await part_throughput(args, workdir, part.removeprefix("throughput_"))
        if part == "idle_demo":
            return await part_idle_demo(args, workdir)
        if part.startswith("idle_"):
            return await part_idle(args, workdir, part.removeprefix("idle_"))
        if part == "fanout_kafka":
            return await part_fanout(args, workdir)
        raise ValueError(f"unknown part {part!r}; known: {', '.join(PARTS)}")


def child_argv(args: argparse.Namespace, part: str, out: Path, topic: str | None) -> list[str]:
    argv = [sys.executable, "-m", "tests.benchmarks.bench_daemon", "--part", part]
    argv += ["--part-out", str(out), "--bootstrap", args.bootstrap, "--pg-url", args.pg_url]
    argv += ["--max-gap-ms", str(args.max_gap_ms), "--topic", topic or ""]
    for name in FULL:
        argv += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    return argv


async def prepare_throughput_topic(bootstrap: str, count: int) -> str:
    topic = f"bench-throughput-{uuid.uuid4().hex[:8]}"
    await create_topics(bootstrap, [topic], PARTITIONS)
    await produce(bootstrap, topic, count)
    return topic


def run_all(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {
        "meta": {
            "cpus": os.cpu_count(),
            "load_average_at_start": [round(x, 2) for x in os.getloadavg()],
            "sizes": {name: getattr(args, name) for name in FULL},
            "goals": GOALS,
        }
    }
    with tempfile.TemporaryDirectory(prefix="bench-daemon-") as folder:
        broker = tansu(Path(folder))
        broker.start()
        args.bootstrap = broker.address
        try:
            topic = None
            if any(part.startswith("throughput_") for part in args.parts):
                produced = time.perf_counter()
                topic = anyio.run(
                    prepare_throughput_topic, broker.address, args.throughput_messages
                )
                results["meta"]["produce_s"] = round(time.perf_counter() - produced, 1)
            for part in args.parts:
                sys.stdout.write(f"-- {part}\n")
                sys.stdout.flush()
                out = Path(folder) / f"{part}.json"
                started = time.perf_counter()
                done = subprocess.run(child_argv(args, part, out, topic), check=False)  # noqa: S603 - this script
                if done.returncode:
                    results[part] = {"error": f"exit code {done.returncode} (see stderr above)"}
                else:
                    results[part] = json.loads(out.read_text())
                results[part]["part_wall_s"] = round(time.perf_counter() - started, 1)
        finally:
            broker.stop()
    results["meta"]["load_average_at_end"] = [round(x, 2) for x in os.getloadavg()]
    return results


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="daemon end-to-end benchmark")
    parser.add_argument("--out", type=Path, default=Path("bench_daemon.json"))
    parser.add_argument("--quick", action="store_true", help="small sizes: " + json.dumps(QUICK))
    parser.add_argument("--parts", nargs="+", choices=PARTS, default=list(PARTS))
    for name, full in FULL.items():
        parser.add_argument(f"--{name.replace('_', '-')}", type=type(full), help=f"(full {full})")
    parser.add_argument(
        "--max-gap-ms",
        type=float,
        default=150.0,
        help="latency: pause a random 0..this long after each message is processed, so messages "
        "land at random points of the consumer's long-poll cycle",
    )
    parser.add_argument("--pg-url", default=DEFAULT_PG_URL, help="server to create databases on")
    parser.add_argument("--part", help=argparse.SUPPRESS)
    parser.add_argument("--part-out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--bootstrap", help=argparse.SUPPRESS)
    parser.add_argument("--topic", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    for name in FULL:
        if getattr(args, name) is None:
            setattr(args, name, (QUICK if args.quick else FULL)[name])
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    configure_logging(LoggingSettings(level="WARNING", format="console"))
    if args.part:
        result = anyio.run(run_part, args)
        args.part_out.write_text(json.dumps(result, indent=2) + "\n")
        return
    results = run_all(args)
    publish(results, args.out)
    if any("error" in value for value in results.values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
