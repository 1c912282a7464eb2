"""A store written before the providers became packages (``watchers/kafka/``, ...) keeps
working: each classpath and keyword arguments it holds, as ``serialize()`` wrote them then,
loads with ``load_trigger``, and the loaded trigger serializes to the same pair, so its trigger
key (and with it the checkpoints and dedup keys stored under that trigger) stays the same."""

from __future__ import annotations

from typing import Any

import pytest

from triggerer.triggers import load_trigger

#: ``MessageQueueTrigger(queue=URI).serialize()`` for one URI of each provider, as main wrote
#: them before the packages (commit bb6cea2); the Redis ones under the classpaths migration 0017
#: gives them (``tests/integration/store/test_upgrades.py`` checks it).
STORED: list[tuple[str, dict[str, Any]]] = [
    (
        "watchers.kafka.KafkaTrigger",
        {
            "bootstrap_servers": "localhost:9092",
            "topics": ["orders"],
            "group_id": None,
            "auto_offset_reset": "earliest",
            "apply_function": None,
            "filter": None,
            "partition_key_path": None,
            "dead_letter_topic": None,
            "max_attempts": 3,
            "max_in_flight": 5000,
            "connection": None,
            "session_timeout_ms": 10000,
            "heartbeat_interval_ms": 3000,
            "commit_interval_ms": 1000,
            "fetch_max_wait_ms": 500,
            "shared_fetch": False,
        },
    ),
    (
        "watchers.sqs.SqsTrigger",
        {
            "queue": "sqs://orders?region=eu-west-1",
            "region_name": None,
            "endpoint_url": None,
            "wait_time_s": 20,
            "max_messages": 10,
            "receivers": 1,
            "batch": False,
            "visibility_timeout_s": None,
            "transform": None,
            "filter": None,
            "partition_key_path": None,
            "dead_letter_queue": None,
            "max_receives": 5,
            "connection": None,
        },
    ),
    (
        "watchers.kinesis.KinesisTrigger",
        {
            "stream": "orders",
            "region_name": "eu-west-1",
            "endpoint_url": None,
            "start": "TRIM_HORIZON",
            "application_name": None,
            "filter": None,
            "apply_function": None,
            "partition_key_path": None,
            "max_deliveries": 5,
            "connection": None,
            "limit": 1000,
            "poll_interval_s": 1.0,
            "shard_sync_interval_s": 60.0,
        },
    ),
    (
        "watchers.nats.NatsTrigger",
        {
            "servers": "localhost:4222",
            "stream": "ORDERS",
            "subject": "orders.new",
            "durable": None,
            "deliver_policy": "all",
            "ack_wait_s": 30.0,
            "max_deliveries": 5,
            "fetch_batch": 256,
            "fetch_wait_s": 5.0,
            "max_in_flight": 5000,
            "filter": None,
            "apply_function": None,
            "partition_key_path": None,
            "connection": None,
        },
    ),
    (
        "watchers.redis.RedisStreamTrigger",
        {
            "host": "localhost",
            "port": 6379,
            "db": 0,
            "stream": "orders",
            "group": None,
            "start_id": "$",
            "body_field": "body",
            "apply_function": None,
            "filter": None,
            "partition_key_path": None,
            "max_deliveries": 5,
            "min_idle_ms": 30000,
            "block_ms": 1000,
            "batch_size": 100,
            "max_in_flight": 5000,
            "connection": None,
        },
    ),
    (
        "watchers.redis.RedisPubSubTrigger",
        {
            "host": "localhost",
            "port": 6379,
            "db": 0,
            "channel": "orders",
            "apply_function": None,
            "filter": None,
            "partition_key_path": None,
            "connection": None,
            "watcher": None,
        },
    ),
    (
        "watchers.rabbitmq.RabbitMqTrigger",
        {
            "queue": "amqp://localhost/%2F/orders",
            "prefetch": 100,
            "filter": None,
            "apply_function": None,
            "partition_key_path": None,
            "max_deliveries": 5,
            "broker_dead_letters": False,
            "stream_offset": None,
            "reader_name": None,
            "connection": None,
        },
    ),
    (
        "watchers.pubsub.PubSubTrigger",
        {
            "subscription": "pubsub://project/orders-sub",
            "emulator_host": None,
            "max_messages": 500,
            "pullers": 2,
            "ack_deadline_s": None,
            "max_deliveries": 5,
            "filter": None,
            "apply_function": None,
            "partition_key_path": None,
            "connection": None,
        },
    ),
    (
        "watchers.mqtt.MqttTrigger",
        {
            "uri": "mqtt://localhost/orders",
            "client_id": None,
            "session_expiry_s": 86400,
            "dedup_property": "message-id",
            "apply_function": None,
            "filter": None,
            "partition_key_path": None,
            "max_deliveries": 5,
            "max_in_flight": 1000,
            "keepalive_s": 60,
            "connection": None,
        },
    ),
]


@pytest.mark.parametrize(
    ("classpath", "kwargs"), STORED, ids=[classpath for classpath, _ in STORED]
)
def test_a_stored_classpath_loads_and_serializes_as_stored(
    classpath: str, kwargs: dict[str, Any]
) -> None:
    trigger = load_trigger(classpath, dict(kwargs))
    assert type(trigger).__name__ == classpath.rpartition(".")[2]
    assert trigger.serialize() == (classpath, kwargs)
