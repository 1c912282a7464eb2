"""Spark runs: from a Kafka message to its pipeline function, in each Spark mode.

    python -m tests.benchmarks.bench_spark --out bench_spark.json [--quick] [--parts ...]

Parts ``spark_local`` / ``spark_classic`` / ``spark_connect``: messages produced one at a time
to a per-event pipeline (``bench_latency``'s), each waited for until its run ended. Local is the
default mode (the daemon's own warm Spark Connect server: its start time and memory are
reported); classic starts a JVM per run; connect uses a server started here
(``deploy.local.services``). Local and connect leave out their first run (a cold server's first
session). Local then produces ``--burst-runs`` messages at once and times them until every run
ended. Goals (local): produce to function entered p50 <= 1 s, p99 <= 2 s; 100 runs <= 60 s.

Part ``runs_burst``: ``--burst-runs`` per-event runs of the trivial ``on_order`` at ``[runs]
parallelism = 2`` in local mode, timed from the first event's produce until the last run ended
(its ``end_date``), after two warm-up runs (the server's first session, the run forker's start).
Goal: 100 runs <= 10 s. It also reports runs started per second and the daemon's and the
machine's CPU over the burst.

Clock: ``time.time()``. The stages: produce, taken just before ``send_and_wait``; run created,
when the run's transaction committed (:class:`tests.benchmarks.observe.StoreWatch`); run
claimed, the run's ``start_date`` in the store; function entered, stamped into a file by the
pipeline function's first statement.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Any

import anyio
from aiokafka import AIOKafkaProducer
from sqlalchemy import select

if __package__ in (None, ""):  # run as a script: put the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from deploy.local.services import spark_connect
from tests.benchmarks.bench_latency import deployment, latency_message, runs_with_events
from tests.benchmarks.harness import GROUP_OPTIONS, Bench, daemon_settings, main, running
from tests.benchmarks.observe import StoreWatch
from tests.benchmarks.stats import (
    cpu_s,
    cpu_ticks,
    machine_busy_percent,
    process_rss_mb,
    spread_ms,
)
from triggerer.service.store import create_engine, models, session_factory

RUN_TIMEOUT_S = 300.0
BURST_PARALLELISM = 2
BURST_WARMUP = 2


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
        return await spark_runs(args.bootstrap, workdir, spark, messages, warmup, burst)


async def spark_runs(
    bootstrap: str, workdir: Path, spark: dict[str, Any], messages: int, warmup: int, burst: int
) -> dict[str, Any]:
    topic, database_url, marks = await deployment(bootstrap, workdir, "spark", GROUP_OPTIONS)
    settings = daemon_settings(workdir, database_url, spark=spark)
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    produced: list[float] = []
    entered: list[float] = []
    total = warmup + messages
    server: dict[str, Any] = {}
    burst_s = None
    try:
        with StoreWatch() as watch:
            async with running(settings) as daemon:
                await daemon.wait_assigned()
                for index in range(total):
                    produced.append(time.time())
                    await producer.send_and_wait(topic, latency_message(index))
                    mark = anyio.Path(marks / str(index))
                    with anyio.fail_after(RUN_TIMEOUT_S):
                        while not await mark.exists():  # noqa: ASYNC110 - another process writes it
                            await anyio.sleep(0.02)  # the stamp is in the file, not the poll time
                        stamps = json.loads(await mark.read_text())
                        entered.append(stamps["entered"])
                        await until_finished(database_url, index + 1)
                spark_server = daemon.service.spark_server
                if spark_server is not None and spark_server.pid is not None:
                    server = {
                        "start_s": round(spark_server.start_s or 0, 1),
                        "rss_mb": round(process_rss_mb(spark_server.pid)),
                    }
                if burst:
                    started = time.perf_counter()
                    for index in range(total, total + burst):
                        await producer.send(topic, latency_message(index))
                    await producer.flush()
                    await until_finished(database_url, total + burst)
                    burst_s = round(time.perf_counter() - started, 1)
    finally:
        await producer.stop()
    rows = (await runs_with_events(database_url))[:total]
    measured = range(warmup, total)
    created = [watch.runs[rows[i]["run_id"]] - produced[i] for i in measured]
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


async def part_runs_burst(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    topic, database_url, _ = await deployment(args.bootstrap, workdir, "burst", GROUP_OPTIONS)
    settings = daemon_settings(
        workdir, database_url, spark={"mode": "local"}, runs={"parallelism": BURST_PARALLELISM}
    )
    producer = AIOKafkaProducer(bootstrap_servers=args.bootstrap)
    await producer.start()
    total = BURST_WARMUP + args.burst_runs
    try:
        with StoreWatch() as watch:
            async with running(settings) as daemon:
                await daemon.wait_assigned()
                for index in range(BURST_WARMUP):
                    await producer.send_and_wait(topic, latency_message(index))
                    await until_finished(database_url, index + 1)
                cpu_before, machine = cpu_s(), cpu_ticks()
                produced = time.time()
                for index in range(BURST_WARMUP, total):
                    await producer.send(topic, latency_message(index))
                await producer.flush()
                await until_finished(database_url, total)
                daemon_cpu_s = cpu_s() - cpu_before
                busy = machine_busy_percent(machine)
    finally:
        await producer.stop()
    rows = (await runs_with_events(database_url))[BURST_WARMUP:total]
    ended = await end_dates(database_url)
    last_created = max(watch.runs[row["run_id"]] for row in rows)
    started = sorted(row["started_at"] for row in rows)
    last_ended = max(ended[row["run_id"]] for row in rows)
    burst_s = last_ended - produced
    return {
        "runs": len(rows),
        "parallelism": BURST_PARALLELISM,
        "produce_to_last_run_ended_s": round(burst_s, 2),
        "runs_per_s": round(len(rows) / burst_s, 1),
        "produce_to_last_run_created_s": round(last_created - produced, 2),
        "first_to_last_run_started_s": round(started[-1] - started[0], 2),
        "run_starts_per_s": round((len(rows) - 1) / max(started[-1] - started[0], 1e-9), 1),
        "daemon_process_cpu_s": round(daemon_cpu_s, 1),
        "machine_busy_percent": busy,
    }


async def end_dates(database_url: str) -> dict[str, float]:
    """Each ended run's ``end_date``, by run id."""
    engine = create_engine(database_url)
    try:
        async with session_factory(engine)() as session:
            rows = await session.execute(select(models.Run.run_id, models.Run.end_date))
            return {run_id: end.timestamp() for run_id, end in rows.all() if end is not None}
    finally:
        await engine.dispose()


async def until_finished(database_url: str, count: int) -> None:
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


async def part_spark_local(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    return await part_spark(args, workdir, "local")


async def part_spark_classic(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    return await part_spark(args, workdir, "classic")


async def part_spark_connect(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    return await part_spark(args, workdir, "connect")


BENCH = Bench(
    module="tests.benchmarks.bench_spark",
    description="Kafka message to pipeline function, in each Spark mode",
    parts={
        "spark_local": part_spark_local,
        "spark_classic": part_spark_classic,
        "spark_connect": part_spark_connect,
        "runs_burst": part_runs_burst,
    },
    full={"local_messages": 5, "connect_messages": 20, "burst_runs": 100},
    quick={"local_messages": 2, "connect_messages": 5, "burst_runs": 20},
)

if __name__ == "__main__":
    main(BENCH)
