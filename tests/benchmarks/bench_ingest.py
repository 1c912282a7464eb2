"""Ingest throughput: pre-produced Kafka messages into committed events, on each store.

    python -m tests.benchmarks.bench_ingest --out bench_ingest.json [--quick] [--parts ...]

Parts ``throughput_sqlite`` / ``throughput_postgresql``: pre-produced messages (4 partitions)
into committed events with queue rows; the consumer pipeline is scheduled on ``[orders,
never]``, so no run starts. Rate from the commit that passes 10% of the events to the last one
(also per half, since the queue grows), and how busy ingest and the scheduler were; then the
median scheduler pass over the full queue, measured on its own.

Part ``avro_sqlite``: the same records as Avro in Confluent's wire format (``value_format=
"avro"``, the writer's schema from the tests' registry, :mod:`tests.fixtures.schema_registry`)
against the JSON ones, on fresh SQLite databases, taking turns for ``ROUNDS`` rounds; the
medians and their ratio. Goal: Avro >= 0.8x JSON. Baselines on fresh databases,
same rows and batch size, one transaction per batch: ``record_events`` alone (the ingest SQL,
without Kafka or the rest of the daemon; at most 30 s), and plain Core INSERTs of
``asset_event`` rows (no dedup, RETURNING or queue rows): one multi-row
``insert().values(rows)`` per batch, and ``execute(insert(), rows)``. Goal: >= 10,000
events/s on PostgreSQL.

Observed through the daemon's metrics, read after each commit
(:class:`tests.benchmarks.observe.IngestLog`): events stored, ingest's commits and the seconds
they took (``triggerer_ingest_commit_seconds``), scheduler passes
(``triggerer_scheduler_pass_seconds``), duplicates; CPU is this process's, the daemon's.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import anyio
from sqlalchemy import func, select
from sqlalchemy.ext.asyncio import AsyncSession

if __package__ in (None, ""):  # run as a script: put the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from aiokafka import AIOKafkaProducer

from tests.benchmarks import baselines
from tests.benchmarks.bench_kafka import (
    MESSAGE_BYTES,
    PARTITIONS,
    create_topics,
    message,
    produce,
)
from tests.benchmarks.harness import (
    DEFAULT_PG_URL,
    GROUP_OPTIONS,
    Bench,
    daemon_settings,
    database,
    main,
    running,
)
from tests.benchmarks.observe import IngestLog, StoreWatch, histogram, metric_value
from tests.benchmarks.stats import cpu_ticks, machine_busy_percent
from tests.e2e.daemon import write_pipelines
from tests.fixtures.schema_registry import FakeRegistry, avro_record, confluent
from triggerer.service import metrics
from triggerer.service.store import create_engine, models, session_factory

GOALS = {"pg_events_per_s": 10_000, "avro_to_json_ratio": 0.8}
ROUNDS = 3
"""Turns of the JSON and Avro runs of ``avro_sqlite``, each kept as its median."""
AVRO_ORDER = {
    "type": "record",
    "name": "Order",
    "fields": [
        {"name": "id", "type": "long"},
        {"name": "type", "type": "string"},
        {"name": "pad", "type": "string"},
    ],
}
WARM = 0.1
"""The share of events left out at the start: the group join and the first fetches."""

PIPELINES = """
    from triggerer import Asset, AssetWatcher, pipeline
    from watchers import KafkaTrigger

    orders = Asset("orders", watchers=[AssetWatcher("orders_topic", KafkaTrigger(
        bootstrap_servers={bootstrap!r}, topics=[{topic!r}], {options}))])
    never = Asset("never")

    @pipeline(schedule=[orders, never])
    def consumer(spark, context):
        raise AssertionError("never runs: the asset 'never' gets no events")
