"""Queue URIs: parsing SQS locations and Kafka URIs, and MessageQueueTrigger's dispatch."""

from __future__ import annotations

import importlib.metadata
import re
from typing import Any

import pytest

import watchers
from triggerer.triggers import BaseEventTrigger, TriggerEvent, UnusableTrigger, load_trigger
from watchers import FileTrigger, KafkaTrigger, MessageQueueTrigger, SqsTrigger
from watchers.kafka import parse_kafka_uri
from watchers.sqs import message_payload
from watchers.sqs.address import SqsQueue, parse_queue

AWS_URL = "https://sqs.eu-west-1.amazonaws.com/123456789012/orders"


def refusal(queue: str, **options: Any) -> str:
    """The error of the trigger ``MessageQueueTrigger`` gives for a queue it refuses."""
    trigger = MessageQueueTrigger(queue, **options)
    assert isinstance(trigger, UnusableTrigger), trigger
    assert trigger.source == queue
    return trigger.error


def test_public_api() -> None:
    assert watchers.__all__ == (
        "FileTrigger",
        "KafkaTrigger",
        "KinesisTrigger",
        "MessageQueueTrigger",
        "MqttTrigger",
        "NatsTrigger",
        "PubSubTrigger",
        "RabbitMqTrigger",
        "RedisPubSubTrigger",
        "RedisStreamTrigger",
        "SqsTrigger",
    )
    for name in watchers.__all__:
        assert getattr(watchers, name).__name__ == name


@pytest.mark.parametrize(
    ("queue", "expected"),
    [
        ("orders", SqsQueue("orders")),
        ("jobs.fifo", SqsQueue("jobs.fifo")),
        ("sqs://orders", SqsQueue("orders")),
        (
            "sqs://orders?region=eu-west-1&endpoint_url=http://127.0.0.1:5000",
            SqsQueue("orders", None, "eu-west-1", "http://127.0.0.1:5000"),
        ),
        (AWS_URL, SqsQueue("orders", AWS_URL, "eu-west-1", None)),
        (
            "http://127.0.0.1:5000/123456789012/orders",
            SqsQueue(
                "orders",
                "http://127.0.0.1:5000/123456789012/orders",
                None,
                "http://127.0.0.1:5000",
            ),
        ),
    ],
)
def test_parse_queue(queue: str, expected: SqsQueue) -> None:
    assert parse_queue(queue) == expected


def test_parse_queue_keywords_fill_the_gaps_and_must_agree() -> None:
    assert parse_queue("sqs://orders", region_name="us-east-2").region_name == "us-east-2"
    assert parse_queue(AWS_URL, region_name="eu-west-1").region_name == "eu-west-1"
    with pytest.raises(ValueError, match=r"region='eu-west-1' but 'us-east-1' was given"):
        parse_queue(AWS_URL, region_name="us-east-1")
    with pytest.raises(ValueError, match="endpoint_url="):
        parse_queue("sqs://orders?endpoint_url=http://a", endpoint_url="http://b")


@pytest.mark.parametrize(
    ("queue", "message"),
    [
        ("sqs://", r"'sqs://' must have the form sqs://queue-name\?region="),
        ("sqs://orders/extra", "must have the form"),
        ("sqs://orders?colour=red", r"unknown options \['colour'\]; valid: region, endpoint_url"),
        ("sqs://bad!name", "queue name 'bad!name' must be 1-80 letters"),
        ("sqs://orders#x", "'sqs://orders#x' must not have a fragment"),
        ("sqs://key:s3cret@orders", r"'sqs://\*\*\*@orders' holds credentials"),
        ("https://sqs.eu-west-1.amazonaws.com/", "has no queue name; expected https://sqs"),
        ("ftp://host/q", "is not a queue name, a queue URL"),
        ("", "is not a queue name"),
    ],
)
def test_parse_queue_errors_name_the_value_and_the_form(queue: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        parse_queue(queue)


def test_parse_kafka_uri() -> None:
    assert parse_kafka_uri("kafka://b1:9092,b2:9093/orders,returns") == (
        "b1:9092,b2:9093",
        ["orders", "returns"],
    )
    assert parse_kafka_uri("kafka://broker/orders") == ("broker:9092", ["orders"])


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("kafka://broker:9092", "must have the form kafka://host:port"),
        ("kafka://broker:9092/", "must have the form"),
        ("kafka:///orders", "must have the form"),
        ("kafka://broker:9092/a/b", "must have the form"),
        ("kafka://broker:x/orders", "bootstrap server 'broker:x' must be host or host:port"),
        ("kafka://broker:9092/orders?group_id=g", "pass options as keyword arguments"),
    ],
)
def test_kafka_uri_errors(uri: str, message: str) -> None:
    error = refusal(uri)
    assert re.search(message, error)
    assert uri in error


