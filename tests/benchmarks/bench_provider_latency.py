"""Each queue provider's message to run: how long from a post to the run it creates.

    python -m tests.benchmarks.bench_provider_latency --out bench_provider_latency.json \\
        [--quick] [--parts nats mqtt]

One part per provider (Kafka and SQS as baselines), each in a child process of its own (the
harness's :func:`~tests.benchmarks.harness.main`): the provider's broker, a new source on it (a
uuid in its name), and the daemon in the part's process (:func:`~tests.benchmarks.harness.running`)
watching it with ``MessageQueueTrigger(URI, **options)``, its options as shipped unless the
part's name says otherwise. The brokers: the harness's tansu (Kafka), a moto of the part's own
(SQS, Kinesis), a Pub/Sub emulator of its own, and the machine's shared NATS, RabbitMQ, Redis and
Mosquitto (as ``bench_<provider>`` and ``tests/fixtures`` start and use them).

Messages are posted one at a time through a client opened once (each provider's ``send`` opens
a client a call, which would count a connection's setup): each is waited for (its run created),
then a random 0..``--max-gap-ms`` pause (at least the watcher's poll cycle where it has a fixed
one: Kafka's fetch wait on tansu, Kinesis's poll interval), so messages land at random points of
it. The pipeline is ``schedule=asset, run_policy="per_event"``; its runs are created and stay
queued: the launcher's one slot (``[runs] parallelism = 1``) goes to a manual run of ``hold``,
which sleeps, and Spark is a Connect server that is not there (as ``bench_large_store`` does),
so no run process adds CPU noise. The first three messages warm up and are left out.

Clock: ``time.time()``.

- posted: taken just before the publish call (which returns once the broker has the message:
  Kafka ``send_and_wait``, JetStream's ack, RabbitMQ's confirm, MQTT's PUBACK, ...);
- consumed: when the watcher yielded the message's event, from the gauge
  ``triggerer_watcher_last_event_age_seconds`` read once its run is created;
- run created: when the run's transaction committed (SQLAlchemy's ``after_commit``,
  :class:`~tests.benchmarks.observe.StoreWatch`); ``run.created_at`` (set just before the
  INSERT) is read back as a cross-check.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import sys
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import aio_pika
import aiomqtt
import anyio
import nats
import redis.asyncio
from aiobotocore.session import get_session
from aiokafka import AIOKafkaProducer
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from sqlalchemy import select

if __package__ in (None, ""):  # run as a script: put the repository root on the path
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from deploy.local.services import DUMMY_AWS_ENV, moto
from tests.benchmarks.bench_kafka import create_topics
from tests.benchmarks.bench_large_store import SPARK, hold_launcher
from tests.benchmarks.harness import GROUP_OPTIONS, Bench, daemon_settings, main, running
from tests.benchmarks.observe import StoreWatch, last_events_at
from tests.benchmarks.stats import cpu_s, cpu_ticks, machine_busy_percent, percentile, spread_ms
from tests.e2e.daemon import write_pipelines
from tests.e2e.providers.test_mqtt import ASSET, WATCHER, make_session
from tests.fixtures.kinesis import create_stream as create_kinesis_stream
from tests.fixtures.mqtt import SHARED_MQTT
from tests.fixtures.nats import SHARED_NATS, create_stream, delete_stream
from tests.fixtures.pubsub import Admin, pubsub_emulator
from tests.fixtures.rabbitmq import SHARED_RABBITMQ, declare_queue, delete_queue
from tests.fixtures.redis import SHARED_REDIS_HOST, SHARED_REDIS_PORT
from tests.fixtures.redis import create_stream as create_redis_stream
from triggerer.service.store import create_engine, models, session_factory
from watchers.mqtt import MESSAGE_ID_PROPERTY

WARMUP = 3
GAP_SEED = 20_260_316
FIRST_RUN_TIMEOUT_S = 120.0
"""For the first message's run: the watcher starts (a group join, a subscription) meanwhile."""
RUN_TIMEOUT_S = 60.0
READY_TIMEOUT_S = 60.0
SETTLE_S = 2.0
"""After the last run, how long a run more (a message delivered twice) is waited for."""
REGION = "us-east-1"
FAST_KAFKA_OPTIONS = "fetch_max_wait_ms=10"
"""As ``bench_latency``'s fast fetch: tansu answers a waiting fetch late."""
FAST_KINESIS_OPTIONS = "poll_interval_s=0.2"
"""Five GetRecords a second, the most a Kinesis shard serves."""

