"""What ``[tracing]`` costs ingest: the daemon's CPU per event with tracing on against off.

    python -m tests.benchmarks.bench_tracing --out bench_tracing.json [--quick]

Parts ``cpu_per_event_postgresql`` and ``cpu_per_event_sqlite``: pre-produced Kafka messages
(4 partitions), each with a ``traceparent`` header of a trace of its own, ingested into
committed events by the daemon in this process
(:func:`tests.benchmarks.bench_ingest.daemon_throughput`), in three arms:

- ``off``: ``exporter = "none"``; each event still stores its message's trace context;
- ``on``: ``exporter = "otlp"`` to an OTLP/HTTP receiver in a process of its own
  (``tests/fixtures/otlp.py``), so the spans are made, batched, serialized and sent (a span
  per ingested batch, a link per message) and only the receiving is not the daemon's;
- ``off_no_context``: off, on the same messages with the header under another name
  (``xtraceparent``, the payloads as long), so that no context is read or stored: what
  reading and storing the carried context costs.

The arms alternate over ``--rounds`` rounds, each on a new database, and each arm's median CPU
per event (this process's CPU over the events from 10% on, the export thread's included) is
reported with the ratios. Goal: on at most 1.05 times off. PostgreSQL's writes cost the daemon
least CPU (SQLite writes in the daemon's process), so tracing's share shows most there.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

from aiokafka import AIOKafkaProducer

if __package__ in (None, ""):  # run as a script: put the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.benchmarks.bench_ingest import daemon_throughput
from tests.benchmarks.bench_kafka import PARTITIONS, create_topics, message
from tests.benchmarks.harness import DEFAULT_PG_URL, Bench, database, main

GOALS = {"max_cpu_ratio_on_to_off": 1.05}
ARMS = ("off", "on", "off_no_context")
PLAIN = "-plain"
"""The suffix of the topic holding the same messages with the header under another name."""


def traceparent(index: int) -> str:
    """A sampled context of a trace of its own for message ``index``."""
    return f"00-{uuid.uuid4().hex}-{index + 1:016x}-01"


async def produce(bootstrap: str, topic: str, count: int, *, traced: bool) -> None:
    header = "traceparent" if traced else "xtraceparent"
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, max_batch_size=1 << 20)
    await producer.start()
    try:
        for start in range(0, count, 10_000):
            sent = [
                await producer.send(
                    topic,
                    message(i),
                    partition=i % PARTITIONS,
                    headers=[(header, traceparent(i).encode())],
                )
                for i in range(start, min(start + 10_000, count))
            ]
            await asyncio.gather(*sent)
    finally:
        await producer.stop()


async def prepare(args: argparse.Namespace, meta: dict[str, Any]) -> None:
    args.topic = f"bench-tracing-{uuid.uuid4().hex[:8]}"
    await create_topics(args.bootstrap, [args.topic, args.topic + PLAIN], PARTITIONS)
    await produce(args.bootstrap, args.topic, args.tracing_messages, traced=True)
    await produce(args.bootstrap, args.topic + PLAIN, args.tracing_messages, traced=False)


class Receiver:
    """``python -m tests.fixtures.otlp``: an OTLP/HTTP receiver in a process of its own."""

    def __init__(self) -> None:
        command = [sys.executable, "-m", "tests.fixtures.otlp"]
        self.process = subprocess.Popen(  # noqa: S603 - our own module
            command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
        )
        assert self.process.stdout is not None
        self.endpoint = self.process.stdout.readline().strip()

    def close(self) -> dict[str, int]:
        """Stop it; the spans, links and requests it received."""
        out, _ = self.process.communicate(timeout=60)
        counts: dict[str, int] = json.loads(out)
        return counts


async def cpu_per_event(args: argparse.Namespace, workdir: Path, backend: str) -> dict[str, Any]:
    count = args.tracing_messages
    receiver = Receiver()
    tracing = {"exporter": "otlp", "endpoint": receiver.endpoint, "export_delay_s": 1.0}
    figures: dict[str, list[dict[str, Any]]] = {arm: [] for arm in ARMS}
    try:
        for round_ in range(args.rounds):
            # Rotated, so that no arm always runs first, after the same one, or last.
            for arm in ARMS[round_ % 3 :] + ARMS[: round_ % 3]:
                topic = args.topic + (PLAIN if arm == "off_no_context" else "")
                arm_args = argparse.Namespace(**{**vars(args), "topic": topic})
                sections = {"tracing": tracing} if arm == "on" else {}
                with database(backend, workdir, args.pg_url, f"{arm}{round_}") as url:
                    result = await daemon_throughput(arm_args, workdir, url, count, **sections)
                figures[arm].append(result)
    finally:
        received = receiver.close()
    cpu = {
        arm: statistics.median(r["daemon_cpu_us_per_event"] for r in results)
        for arm, results in figures.items()
    }
    rates = {
        arm: round(statistics.median(r["events_per_s"] for r in results))
        for arm, results in figures.items()
    }
    expected_links = args.rounds * count
    if received["links"] != expected_links:
        raise AssertionError(f"the receiver got {received['links']} links, not {expected_links}")
    ratio = cpu["on"] / cpu["off"]
    return {
        "messages": count,
        "rounds": args.rounds,
        "batch_size": figures["on"][0]["batch_size"],
        "daemon_cpu_us_per_event": {arm: round(value, 1) for arm, value in cpu.items()},
        "daemon_cpu_us_per_event_rounds": {
            arm: [r["daemon_cpu_us_per_event"] for r in results] for arm, results in figures.items()
        },
        "events_per_s": rates,
        "cpu_ratio_on_to_off": round(ratio, 3),
        "cpu_ratio_off_to_off_no_context": round(cpu["off"] / cpu["off_no_context"], 3),
        "spans_received": received["spans"],
        "links_received": received["links"],
        "meets_goal": ratio <= GOALS["max_cpu_ratio_on_to_off"],
    }


async def part_cpu_per_event_postgresql(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    return await cpu_per_event(args, workdir, "postgresql")


async def part_cpu_per_event_sqlite(args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    return await cpu_per_event(args, workdir, "sqlite")


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--pg-url", default=DEFAULT_PG_URL, help="server to create databases on")


BENCH = Bench(
    module="tests.benchmarks.bench_tracing",
    description="what [tracing] costs ingest: CPU per event, tracing on against off",
    parts={
        "cpu_per_event_postgresql": part_cpu_per_event_postgresql,
        "cpu_per_event_sqlite": part_cpu_per_event_sqlite,
    },
    full={"tracing_messages": 50_000, "rounds": 5},
    quick={"tracing_messages": 10_000, "rounds": 2},
    goals=GOALS,
    options=options,
    prepare=prepare,
)

if __name__ == "__main__":
    main(BENCH)
