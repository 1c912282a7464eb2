"""The provider contract for RabbitMQ (``amqp://``), through ``triggerer run``.

Each test declares a durable quorum queue of its own (so the broker counts deliveries, and the
queue and its messages outlive a restart of the private node); the watcher's dead letters go to
the dead-letter table (no ``broker_dead_letters``). The private node is a ``rabbitmq-server`` of
the test's own, on a free port: the machine's system node is never restarted.
"""

from __future__ import annotations

import json
import signal
import uuid
from collections.abc import AsyncIterator, Mapping, Sequence
from typing import TYPE_CHECKING

import aio_pika
import anyio
import pytest

from tests.e2e.daemon import event_count, events_of, wait_for, write_pipelines
from tests.e2e.providers.contract import (
    FOUND_WITHIN_S,
    Broker,
    PrivateBroker,
    ProviderContract,
    Source,
    daemon,
    failed_missing,
    listed,
    numbers,
    post_and_store,
    posted,
    settled_events,
    watching,
)
from tests.fixtures.rabbitmq import SHARED_RABBITMQ, declare_queue, delete_queue
from watchers.rabbitmq import send

if TYPE_CHECKING:
    from pathlib import Path

    from deploy.local.services import Service


class RabbitMq(Broker):
    """Quorum queues of their own (``triggerer-test-<uuid>``) on one broker, deleted after."""

    def __init__(self, address: str) -> None:
        self.address = address
        self.made: list[str] = []

    async def source(self) -> Source:
        name = f"triggerer-test-{uuid.uuid4().hex}"
        await declare_queue(self.address, name, kind="quorum")
        self.made.append(name)
        uri = f"amqp://{self.address}/%2F/{name}"

        async def post(bodies: Sequence[str]) -> None:
            await send(uri, bodies)

        async def send_binary(attributes: Mapping[str, str], data: bytes) -> None:
            message = aio_pika.Message(
                data,
                message_id=str(uuid.uuid4()),
                content_type="application/json",
                delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                headers={f"cloudEvents:{key}": value for key, value in attributes.items()},
            )
            connection = await aio_pika.connect(f"amqp://guest:guest@{self.address}/")
            async with connection:
                channel = await connection.channel(publisher_confirms=True)
                await channel.default_exchange.publish(message, routing_key=name)

        return Source(uri=uri, send=post, send_binary=send_binary)

    def bad_uris(self) -> list[tuple[str, str]]:
        return [
            ("amqp://127.0.0.1/orders", "'amqp://127.0.0.1/orders'"),
            ("amqp://guest:s3cret@127.0.0.1/%2F/orders", "connection='NAME'"),
            ("amqp://127.0.0.1/%2F/orders?prefetch=5", "keyword arguments"),
        ]

    async def close(self) -> None:
        for name in self.made:
            await delete_queue(self.address, name)


class PrivateRabbitMq(RabbitMq, PrivateBroker):
    def __init__(self, service: Service) -> None:
        super().__init__(service.address)
        self.service = service

    async def restart(self) -> None:
        self.service.stop(grace_s=30)  # SIGTERM: the node shuts down, its queues on disk
        self.service.start(timeout_s=90)


@pytest.fixture
async def broker() -> AsyncIterator[Broker]:
    shared = RabbitMq(SHARED_RABBITMQ)
    try:
        yield shared
    finally:
        await shared.close()


@pytest.fixture
def private_broker(private_rabbitmq: Service) -> PrivateBroker:
    return PrivateRabbitMq(private_rabbitmq)


class TestRabbitMq(ProviderContract):
    """The contract on RabbitMQ."""


TWO_WATCHERS = """
from triggerer import Asset, AssetWatcher
from watchers import MessageQueueTrigger

first = Asset("first", watchers=[AssetWatcher("first_queue", MessageQueueTrigger(queue={uri!r}))])
second = Asset("second", watchers=[AssetWatcher(
    "second_queue", MessageQueueTrigger(queue={uri!r}, filter={{"path": "$.body.i",
    "one_of": list(range(0, {count}, 2))}}))])
missing = Asset("missing", watchers=[AssetWatcher(
    "missing_queue", MessageQueueTrigger(queue={missing!r}))])
"""