PIPELINES = """
    import time

    from triggerer import Asset, AssetWatcher, pipeline
    from watchers import MessageQueueTrigger

    stream = Asset({asset!r}, watchers=[AssetWatcher({watcher!r}, MessageQueueTrigger(
        {uri!r}, {options}))])


    @pipeline(schedule=stream, run_policy="per_event", max_active_runs=1_000_000)
    def on_message(spark, context):
        pass


    @pipeline(schedule=None)
    def hold(spark, context):
        time.sleep(3600)
"""
"""``on_message``: a run per message (never started); ``hold``: a manual run that keeps the
launcher's slot. The asset and watcher names are those :func:`make_session` gives an MQTT
session for."""


@dataclass(frozen=True)
class Line:
    """A source of a part's own on its provider's broker, and a client to post to it."""

    uri: str
    options: str
    """The other keyword arguments of ``MessageQueueTrigger``, as Python source."""
    post: Callable[[str], Awaitable[None]]
    """Publishes one body; returns once the broker has it."""
    ready: Callable[[], Awaitable[bool]] | None = None
    """Whether the watcher is subscribed, where a message posted before would be lost."""


Opener = Callable[[argparse.Namespace, Path], contextlib.AbstractAsyncContextManager[Line]]


def unique(prefix: str = "triggerer-bench") -> str:
    return f"{prefix}-{uuid.uuid4().hex[:12]}"


# -- the providers


@contextlib.asynccontextmanager
async def kafka(args: argparse.Namespace, workdir: Path) -> AsyncIterator[Line]:
    """A topic on the harness's tansu."""
    topic = unique()
    await create_topics(args.bootstrap, [topic], 1)
    producer = AIOKafkaProducer(bootstrap_servers=args.bootstrap)
    await producer.start()
    try:

        async def post(body: str) -> None:
            await producer.send_and_wait(topic, body.encode())

        yield Line(f"kafka://{args.bootstrap}/{topic}", GROUP_OPTIONS, post)
    finally:
        await producer.stop()


@contextlib.asynccontextmanager
async def moto_endpoint(workdir: Path) -> AsyncIterator[str]:
    """A moto server of the part's own; dummy AWS credentials in this process's environment."""
    os.environ.update(DUMMY_AWS_ENV)
    server = moto(workdir)
    await anyio.to_thread.run_sync(server.start)
    try:
        yield f"http://{server.address}"
    finally:
        server.stop()


@contextlib.asynccontextmanager
async def sqs(args: argparse.Namespace, workdir: Path) -> AsyncIterator[Line]:
    """A standard queue on moto."""
    async with (
        moto_endpoint(workdir) as endpoint,
        get_session().create_client("sqs", endpoint_url=endpoint, region_name=REGION) as client,
    ):
        name = unique()
        url = (await client.create_queue(QueueName=name))["QueueUrl"]

        async def post(body: str) -> None:
            await client.send_message(QueueUrl=url, MessageBody=body)

        yield Line(f"sqs://{name}?endpoint_url={endpoint}&region={REGION}", "", post)


