"""Fan-out: many watchers of one topic, through the shared consumer or a consumer each.

    python -m tests.benchmarks.bench_fanout --out bench_fanout.json [--quick]

Part ``fanout_kafka``: N watchers of one topic with different filters, on pre-produced
messages, first through the shared consumer, then each with a consumer of its own
(``group_id`` set): messages fetched from the broker (the shared consumers' count, or the
triggers' own), time until every event is stored (the metric ``triggerer_events_stored_total``,
looked at after each commit), and the daemon's CPU seconds from its start (the queue
providers it imports as it starts are imported beforehand, so neither daemon is charged for
them).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
import uuid
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer

if __package__ in (None, ""):  # run as a script: put the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.benchmarks.bench_kafka import create_topics
from tests.benchmarks.harness import Bench, daemon_settings, import_providers, main, running
from tests.benchmarks.observe import StoreWatch, events_stored
from tests.benchmarks.stats import cpu_s
from tests.e2e.daemon import write_pipelines

KINDS = 5
ALL_EVENTS_TIMEOUT_S = 600.0
PIPELINES = """
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


async def part_fanout(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    topic = f"bench-fanout-{uuid.uuid4().hex[:8]}"
    await create_topics(args.bootstrap, [topic], 1)
    messages = args.fanout_messages
    await produce_kinds(args.bootstrap, topic, messages)
    import_providers()
    results = {}
    for name, group in (("shared", ""), ("own_consumers", ", group_id=f'fanout-{number}'")):
        folder = workdir / name
        write_pipelines(
            folder / "pipelines",
            PIPELINES.format(
                bootstrap=args.bootstrap,
                topic=topic,
                count=args.fanout_watchers,
                kinds=KINDS,
                group=group,
            ),
        )
        settings = daemon_settings(folder, f"sqlite:///{folder / 'triggerer.db'}")
        expected = args.fanout_watchers * messages // KINDS
        before = events_stored()
        started, cpu = time.time(), cpu_s()
        with StoreWatch() as watch:
            async with running(settings) as daemon:
                await watch.wait_stored(before + expected, ALL_EVENTS_TIMEOUT_S)
                elapsed, used = time.time() - started, cpu_s() - cpu
                results[name] = {
                    "events": events_stored() - before,
                    "messages_fetched": daemon.messages_fetched(),
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
    """``count`` messages whose ``kind`` goes round ``0..KINDS-1``."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20)
    await producer.start()
    try:
        sent = [
            await producer.send(topic, json.dumps({"n": n, "kind": n % KINDS}).encode())
            for n in range(count)
        ]
        await asyncio.gather(*sent)
    finally:
        await producer.stop()


BENCH = Bench(
    module="tests.benchmarks.bench_fanout",
    description="many watchers of one topic: the shared consumer against a consumer each",
    parts={"fanout_kafka": part_fanout},
    full={"fanout_watchers": 50, "fanout_messages": 2000},
    quick={"fanout_watchers": 10, "fanout_messages": 500},
)

if __name__ == "__main__":
    main(BENCH)
