"""Retention's cost to ingest: the ingest rate while retention deletes a large backlog, against
the same ingest with retention off, on each store.

    python -m tests.benchmarks.bench_retention --out bench_retention.json [--quick] [--parts ...]

Parts ``sqlite`` / ``postgresql``, each run twice on fresh databases holding the same backlog of
old events (``--backlog-events``, stored 60 days ago, queued for no pipeline, with payloads of
the size Kafka's messages get): once with ``[retention]`` off (every kind ``0`` days), once with
``events_days = 30`` and ``interval_s = 1``, so that retention deletes the whole backlog in
batches of the default ``batch_size``. The daemon starts with no watcher, so retention is
deleting (its first batch is seen) before the Kafka watcher is added to the pipelines folder;
then the pre-produced messages (4 partitions) are ingested into events and queue rows, as in
``bench_ingest``.

Figures per run: ingest's events/s from the commit that passes 10% of the messages to the last
one, and the daemon's CPU per event. With retention on also: ingest's events/s over the part of
that window where retention was deleting (between its first and last batch seen) and how much of
the window that was, retention's rows/s while ingest ran, and how long it took to clear the
backlog. Observed through the daemon's metrics (``triggerer_events_stored_total``,
``triggerer_retention_deleted_total{kind="events"}``), read after each commit.
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import anyio
from sqlalchemy import func, insert, select

if __package__ in (None, ""):  # run as a script: put the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.benchmarks.baselines import kafka_extra
from tests.benchmarks.bench_ingest import PIPELINES, prepare_topic
from tests.benchmarks.harness import (
    DEFAULT_PG_URL,
    GROUP_OPTIONS,
    Bench,
    daemon_settings,
    database,
    main,
    running,
)
from tests.benchmarks.observe import IngestLog, Progress, StoreWatch, metric_value
from tests.e2e.daemon import write_pipelines
from triggerer.service import metrics
from triggerer.service.loader import load_pipelines
from triggerer.service.scheduling.registry import sync_definitions
from triggerer.service.store import create_engine, models, session_factory, upgrade
from triggerer.service.store.types import utcnow

WARM = 0.1
"""The share of events left out at the start: the group join and the first fetches."""
BACKLOG_AGE_DAYS = 60
SEED_CHUNK = 5_000
SAMPLE_S = 0.02

IDLE_PIPELINES = """
    from triggerer import Asset, pipeline

    orders = Asset("orders")
    never = Asset("never")

    @pipeline(schedule=[orders, never])
    def consumer(spark, context):
        raise AssertionError("never runs: the asset 'never' gets no events")
"""
"""The pipelines of ``bench_ingest`` without the watcher: the daemon's first moments."""

RETENTION_OFF = {"events_days": 0, "runs_days": 0, "dead_letters_days": 0}
RETENTION_ON = {"events_days": 30, "interval_s": 1.0}


async def prepare(args: argparse.Namespace, meta: dict[str, Any]) -> None:
    started = time.perf_counter()
    args.topic = await prepare_topic(args.bootstrap, args.retention_messages)
    meta["produce_s"] = round(time.perf_counter() - started, 1)


async def seed_backlog(database_url: str, pipelines: Path, count: int) -> float:
    """The store as the daemon would leave it, plus ``count`` old events on ``orders``; the
    seconds it took."""
    started = time.perf_counter()
    await upgrade(database_url)
    engine = create_engine(database_url)
    try:
        async with session_factory(engine).begin() as session:
            await sync_definitions(session, load_pipelines(pipelines))
            orders = await session.scalar(
                select(models.Asset.id).where(models.Asset.name == "orders")
            )
        old = utcnow() - dt.timedelta(days=BACKLOG_AGE_DAYS)
        extra = kafka_extra("backlog", 0)
        for first in range(0, count, SEED_CHUNK):
            rows = [
                {
                    "asset_id": orders,
                    "extra": extra,
                    "source": "trigger",
                    "dedup_key": f"backlog/{index}",
                    "timestamp": old,
                }
                for index in range(first, min(count, first + SEED_CHUNK))
            ]
            async with engine.begin() as connection:
                await connection.execute(insert(models.AssetEvent), rows)
    finally:
        await engine.dispose()
    return time.perf_counter() - started


class RetentionLog:
    """When retention's deleted-events counter moved: :meth:`run` it in a task."""

    def __init__(self) -> None:
        self._base = self._deleted()
        self.samples: list[tuple[float, float]] = []
        """(``time.time()``, events deleted so far), at each change."""
        self._changed = anyio.Event()

    @staticmethod
    def _deleted() -> float:
        return metric_value(
            metrics.RETENTION_DELETED, "triggerer_retention_deleted_total", {"kind": "events"}
        )

    async def run(self) -> None:
        while True:
            deleted = self._deleted() - self._base
            if deleted and (not self.samples or deleted > self.samples[-1][1]):
                self.samples.append((time.time(), deleted))
                self._changed.set()
                self._changed = anyio.Event()
            await anyio.sleep(SAMPLE_S)

    async def wait_deleted(self, count: float, timeout_s: float) -> None:
        with anyio.fail_after(timeout_s):
            while not self.samples or self.samples[-1][1] < count:
                await self._changed.wait()

    def at(self, moment: float) -> float:
        """Events deleted by ``moment``."""
        return max((deleted for at, deleted in self.samples if at <= moment), default=0.0)