def test_kafka_uri_gives_a_kafka_trigger() -> None:
    trigger = MessageQueueTrigger("kafka://127.0.0.1:9092/orders,returns", group_id="g")
    assert isinstance(trigger, KafkaTrigger)
    assert isinstance(trigger, BaseEventTrigger)
    classpath, kwargs = trigger.serialize()
    assert classpath == "watchers.kafka.KafkaTrigger"
    assert kwargs["bootstrap_servers"] == "127.0.0.1:9092"
    assert kwargs["topics"] == ["orders", "returns"]
    assert kwargs["group_id"] == "g"


@pytest.mark.parametrize("queue", ["sqs://orders?region=eu-west-1", AWS_URL])
def test_sqs_uris_give_an_sqs_trigger(queue: str) -> None:
    trigger = MessageQueueTrigger(queue, wait_time_s=5, batch=True)
    assert isinstance(trigger, SqsTrigger)
    classpath, kwargs = trigger.serialize()
    assert classpath == "watchers.sqs.SqsTrigger"
    assert kwargs["queue"] == queue
    assert kwargs["wait_time_s"] == 5
    assert kwargs["batch"] is True
    assert load_trigger(classpath, kwargs).serialize() == trigger.serialize()


def test_sqs_uri_without_a_queue_name() -> None:
    assert re.search(
        r"'sqs://\?region=x' must have the form sqs://queue-name", refusal("sqs://?region=x")
    )


def test_unknown_scheme_names_the_uri_and_the_supported_schemes() -> None:
    assert re.search(r"'stomp://h/q'.*supported: .*kafka.*sqs", refusal("stomp://h/q"))
    assert re.search(
        r"'https://example.com/not/a/queue' is not an SQS",
        refusal("https://example.com/not/a/queue"),
    )


async def test_a_refused_uri_is_a_trigger_that_raises_its_error_when_run() -> None:
    trigger = MessageQueueTrigger("kafka://broker:9092")
    assert isinstance(trigger, UnusableTrigger)
    with pytest.raises(ValueError, match="must have the form kafka://host:port"):
        await anext(aiter(trigger.run()))


class _Provided(BaseEventTrigger):
    def __init__(self, uri: str, **options: Any) -> None:
        self.uri = uri
        self.options = options

    def serialize(self) -> tuple[str, dict[str, Any]]:
        return self.classpath(), {"uri": self.uri, **self.options}

    async def run(self) -> Any:  # pragma: no cover - never run here
        yield TriggerEvent({})


def _provider(uri: str, **options: Any) -> BaseEventTrigger:
    return _Provided(uri, **options)


def test_more_schemes_come_from_entry_points(monkeypatch: pytest.MonkeyPatch) -> None:
    entry_point = importlib.metadata.EntryPoint(
        name="stomp", value=f"{__name__}:_provider", group="triggerer.queue_providers"
    )
    real = importlib.metadata.entry_points

    def entry_points(**selection: Any) -> Any:
        if selection == {"group": "triggerer.queue_providers"}:
            return importlib.metadata.EntryPoints([entry_point])
        return real(**selection)

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    trigger = MessageQueueTrigger("stomp://h/q", prefetch=5)
    assert isinstance(trigger, _Provided)
    assert trigger.serialize() == (_Provided.classpath(), {"uri": "stomp://h/q", "prefetch": 5})
    assert "supported: " in refusal("zmq://h/q")
    assert "stomp" in refusal("zmq://h/q")