"""


async def prepare_topic(bootstrap: str, count: int) -> str:
    """A new topic of ``PARTITIONS`` partitions holding ``count`` messages."""
    topic = f"bench-throughput-{uuid.uuid4().hex[:8]}"
    await create_topics(bootstrap, [topic], PARTITIONS)
    await produce(bootstrap, topic, count)
    return topic


async def prepare(args: argparse.Namespace, meta: dict[str, Any]) -> None:
    started = time.perf_counter()
    args.topic = await prepare_topic(args.bootstrap, args.throughput_messages)
    meta["produce_s"] = round(time.perf_counter() - started, 1)


async def part_throughput(args: argparse.Namespace, workdir: Path, backend: str) -> dict[str, Any]:
    count = args.throughput_messages
    pipelines = workdir / "pipelines"
    with database(backend, workdir, args.pg_url, "daemon") as database_url:
        result = await daemon_throughput(args, workdir, database_url, count)
        result["scheduler_pass_ms_with_full_queue"] = await baselines.scheduler_pass_ms(
            database_url, pipelines, "consumer"
        )
    batch_size = result["batch_size"]
    with database(backend, workdir, args.pg_url, "record") as database_url:
        result["record_events_alone"] = await baselines.record_events_loop(
            database_url, pipelines, count, args.topic, batch_size
        )
    rates: dict[str, float] = {}
    for name, many in (("raw_multi_values_insert", False), ("raw_executemany_insert", True)):
        with database(backend, workdir, args.pg_url, name) as database_url:
            rates[name] = await baselines.raw_insert(
                database_url, count, args.topic, batch_size, many
            )
    result["baselines_events_per_s"] = {name: round(rate) for name, rate in rates.items()}
    raw = max(rates["raw_multi_values_insert"], rates["raw_executemany_insert"])
    result["ratio_to_best_raw_insert"] = round(result["events_per_s"] / raw, 3)
    if backend == "postgresql":
        result["meets_goal"] = result["events_per_s"] >= GOALS["pg_events_per_s"]
    return result


async def daemon_throughput(
    args: argparse.Namespace,
    workdir: Path,
    database_url: str,
    count: int,
    *,
    topic: str | None = None,
    options: str = GROUP_OPTIONS,
    **sections: dict[str, Any],
) -> dict[str, Any]:
    """The daemon's ingest of ``count`` messages of ``topic`` (default ``args.topic``) into a
    new database, with ``sections`` of settings merged into the benchmark's
    (``tracing={...}``)."""
    write_pipelines(
        workdir / "pipelines",
        PIPELINES.format(bootstrap=args.bootstrap, topic=topic or args.topic, options=options),
    )
    settings = daemon_settings(workdir, database_url, **sections)
    passes_before, _ = histogram(metrics.SCHEDULER_PASS)
    with StoreWatch() as watch:
        log = IngestLog(watch)
        async with running(settings), anyio.create_task_group() as tasks:
            tasks.start_soon(log.run)
            started, machine = time.time(), cpu_ticks()
            last = await log.wait_recorded(count, timeout_s=max(300, count / 200))
            machine_percent = machine_busy_percent(machine)
            tasks.cancel_scope.cancel()
    passes = histogram(metrics.SCHEDULER_PASS)[0] - passes_before
    duplicates = metric_value(metrics.DUPLICATES, "triggerer_event_duplicates_total")
    warm, half = log.first(count * WARM), log.first(count / 2)
    steady_s = last.at - warm.at
    counts = await _counts(database_url)
    if counts != {"asset_event": count, "queued_event": count, "run": 0}:
        raise AssertionError(f"expected {count} events and queue rows and no run, got {counts}")
    return {
        "messages": count,
        "partitions": PARTITIONS,
        "message_bytes": MESSAGE_BYTES,
        "batch_size": settings.daemon.ingest_batch_size,
        "events_per_s": round((last.recorded - warm.recorded) / steady_s),
        "events_per_s_10_to_50pct": round((half.recorded - warm.recorded) / (half.at - warm.at)),
        "events_per_s_50_to_100pct": round((last.recorded - half.recorded) / (last.at - half.at)),
        "wall_s_from_started": round(last.at - started, 1),
        "commits": last.commits,
        "mean_events_per_commit": round(count / last.commits, 1),
        "ingest_busy_percent": round(100 * (last.committing_s - warm.committing_s) / steady_s, 1),
        "scheduler_passes": passes,
        "daemon_cpu_percent": round(100 * (last.cpu_s - warm.cpu_s) / steady_s, 1),
        # Less at the mercy of other load on the machine than a rate.
        "daemon_cpu_us_per_event": round(
            1e6 * (last.cpu_s - warm.cpu_s) / (last.recorded - warm.recorded), 1
        ),
        "machine_cpu_busy_percent": machine_percent,
        "duplicates": int(duplicates),
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


async def part_avro_sqlite(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """The JSON topic's messages and the same records in Avro, into committed events, in
    turns; each format's median rate and the ratio."""
    count = args.throughput_messages
    registry = FakeRegistry()
    registry.start()
    try:
        schema_id = registry.register("orders-value", AVRO_ORDER)
        avro_topic = f"bench-avro-{uuid.uuid4().hex[:8]}"
        await create_topics(args.bootstrap, [avro_topic], PARTITIONS)
        await _produce_avro(args.bootstrap, avro_topic, count, schema_id)
        avro_options = f"{GROUP_OPTIONS}, value_format='avro', schema_registry={registry.url!r}"
        runs: dict[str, list[dict[str, Any]]] = {"json": [], "avro": []}
        for round_ in range(ROUNDS):
            for name, topic, options in (
                ("json", args.topic, GROUP_OPTIONS),
                ("avro", avro_topic, avro_options),
            ):
                with database("sqlite", workdir, args.pg_url, f"{name}-{round_}") as url:
                    result = await daemon_throughput(
                        args,
                        workdir / f"{name}-{round_}",
                        url,
                        count,
                        topic=topic,
                        options=options,
                    )
                runs[name].append(result)
        fetches = registry.requests[f"GET /schemas/ids/{schema_id}"]
    finally:
        registry.stop()
    rates = {
        name: statistics.median(run["events_per_s"] for run in results)
        for name, results in runs.items()
    }
    cpu = {
        name: round(statistics.median(run["daemon_cpu_us_per_event"] for run in results), 1)
        for name, results in runs.items()
    }
    ratio = rates["avro"] / rates["json"]
    return {
        "messages": count,
        "rounds": ROUNDS,
        "json_message_bytes": MESSAGE_BYTES,
        "avro_message_bytes": len(_avro_message(schema_id, 0)),
        "json_events_per_s": round(rates["json"]),
        "avro_events_per_s": round(rates["avro"]),
        "avro_to_json_ratio": round(ratio, 3),
        "json_daemon_cpu_us_per_event": cpu["json"],
        "avro_daemon_cpu_us_per_event": cpu["avro"],
        "schema_fetches": fetches,
        "meets_goal": ratio >= GOALS["avro_to_json_ratio"],
        "runs_events_per_s": {
            name: [run["events_per_s"] for run in results] for name, results in runs.items()
        },
    }


