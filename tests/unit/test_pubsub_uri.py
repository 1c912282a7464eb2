"""Pub/Sub URIs and options: what PubSubTrigger takes, and the errors naming what it does not."""

from __future__ import annotations

import calendar
import re
from typing import Any

import pytest
from google.pubsub_v1.types import PubsubMessage

from watchers import MessageQueueTrigger, PubSubTrigger
from watchers.pubsub import parse_pubsub_uri
from watchers.pubsub.puller import dedup_key


def test_a_uri_names_the_project_and_the_subscription() -> None:
    assert parse_pubsub_uri("pubsub://my-project/orders.v1") == ("my-project", "orders.v1")
    assert parse_pubsub_uri("pubsub://example.com:my-project/orders") == (
        "example.com:my-project",
        "orders",
    )
    trigger = MessageQueueTrigger("pubsub://my-project/orders")
    assert isinstance(trigger, PubSubTrigger)
    assert trigger.subscription_path == "projects/my-project/subscriptions/orders"
    assert trigger.reads_as == "projects/my-project/subscriptions/orders"
    assert trigger.serialize() == (
        "watchers.pubsub.PubSubTrigger",
        {
            "subscription": "pubsub://my-project/orders",
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
    )


@pytest.mark.parametrize(
    ("uri", "named"),
    [
        ("pubsub://my-project", "pubsub://PROJECT/SUBSCRIPTION"),
        ("pubsub://my-project/", "pubsub://PROJECT/SUBSCRIPTION"),
        ("pubsub:///orders", "pubsub://PROJECT/SUBSCRIPTION"),
        ("pubsub://my-project/a/b", "pubsub://PROJECT/SUBSCRIPTION"),
        ("pubsub://My_Project/orders", "project 'My_Project'"),
        ("pubsub://my-project/1orders", "subscription '1orders'"),
        ("pubsub://my-project/goog-orders", "subscription 'goog-orders'"),
        ("pubsub://my-project/orders?emulator_host=x:1", "keyword arguments"),
        ("pubsub://user:secret@my-project/orders", "connection='NAME'"),
    ],
)
def test_a_bad_uri_is_a_value_error_naming_it(uri: str, named: str) -> None:
    with pytest.raises(ValueError, match="Pub/Sub URI") as raised:
        PubSubTrigger(uri)
    assert re.sub(r"//[^/]*@", "//***@", uri) in str(raised.value)  # credentials masked
    assert "secret" not in str(raised.value)
    assert named in str(raised.value)


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"max_messages": 0}, "max_messages=0"),
        ({"max_messages": 1001}, "max_messages=1001"),
        ({"pullers": 0}, "pullers=0"),
        ({"max_deliveries": True}, "max_deliveries=True"),
        ({"ack_deadline_s": 5}, "ack_deadline_s=5"),
        ({"emulator_host": "localhost"}, "emulator_host='localhost'"),
        ({"connection": ""}, "connection=''"),
        ({"filter": {"path": "value"}}, "filter="),
        ({"partition_key_path": "body"}, "'body'"),
        ({"apply_function": "nodots"}, "apply_function='nodots'"),
    ],
)
def test_a_bad_option_is_an_error_naming_it(options: dict[str, Any], named: str) -> None:
    with pytest.raises((ValueError, ImportError)) as raised:
        PubSubTrigger("pubsub://my-project/orders", **options)
    assert named in str(raised.value)


def test_a_redelivery_is_the_same_message_though_its_attempt_counts_up() -> None:
    trigger = PubSubTrigger("pubsub://my-project/orders")
    stored = {"message_id": "1", "body": {"a": 1}, "delivery_attempt": 1}
    assert trigger.same_message(stored, {**stored, "delivery_attempt": 2})
    assert not trigger.same_message(stored, {**stored, "body": {"a": 2}})


def _message(message_id: str, seconds: int, nanos: int) -> Any:
    return PubsubMessage.pb()(
        message_id=message_id, publish_time={"seconds": seconds, "nanos": nanos}
    )


def test_the_dedup_key_names_the_message_and_its_publish_time() -> None:
    published = calendar.timegm((2026, 1, 2, 3, 4, 5))
    key = dedup_key("orders", _message("7", published, 678_000_001))
    assert key == "orders/7@2026-01-02T03:04:05.678000001Z"
    # All nine digits, always: one text for one instant.
    assert dedup_key("orders", _message("7", published, 0)) == (
        "orders/7@2026-01-02T03:04:05.000000000Z"
    )
    # The emulator restarted numbers its messages from 1 again: the publish time tells them apart.
    later = _message("7", published + 60, 678_000_001)
    assert dedup_key("orders", later) != key
