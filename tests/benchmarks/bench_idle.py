"""Idle watchers: what N watchers with nothing to read cost the daemon.

    python -m tests.benchmarks.bench_idle --out bench_idle.json [--quick] [--parts ...]

Parts ``idle_kafka`` / ``idle_file``: N assets, each with its own trigger (KafkaTrigger on its
own topic, read through the daemon's shared consumer, or FileTrigger on its own folder), in one
daemon; RSS and CPU of the daemon's process (not the broker) over an idle period once every
trigger runs, and how long the daemon's heartbeat takes (``triggerer check`` calls a heartbeat
older than three intervals stale). ``idle_kafka`` also measures the floor alongside: one plain
aiokafka consumer of the same topics (the shared consumer's own cost: every fetch names every
partition), as a ratio.

Observed: watchers and restarts from the metrics ``triggerer_watcher_up`` and
``triggerer_watcher_restarts_total``; heartbeats and lease renewals from the daemon's SQL
(:class:`tests.benchmarks.observe.StoreWatch`): a heartbeat from its sign of life's read to its
last query, a renewal from its statement to its commit.
"""

from __future__ import annotations

import argparse
import itertools
import sys
import time
import uuid
from pathlib import Path
from typing import Any

import anyio

if __package__ in (None, ""):  # run as a script: put the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.benchmarks import baselines
from tests.benchmarks.bench_kafka import create_topics, rss_mb
from tests.benchmarks.harness import Bench, daemon_settings, import_providers, main, running
from tests.benchmarks.observe import StoreWatch, metric_series
from tests.benchmarks.stats import cpu_s, cpu_ticks, machine_busy_percent, process_status
from tests.e2e.daemon import write_pipelines
from triggerer.service import metrics

HEARTBEAT_WAIT_S = 60.0
SETTLE_S = 5.0
"""Past the first FileTrigger poll and the consumers' heartbeats, before measuring."""
TOPICS_PER_CALL = 250

PIPELINES = """
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
KAFKA_TRIGGER = "KafkaTrigger(bootstrap_servers={bootstrap!r}, topics=[source])"
FILE_TRIGGER = "FileTrigger(source)"


async def part_idle(args: argparse.Namespace, workdir: Path, kind: str) -> dict[str, Any]:
    count = args.idle_watchers
    if kind == "kafka":
        prefix = f"bench-idle-{uuid.uuid4().hex[:8]}"
        sources = [f"{prefix}-{number}" for number in range(count)]
        for first in range(0, count, TOPICS_PER_CALL):
            await create_topics(args.bootstrap, sources[first : first + TOPICS_PER_CALL], 1)
        trigger = KAFKA_TRIGGER.format(bootstrap=args.bootstrap)
    else:
        sources = [str(workdir / "folders" / str(number)) for number in range(count)]
        for source in sources:
            await anyio.Path(source).mkdir(parents=True)
        trigger = FILE_TRIGGER
    write_pipelines(workdir / "pipelines", PIPELINES.format(trigger=trigger, sources=sources))
    settings = daemon_settings(workdir, f"sqlite:///{workdir / 'triggerer.db'}")
    import_providers()
    rss_before = rss_mb()
    started = time.time()
    with StoreWatch() as watch:
        async with running(settings) as daemon:
            serving = time.time()
            if kind == "kafka":
                await daemon.wait_assigned(timeout_s=300)
            ready = time.time()
            await anyio.sleep(SETTLE_S)
            rss_started, wall, cpu, machine = rss_mb(), time.time(), cpu_s(), cpu_ticks()
            await anyio.sleep(args.idle_seconds)
            ended = time.time()
            cpu_percent = 100 * (cpu_s() - cpu) / (ended - wall)
            machine_percent = machine_busy_percent(machine)
            rss_idle = rss_mb()
            status = process_status()
            watchers_running = len(metric_series(metrics.WATCHER_UP))
            restarts = sum(metric_series(metrics.WATCHER_RESTARTS).values())
            # Two heartbeats after startup give one staleness figure, however long they take.
            with anyio.move_on_after(HEARTBEAT_WAIT_S):
                await watch.wait_until(
                    lambda: sum(start >= ready for start, _ in watch.heartbeats) >= 2,
                    HEARTBEAT_WAIT_S,
                )
            stopping = time.time()
    heartbeats = [(a, b) for a, b in watch.heartbeats if a >= ready and b <= stopping]
    durations = [b - a for a, b in heartbeats]
    renewals = [b - a for a, b in watch.lease_renewals if a >= ready and b <= stopping]
    if durations and not renewals:
        renewals = [0.0]  # no lease held (shareable triggers): a renewal sends nothing
    window = [b - a for a, b in heartbeats if a >= wall and b <= ended]
    floor = {}
    if kind == "kafka":
        raw = await baselines.idle_consumer_cpu_percent(args.bootstrap, sources, args.idle_seconds)
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
        "restarts": int(restarts),
        **status,
        "heartbeat_interval_s": settings.daemon.heartbeat_interval_s,
        "heartbeats_measured": len(durations),
        "heartbeats_in_idle_window": len(window),
        "heartbeat_mean_ms": round(1000 * sum(durations) / len(durations)) if durations else None,
        "of_which_lease_renewal_mean_ms": (
            round(1000 * sum(renewals) / len(renewals)) if renewals else None
        ),
        "heartbeat_max_staleness_s": round(
            max((b2 - a1 for (a1, _), (_, b2) in itertools.pairwise(heartbeats)), default=0), 1
        ),
        "check_stale_after_s": settings.daemon.dead_after_s,
    }


async def part_idle_kafka(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    return await part_idle(args, workdir, "kafka")


async def part_idle_file(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    return await part_idle(args, workdir, "file")


BENCH = Bench(
    module="tests.benchmarks.bench_idle",
    description="idle watchers: the daemon's memory, CPU and heartbeat with N of them",
    parts={"idle_kafka": part_idle_kafka, "idle_file": part_idle_file},
    full={"idle_watchers": 1000, "idle_seconds": 20.0},
    quick={"idle_watchers": 200, "idle_seconds": 10.0},
)

if __name__ == "__main__":
    main(BENCH)