@contextlib.asynccontextmanager
async def kinesis(args: argparse.Namespace, workdir: Path) -> AsyncIterator[Line]:
    """A one-shard stream on moto."""
    async with (
        moto_endpoint(workdir) as endpoint,
        get_session().create_client("kinesis", endpoint_url=endpoint, region_name=REGION) as client,
    ):
        stream = await create_kinesis_stream(client, unique())

        async def post(body: str) -> None:
            await client.put_record(
                StreamName=stream, Data=body.encode(), PartitionKey=uuid.uuid4().hex
            )

        yield Line(f"kinesis://{stream}?endpoint_url={endpoint}&region={REGION}", "", post)


@contextlib.asynccontextmanager
async def pubsub(args: argparse.Namespace, workdir: Path) -> AsyncIterator[Line]:
    """A subscription (on a topic of its own) on a Pub/Sub emulator of the part's own."""
    service = pubsub_emulator(workdir)
    await anyio.to_thread.run_sync(partial(service.start, timeout_s=60))
    admin = Admin(service.address)
    try:
        name = unique("bench")
        uri = await admin.create(name)

        async def post(body: str) -> None:
            await admin.publish(name, body)

        yield Line(uri, f"emulator_host={service.address!r}", post)
    finally:
        await admin.aclose()
        service.stop()


@contextlib.asynccontextmanager
async def nats_jetstream(args: argparse.Namespace, workdir: Path) -> AsyncIterator[Line]:
    """A stream (``<name>.>`` its subjects) on the shared NATS server."""
    name = unique()
    await create_stream(SHARED_NATS, name)
    client = await nats.connect(f"nats://{SHARED_NATS}")
    try:
        jetstream = client.jetstream()

        async def post(body: str) -> None:
            headers = {"Nats-Msg-Id": uuid.uuid4().hex}
            await jetstream.publish(f"{name}.in", body.encode(), stream=name, headers=headers)

        yield Line(f"nats://{SHARED_NATS}/{name}/{name}.%3E", "", post)
    finally:
        await client.close()
        await delete_stream(SHARED_NATS, name)


@contextlib.asynccontextmanager
async def rabbitmq(args: argparse.Namespace, workdir: Path) -> AsyncIterator[Line]:
    """A durable classic queue on the shared RabbitMQ; persistent messages, each confirmed."""
    name = unique()
    await declare_queue(SHARED_RABBITMQ, name)
    connection = await aio_pika.connect(f"amqp://guest:guest@{SHARED_RABBITMQ}/")
    try:
        channel = await connection.channel(publisher_confirms=True)

        async def post(body: str) -> None:
            message = aio_pika.Message(
                body.encode(),
                message_id=str(uuid.uuid4()),
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
            )
            await channel.default_exchange.publish(message, routing_key=name)

        yield Line(f"amqp://{SHARED_RABBITMQ}/%2F/{name}", "", post)
    finally:
        await connection.close()
        await delete_queue(SHARED_RABBITMQ, name)


@contextlib.asynccontextmanager
async def shared_redis() -> AsyncIterator[redis.asyncio.Redis]:
    client = redis.asyncio.Redis(host=SHARED_REDIS_HOST, port=SHARED_REDIS_PORT)
    try:
        yield client
    finally:
        await client.aclose()


@contextlib.asynccontextmanager
async def redis_streams(args: argparse.Namespace, workdir: Path) -> AsyncIterator[Line]:
    """A stream on the shared Redis; the watcher's group starts at ``$`` (as shipped), so the
    first post waits for the group."""
    async with shared_redis() as client:
        name = unique()
        await create_redis_stream(client, name)
        try:

            async def post(body: str) -> None:
                await client.xadd(name, {"body": body})

            async def ready() -> bool:
                return bool(await client.xinfo_groups(name))

            uri = f"redis+stream://{SHARED_REDIS_HOST}:{SHARED_REDIS_PORT}/0/{name}"
            yield Line(uri, "", post, ready)
        finally:
            await client.delete(name)