async def ingest(
    args: argparse.Namespace, workdir: Path, backend: str, retention: dict[str, Any]
) -> dict[str, Any]:
    """One daemon on a fresh database holding the backlog: ingest with ``retention``."""
    count, backlog = args.retention_messages, args.backlog_events
    name = f"r{uuid.uuid4().hex[:6]}"
    pipelines = workdir / name / "pipelines"
    write_pipelines(pipelines, IDLE_PIPELINES)
    with database(backend, workdir, args.pg_url, name) as database_url:
        seed_s = await seed_backlog(database_url, pipelines, backlog)
        settings = daemon_settings(
            workdir / name,
            database_url,
            pipelines={"reload_interval_s": 0.2},
            retention=retention,
        )
        on = bool(retention.get("events_days"))
        with StoreWatch() as watch:
            log, deleting = IngestLog(watch), RetentionLog()
            async with running(settings), anyio.create_task_group() as tasks:
                tasks.start_soon(log.run)
                tasks.start_soon(deleting.run)
                if on:
                    await deleting.wait_deleted(1, timeout_s=120)
                write_pipelines(
                    pipelines,
                    PIPELINES.format(
                        bootstrap=args.bootstrap, topic=args.topic, options=GROUP_OPTIONS
                    ),
                )
                last = await log.wait_recorded(count, timeout_s=max(300, count / 200))
                left_at_end = backlog - deleting.at(last.at)
                cleared_s = None
                if on:
                    await deleting.wait_deleted(backlog, timeout_s=max(300, backlog / 500))
                    cleared_s = round(deleting.samples[-1][0] - deleting.samples[0][0], 1)
                tasks.cancel_scope.cancel()
        counts = await _counts(database_url)
    expected = {"events": count + (0 if on else backlog), "queued": count}
    if counts != expected:
        raise AssertionError(f"expected {expected}, got {counts}")
    warm = log.first(count * WARM)
    steady_s = last.at - warm.at
    result: dict[str, Any] = {
        "backlog_seed_s": round(seed_s, 1),
        "events_per_s": round((last.recorded - warm.recorded) / steady_s),
        "daemon_cpu_us_per_event": round(
            1e6 * (last.cpu_s - warm.cpu_s) / (last.recorded - warm.recorded), 1
        ),
    }
    if on:
        result |= _overlap(log.progress, deleting, warm, last)
        result["backlog_left_when_ingest_ended"] = int(left_at_end)
        result["backlog_cleared_s"] = cleared_s
    return result


def _overlap(
    progress: list[Progress], deleting: RetentionLog, warm: Progress, last: Progress
) -> dict[str, Any]:
    """Ingest's rate while retention was deleting, within the measured window."""
    start = max(warm.at, deleting.samples[0][0])
    end = min(last.at, deleting.samples[-1][0])
    inside = [p for p in progress if start <= p.at <= end]
    if end <= start or len(inside) < 2:
        return {"overlap_percent": 0.0}
    first, final = inside[0], inside[-1]
    return {
        "overlap_percent": round(100 * (end - start) / (last.at - warm.at), 1),
        "events_per_s_while_deleting": round(
            (final.recorded - first.recorded) / (final.at - first.at)
        ),
        "retention_rows_per_s_while_ingesting": round(
            (deleting.at(end) - deleting.at(start)) / (end - start)
        ),
    }


async def _counts(database_url: str) -> dict[str, int]:
    engine = create_engine(database_url)
    try:
        async with session_factory(engine)() as session:
            events = await session.scalar(select(func.count()).select_from(models.AssetEvent))
            queued = await session.scalar(select(func.count()).select_from(models.QueuedEvent))
            return {"events": int(events or 0), "queued": int(queued or 0)}
    finally:
        await engine.dispose()


async def part(args: argparse.Namespace, workdir: Path, backend: str) -> dict[str, Any]:
    without = await ingest(args, workdir, backend, RETENTION_OFF)
    with_retention = await ingest(args, workdir, backend, RETENTION_ON)
    result = {
        "messages": args.retention_messages,
        "backlog_events": args.backlog_events,
        "retention_off": without,
        "retention_on": with_retention,
        "ratio_events_per_s": round(with_retention["events_per_s"] / without["events_per_s"], 3),
    }
    while_deleting = with_retention.get("events_per_s_while_deleting")
    if while_deleting is not None:
        result["ratio_events_per_s_while_deleting"] = round(
            while_deleting / without["events_per_s"], 3
        )
    return result


async def part_sqlite(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    return await part(args, workdir, "sqlite")


async def part_postgresql(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    return await part(args, workdir, "postgresql")


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pg-url", default=DEFAULT_PG_URL, help="server to create databases on")


BENCH = Bench(
    module="tests.benchmarks.bench_retention",
    description="retention's cost to ingest: ingest while it deletes a backlog, and without",
    parts={"sqlite": part_sqlite, "postgresql": part_postgresql},
    full={"retention_messages": 100_000, "backlog_events": 1_000_000},
    quick={"retention_messages": 20_000, "backlog_events": 200_000},
    options=options,
    prepare=prepare,
)

if __name__ == "__main__":
    main(BENCH)
