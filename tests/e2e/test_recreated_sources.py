"""A Kafka topic recreated under ``triggerer run``, or a broker that forgets its topics restarted
under a store that keeps its events: offsets start again at 0, and every new message is still a
new event (the dedup key carries the record's timestamp). A message that really reuses a stored
key is dropped, but named in the log."""

from __future__ import annotations

import json
import signal
import uuid
from typing import TYPE_CHECKING

import anyio
import pytest
from aiokafka import AIOKafkaProducer
from aiokafka.admin import AIOKafkaAdminClient

from deploy.local.services import free_port, tansu
from tests.e2e.daemon import ORDERS, Deployment, event_count, events_of, triggerer_cli
from tests.fixtures.brokers import create_topic, unique_name

if TYPE_CHECKING:
    from pathlib import Path

    from tests.e2e.daemon import DaemonProcess
    from tests.fixtures.brokers import MakeTopic

NO_SPARK = "sc://127.0.0.1:1"  # no pipeline runs here: events are what is checked


async def delete_topic(bootstrap: str, topic: str) -> None:
    admin = AIOKafkaAdminClient(bootstrap_servers=bootstrap)
    await admin.start()
    try:
        await admin.delete_topics([topic])
    finally:
        await admin.close()


async def recreate_topic(bootstrap: str, topic: str) -> None:
    """Delete ``topic`` and create it again, retrying while the broker still has it."""
    await delete_topic(bootstrap, topic)
    with anyio.fail_after(30):
        while True:
            try:
                await create_topic(bootstrap, topic)
            except Exception:  # noqa: BLE001 - TopicAlreadyExists while the deletion lands
                await anyio.sleep(0.2)
            else:
                return


def values(events: list[object]) -> list[int]:
    return sorted(e.extra["payload"]["value"]["i"] for e in events)  # type: ignore[attr-defined]


async def started(deployment: Deployment) -> DaemonProcess:
    daemon = deployment.process_with_config(deployment.config_file())
    daemon.start()
    await daemon.wait_logged("pipelines_loaded")
    await daemon.wait_logged("kafka_partitions_assigned", timeout_s=60)
    return daemon


OWN_GROUP = ORDERS.replace(
    "heartbeat_interval_ms=1000", "heartbeat_interval_ms=1000, group_id='own'"
)
"""The asset ``orders`` fed by a KafkaTrigger with a consumer (and group) of its own."""


@pytest.mark.parametrize("source", [ORDERS, OWN_GROUP], ids=["shared-consumer", "own-consumer"])
async def test_messages_of_a_topic_recreated_under_the_daemon_become_events(
    tmp_path: Path, database_url: str, kafka_broker: str, make_topic: MakeTopic, source: str
) -> None:
    topic = await make_topic()
    deployment = Deployment(tmp_path, database_url, NO_SPARK, kafka_broker, topic)
    deployment.write_pipelines(source)
    with await started(deployment) as daemon:
        await deployment.produce([{"i": 0}, {"i": 1}])
        await deployment.wait_for(lambda s: event_count(s, "orders"), lambda n: n == 2)

        await recreate_topic(kafka_broker, topic)
        await deployment.produce([{"i": 2}, {"i": 3}])
        events = await deployment.wait_for(
            lambda s: events_of(s, "orders"), lambda e: len(e) >= 4, timeout_s=60
        )
        logged = await anyio.Path(daemon.log_path).read_text()

    assert values(events) == [0, 1, 2, 3], daemon.tail()
    offsets = [e.extra["payload"]["offset"] for e in events]
    assert offsets == [0, 1, 0, 1]  # the new topic's offsets start again
    assert len({e.dedup_key for e in events}) == 4
    assert "duplicate_key_other_message" not in logged
    assert '"event": "kafka_topic_recreated"' in logged
    assert '"event": "kafka_partition_reset"' in logged


