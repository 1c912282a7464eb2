"""RedisStreamTrigger throughput against a raw redis-py loop (XREADGROUP + XACK), on one Redis.

    python -m tests.benchmarks.bench_redis_streams [--quick] [--messages 20000]

Starts a Redis of its own. Each round reads one filled stream in two new consumer groups: the
raw loop reads ``BATCH`` entries at a time and acknowledges them with one XACK, without making
payloads; the trigger acks each event as it comes (as the daemon does after its commit), its
XACKs batched before each read. The rounds take turns and each loop keeps its median. The
latency part adds one entry at a time to a running trigger and times each until its event is
yielded (produce -> event, without the daemon's commit).
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

import redis.asyncio

from tests.benchmarks.harness import Bench, main, on_server
from tests.benchmarks.providers import MESSAGE_BYTES, ack_each, order
from tests.fixtures.redis import redis_server
from triggerer.triggers import TriggerEvent
from watchers.redis.streams import RedisStreamTrigger

ROUNDS = 3
BATCH = 100
LATENCY_SAMPLES = 200


async def fill(client: redis.asyncio.Redis, stream: str, messages: int) -> None:
    for start in range(0, messages, 1000):
        async with client.pipeline(transaction=False) as pipe:
            for index in range(start, min(start + 1000, messages)):
                pipe.xadd(stream, {"body": order(index)})
            await pipe.execute()


async def raw_loop(client: redis.asyncio.Redis, stream: str, group: str, messages: int) -> float:
    """Entries per second: XREADGROUP ``BATCH`` entries, XACK them at once, repeat."""
    await client.xgroup_create(stream, group, id="0")
    started = time.perf_counter()
    done = 0
    while done < messages:
        response: Any = await client.xreadgroup(
            group, "raw", {stream: ">"}, count=BATCH, block=1000
        )
        if response:
            [[_, entries]] = response
            await client.xack(stream, group, *[entry_id for entry_id, _ in entries])
            done += len(entries)
    return messages / (time.perf_counter() - started)


async def trigger_loop(port: int, stream: str, group: str, messages: int, db: int = 0) -> float:
    """Events per second of a trigger whose every event is acked as it comes."""
    trigger = RedisStreamTrigger(
        host="127.0.0.1",
        port=port,
        db=db,
        stream=stream,
        group=group,
        start_id="0",
        batch_size=BATCH,
    )
    seconds = await ack_each(trigger, messages)
    assert trigger.acked == messages, trigger.acked
    return messages / seconds


async def latency(client: redis.asyncio.Redis, port: int, stream: str) -> dict[str, float]:
    """Produce -> event (ms), one entry at a time, through a running trigger."""
    await client.xadd(stream, {"body": "warm-up"})
    trigger = RedisStreamTrigger(host="127.0.0.1", port=port, stream=stream, start_id="0")
    events = cast(AsyncGenerator[TriggerEvent, None], trigger.run())
    samples = []
    try:
        await anext(events)
        for index in range(LATENCY_SAMPLES):
            started = time.perf_counter()
            await client.xadd(stream, {"body": order(index)})
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


async def bench(port: int, messages: int) -> dict[str, Any]:
    client = redis.asyncio.Redis(port=port)
    try:
        stream = f"bench-{uuid.uuid4().hex}"
        await fill(client, stream, messages)
        runs: dict[str, list[float]] = {"raw": [], "trigger": []}
        for round_ in range(ROUNDS):
            runs["raw"].append(await raw_loop(client, stream, f"raw-{round_}", messages))
            runs["trigger"].append(await trigger_loop(port, stream, f"trigger-{round_}", messages))
        raw, trigger = (statistics.median(runs[name]) for name in runs)
        return {
            "messages": messages,
            "rounds": ROUNDS,
            "message_bytes": MESSAGE_BYTES,
            "batch": BATCH,
            "raw_events_per_s": round(raw),
            "trigger_events_per_s": round(trigger),
            "ratio": round(trigger / raw, 3),
            "produce_to_event": await latency(client, port, f"latency-{uuid.uuid4().hex}"),
        }
    finally:
        await client.aclose()


BENCH = Bench(
    module="tests.benchmarks.bench_redis_streams",
    description="RedisStreamTrigger against a raw XREADGROUP loop, and produce -> event",
    parts={
        "redis_streams": on_server(
            lambda folder: redis_server(folder / "data", folder),
            lambda server, args: bench(server.port, args.messages),
        )
    },
    full={"messages": 20_000},
    quick={"messages": 1_000},
)

if __name__ == "__main__":
    main(BENCH)