@contextlib.asynccontextmanager
async def redis_pubsub(args: argparse.Namespace, workdir: Path) -> AsyncIterator[Line]:
    """A channel on the shared Redis; the first post waits for the watcher's subscription."""
    async with shared_redis() as client:
        channel = unique()

        async def post(body: str) -> None:
            await client.publish(channel, body)

        async def ready() -> bool:
            [(_, subscribers)] = await client.pubsub_numsub(channel)
            return bool(subscribers)

        uri = f"redis+pubsub://{SHARED_REDIS_HOST}:{SHARED_REDIS_PORT}/0/{channel}"
        yield Line(uri, "", post, ready)


@contextlib.asynccontextmanager
async def mqtt(args: argparse.Namespace, workdir: Path) -> AsyncIterator[Line]:
    """A topic on the shared Mosquitto, the watcher's persistent session made before (as the
    contract tests do): what is posted before the watcher connects waits in it. QoS 1."""
    host, port = SHARED_MQTT.split(":")
    topic = f"triggerer-bench/{uuid.uuid4().hex}"
    uri = f"mqtt://{SHARED_MQTT}/{topic}"
    await make_session(uri, int(port))
    async with aiomqtt.Client(host, int(port), protocol=aiomqtt.ProtocolVersion.V5) as client:

        async def post(body: str) -> None:
            properties = Properties(PacketTypes.PUBLISH)
            properties.UserProperty = (MESSAGE_ID_PROPERTY, uuid.uuid4().hex)
            await client.publish(topic, body.encode(), qos=1, properties=properties)

        yield Line(uri, "", post)


# -- the measurement


async def post_to_run(
    opener: Opener, options: str, cycle_ms: float, args: argparse.Namespace, workdir: Path
) -> dict[str, Any]:
    """Post ``--latency-messages`` (after the warm-up) one at a time to the source ``opener``
    makes, each waited for until its run is created; ``options`` added to the trigger's. The
    pauses span at least ``cycle_ms``, the watcher's poll cycle where it has a fixed one: with
    shorter ones, each post would land at the same point of it."""
    gaps = random.Random(GAP_SEED)  # noqa: S311 - benchmark jitter, not security
    max_gap_s = max(args.max_gap_ms, cycle_ms) / 1000
    total = WARMUP + args.latency_messages
    database_url = f"sqlite:///{workdir / 'triggerer.db'}"
    posted: list[float] = []
    published: list[float] = []
    consumed: list[float] = []
    async with opener(args, workdir) as line:
        trigger_options = ", ".join(filter(None, [line.options, options]))
        write_pipelines(
            workdir / "pipelines",
            PIPELINES.format(asset=ASSET, watcher=WATCHER, uri=line.uri, options=trigger_options),
        )
        settings = daemon_settings(
            workdir,
            database_url,
            spark=SPARK,
            runs={"parallelism": 1},
            daemon={"shutdown_grace_s": 0},  # the held run is stopped at once
        )
        with StoreWatch() as watch:
            async with running(settings) as daemon:
                await hold_launcher(daemon)
                await daemon.wait_assigned()
                if line.ready is not None:
                    await until(line.ready, READY_TIMEOUT_S)
                runs_before = len(watch.runs)
                cpu_before, wall_before, machine = cpu_s(), time.time(), cpu_ticks()
                for index in range(total):
                    posted.append(time.time())
                    await line.post(json.dumps({"i": index}))
                    published.append(time.time())
                    timeout_s = FIRST_RUN_TIMEOUT_S if index == 0 else RUN_TIMEOUT_S
                    await watch.wait_runs(runs_before + index + 1, timeout_s)
                    (at,) = last_events_at().values()
                    consumed.append(at)
                    await anyio.sleep(gaps.uniform(0, max_gap_s))
                cpu_percent = 100 * (cpu_s() - cpu_before) / (time.time() - wall_before)
                machine_percent = machine_busy_percent(machine)
                await anyio.sleep(SETTLE_S)
                run_ids = list(watch.runs)[runs_before:]
                created = [watch.runs[run_id] for run_id in run_ids]
    if len(run_ids) != total:
        raise AssertionError(f"{total} messages made {len(run_ids)} runs")
    columns = await created_at(database_url, run_ids)
    if any(state != models.RunState.QUEUED for _, state in columns.values()):
        raise AssertionError("a measured run was started: the held run let go of its slot")
    measured = range(WARMUP, total)
    created_s = [created[i] - posted[i] for i in measured]
    consumed_s = [consumed[i] - posted[i] for i in measured]
    return {
        "uri": line.uri,
        "options": trigger_options or "(as shipped)",
        "messages": args.latency_messages,
        "max_gap_ms": max_gap_s * 1000,
        "post_to_run_created_ms": spread_ms(created_s),
        "breakdown_p50_ms": {
            "publish_call": p50_ms([published[i] - posted[i] for i in measured]),
            "post_to_consumed": p50_ms(consumed_s),
            "consumed_to_run_created": p50_ms(
                [b - a for a, b in zip(consumed_s, created_s, strict=True)]
            ),
        },
        "post_to_run_created_at_column_ms": spread_ms(
            [columns[run_ids[i]][0] - posted[i] for i in measured]
        ),
        "process_cpu_percent": round(cpu_percent, 1),
        "machine_cpu_busy_percent": machine_percent,
        "load_average_1m": round(os.getloadavg()[0], 2),
    }


