"""RabbitMQ URIs, options and dedup keys: pure rules, no broker."""

from __future__ import annotations

import re
from types import SimpleNamespace
from typing import Any, cast

import pytest

from watchers import MessageQueueTrigger, RabbitMqTrigger
from watchers.rabbitmq_address import RabbitQueue, parse_rabbitmq_uri
from watchers.rabbitmq_consumer import dedup_key


@pytest.mark.parametrize(
    ("uri", "expected"),
    [
        ("amqp://broker/%2F/orders", RabbitQueue("broker", 5672, "/", "orders")),
        ("amqp://broker:5673/prod/orders", RabbitQueue("broker", 5673, "prod", "orders")),
        ("AMQP://broker/v/a%2Fb", RabbitQueue("broker", 5672, "v", "a/b")),
        ("amqps://broker/%2F/q", RabbitQueue("broker", 5671, "/", "q", tls=True)),
        ("amqp://[::1]:5672/%2F/q", RabbitQueue("::1", 5672, "/", "q")),
    ],
)
def test_uris_parse(uri: str, expected: RabbitQueue) -> None:
    assert parse_rabbitmq_uri(uri) == expected


@pytest.mark.parametrize(
    ("uri", "says"),
    [
        ("amqp://broker/orders", "must have the form"),
        ("amqp://broker//orders", "must have the form"),
        ("amqp://broker/%2F/", "must have the form"),
        ("amqp://broker/%2F/a/b", "%2F"),
        ("amqp:///%2F/q", "must have the form"),
        ("amqp://guest:secret@broker/%2F/q", "connection="),
        ("amqp://guest@broker/%2F/q", "connection="),
        ("amqp://broker/%2F/q?prefetch=1", "keyword arguments"),
        ("amqp://broker:port/%2F/q", "bad port"),
        ("amqp://broker/%2F/" + "q" * 256, "255 bytes"),
    ],
)
def test_bad_uris_name_the_value(uri: str, says: str) -> None:
    with pytest.raises(ValueError, match="RabbitMQ URI") as raised:
        RabbitMqTrigger(uri)
    assert says in str(raised.value)
    assert repr(uri) in str(raised.value)
    # Through MessageQueueTrigger, the watcher's error.
    assert repr(uri) in MessageQueueTrigger(queue=uri).serialize()[1]["error"]


def test_the_scheme_picks_rabbitmq() -> None:
    assert isinstance(MessageQueueTrigger(queue="amqp://broker/%2F/q"), RabbitMqTrigger)
    assert isinstance(MessageQueueTrigger(queue="amqps://broker/%2F/q"), RabbitMqTrigger)


@pytest.mark.parametrize(
    ("options", "says"),
    [
        ({"prefetch": 0}, "prefetch=0"),
        ({"prefetch": True}, "prefetch=True"),
        ({"max_deliveries": 0}, "max_deliveries=0"),
        ({"broker_dead_letters": "yes"}, "broker_dead_letters='yes'"),
        ({"stream_offset": "start"}, "stream_offset='start'"),
        ({"stream_offset": -1}, "stream_offset=-1"),
        ({"connection": ""}, "connection=''"),
        ({"filter": {"path": "value"}}, "filter="),
        ({"partition_key_path": "key"}, "'key'"),
        ({"apply_function": "nodots"}, "apply_function='nodots'"),
    ],
)
def test_bad_options_name_the_value(options: dict[str, Any], says: str) -> None:
    with pytest.raises(ValueError, match=re.escape(says)):
        RabbitMqTrigger("amqp://broker/%2F/q", **options)


def test_serialize_round_trips_the_options() -> None:
    trigger = RabbitMqTrigger(
        "amqp://broker/%2F/q", prefetch=10, stream_offset=5, connection="rabbit"
    )
    classpath, kwargs = trigger.serialize()
    assert classpath == "watchers.rabbitmq.RabbitMqTrigger"
    assert RabbitMqTrigger(**kwargs).serialize() == (classpath, kwargs)
    assert kwargs["prefetch"] == 10
    assert kwargs["stream_offset"] == 5


def _message(message_id: str | None, headers: dict[str, Any]) -> Any:
    return cast(Any, SimpleNamespace(message_id=message_id, headers=headers))


def test_dedup_keys() -> None:
    queue = RabbitQueue("broker", 5672, "/", "a/b")
    assert dedup_key(queue, _message("m1", {})) == "%2F/a%2Fb/m1"
    assert dedup_key(queue, _message("m1", {"x-stream-offset": 7})) == "%2F/a%2Fb/m1"
    assert dedup_key(queue, _message(None, {"x-stream-offset": 7})) == "%2F/a%2Fb@7"
    assert dedup_key(queue, _message(None, {})) is None
    assert dedup_key(queue, _message("", {"x-delivery-count": 2})) is None
