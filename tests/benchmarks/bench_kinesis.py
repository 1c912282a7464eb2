"""KinesisTrigger throughput against a raw GetRecords loop of the same client, on one moto server;
and the time from a record put to its event.

    python -m tests.benchmarks.bench_kinesis [--quick] [--messages 5000]

Kinesis has no ack: the raw loop is GetShardIterator then GetRecords until every record is
read; the trigger does the same plus the payload, the dedup key and the checkpoint of each
record (the daemon stores the checkpoint with the events, which ``bench_ingest`` measures). Each
is run twice, alternately, on streams of the same records. moto answers in milliseconds a call,
so the ratio to the raw loop is the figure to watch (goal: at least 0.8).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import statistics
import sys
import time
from collections.abc import AsyncGenerator
from pathlib import Path
from typing import Any, cast

if __package__ in (None, ""):  # run as a script: put the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from aiobotocore.session import get_session

from deploy.local.services import DUMMY_AWS_ENV, moto
from tests.benchmarks.harness import Bench, main, on_server
from tests.fixtures.kinesis import create_stream
from triggerer.triggers import TriggerEvent
from watchers.kinesis import KinesisTrigger, send

LIMIT = 1000
LATENCY_SAMPLES = 30


def _uri(stream: str, endpoint: str) -> str:
    return f"kinesis://{stream}?endpoint_url={endpoint}&region=us-east-1"


async def fill(client: Any, endpoint: str, name: str, messages: int) -> str:
    await create_stream(client, name, shards=1)
    bodies = [json.dumps({"n": n, "pad": "x" * 200}) for n in range(messages)]
    await send(_uri(name, endpoint), bodies)
    return name


async def raw_loop(endpoint: str, stream: str, messages: int) -> float:
    """Its own client, made within the time, as the trigger makes its own."""
    started = time.perf_counter()
    async with get_session().create_client("kinesis", endpoint_url=endpoint) as client:
        return await _raw_reads(client, stream, messages, started)


async def _raw_reads(client: Any, stream: str, messages: int, started: float) -> float:
    shards = (await client.list_shards(StreamName=stream))["Shards"]
    done = 0
    for shard in shards:
        iterator = (
            await client.get_shard_iterator(
                StreamName=stream, ShardId=shard["ShardId"], ShardIteratorType="TRIM_HORIZON"
            )
        )["ShardIterator"]
        while done < messages:
            answer = await client.get_records(ShardIterator=iterator, Limit=LIMIT)
            done += len(answer["Records"])
            iterator = answer["NextShardIterator"]
            if not answer["Records"]:
                break
    assert done == messages, done
    return time.perf_counter() - started


async def trigger_loop(endpoint: str, stream: str, messages: int) -> float:
    trigger = KinesisTrigger(stream=stream, endpoint_url=endpoint, limit=LIMIT)
    started = time.perf_counter()
    events = cast(AsyncGenerator[TriggerEvent, None], trigger.run())
    done = 0
    try:
        async for event in events:
            if event.is_checkpoint_only:  # the first start's marker: not a record
                continue
            done += 1
            if done == messages:
                break
    finally:
        await events.aclose()
    return time.perf_counter() - started


async def next_event(events: AsyncGenerator[TriggerEvent, None]) -> TriggerEvent:
    """The next event of a record, past checkpoint-only ones (the first start's marker, the
    place past filtered records)."""
    event = await anext(events)
    while event.is_checkpoint_only:
        event = await anext(events)
    return event


async def latency(client: Any, endpoint: str, stream: str) -> list[float]:
    """Seconds from each put (one at a time) to its event, the trigger idle in between."""
    trigger = KinesisTrigger(
        stream=stream, endpoint_url=endpoint, start="LATEST", poll_interval_s=0.05
    )
    events = cast(AsyncGenerator[TriggerEvent, None], trigger.run())
    samples = []
    try:
        pending = asyncio.ensure_future(next_event(events))
        await asyncio.sleep(1)  # the trigger has its iterators
        for n in range(LATENCY_SAMPLES):
            put_at = time.perf_counter()
            await client.put_record(StreamName=stream, Data=json.dumps({"n": n}), PartitionKey="k")
            await pending
            samples.append(time.perf_counter() - put_at)
            pending = asyncio.ensure_future(next_event(events))
            await asyncio.sleep(0.05)
        pending.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await pending
    finally:
        await events.aclose()
    return samples


async def bench(endpoint: str, messages: int) -> dict[str, Any]:
    runs: list[dict[str, Any]] = []
    async with get_session().create_client("kinesis", endpoint_url=endpoint) as client:
        for number, kind in enumerate(["raw", "trigger", "raw", "trigger"]):
            stream = await fill(client, endpoint, f"bench-{number}", messages)
            if kind == "raw":
                seconds = await raw_loop(endpoint, stream, messages)
            else:
                seconds = await trigger_loop(endpoint, stream, messages)
            runs.append({"name": kind, "seconds": round(seconds, 3)})
        await create_stream(client, "bench-latency", shards=1)
        samples = await latency(client, endpoint, "bench-latency")
    rates = {
        kind: messages / statistics.fmean(r["seconds"] for r in runs if r["name"] == kind)
        for kind in ("raw", "trigger")
    }
    return {
        "messages": messages,
        "runs": runs,
        "raw_messages_per_s": round(rates["raw"], 1),
        "trigger_messages_per_s": round(rates["trigger"], 1),
        "ratio_to_raw": round(rates["trigger"] / rates["raw"], 2),
        "put_to_event_p50_ms": round(statistics.median(samples) * 1000, 1),
        "put_to_event_max_ms": round(max(samples) * 1000, 1),
    }


BENCH = Bench(
    module="tests.benchmarks.bench_kinesis",
    description="KinesisTrigger against a raw GetRecords loop, and produce -> event",
    parts={
        "kinesis": on_server(
            moto,
            lambda server, args: bench(f"http://{server.address}", args.messages),
        )
    },
    full={"messages": 5_000},
    quick={"messages": 500},
)

if __name__ == "__main__":  # the parts too: each runs this module as a script
    os.environ.update(DUMMY_AWS_ENV)  # moto takes any credentials, boto wants some
    main(BENCH)
