"""The raw baselines the daemon benchmarks put beside the daemon's figures: what a plain client
or plain SQL does with the same broker, messages and rows, without the daemon.

- :func:`consumer_latency`: a plain aiokafka consumer, produce to ``getmany`` returning;
- :func:`idle_consumer_cpu_percent`: a plain aiokafka consumer of idle topics;
- :func:`record_events_loop`: the ingest transaction's SQL (``record_events``) alone;
- :func:`raw_insert`: plain Core INSERTs of the same ``asset_event`` rows;
- :func:`scheduler_pass_ms`: one scheduler pass, on its own, over a full queue.
"""

from __future__ import annotations

import json
import random
import time
import uuid
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import anyio
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer
from sqlalchemy import insert

from tests.benchmarks.bench_kafka import MESSAGE_BYTES, PARTITIONS, create_topics
from tests.benchmarks.stats import cpu_s, percentile, spread_ms
from triggerer.service.events import NewEvent, record_events
from triggerer.service.loader import load_pipelines
from triggerer.service.scheduling.registry import sync_definitions
from triggerer.service.scheduling.scheduler import Scheduler
from triggerer.service.store import create_engine, models, session_factory, upgrade
from triggerer.service.store.states import EventSource
from triggerer.service.store.types import utcnow

RECORD_EVENTS_MAX_S = 30.0
SCHEDULER_PASSES = 5
SETTLE_S = 5.0
"""Idle consumers: past the group join and the first fetches before measuring."""


async def consumer_latency(
    bootstrap: str,
    messages: int,
    *,
    warmup: int,
    message: Callable[[int], bytes],
    fetch_max_wait_ms: int | None,
    max_gap_s: float,
    seed: int,
) -> dict[str, Any]:
    """The broker and client floor: produce to ``getmany`` returning, plain aiokafka, one
    message at a time with a random pause after each (as the daemon's latency part)."""
    topic = f"bench-raw-latency-{uuid.uuid4().hex[:8]}"
    await create_topics(bootstrap, [topic], 1)
    options = {} if fetch_max_wait_ms is None else {"fetch_max_wait_ms": fetch_max_wait_ms}
    consumer = AIOKafkaConsumer(
        topic,
        bootstrap_servers=bootstrap,
        group_id=f"{topic}-group",
        auto_offset_reset="earliest",
        enable_auto_commit=False,
        session_timeout_ms=6000,
        heartbeat_interval_ms=1000,
        **options,
    )
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    await consumer.start()
    produced: list[float] = []
    received: list[float] = []
    arrived = anyio.Event()
    gaps = random.Random(seed)  # noqa: S311 - benchmark jitter, not security

    async def consume() -> None:
        nonlocal arrived
        while True:
            batch = await consumer.getmany(timeout_ms=1000)
            now = time.time()
            for records in batch.values():
                received.extend(now for _ in records)
            if batch:
                arrived.set()
                arrived = anyio.Event()

    total = warmup + messages
    try:
        async with anyio.create_task_group() as tasks:
            tasks.start_soon(consume)
            for index in range(total):
                produced.append(time.time())
                await producer.send_and_wait(topic, message(index))
                with anyio.fail_after(60):
                    while len(received) <= index:
                        await arrived.wait()
                await anyio.sleep(gaps.uniform(0, max_gap_s))
            tasks.cancel_scope.cancel()
    finally:
        await consumer.stop()
        await producer.stop()
    delays = [received[i] - produced[i] for i in range(warmup, total)]
    return {
        "messages": messages,
        "fetch_max_wait_ms": fetch_max_wait_ms or 500,
        "produce_to_consumed_ms": spread_ms(delays),
    }


async def idle_consumer_cpu_percent(
    bootstrap: str, topics: list[str], seconds: float, *, fast_topics: Sequence[str] = ()
) -> float:
    """CPU of one plain aiokafka consumer of ``topics`` (one group, the default 500 ms fetch
    wait, a getmany loop) over ``seconds`` of idleness, in this process; with ``fast_topics``,
    beside it a second consumer of those at a 10 ms fetch wait (as a latency-minded watcher
    reads them)."""
    groups = [(topics, 500), (list(fast_topics), 10)] if fast_topics else [(topics, 500)]
    consumers = [
        AIOKafkaConsumer(
            *group,
            bootstrap_servers=bootstrap,
            group_id=f"bench-idle-raw-{uuid.uuid4().hex[:8]}",
            enable_auto_commit=False,
            fetch_max_wait_ms=wait_ms,
        )
        for group, wait_ms in groups
    ]
    for consumer in consumers:
        await consumer.start()
    try:
        async with anyio.create_task_group() as tasks:

            async def poll(consumer: AIOKafkaConsumer) -> None:
                while True:
                    await consumer.getmany(timeout_ms=1000)

            for consumer in consumers:
                tasks.start_soon(poll, consumer)
            with anyio.fail_after(300):
                while not all(c.assignment() for c in consumers):  # noqa: ASYNC110 - joins are not notified
                    await anyio.sleep(0.1)
            await anyio.sleep(SETTLE_S)
            wall, cpu = time.time(), cpu_s()
            await anyio.sleep(seconds)
            percent = 100 * (cpu_s() - cpu) / (time.time() - wall)
            tasks.cancel_scope.cancel()
    finally:
        for consumer in consumers:
            await consumer.stop()
    return percent