def _avro_message(schema_id: int, index: int) -> bytes:
    """The record of ``message(index)``, in Avro framed in Confluent's wire format."""
    return confluent(schema_id, avro_record(AVRO_ORDER, json.loads(message(index))))


async def _produce_avro(bootstrap: str, topic: str, count: int, schema_id: int) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, max_batch_size=1 << 20)
    await producer.start()
    try:
        for start in range(0, count, 10_000):
            sent = [
                await producer.send(topic, _avro_message(schema_id, i), partition=i % PARTITIONS)
                for i in range(start, min(start + 10_000, count))
            ]
            for delivery in sent:
                await delivery
    finally:
        await producer.stop()


async def part_throughput_sqlite(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    return await part_throughput(args, workdir, "sqlite")


async def part_throughput_postgresql(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    return await part_throughput(args, workdir, "postgresql")


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pg-url", default=DEFAULT_PG_URL, help="server to create databases on")


BENCH = Bench(
    module="tests.benchmarks.bench_ingest",
    description="ingest throughput: Kafka messages to committed events, on each store",
    parts={
        "throughput_sqlite": part_throughput_sqlite,
        "throughput_postgresql": part_throughput_postgresql,
        "avro_sqlite": part_avro_sqlite,
    },
    full={"throughput_messages": 100_000},
    quick={"throughput_messages": 10_000},
    goals=GOALS,
    options=options,
    prepare=prepare,
)

if __name__ == "__main__":
    main(BENCH)