async def until(done: Callable[[], Awaitable[bool]], timeout_s: float) -> None:
    with anyio.fail_after(timeout_s):
        while not await done():  # noqa: ASYNC110 - the broker tells no one of a subscriber
            await anyio.sleep(0.05)


def p50_ms(values_s: list[float]) -> float:
    return round(percentile(values_s, 50) * 1000, 1)


async def created_at(
    database_url: str, run_ids: list[str]
) -> dict[str, tuple[float, models.RunState]]:
    """Each run's ``created_at`` column and state, by run id."""
    engine = create_engine(database_url)
    try:
        async with session_factory(engine)() as session:
            rows = await session.execute(
                select(models.Run.run_id, models.Run.created_at, models.Run.state).where(
                    models.Run.run_id.in_(run_ids)
                )
            )
            return {run_id: (at.timestamp(), state) for run_id, at, state in rows.all()}
    finally:
        await engine.dispose()


PARTS: dict[str, tuple[Opener, str, float]] = {
    "kafka": (kafka, "", 500),  # fetch_max_wait_ms: tansu answers a waiting fetch that late
    "kafka_fast_fetch": (kafka, FAST_KAFKA_OPTIONS, 10),
    "sqs": (sqs, "", 0),
    "nats": (nats_jetstream, "", 0),
    "rabbitmq": (rabbitmq, "", 0),
    "redis_streams": (redis_streams, "", 0),
    "redis_pubsub": (redis_pubsub, "", 0),
    "mqtt": (mqtt, "", 0),
    "pubsub": (pubsub, "", 0),
    "kinesis": (kinesis, "", 1000),  # poll_interval_s
    "kinesis_fast_poll": (kinesis, FAST_KINESIS_OPTIONS, 200),
}
"""Each part: its source, what it adds to the trigger's options (nothing: as shipped), and
the watcher's poll cycle (ms) where it has a fixed one (0: it is told of each message)."""


def options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--max-gap-ms",
        type=float,
        default=150.0,
        help="pause a random 0..this long after each message's run is created, so messages "
        "land at random points of a watcher's poll",
    )


BENCH = Bench(
    module="tests.benchmarks.bench_provider_latency",
    description="each queue provider's message to run created, through the daemon",
    parts={name: partial(post_to_run, *part) for name, part in PARTS.items()},
    full={"latency_messages": 200},
    quick={"latency_messages": 50},
    options=options,
)

if __name__ == "__main__":
    main(BENCH)
