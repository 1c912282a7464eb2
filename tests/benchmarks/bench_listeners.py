"""Ingest rate with and without a slow listener: a listener must not slow ingest.

    python -m tests.benchmarks.bench_listeners --out bench_listeners.json [--quick]

Pre-produced Kafka messages (4 partitions) into committed events with queue rows, as
``bench_ingest``'s throughput parts (their pipelines, observed the same way): the consumer
pipeline is scheduled on ``[orders, never]``, so no run starts. Each variant runs in a child
process of its own with a fresh database and consumer group:

- ``none``: no listener plugin;
- ``sleep_1ms``: a plugin whose ``on_asset_event_emitted`` sleeps 1 ms per call, so it hears at
  most ~1,000 events/s while ingest commits several times that.

Variants alternate (none, sleep, none, sleep, ...: ``REPEATS`` each, as the machine's load
drifts) on SQLite and on PostgreSQL; each backend's ratio is the median rate with the listener
over the median without. Rate: from the commit that passes
10% of the events to the last one. Also reported: the daemon's CPU per event (the listeners'
process not included), and what the listener had heard (acknowledged in items of a batch),
what waited for it and what was dropped (the queue holds ``[listeners] max_pending_events``)
when ingest finished. Goal: ratio >= 0.9.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import uuid
from pathlib import Path
from typing import Any

import anyio

if __package__ in (None, ""):  # run as a script: put the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from deploy.local.services import tansu
from tests.benchmarks.bench_ingest import PIPELINES, WARM, prepare_topic
from tests.benchmarks.harness import (
    DEFAULT_PG_URL,
    GROUP_OPTIONS,
    daemon_settings,
    database,
    running,
)
from tests.benchmarks.observe import IngestLog, StoreWatch, metric_value
from tests.benchmarks.report import publish
from tests.e2e.daemon import write_pipelines
from triggerer.service import metrics
from triggerer.service.config import LoggingSettings
from triggerer.service.logs import configure_logging

BACKENDS = ("sqlite", "postgresql")
VARIANTS = ("none", "sleep_1ms")
REPEATS = 4
FULL = {"messages": 40_000}
QUICK = {"messages": 10_000}
GOAL_RATIO = 0.9
LISTENER_SLEEP_S = 0.001

LISTENER = """
    import time

    from triggerer import hookimpl

    @hookimpl
    def on_asset_event_emitted(asset_event):
        time.sleep({sleep_s})
