"""KafkaTrigger throughput against a raw aiokafka loop, and the cost of idle triggers.

    python tests/benchmarks/bench_kafka.py --out results.json [--messages N] [--idle-seconds S]

Starts its own tansu broker. The consumers read the same pre-produced topic in fresh groups;
throughput is timed from the message after the first ``WARMUP`` share to the last one, so the
consumer-group join and the first prefetch are not counted. KafkaTrigger runs twice: with a
consumer of its own, and through a shared consumer as the daemon runs it. The idle part runs
``--idle-triggers`` KafkaTriggers, each on its own empty topic, and samples the process's RSS
and CPU while they long-poll.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import anyio
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient, NewTopic

if __package__ in (None, ""):  # run as a script: put the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from deploy.local.services import tansu
from tests.benchmarks.report import publish
from watchers.kafka import KafkaTrigger
from watchers.kafka import fetcher as kafka_fetcher
from watchers.payloads import decode_body

PARTITIONS = 4
MESSAGE_BYTES = 200
WARMUP = 0.1
ROUNDS = 3
GROUP_OPTIONS: dict[str, Any] = {"session_timeout_ms": 6000, "heartbeat_interval_ms": 1000}


def message(index: int) -> bytes:
    """A JSON object of exactly ``MESSAGE_BYTES`` bytes."""
    head = json.dumps({"id": index, "type": "order", "pad": ""})
    return json.dumps(
        {"id": index, "type": "order", "pad": "x" * (MESSAGE_BYTES - len(head))}
    ).encode()


async def create_topics(bootstrap: str, names: list[str], partitions: int) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.create_topics([NewTopic(name, partitions, 1) for name in names])
    finally:
        await admin.close()


async def produce(bootstrap: str, topic: str, count: int) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=20, max_batch_size=1 << 20)
    await producer.start()
    try:
        for start in range(0, count, 10_000):
            sent = [
                await producer.send(topic, message(i), partition=i % PARTITIONS)
                for i in range(start, min(start + 10_000, count))
            ]
            await asyncio.gather(*sent)
    finally:
        await producer.stop()


async def raw_loop(
    bootstrap: str, topic: str, count: int, *, group_id: str, decode: bool = False
) -> float:
    """Events per second of a plain ``getmany`` + ``commit`` loop, decoding values if ``decode``."""
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=group_id,
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        **GROUP_OPTIONS,
    )
    await consumer.start()
    try:
        seen, warm, started = 0, int(count * WARMUP), 0.0
        while seen < count:
            batch = await consumer.getmany(timeout_ms=1000)
            for records in batch.values():
                seen += len(records)
                if decode:
                    for record in records:
                        decode_body(record.value)
            if batch:
                await consumer.commit()
            if not started and seen >= warm:
                started, warm = time.perf_counter(), seen
        return (count - warm) / (time.perf_counter() - started)
    finally:
        await consumer.stop()


async def trigger_loop(
    bootstrap: str, topic: str, count: int, *, group_id: str, shared: bool = False
) -> float:
    """Events per second through KafkaTrigger, each event acknowledged: with a consumer of its
    own, or (``shared``) through a shared consumer as in the daemon."""
    trigger = KafkaTrigger(
        bootstrap_servers=bootstrap,
        topics=[topic],
        group_id=group_id,
        shared_fetch=shared,
        **GROUP_OPTIONS,
    )
    with kafka_fetcher.sharing(kafka_fetcher.Fetchers(group_id)):
        return await _events_per_s(trigger, count)


async def _events_per_s(trigger: KafkaTrigger, count: int) -> float:
    seen, warm, started = 0, int(count * WARMUP), 0.0
    events = trigger.run()
    try:
        async for event in events:
            assert event.ack is not None  # every KafkaTrigger event has one
            await event.ack()
            seen += 1
            if seen == warm:
                started = time.perf_counter()
            elif seen == count:
                break
        return (count - warm) / (time.perf_counter() - started)
    finally:
        await events.aclose()
        await trigger.cleanup()


async def bench_throughput(bootstrap: str, messages: int) -> dict[str, Any]:
    topic = f"bench-{time.time_ns()}"
    await create_topics(bootstrap, [topic], PARTITIONS)
    await produce(bootstrap, topic, messages)
    # The three loops take turns, each in a fresh group, and each keeps its median: a burst of
    # load from elsewhere on the machine then skews one round, not one loop.
    runs: dict[str, list[float]] = {"raw": [], "raw_decoded": [], "trigger": [], "shared": []}
    for round_ in range(ROUNDS):
        runs["raw"].append(
            await raw_loop(bootstrap, topic, messages, group_id=f"{topic}-raw-{round_}")
        )
        runs["raw_decoded"].append(
            await raw_loop(
                bootstrap, topic, messages, group_id=f"{topic}-decoded-{round_}", decode=True
            )
        )
        runs["trigger"].append(
            await trigger_loop(bootstrap, topic, messages, group_id=f"{topic}-trigger-{round_}")
        )
        runs["shared"].append(
            await trigger_loop(
                bootstrap, topic, messages, group_id=f"{topic}-shared-{round_}", shared=True
            )
        )
    raw, raw_decoded, trigger, shared = (statistics.median(runs[name]) for name in runs)
    return {
        "messages": messages,
        "rounds": ROUNDS,
        "message_bytes": MESSAGE_BYTES,
        "partitions": PARTITIONS,
        "raw_events_per_s": round(raw),
        "raw_decoded_events_per_s": round(raw_decoded),
        "trigger_events_per_s": round(trigger),
        "ratio": round(trigger / raw, 3),
        "ratio_to_raw_decoded": round(trigger / raw_decoded, 3),
        "shared_consumer_events_per_s": round(shared),
        "shared_ratio": round(shared / raw, 3),
    }


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


async def bench_idle(bootstrap: str, count: int, seconds: float) -> dict[str, Any]:
    topics = [f"idle-{time.time_ns()}-{i}" for i in range(count)]
    await create_topics(bootstrap, topics, 1)
    rss_before = rss_mb()
    triggers = [KafkaTrigger(bootstrap_servers=bootstrap, topics=[topic]) for topic in topics]

    async def drain(trigger: KafkaTrigger) -> None:
        async for _ in trigger.run():
            raise AssertionError("an idle topic yielded an event")

    try:
        async with anyio.create_task_group() as tasks:
            for trigger in triggers:
                tasks.start_soon(drain, trigger)
            with anyio.fail_after(60):
                while not all(trigger.assignment for trigger in triggers):  # noqa: ASYNC110
                    await asyncio.sleep(0.2)  # group joins have no notification: poll them
            rss_started, wall, cpu = rss_mb(), time.perf_counter(), time.process_time()
            await asyncio.sleep(seconds)  # the measured idle period itself
            cpu_percent = 100 * (time.process_time() - cpu) / (time.perf_counter() - wall)
            rss_idle = rss_mb()
            tasks.cancel_scope.cancel()
    finally:
        for trigger in triggers:
            await trigger.cleanup()
    return {
        "triggers": count,
        "idle_seconds": seconds,
        "rss_mb_before": round(rss_before, 1),
        "rss_mb_started": round(rss_started, 1),
        "rss_mb_after_idle": round(rss_idle, 1),
        "rss_kb_per_trigger": round((rss_idle - rss_before) * 1024 / count, 1),
        "cpu_percent": round(cpu_percent, 2),
    }


async def run(messages: int, idle_triggers: int, idle_seconds: float) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as log_dir:
        broker = tansu(Path(log_dir))
        broker.start()
        try:
            # Idle first: the throughput run's freed memory would hide the triggers' own RSS.
            idle = await bench_idle(broker.address, idle_triggers, idle_seconds)
            throughput = await bench_throughput(broker.address, messages)
        finally:
            broker.stop()
    return {"throughput": throughput, "idle": idle}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="KafkaTrigger benchmark")
    parser.add_argument("--out", type=Path, default=Path("bench_kafka.json"))
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--idle-triggers", type=int, default=100)
    parser.add_argument("--idle-seconds", type=float, default=30.0)
    args = parser.parse_args(argv)
    results = asyncio.run(run(args.messages, args.idle_triggers, args.idle_seconds))
    publish(results, args.out)


if __name__ == "__main__":
    main()
