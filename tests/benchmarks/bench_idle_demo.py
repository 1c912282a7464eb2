"""The demo's daemon, idle: what ``triggerer run`` on the demo configuration costs at rest.

    python -m tests.benchmarks.bench_idle_demo --out bench_idle_demo.json [--quick]

Part ``idle_demo``: ``triggerer run --config config/triggerer.toml`` (local Spark, SQLite, the
API, the demo's Kafka, SQS and file watchers; its moto server started here), left alone once it
settled: CPU of the daemon's process (its Spark server and run forker are processes of their
own) and how often each of its threads woke, from ``/proc``. Goal: under 1 % of a core.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path
from typing import Any

import anyio

if __package__ in (None, ""):  # run as a script: put the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from deploy.local import demo
from deploy.local.services import DUMMY_AWS_ENV, moto
from tests.benchmarks.harness import Bench, main, triggerer_run
from tests.benchmarks.stats import thread_activity

GOALS = {"demo_idle_cpu_percent": 1.0}
SETTLE_S = 30.0
"""Its Spark server's start, the watchers' joins and the first heartbeats, before measuring."""


async def part_idle_demo(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    sqs = moto(workdir)
    sqs.start()
    endpoint = f"http://{sqs.address}"
    env = {
        **os.environ,
        **DUMMY_AWS_ENV,
        "TRIGGERER_DEMO_KAFKA": args.bootstrap,
        "TRIGGERER_DEMO_SQS": f"sqs://customers?region=us-east-1&endpoint_url={endpoint}",
        "TRIGGERER_DATABASE__URL": f"sqlite:///{workdir / 'triggerer.db'}",
        "TRIGGERER_SPARK__LOGS_DIR": str(workdir / "logs"),
        "TRIGGERER_API__PORT": "0",
    }
    try:
        os.environ.update(DUMMY_AWS_ENV)  # the SQS client's region and credentials
        await demo.create_queue_and_topic(endpoint, args.bootstrap)
        daemon = await triggerer_run(demo.CONFIG, env, demo.ROOT, workdir / "daemon.log")
        try:
            await anyio.sleep(SETTLE_S)
            before, wall = thread_activity(daemon.pid), time.time()
            # Three times the watchers' window: a fraction of a percent is a few clock ticks.
            await anyio.sleep(3 * args.idle_seconds)
            after, seconds = thread_activity(daemon.pid), time.time() - wall
        finally:
            daemon.terminate()
            with anyio.fail_after(60):
                await daemon.wait()
    finally:
        sqs.stop()
    both = [thread for thread in after if thread in before]
    busy_s = sum(after[t][1] - before[t][1] for t in both) / os.sysconf("SC_CLK_TCK")
    wakes = sorted((round((after[t][0] - before[t][0]) / seconds, 1) for t in both), reverse=True)
    return {
        "idle_seconds": round(seconds, 1),
        "cpu_percent": round(100 * busy_s / seconds, 2),
        "wakes_per_s_by_thread": wakes,
        "goal_cpu_percent": GOALS["demo_idle_cpu_percent"],
    }


BENCH = Bench(
    module="tests.benchmarks.bench_idle_demo",
    description="the demo's daemon (triggerer run), idle",
    parts={"idle_demo": part_idle_demo},
    full={"idle_seconds": 20.0},
    quick={"idle_seconds": 10.0},
    goals=GOALS,
)

if __name__ == "__main__":
    main(BENCH)