"""


async def run_variant(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """One daemon over the whole topic, with or without the sleeping listener."""
    plugins: tuple[str, ...] = ()
    if args.variant == "sleep_1ms":
        name = f"bench_sleeping_listener_{uuid.uuid4().hex[:8]}"
        (workdir / f"{name}.py").write_text(
            textwrap.dedent(LISTENER.format(sleep_s=LISTENER_SLEEP_S))
        )
        sys.path.insert(0, str(workdir))
        plugins = (name,)
    write_pipelines(
        workdir / "pipelines",
        PIPELINES.format(
            bootstrap=args.bootstrap,
            topic=args.topic,
            group=f"{args.topic}-{uuid.uuid4().hex[:8]}",
            options=GROUP_OPTIONS,
        ),
    )
    count = args.messages
    with database(args.backend, workdir, args.pg_url, "listeners") as database_url:
        settings = daemon_settings(workdir, database_url, listeners={"plugins": plugins})
        with StoreWatch() as watch:
            log = IngestLog(watch)
            async with running(settings), anyio.create_task_group() as tasks:
                tasks.start_soon(log.run)
                last = await log.wait_recorded(count, timeout_s=max(300, count / 200))
                tasks.cancel_scope.cancel()
                pending = metric_value(
                    metrics.LISTENER_PENDING, "triggerer_listener_pending_events"
                )
                waiting = int(pending)
                dropped = int(
                    metric_value(
                        metrics.LISTENER_DROPPED, "triggerer_listener_events_dropped_total"
                    )
                )
                at_end = {
                    "heard": count - waiting - dropped,
                    "waiting": waiting,
                    "dropped": dropped,
                }
    warm = log.first(count * WARM)
    steady_s = last.at - warm.at
    return {
        "events_per_s": round((last.recorded - warm.recorded) / steady_s),
        "daemon_cpu_us_per_event": round(
            1e6 * (last.cpu_s - warm.cpu_s) / (last.recorded - warm.recorded), 1
        ),
        "commits": last.commits,
        "listener_at_ingest_end": at_end if plugins else None,
    }


def summarise(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    rates = {variant: [r["events_per_s"] for r in runs[variant]] for variant in VARIANTS}
    medians = {variant: statistics.median(rates[variant]) for variant in VARIANTS}
    ratio = medians["sleep_1ms"] / medians["none"]
    return {
        "events_per_s_without_listener": rates["none"],
        "events_per_s_with_1ms_listener": rates["sleep_1ms"],
        "cpu_us_per_event_without": [r["daemon_cpu_us_per_event"] for r in runs["none"]],
        "cpu_us_per_event_with": [r["daemon_cpu_us_per_event"] for r in runs["sleep_1ms"]],
        "listener_at_ingest_end": [r["listener_at_ingest_end"] for r in runs["sleep_1ms"]],
        "ratio_of_medians": round(ratio, 3),
        "meets_goal": ratio >= GOAL_RATIO,
    }


def run_all(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {
        "meta": {
            "messages": args.messages,
            "listener_sleep_s": LISTENER_SLEEP_S,
            "repeats": REPEATS,
            "goal_ratio": GOAL_RATIO,
        }
    }
    with tempfile.TemporaryDirectory(prefix="bench-listeners-") as folder:
        broker = tansu(Path(folder))
        broker.start()
        try:
            produced = time.perf_counter()
            topic = anyio.run(prepare_topic, broker.address, args.messages)
            results["meta"]["produce_s"] = round(time.perf_counter() - produced, 1)
            for backend in BACKENDS:
                runs: dict[str, list[dict[str, Any]]] = {variant: [] for variant in VARIANTS}
                for _ in range(REPEATS):
                    for variant in VARIANTS:
                        sys.stdout.write(f"-- {backend} {variant}\n")
                        sys.stdout.flush()
                        out = Path(folder) / "variant.json"
                        argv = [sys.executable, "-m", "tests.benchmarks.bench_listeners"]
                        argv += ["--variant", variant, "--backend", backend, "--topic", topic]
                        argv += ["--bootstrap", broker.address, "--pg-url", args.pg_url]
                        argv += ["--messages", str(args.messages), "--variant-out", str(out)]
                        done = subprocess.run(argv, check=False)  # noqa: S603 - this script
                        if done.returncode:
                            results[backend] = {"error": f"{variant}: exit code {done.returncode}"}
                            break
                        runs[variant].append(json.loads(out.read_text()))
                    if backend in results:
                        break
                if backend not in results:
                    results[backend] = summarise(runs)
        finally:
            broker.stop()
    return results


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description="ingest rate with and without a slow listener")
    parser.add_argument("--out", type=Path, default=Path("bench_listeners.json"))
    parser.add_argument("--quick", action="store_true", help="small sizes: " + json.dumps(QUICK))
    parser.add_argument("--messages", type=int, help=f"(full {FULL['messages']})")
    parser.add_argument("--pg-url", default=DEFAULT_PG_URL, help="server to create databases on")
    parser.add_argument("--variant", choices=VARIANTS, help=argparse.SUPPRESS)
    parser.add_argument("--backend", choices=BACKENDS, help=argparse.SUPPRESS)
    parser.add_argument("--variant-out", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--bootstrap", help=argparse.SUPPRESS)
    parser.add_argument("--topic", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.messages is None:
        args.messages = (QUICK if args.quick else FULL)["messages"]
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse(argv)
    configure_logging(LoggingSettings(level="WARNING", format="console"))
    if args.variant:
        with tempfile.TemporaryDirectory(prefix="bench-listeners-") as folder:
            result = anyio.run(run_variant, args, Path(folder))
        args.variant_out.write_text(json.dumps(result, indent=2) + "\n")
        return
    results = run_all(args)
    publish(results, args.out)
    if any("error" in value for value in results.values()):
        sys.exit(1)


if __name__ == "__main__":
    main()