async def test_a_broker_that_forgets_its_topics_restarted_twice_loses_no_message(
    tmp_path: Path, services_log_dir: Path
) -> None:
    """What ``make demo`` run three times does: a broker with memory storage, a kept store."""
    port = free_port()
    topic = f"orders-{uuid.uuid4().hex[:8]}"
    deployment = Deployment(
        tmp_path, f"sqlite:///{tmp_path / 'triggerer.db'}", NO_SPARK, f"127.0.0.1:{port}", topic
    )
    deployment.write_pipelines(ORDERS)
    config = deployment.config_file()
    for demo in range(3):
        broker = tansu(services_log_dir, port=port)
        broker.start()
        try:
            await create_topic(deployment.bootstrap, topic)
            daemon = deployment.process_with_config(config)
            with daemon:
                daemon.start()
                await daemon.wait_logged("pipelines_loaded", times=demo + 1)
                await deployment.produce([{"i": 2 * demo}, {"i": 2 * demo + 1}])
                events = await deployment.wait_for(
                    lambda s: events_of(s, "orders"), lambda e, n=demo: len(e) >= 2 * n + 2
                )
                daemon.signal(signal.SIGTERM)
                assert await daemon.wait(30) == 0, daemon.tail()
        finally:
            broker.stop()

    assert values(events) == list(range(6)), daemon.tail()
    assert [e.extra["payload"]["offset"] for e in events] == [0, 1] * 3


async def test_another_message_under_a_stored_key_is_dropped_and_named_in_the_log(
    tmp_path: Path, database_url: str, kafka_broker: str, make_topic: MakeTopic
) -> None:
    """A producer that stamps its records itself can reuse a key: the same offset and the same
    timestamp in two incarnations of a topic. The second message is dropped (the key cannot tell
    it apart), and the log says so, naming the watcher, the key and both times."""
    topic = await make_topic()
    deployment = Deployment(tmp_path, database_url, NO_SPARK, kafka_broker, topic)
    deployment.write_pipelines(ORDERS)
    stamp_ms = 1_790_000_000_123
    with await started(deployment) as daemon:
        await produce_stamped(kafka_broker, topic, {"i": 0}, stamp_ms)
        await deployment.wait_for(lambda s: event_count(s, "orders"), lambda n: n == 1)
        await recreate_topic(kafka_broker, topic)
        await produce_stamped(kafka_broker, topic, {"i": 1}, stamp_ms)
        [logged] = await daemon.wait_logged("duplicate_key_other_message", timeout_s=60)

    # Logged after the batch committed: the second message was not stored.
    [first] = await deployment.query(lambda s: events_of(s, "orders"))
    assert values([first]) == [0]
    assert logged["watchers"] == ["orders/orders_topic"]
    assert logged["dedup_key"] == f"{topic}/0/0@{stamp_ms}" == first.dedup_key
    assert logged["stored_at"] == first.timestamp.isoformat()
    assert logged["received_at"] > logged["stored_at"]


async def produce_stamped(bootstrap: str, topic: str, value: object, timestamp_ms: int) -> None:
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap)
    await producer.start()
    try:
        await producer.send_and_wait(topic, json.dumps(value).encode(), timestamp_ms=timestamp_ms)
    finally:
        await producer.stop()


async def test_the_first_message_of_a_topic_missing_when_the_watcher_started_is_an_event(
    tmp_path: Path, database_url: str, kafka_broker: str, request: pytest.FixtureRequest
) -> None:
    """Issue 29, for Kafka: the watcher subscribes to a topic that does not exist. Kafka makes
    a topic on first use (``auto.create.topics.enable``, the broker's default; tansu always
    does): the watcher's own metadata request makes it, and its partitions are assigned before
    anything is sent, so the first message ``triggerer post kafka`` sends is an event."""
    topic = unique_name(request)
    deployment = Deployment(tmp_path, database_url, NO_SPARK, kafka_broker, topic)
    deployment.write_pipelines(ORDERS)
    config = deployment.config_file()
    with deployment.process_with_config(config) as daemon:
        daemon.start()
        await daemon.wait_logged("pipelines_loaded")
        await daemon.wait_logged("kafka_partitions_assigned", timeout_s=60)
        posted = await triggerer_cli(
            daemon.env,
            "--config",
            str(config),
            "post",
            "kafka",
            topic,
            '{"i": 1}',
            "--bootstrap-servers",
            kafka_broker,
        )
        assert posted.returncode == 0, posted.stderr
        await deployment.wait_for(lambda s: event_count(s, "orders"), lambda n: n >= 1)
        await deployment.produce([{"i": 2}])
        await deployment.wait_for(lambda s: event_count(s, "orders"), lambda n: n >= 2)
        await anyio.sleep(1)  # a message read twice would be stored by now
        events = await deployment.query(lambda s: events_of(s, "orders"))
    assert values(events) == [1, 2], daemon.tail()