@pytest.mark.timeout(180)
@pytest.mark.parametrize("db_backend", ["sqlite"], indirect=True)
async def test_two_watchers_of_one_queue_each_see_every_message(
    broker: Broker, tmp_path: Path, database_url: str
) -> None:
    """A queue splits its messages between consumers: the daemon's watchers of one queue share
    one consumer, so each sees every message. A queue that does not exist is its watcher's
    error, retried with backoff (the queue may be declared later)."""
    source = await broker.source()
    count = 40
    missing = source.uri.rsplit("/", 1)[0] + "/triggerer-test-missing"
    text = TWO_WATCHERS.format(uri=source.uri, count=count, missing=missing)
    write_pipelines(tmp_path / "pipelines", text)
    with daemon(tmp_path, database_url, source) as process:
        process.start()
        await process.wait_logged("pipelines_loaded")
        await source.send([json.dumps({"i": i}) for i in range(count)])
        await wait_for(database_url, lambda s: event_count(s, "first"), lambda n: n >= count)
        await wait_for(database_url, lambda s: event_count(s, "second"), lambda n: n >= count // 2)
        await anyio.sleep(1)  # anything delivered twice would be stored by now
        first = await wait_for(database_url, lambda s: events_of(s, "first"), bool)
        second = await wait_for(database_url, lambda s: events_of(s, "second"), bool)
        watchers = {row["watcher"]: row for row in await listed(process, "watchers", "list")}
        assert process.process is not None
        assert process.process.poll() is None, process.tail()
    assert numbers(first) == list(range(count))
    assert numbers(second) == list(range(0, count, 2))
    assert watchers["first_queue"]["state"] == "running"
    assert (
        "'triggerer-test-missing' does not exist in vhost '/'"
        in (watchers["missing_queue"]["last_error"])
    )


ONE_STREAM = """
from triggerer import Asset, AssetWatcher
from watchers import MessageQueueTrigger

stream = Asset(
    "stream", watchers=[AssetWatcher("stream_queue", MessageQueueTrigger(queue={uri!r}))]
)
"""


@pytest.mark.timeout(180)
@pytest.mark.parametrize("db_backend", ["sqlite"], indirect=True)
async def test_a_stream_queue_is_read_on_after_a_restart(
    broker: RabbitMq, tmp_path: Path, database_url: str
) -> None:
    """A stream queue keeps its messages and the consumer says where to read: the watcher's
    offset, stored with its events, is where it reads on after the daemon is killed, so what
    was published meanwhile is read (the broker's default, ``next``, would skip it)."""
    name = f"triggerer-test-{uuid.uuid4().hex}"
    await declare_queue(broker.address, name, kind="stream")
    broker.made.append(name)
    uri = f"amqp://{broker.address}/%2F/{name}"
    source = Source(uri=uri, send=lambda bodies: send(uri, bodies))
    write_pipelines(tmp_path / "pipelines", ONE_STREAM.format(uri=uri))
    with daemon(tmp_path, database_url, source) as process:
        process.start()
        await process.wait_logged("rabbitmq_consuming")
        await send(uri, [json.dumps({"i": i}) for i in range(20)])
        await wait_for(database_url, lambda s: event_count(s, "stream"), lambda n: n >= 20)
        process.signal(signal.SIGKILL)
        assert await process.wait(30) == -signal.SIGKILL
        await send(uri, [json.dumps({"i": i}) for i in range(20, 40)])  # while it is down
        process.start()
        await wait_for(database_url, lambda s: event_count(s, "stream"), lambda n: n >= 40)
        events = await settled_events(process, database_url)
        watchers = {row["watcher"]: row for row in await listed(process, "watchers", "list")}
    assert numbers(events) == list(range(40))
    assert watchers["stream_queue"]["consumer_group"].startswith("triggerer-stream_queue-")


@pytest.mark.timeout(240)
@pytest.mark.parametrize("db_backend", ["sqlite"], indirect=True)
async def test_a_queue_declared_after_the_watcher_started_is_read_within_seconds(
    broker: RabbitMq, tmp_path: Path, database_url: str
) -> None:
    """Issue 29: a missing queue was looked for again after a backoff grown towards a minute
    (the watcher ran 48.6 s after the queue was declared). It is looked for every 5 s at most,
    and the first message published once it exists is one event. (A message published to a
    queue that does not exist is dropped by the broker: there is nothing to read before.)"""
    name = f"triggerer-test-{uuid.uuid4().hex}"
    uri = f"amqp://{broker.address}/%2F/{name}"
    source = Source(uri=uri, send=lambda bodies: send(uri, bodies))
    write_pipelines(tmp_path / "pipelines", watching(source))
    with daemon(tmp_path, database_url, source) as process:
        process.start()
        error = await failed_missing(process, database_url)
        await declare_queue(broker.address, name, kind="quorum")
        broker.made.append(name)
        await process.wait_logged("rabbitmq_consuming", timeout_s=FOUND_WITHIN_S)
        await post_and_store(process, database_url, "rabbitmq", uri, 1)
        events = await settled_events(process, database_url)
        watchers = await listed(process, "watchers", "list")
    assert f"RabbitMQ queue {name!r} does not exist" in error
    assert "QueueMissing" in error
    assert numbers(events) == [1]
    assert [watcher["state"] for watcher in watchers] == ["running"]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("db_backend", ["sqlite"], indirect=True)
async def test_a_stream_queue_declared_while_the_daemon_is_down_is_read_from_its_first_message(
    broker: RabbitMq, tmp_path: Path, database_url: str
) -> None:
    """A stream queue keeps its messages and is read from where its consumer says. With no
    offset stored, that was ``next``: the messages of a stream declared after the watcher was
    deployed (here while the daemon is down) that came before the watcher's next start were
    never events. It is read from the watcher's first start, stored by the first daemon."""
    name = f"triggerer-test-{uuid.uuid4().hex}"
    uri = f"amqp://{broker.address}/%2F/{name}"
    source = Source(uri=uri, send=lambda bodies: send(uri, bodies))
    write_pipelines(tmp_path / "pipelines", watching(source))
    with daemon(tmp_path, database_url, source) as process:
        process.start()
        await failed_missing(process, database_url, times=1)
        process.signal(signal.SIGTERM)
        assert await process.wait(60) == 0, process.tail()
        await declare_queue(broker.address, name, kind="stream")
        broker.made.append(name)
        await posted(process, "rabbitmq", uri, json.dumps({"i": 1}))
        process.start()
        await wait_for(database_url, lambda s: event_count(s, "stream"), lambda n: n >= 1)
        await post_and_store(process, database_url, "rabbitmq", uri, 2)
        events = await settled_events(process, database_url)
    assert numbers(events) == [1, 2]