def test_sqs_trigger_round_trips_every_option() -> None:
    trigger = SqsTrigger(
        "sqs://orders?region=eu-west-1",
        wait_time_s=10,
        max_messages=5,
        receivers=3,
        batch=True,
        visibility_timeout_s=60,
        transform="json.loads",
        filter={"path": "$.body.kind", "one_of": ["a", "b"]},
        partition_key_path="$.body.day",
        dead_letter_queue="orders-dlq",
        max_receives=3,
        connection="aws",
    )
    classpath, kwargs = trigger.serialize()
    assert kwargs["filter"] == {"path": "$.body.kind", "one_of": ["a", "b"]}
    rebuilt = load_trigger(classpath, kwargs)
    assert rebuilt.serialize() == trigger.serialize()
    assert SqsTrigger.shareable is True


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"wait_time_s": 21}, "wait_time_s=21 must be an integer from 1 to 20"),
        ({"max_messages": 11}, "max_messages=11 must be an integer from 1 to 10"),
        ({"receivers": 0}, "receivers=0 must be an integer from 1"),
        ({"visibility_timeout_s": 0}, "visibility_timeout_s=0 must be an integer"),
        ({"max_receives": True}, "max_receives=True must be an integer"),
        ({"batch": "yes"}, "batch='yes' must be true or false"),
        ({"filter": {"equals": 1}}, "must be a mapping with 'path'"),
        ({"partition_key_path": "day"}, "JSON path 'day' must start with '\\$'"),
        ({"transform": "nodots"}, "transform='nodots' must be a dotted path"),
        ({"dead_letter_queue": "bad name"}, "is not a queue name"),
    ],
)
def test_sqs_trigger_option_errors(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        SqsTrigger("orders", **options)


async def _async_transform(payload: Any) -> Any:
    return payload


def test_sqs_transform_must_not_be_async() -> None:
    with pytest.raises(ValueError, match="must be a plain function, not async"):
        SqsTrigger("orders", transform=f"{__name__}._async_transform")


def test_message_payload() -> None:
    message = {
        "MessageId": "m-1",
        "ReceiptHandle": "r",
        "Body": '{"a": [1, 2]}',
        "Attributes": {"ApproximateReceiveCount": "2"},
        "MessageAttributes": {
            "kind": {"DataType": "String", "StringValue": "order"},
            "price": {"DataType": "Number.float", "StringValue": "1.50"},
            "raw": {"DataType": "Binary", "BinaryValue": b"\x80abc"},
        },
    }
    assert message_payload(message) == {
        "message_id": "m-1",
        "body": {"a": [1, 2]},
        "attributes": {"ApproximateReceiveCount": "2"},
        "message_attributes": {"kind": "order", "price": "1.50", "raw": {"base64": "gGFiYw=="}},
    }


def test_file_trigger_round_trips(tmp_path: Any) -> None:
    trigger = FileTrigger(str(tmp_path), "*.csv", poll_interval_s=0.5)
    assert load_trigger(*trigger.serialize()).serialize() == trigger.serialize()
    assert FileTrigger.shareable is False
    with pytest.raises(ValueError, match="pattern='/abs' must be a relative glob"):
        FileTrigger(str(tmp_path), "/abs")
    with pytest.raises(ValueError, match="poll_interval_s=0 must be above 0"):
        FileTrigger(str(tmp_path), poll_interval_s=0)


@pytest.mark.parametrize(
    "queue",
    [
        "amqp://user:s3cret@h/%2F/q",
        "nats://s3cret@h/S/x",
        "redis+stream://:s3cret@h/0/s",
        "sqs://key:s3cret@h/",
        "kafka://user:s3cret@h/t",
    ],
)
def test_a_refused_uri_hides_its_credentials(queue: str) -> None:
    trigger = MessageQueueTrigger(queue)
    assert isinstance(trigger, UnusableTrigger)
    assert "s3cret" not in repr(trigger.serialize())
    assert "***@h/" in trigger.source
    assert "***@h/" in trigger.error


async def test_an_apply_function_that_cannot_be_imported_is_its_watchers_error() -> None:
    trigger = MessageQueueTrigger("amqp://h/%2F/q", apply_function="nosuch.module.fn")
    # Imported when the trigger starts to run (before it connects), not when it is made.
    with pytest.raises(ImportError, match="nosuch"):
        await anext(aiter(trigger.run()))
