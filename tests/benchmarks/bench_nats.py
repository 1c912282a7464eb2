"""NatsTrigger throughput against a raw nats-py loop (pull fetch + ack), on one JetStream server.

    python -m tests.benchmarks.bench_nats [--quick] [--messages 20000]

Starts a nats-server of its own (file store). Each round reads one filled stream through two new
durable pull consumers: the raw loop fetches ``BATCH`` messages at a time and acks each, without
making payloads; the trigger (which pulls by hand, watchers/nats/pull.py) acks each event as it
comes (as the daemon does after its commit).
The rounds take turns and each loop keeps its median. The latency part publishes one message at
a time to a running trigger and times each until its event is yielded (produce -> event,
without the daemon's commit).
"""

from __future__ import annotations

import asyncio
import statistics
import sys
import time
import uuid
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any, cast

if __package__ in (None, ""):  # run as a script: put the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

import nats
from nats.aio.client import Client
from nats.js.api import AckPolicy, ConsumerConfig

from tests.benchmarks.harness import Bench, main, on_server
from tests.benchmarks.providers import MESSAGE_BYTES, ack_each, order
from tests.fixtures.nats import create_stream, nats_server
from triggerer.triggers import TriggerEvent
from watchers.nats import NatsTrigger

ROUNDS = 3
BATCH = 256
LATENCY_SAMPLES = 200


async def fill(client: Client, stream: str, messages: int) -> None:
    jetstream = client.jetstream()
    for start in range(0, messages, 1000):
        acks = [
            await jetstream.publish_async(f"{stream}.in", order(index).encode())
            for index in range(start, min(start + 1000, messages))
        ]
        await asyncio.gather(*acks)


async def raw_loop(client: Client, stream: str, durable: str, messages: int) -> float:
    """Messages per second: fetch ``BATCH`` messages of a durable, ack each, repeat."""
    jetstream = client.jetstream()
    config = ConsumerConfig(
        durable_name=durable, filter_subject=f"{stream}.>", ack_policy=AckPolicy.EXPLICIT
    )
    await jetstream.add_consumer(stream, config)
    pull = await jetstream.pull_subscribe_bind(durable=durable, stream=stream)
    started = time.perf_counter()
    done = 0
    while done < messages:
        for message in await pull.fetch(BATCH, timeout=5):
            await message.ack()
            done += 1
    seconds = time.perf_counter() - started
    await pull.unsubscribe()
    return messages / seconds


async def trigger_loop(servers: str, stream: str, durable: str, messages: int) -> float:
    """Events per second of a trigger whose every event is acked as it comes."""
    trigger = NatsTrigger(
        servers=servers, stream=stream, subject=f"{stream}.>", durable=durable, fetch_batch=BATCH
    )
    seconds = await ack_each(trigger, messages)
    assert trigger.acked == messages, trigger.acked
    return messages / seconds


async def latency(client: Client, servers: str) -> dict[str, float]:
    """Produce -> event (ms), one message at a time, through a running trigger."""
    stream = f"latency-{uuid.uuid4().hex[:8]}"
    await create_stream(servers, stream)
    jetstream = client.jetstream()
    await jetstream.publish(f"{stream}.in", b"warm-up")
    trigger = NatsTrigger(servers=servers, stream=stream, subject=f"{stream}.>")
    events = cast(AsyncGenerator[TriggerEvent, None], trigger.run())
    samples = []
    try:
        await anext(events)
        for index in range(LATENCY_SAMPLES):
            started = time.perf_counter()
            await jetstream.publish(f"{stream}.in", order(index).encode())
            event = await anext(events)
            samples.append((time.perf_counter() - started) * 1000)
            assert event.ack is not None
            await event.ack()
    finally:
        await events.aclose()
        await trigger.cleanup()
    samples.sort()
    return {
        "p50_ms": round(statistics.median(samples), 3),
        "p99_ms": round(samples[int(len(samples) * 0.99) - 1], 3),
    }


async def bench(servers: str, messages: int) -> dict[str, Any]:
    client = await nats.connect(f"nats://{servers}")
    try:
        stream = f"bench-{uuid.uuid4().hex[:8]}"
        await create_stream(servers, stream)
        await fill(client, stream, messages)
        runs: dict[str, list[float]] = {"raw": [], "trigger": []}
        for round_ in range(ROUNDS):
            runs["raw"].append(await raw_loop(client, stream, f"raw-{round_}", messages))
            runs["trigger"].append(
                await trigger_loop(servers, stream, f"trigger-{round_}", messages)
            )
        raw, trigger = (statistics.median(runs[name]) for name in runs)
        return {
            "messages": messages,
            "rounds": ROUNDS,
            "message_bytes": MESSAGE_BYTES,
            "batch": BATCH,
            "raw_events_per_s": round(raw),
            "trigger_events_per_s": round(trigger),
            "ratio": round(trigger / raw, 3),
            "produce_to_event": await latency(client, servers),
        }
    finally:
        await client.close()


BENCH = Bench(
    module="tests.benchmarks.bench_nats",
    description="NatsTrigger against a raw nats-py pull loop, and produce -> event",
    parts={
        "nats": on_server(
            lambda folder: nats_server(folder / "store", folder),
            lambda server, args: bench(server.address, args.messages),
        )
    },
    full={"messages": 20_000},
    quick={"messages": 1_000},
)

if __name__ == "__main__":
    main(BENCH)