def kafka_extra(topic: str, index: int) -> dict[str, Any]:
    """The ``extra`` the daemon stores for message ``index`` of a topic filled by
    :func:`tests.benchmarks.bench_kafka.produce`."""
    head = json.dumps({"id": index, "type": "order", "pad": ""})
    value = {"id": index, "type": "order", "pad": "x" * (MESSAGE_BYTES - len(head))}
    payload = {
        "topic": topic,
        "partition": index % PARTITIONS,
        "offset": index // PARTITIONS,
        "key": None,
        "value": value,
        "timestamp": 1_700_000_000_000 + index,
        "headers": {},
    }
    return {"from_trigger": True, "payload": payload}


def dedup_key(extra: dict[str, Any]) -> str:
    payload = extra["payload"]
    return f"{payload['topic']}/{payload['partition']}/{payload['offset']}"


async def record_events_loop(
    database_url: str, pipelines: Path, count: int, topic: str, batch_size: int
) -> dict[str, Any]:
    """``record_events`` alone (the ingest transaction without Kafka, the memory stream, acks
    or the scheduler), one transaction per batch, on the same pipelines; stops after
    ``RECORD_EVENTS_MAX_S``. The rate of the last tenth shows how it scales with table size."""
    await upgrade(database_url)
    engine = create_engine(database_url)
    sessions = session_factory(engine)
    extras = [kafka_extra(topic, index) for index in range(count)]
    try:
        loaded = await anyio.to_thread.run_sync(load_pipelines, pipelines)
        async with sessions.begin() as session:
            registry = await sync_definitions(session, loaded)
        (watched,) = registry.triggers.values()
        done: list[tuple[float, int]] = [(time.perf_counter(), 0)]
        for first in range(0, count, batch_size):
            events = [
                NewEvent(
                    asset_id=watched.asset_ids[0],
                    extra=extra,
                    source=EventSource.TRIGGER,
                    dedup_key=dedup_key(extra),
                    source_trigger_id=watched.trigger_id,
                )
                for extra in extras[first : first + batch_size]
            ]
            async with sessions.begin() as session:
                await record_events(session, events)
            done.append((time.perf_counter(), first + len(events)))
            if done[-1][0] - done[0][0] > RECORD_EVENTS_MAX_S:
                break
    finally:
        await engine.dispose()
    (started, _), (ended, events_done) = done[0], done[-1]
    tenth = done[-max(2, len(done) // 10)]
    return {
        "events": events_done,
        "events_per_s": round(events_done / (ended - started)),
        "last_tenth_events_per_s": round((events_done - tenth[1]) / (ended - tenth[0])),
    }


async def raw_insert(
    database_url: str, count: int, topic: str, batch_size: int, executemany: bool
) -> float:
    """Rows per second of plain Core INSERTs of ``asset_event`` rows, one transaction per
    batch (no dedup, no RETURNING, no queue rows, no Kafka): one multi-row
    ``insert().values(rows)`` per batch, or ``execute(insert(), rows)``, which SQLAlchemy
    sends as the driver's executemany."""
    await upgrade(database_url)
    engine = create_engine(database_url)
    extras = [kafka_extra(topic, index) for index in range(count)]
    try:
        async with engine.begin() as connection:
            asset_id = await connection.scalar(
                insert(models.Asset).values(name="orders", uri="orders").returning(models.Asset.id)
            )
        started = time.perf_counter()
        for first in range(0, count, batch_size):
            now = utcnow()
            rows = [
                {
                    "asset_id": asset_id,
                    "extra": extra,
                    "source": "trigger",
                    "dedup_key": dedup_key(extra),
                    "partition_key": None,
                    "source_trigger_id": None,
                    "source_run_pk": None,
                    "timestamp": now,
                }
                for extra in extras[first : first + batch_size]
            ]
            async with engine.begin() as connection:
                if executemany:
                    await connection.execute(insert(models.AssetEvent), rows)
                else:
                    await connection.execute(insert(models.AssetEvent).values(rows))
        return count / (time.perf_counter() - started)
    finally:
        await engine.dispose()


async def scheduler_pass_ms(database_url: str, pipelines: Path, pipeline_id: str) -> float:
    """Median time of a scheduler pass over ``pipeline_id``, on the store as it is (what each
    ingest commit wakes the scheduler to do), with a scheduler of its own."""
    engine = create_engine(database_url)
    sessions = session_factory(engine)
    try:
        loaded = await anyio.to_thread.run_sync(load_pipelines, pipelines)
        async with sessions.begin() as session:
            registry = await sync_definitions(session, loaded)
        scheduler = Scheduler(sessions, lambda: registry, lambda: None)
        pipeline = registry.pipelines[pipeline_id]
        passes = []
        for _ in range(SCHEDULER_PASSES):
            started = time.perf_counter()
            await scheduler.schedule(pipeline, registry)
            passes.append(time.perf_counter() - started)
    finally:
        await engine.dispose()
    return round(percentile(passes, 50) * 1000, 1)
