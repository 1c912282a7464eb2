"""PubSubTrigger throughput against a raw GAPIC loop (Pull + Acknowledge), on the Pub/Sub emulator.

    python -m tests.benchmarks.bench_pubsub [--quick] [--messages 20000]

Starts an emulator of its own. One topic is filled once and read through a new subscription
per loop and round: the raw loop pulls ``BATCH`` messages at a time and acknowledges them with
one call, without making payloads; the trigger (``max_messages=BATCH``, its default two pulls)
acks each event as it comes, as the daemon does after its commit, its acks batched. The rounds
take turns and each loop keeps its median. The latency part publishes one message at a time to
a running trigger and times each until its event is yielded (produce -> event, without the
daemon's commit).
"""

from __future__ import annotations

import statistics
import sys
import time
import uuid
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any, cast

if __package__ in (None, ""):  # run as a script: put the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from google.api_core import exceptions

from tests.benchmarks.harness import Bench, main, on_server
from tests.benchmarks.providers import MESSAGE_BYTES, ack_each, order
from tests.fixtures.pubsub import PROJECT, Admin, pubsub_emulator
from triggerer.triggers import TriggerEvent
from watchers.pubsub import PubSubTrigger

ROUNDS = 3
BATCH = 500
LATENCY_SAMPLES = 200


async def fill(admin: Admin, topic: str, messages: int) -> None:
    for start in range(0, messages, 1000):
        bodies = [order(index) for index in range(start, min(start + 1000, messages))]
        await admin.publish(topic, *bodies)


async def raw_loop(admin: Admin, subscription: str, messages: int) -> float:
    """Messages per second: Pull ``BATCH``, Acknowledge them with one call, repeat."""
    path = f"projects/{PROJECT}/subscriptions/{subscription}"
    started = time.perf_counter()
    done = 0
    while done < messages:
        try:
            response = await admin.subscriber.pull(
                subscription=path, max_messages=BATCH, timeout=5, retry=None
            )
        except exceptions.DeadlineExceeded:
            continue
        ack_ids = [received.ack_id for received in type(response).pb(response).received_messages]
        if ack_ids:
            await admin.subscriber.acknowledge(subscription=path, ack_ids=ack_ids)
            done += len(ack_ids)
    return messages / (time.perf_counter() - started)


async def trigger_loop(uri: str, host: str, messages: int) -> float:
    """Events per second of a trigger whose every event is acked as it comes."""
    trigger = PubSubTrigger(uri, emulator_host=host, max_messages=BATCH)
    seconds = await ack_each(trigger, messages)
    return messages / seconds


async def latency(admin: Admin) -> dict[str, float]:
    """Produce -> event (ms), one message at a time, through a running trigger."""
    name = f"latency-{uuid.uuid4().hex[:8]}"
    uri = await admin.create(name)
    await admin.publish(name, "warm-up")
    trigger = PubSubTrigger(uri, emulator_host=admin.host)
    events = cast(AsyncGenerator[TriggerEvent, None], trigger.run())
    samples = []
    try:
        await anext(events)
        for index in range(LATENCY_SAMPLES):
            started = time.perf_counter()
            await admin.publish(name, order(index))
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


async def bench(host: str, messages: int) -> dict[str, Any]:
    admin = Admin(host)
    try:
        # One topic, a subscription per loop and round, all made before the topic is filled.
        topic = f"bench-{uuid.uuid4().hex[:8]}"
        names = {
            (loop, round_): f"{topic}-{loop}-{round_}"
            for round_ in range(ROUNDS)
            for loop in ("raw", "trigger")
        }
        await admin.create(topic)  # the topic <topic>-topic, with a subscription left unread
        for name in names.values():
            await admin.subscriber.create_subscription(
                name=f"projects/{PROJECT}/subscriptions/{name}",
                topic=f"projects/{PROJECT}/topics/{topic}-topic",
            )
        await admin.subscriber.delete_subscription(
            subscription=f"projects/{PROJECT}/subscriptions/{topic}"
        )
        await fill(admin, topic, messages)
        runs: dict[str, list[float]] = {"raw": [], "trigger": []}
        for round_ in range(ROUNDS):
            runs["raw"].append(await raw_loop(admin, names["raw", round_], messages))
            uri = f"pubsub://{PROJECT}/{names['trigger', round_]}"
            runs["trigger"].append(await trigger_loop(uri, host, messages))
        raw, trigger = (statistics.median(runs[name]) for name in runs)
        return {
            "messages": messages,
            "rounds": ROUNDS,
            "message_bytes": MESSAGE_BYTES,
            "batch": BATCH,
            "raw_events_per_s": round(raw),
            "trigger_events_per_s": round(trigger),
            "ratio": round(trigger / raw, 3),
            "produce_to_event": await latency(admin),
        }
    finally:
        await admin.aclose()


BENCH = Bench(
    module="tests.benchmarks.bench_pubsub",
    description="PubSubTrigger against a raw Pull + Acknowledge loop, and produce -> event",
    parts={
        "pubsub": on_server(
            lambda folder: pubsub_emulator(folder),
            lambda server, args: bench(server.address, args.messages),
            start_timeout_s=60,
        )
    },
    full={"messages": 20_000},
    quick={"messages": 1_000},
)

if __name__ == "__main__":
    main(BENCH)
