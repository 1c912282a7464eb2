"""Kafka message to run: how long from a message's produce to the run it creates.

    python -m tests.benchmarks.bench_latency --out bench_latency.json [--quick]

Part ``latency``: messages produced one at a time; each is waited for (its run created), then a
random 0..``--max-gap-ms`` pause, so messages land at random points of the consumer's long poll.
Runs are created and stay queued: the launcher's one slot (``[runs] parallelism = 1``) goes to a
manual run of ``hold``, which waits, so no run process adds CPU noise (``max_active_runs`` of
the measured pipeline is high). Run twice: as shipped, and with the KafkaTrigger option
``fetch_max_wait_ms=10``, which separates what the broker's long poll costs (tansu answers a
waiting fetch late) from the daemon's own cost; a plain aiokafka consumer (50 messages, both
settings) gives the broker's floor. The first three messages warm up and are left out. Goal:
produce to run created p50 <= 20 ms, p99 <= 100 ms.

Clock: ``time.time()``. The stages, each seen through what the daemon offers
(:mod:`tests.benchmarks.observe`):

- produce: taken just before ``send_and_wait``, and sent as the record's timestamp (in ms);
- consumed: when the watcher yielded the message's event, from the gauge
  ``triggerer_watcher_last_event_age_seconds`` read once its run is created;
- committed: the record's timestamp plus what the message added to the histogram
  ``triggerer_message_to_committed_seconds`` (one message per commit: from that timestamp to
  the commit of its event);
- run created: when the run's transaction committed (SQLAlchemy's ``after_commit``).

The ``asset_event.timestamp`` and ``run.created_at`` columns are read back as a cross-check:
both are set in Python just before the INSERT, so they come slightly before the commit.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import anyio
from aiokafka import AIOKafkaProducer
from sqlalchemy import select

if __package__ in (None, ""):  # run as a script: put the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.benchmarks import baselines
from tests.benchmarks.bench_kafka import create_topics
from tests.benchmarks.harness import (
    GROUP_OPTIONS,
    Bench,
    Daemon,
    daemon_settings,
    main,
    running,
)
from tests.benchmarks.observe import StoreWatch, histogram, last_events_at
from tests.benchmarks.stats import cpu_s, cpu_ticks, machine_busy_percent, percentile, spread_ms
from tests.e2e.daemon import write_pipelines
from triggerer.service import metrics
from triggerer.service.actions import trigger_run
from triggerer.service.principals import cli_principal
from triggerer.service.store import create_engine, models, session_factory

GOALS = {"run_created_p50_ms": 20.0, "run_created_p99_ms": 100.0}
LATENCY_WARMUP = 3
RAW_LATENCY_MESSAGES = 50
GAP_SEED = 20_260_316
FAST_FETCH_MAX_WAIT_MS = 10
RUN_TIMEOUT_S = 60.0
HOLD_TIMEOUT_S = 300.0
"""For the held run to start: the local Spark server's start comes first."""

PIPELINES = """
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


    @pipeline(schedule=None)
    def hold(spark, context):
        (MARKS / "hold").write_text("")
        time.sleep(3600)
"""
"""``on_order``: a run per message, which stamps when its function is entered into a file
named after the message's offset; ``hold``: a manual run that keeps its slot."""


def latency_message(index: int) -> bytes:
    return json.dumps({"i": index, "type": "order"}).encode()


async def deployment(
    bootstrap: str, workdir: Path, name: str, options: str
) -> tuple[str, str, Path]:
    """A new topic, a SQLite database and :data:`PIPELINES` on them: (topic, url, marks dir)."""
    topic = f"bench-{name}-{uuid.uuid4().hex[:8]}"
    await create_topics(bootstrap, [topic], 1)
    marks = workdir / "marks"
    marks.mkdir(parents=True)
    write_pipelines(
        workdir / "pipelines",
        PIPELINES.format(marks=str(marks), bootstrap=bootstrap, topic=topic, options=options),
    )
    return topic, f"sqlite:///{workdir / 'triggerer.db'}", marks


async def runs_with_events(database_url: str) -> list[dict[str, Any]]:
    """Each run that consumed an event, in creation order, with that event (its offset)."""
    engine = create_engine(database_url)
    try:
        async with session_factory(engine)() as session:
            result = await session.execute(
                select(
                    models.Run.run_id,
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
                    "run_id": run_id,
                    "created_at": created_at.timestamp(),
                    "started_at": start_date.timestamp() if start_date else None,
                    "state": state,
                    "event_at": event_at.timestamp(),
                    "offset": extra["payload"]["offset"],
                }
                for run_id, created_at, start_date, state, event_at, extra in result.all()
            ]
    finally:
        await engine.dispose()


async def hold_launcher(daemon: Daemon, marks: Path) -> None:
    """Queue a manual run of ``hold`` and wait until it runs: it keeps the launcher's slot."""
    async with daemon.service.sessions.begin() as session:
        await trigger_run(session, "hold", actor=cli_principal())
    held = anyio.Path(marks / "hold")
    with anyio.fail_after(HOLD_TIMEOUT_S):
        while not await held.exists():  # noqa: ASYNC110 - another process writes it
            await anyio.sleep(0.1)


