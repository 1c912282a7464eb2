"""RabbitMqTrigger throughput against a raw aio-pika loop (consume + ack), on one RabbitMQ.

    python -m tests.benchmarks.bench_rabbitmq [--quick] [--messages 20000]

Uses the machine's RabbitMQ (127.0.0.1:5672, guest/guest). Each round fills two durable classic
queues of its own with the same persistent messages; the raw loop consumes one with aio-pika
(``prefetch`` unacked, each message acked as it comes, no payload made), the trigger the other,
each event acked as it comes (as the daemon does after its commit). The rounds take turns and
each loop keeps its median. The latency part publishes one message at a time to a running
trigger and times each until its event is yielded (produce -> event, without the daemon's
commit).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
import uuid
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any, cast

if __package__ in (None, ""):  # run as a script: put the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import aio_pika

from tests.benchmarks.harness import Bench, main
from tests.benchmarks.providers import ack_each
from tests.fixtures.rabbitmq import SHARED_RABBITMQ, declare_queue, delete_queue
from triggerer.triggers import TriggerEvent
from watchers.rabbitmq import RabbitMqTrigger

ROUNDS = 3
PREFETCH = 100
LATENCY_SAMPLES = 200
MESSAGE_BYTES = 200
URL = f"amqp://guest:guest@{SHARED_RABBITMQ}/"


def body(index: int) -> bytes:
    return json.dumps({"n": index, "pad": "x" * MESSAGE_BYTES}).encode()


async def fill(channel: aio_pika.abc.AbstractChannel, queue: str, messages: int) -> None:
    for first in range(0, messages, 500):
        await asyncio.gather(
            *(
                channel.default_exchange.publish(
                    aio_pika.Message(body(i), delivery_mode=aio_pika.DeliveryMode.PERSISTENT),
                    routing_key=queue,
                )
                for i in range(first, min(first + 500, messages))
            )
        )


async def raw_loop(queue: str, messages: int) -> float:
    """aio-pika's consumer, each message acked as it comes."""
    connection = await aio_pika.connect(URL)
    async with connection:
        channel = await connection.channel()
        await channel.set_qos(prefetch_count=PREFETCH)
        source = await channel.get_queue(queue)
        started = time.perf_counter()
        done = 0
        async with source.iterator() as incoming:
            async for message in incoming:
                await message.ack()
                done += 1
                if done == messages:
                    break
        return time.perf_counter() - started


async def trigger_loop(queue: str, messages: int) -> float:
    trigger = RabbitMqTrigger(f"amqp://{SHARED_RABBITMQ}/%2F/{queue}", prefetch=PREFETCH)
    return await ack_each(trigger, messages, through_cleanup=True)


async def latency(channel: aio_pika.abc.AbstractChannel) -> dict[str, float]:
    queue = f"bench-latency-{uuid.uuid4().hex[:8]}"
    await declare_queue(SHARED_RABBITMQ, queue)
    trigger = RabbitMqTrigger(f"amqp://{SHARED_RABBITMQ}/%2F/{queue}")
    events = cast(AsyncGenerator[TriggerEvent, None], trigger.run())
    samples = []
    try:
        for index in range(LATENCY_SAMPLES):
            started = time.perf_counter()
            await channel.default_exchange.publish(aio_pika.Message(body(index)), queue)
            event = await anext(events)
            while event.is_checkpoint_only:  # a marker, not the message: read on
                event = await anext(events)
            samples.append((time.perf_counter() - started) * 1000)
            assert event.ack is not None
            await event.ack()
    finally:
        await events.aclose()
        await trigger.cleanup()
        await delete_queue(SHARED_RABBITMQ, queue)
    samples.sort()
    return {
        "p50_ms": round(statistics.median(samples), 3),
        "p99_ms": round(samples[int(len(samples) * 0.99) - 1], 3),
    }


async def bench(messages: int) -> dict[str, Any]:
    raw: list[float] = []
    triggered: list[float] = []
    connection = await aio_pika.connect(URL)
    async with connection:
        channel = await connection.channel(publisher_confirms=False)
        for _ in range(ROUNDS):
            queues = [f"bench-{uuid.uuid4().hex[:8]}" for _ in range(2)]
            for queue in queues:
                await declare_queue(SHARED_RABBITMQ, queue)
                await fill(channel, queue, messages)
            try:
                raw.append(await raw_loop(queues[0], messages))
                triggered.append(await trigger_loop(queues[1], messages))
            finally:
                for queue in queues:
                    await delete_queue(SHARED_RABBITMQ, queue)
        latency_ms = await latency(channel)
    raw_s, trigger_s = statistics.median(raw), statistics.median(triggered)
    return {
        "messages": messages,
        "prefetch": PREFETCH,
        "raw_messages_per_s": round(messages / raw_s, 1),
        "trigger_messages_per_s": round(messages / trigger_s, 1),
        "ratio_to_raw": round(raw_s / trigger_s, 2),
        "produce_to_event": latency_ms,
    }


async def part_rabbitmq(args: argparse.Namespace, folder: Path) -> dict[str, Any]:
    """The rounds and the latency on the machine's RabbitMQ."""
    return await bench(args.messages)


BENCH = Bench(
    module="tests.benchmarks.bench_rabbitmq",
    description="RabbitMqTrigger against a raw aio-pika consume + ack, and produce -> event",
    parts={"rabbitmq": part_rabbitmq},
    full={"messages": 20_000},
    quick={"messages": 1_000},
)

if __name__ == "__main__":
    main(BENCH)
