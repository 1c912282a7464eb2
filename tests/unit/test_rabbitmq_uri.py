"""RabbitMQ URIs, options and dedup keys: pure rules, no broker."""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace
from typing import Any, cast

import pytest

from watchers import MessageQueueTrigger, RabbitMqTrigger
from watchers.rabbitmq.address import (
    RabbitQueue,
    StreamStart,
    checkpoint_key,
    dedup_key,
    parse_rabbitmq_uri,
    stream_start,
)


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
    shown = repr(re.sub(r"//[^/]*@", "//***@", uri))  # credentials masked
    assert shown in str(raised.value)
    assert "secret" not in str(raised.value)
    # Through MessageQueueTrigger, the watcher's error.
    error = MessageQueueTrigger(queue=uri).serialize()[1]["error"]
    assert shown in error
    assert "secret" not in error


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
        ({"reader_name": ""}, "reader_name=''"),
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


def _message(
    message_id: str | None,
    headers: dict[str, Any],
    *,
    timestamp: datetime | None = None,
    body: bytes = b"{}",
) -> Any:
    return cast(
        Any, SimpleNamespace(message_id=message_id, headers=headers, timestamp=timestamp, body=body)
    )


def test_dedup_keys() -> None:
    queue = RabbitQueue("broker", 5672, "/", "a/b")
    assert dedup_key(queue, _message("m1", {})) == "%2F/a%2Fb/m1"
    assert dedup_key(queue, _message("m1", {"x-stream-offset": 7})) == "%2F/a%2Fb/m1"
    assert dedup_key(queue, _message(None, {})) is None
    assert dedup_key(queue, _message("", {"x-delivery-count": 2})) is None


def test_a_stream_key_tells_a_recreated_streams_message_from_the_old_one() -> None:
    """A stream declared again numbers its messages from 0: the offset alone would key a new
    message as the old one at that offset (and the store would drop it as a duplicate)."""
    queue = RabbitQueue("broker", 5672, "/", "s")
    at = datetime(2025, 1, 2, 3, 4, 5, tzinfo=UTC)
    old = _message(None, {"x-stream-offset": 7}, timestamp=at)
    new = _message(None, {"x-stream-offset": 7}, timestamp=at + timedelta(seconds=90))
    assert dedup_key(queue, old) == f"%2F/s@7@{int(at.timestamp())}"
    assert dedup_key(queue, old) != dedup_key(queue, new)
    # Read again, the same message has the same key.
    assert dedup_key(queue, old) == dedup_key(
        queue, _message(None, {"x-stream-offset": 7}, timestamp=at)
    )
    # Without a timestamp, the body tells them apart.
    untimed = dedup_key(queue, _message(None, {"x-stream-offset": 7}, body=b"a"))
    assert untimed is not None
    assert untimed.startswith("%2F/s@7@sha256:")
    assert untimed != dedup_key(queue, _message(None, {"x-stream-offset": 7}, body=b"b"))
    assert untimed == dedup_key(queue, _message(None, {"x-stream-offset": 7}, body=b"a"))


def test_checkpoint_keys() -> None:
    queue = RabbitQueue("broker", 5672, "/", "a/b")
    assert checkpoint_key(queue, "triggerer-w-1") == "rabbitmq/%2F/a%2Fb/triggerer-w-1"


@pytest.mark.parametrize(
    ("configured", "stored", "expected"),
    [
        # Nothing stored: the configured offset (the broker's next by default).
        (None, {"a": None}, StreamStart(None, {}, resumed=False)),
        ("first", {"a": None}, StreamStart("first", {}, resumed=False)),
        # Stored: from the earliest, the message there read again (and skipped).
        (None, {"a": 10, "b": 4}, StreamStart(4, {"a": 10, "b": 4}, resumed=True)),
        ("next", {"a": 10}, StreamStart(10, {"a": 10}, resumed=True)),
        ("last", {"a": 10, "b": None}, StreamStart(10, {"a": 10}, resumed=True)),
        # "first" or an earlier offset still wins, each reader skipping what it stored.
        ("first", {"a": 10, "b": None}, StreamStart("first", {"a": 10}, resumed=False)),
        (3, {"a": 10, "b": None}, StreamStart(3, {"a": 10, "b": 2}, resumed=False)),
        # A later configured offset: from the stored one, the new reader skipping to its own.
        (20, {"a": 10, "b": None}, StreamStart(10, {"a": 10, "b": 19}, resumed=True)),
        (0, {"a": 10, "b": None}, StreamStart(0, {"a": 10}, resumed=False)),
    ],
)
def test_where_a_stream_is_read_from(
    configured: str | int | None, stored: dict[str, int | None], expected: StreamStart
) -> None:
    assert stream_start(configured, stored) == expected


class _Asset:
    name = "orders"
    uri = "amqp://broker/%2F/q"


def test_each_watcher_reads_a_stream_under_a_name_of_its_own() -> None:
    trigger = RabbitMqTrigger("amqp://broker/%2F/q", stream_offset="first")
    assert trigger.reads_as == "triggerer"
    assert RabbitMqTrigger("amqp://broker/%2F/q").reads_as is None  # not known to be a stream
    one = trigger.for_watcher(_Asset(), "one")
    two = trigger.for_watcher(_Asset(), "two")
    assert one.reads_as is not None
    assert one.reads_as.startswith("triggerer-one-")
    assert one.reads_as != two.reads_as
    assert one.reader_spec().checkpoint_key == f"rabbitmq/%2F/q/{one.reads_as}"
    # Options edited: the same name, so the stored offset is kept.
    edited = RabbitMqTrigger("amqp://broker/%2F/q", prefetch=7).for_watcher(_Asset(), "one")
    assert edited.reader == one.reader
    # Given: kept.
    named = RabbitMqTrigger("amqp://broker/%2F/q", reader_name="mine")
    assert named.for_watcher(_Asset(), "one") is named
    assert RabbitMqTrigger(**one.serialize()[1]).serialize() == one.serialize()