async def daemon_latency(
    bootstrap: str,
    workdir: Path,
    messages: int,
    max_gap_s: float,
    fetch_max_wait_ms: int | None,
) -> dict[str, Any]:
    options = GROUP_OPTIONS + f", fetch_max_wait_ms={fetch_max_wait_ms or 500}"
    topic, database_url, marks = await deployment(bootstrap, workdir, "latency", options)
    settings = daemon_settings(
        workdir,
        database_url,
        runs={"parallelism": 1},
        daemon={"shutdown_grace_s": 0},  # the held run is stopped at once
    )
    gaps = random.Random(GAP_SEED)  # noqa: S311 - benchmark jitter, not security
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    produced: list[float] = []
    consumed: list[float] = []
    committed: list[float] = []
    total = LATENCY_WARMUP + messages
    try:
        with StoreWatch() as watch:
            async with running(settings) as daemon:
                await hold_launcher(daemon, marks)
                await daemon.wait_assigned()
                runs_before = len(watch.runs)
                cpu_before, wall_before, machine = cpu_s(), time.time(), cpu_ticks()
                seen, seen_s = histogram(metrics.MESSAGE_TO_COMMITTED)
                for index in range(total):
                    produced.append(time.time())
                    timestamp_ms = int(produced[-1] * 1000)
                    await producer.send_and_wait(
                        topic, latency_message(index), timestamp_ms=timestamp_ms
                    )
                    await watch.wait_runs(runs_before + index + 1, RUN_TIMEOUT_S)
                    (at,) = last_events_at().values()
                    consumed.append(at)
                    count, sum_s = histogram(metrics.MESSAGE_TO_COMMITTED)
                    if count != seen + 1:
                        raise AssertionError(f"message {index}: {count - seen} commits, not 1")
                    committed.append(timestamp_ms / 1000 + sum_s - seen_s)
                    seen, seen_s = count, sum_s
                    await anyio.sleep(gaps.uniform(0, max_gap_s))
                cpu_percent = 100 * (cpu_s() - cpu_before) / (time.time() - wall_before)
                machine_percent = machine_busy_percent(machine)
    finally:
        await producer.stop()
    rows = await runs_with_events(database_url)
    offsets = [row["offset"] for row in rows]
    if offsets != list(range(total)):
        raise AssertionError(f"expected one run per message in order, got offsets {offsets}")
    if any(row["state"] != "queued" for row in rows):
        raise AssertionError("a measured run was started: the held run let go of its slot")
    measured = range(LATENCY_WARMUP, total)
    consumed_s = [consumed[i] - produced[i] for i in measured]
    committed_s = [committed[i] - produced[i] for i in measured]
    created_s = [watch.runs[rows[i]["run_id"]] - produced[i] for i in measured]
    return {
        "kafka_fetch_max_wait_ms": fetch_max_wait_ms or "500 (the default)",
        "messages": messages,
        "produce_to_committed_ms": spread_ms(committed_s),
        "produce_to_run_created_ms": spread_ms(created_s),
        "breakdown_p50_ms": {
            "produce_to_consumed": round(percentile(consumed_s, 50) * 1000, 1),
            "consumed_to_committed": _p50_ms_between(consumed_s, committed_s),
            "committed_to_run_created": _p50_ms_between(committed_s, created_s),
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
            percentile(created_s, 50) * 1000 <= GOALS["run_created_p50_ms"]
            and percentile(created_s, 99) * 1000 <= GOALS["run_created_p99_ms"]
        ),
    }


def _p50_ms_between(earlier: list[float], later: list[float]) -> float:
    return round(percentile([b - a for a, b in zip(earlier, later, strict=True)], 50) * 1000, 1)


async def part_latency(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    gap_s = args.max_gap_ms / 1000
    messages = args.latency_messages
    raw: dict[str, Any] = {
        "messages": min(messages, RAW_LATENCY_MESSAGES),
        "warmup": LATENCY_WARMUP,
        "message": latency_message,
        "max_gap_s": gap_s,
        "seed": GAP_SEED,
    }
    return {
        "method": "observed through metrics and run commits; the launcher's one slot held by a "
        "waiting run: runs created, not started",
        "raw_aiokafka": await baselines.consumer_latency(
            args.bootstrap, fetch_max_wait_ms=None, **raw
        ),
        "raw_aiokafka_fast_fetch": await baselines.consumer_latency(
            args.bootstrap, fetch_max_wait_ms=FAST_FETCH_MAX_WAIT_MS, **raw
        ),
        "daemon": await daemon_latency(args.bootstrap, workdir / "a", messages, gap_s, None),
        "daemon_fast_fetch": await daemon_latency(
            args.bootstrap, workdir / "b", messages, gap_s, FAST_FETCH_MAX_WAIT_MS
        ),
    }


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max-gap-ms",
        type=float,
        default=150.0,
        help="pause a random 0..this long after each message is processed, so messages land at "
        "random points of the consumer's long-poll cycle",
    )


BENCH = Bench(
    module="tests.benchmarks.bench_latency",
    description="Kafka message to run created, through the daemon",
    parts={"latency": part_latency},
    full={"latency_messages": 200},
    quick={"latency_messages": 50},
    goals=GOALS,
    options=options,
)

if __name__ == "__main__":
    main(BENCH)
