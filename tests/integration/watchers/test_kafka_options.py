"""KafkaTrigger options: serialisation, validation and named connections (no broker needed)."""

from __future__ import annotations

from typing import Any

import pytest

from triggerer import Asset
from triggerer.triggers import load_trigger
from watchers.kafka import KafkaTrigger
from watchers.kafka import trigger as kafka


def test_serialize_round_trips_and_leaves_the_default_group_out() -> None:
    trigger = KafkaTrigger(
        bootstrap_servers="127.0.0.1:9092,127.0.0.1:9093",
        topics=["orders", "customers"],
        filter={"path": "$.value.type", "equals": "order"},
        max_in_flight=10,
    )

    classpath, options = trigger.serialize()

    assert classpath == "watchers.kafka.KafkaTrigger"
    assert options["group_id"] is None
    assert trigger.consumer_group == "triggerer-customers,orders"  # run on its own
    assert "messages" not in options
    assert load_trigger(classpath, options).serialize() == (classpath, options)
    assert KafkaTrigger.shareable


def test_a_watcher_gets_a_group_of_its_own_that_options_do_not_change() -> None:
    orders, refunds = Asset("orders"), Asset("refunds")

    def group(asset: Asset, watcher: str, **options: Any) -> str:
        trigger = KafkaTrigger(bootstrap_servers="b:9092", topics=["sales"], **options)
        bound = trigger.for_watcher(asset, watcher)
        assert isinstance(bound, KafkaTrigger)
        assert load_trigger(*bound.serialize()).serialize() == bound.serialize()
        return bound.consumer_group

    first = group(orders, "sales_topic")
    assert first.startswith("triggerer-sales_topic-")
    assert group(orders, "sales_topic", filter={"path": "$.value.t", "equals": 1}) == first
    assert group(orders, "sales_topic", apply_function="json.dumps", max_attempts=9) == first
    assert group(refunds, "sales_topic") != first
    assert group(orders, "other") != first
    assert group(Asset("orders", "s3://b/orders"), "sales_topic") != first
    assert group(orders, "sales_topic", group_id="mine") == "mine"  # explicit wins


def test_the_exclusive_sources_are_its_topics_in_its_group() -> None:
    trigger = KafkaTrigger(bootstrap_servers="b:9092", topics=["t", "s"], group_id="g")

    assert trigger.exclusive_sources() == (
        "Kafka topic 's' in consumer group 'g' at b:9092",
        "Kafka topic 't' in consumer group 'g' at b:9092",
    )


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"topics": []}, "topics"),
        ({"auto_offset_reset": "oldest"}, "auto_offset_reset='oldest'"),
        ({"max_attempts": 0}, "max_attempts=0"),
        ({"max_in_flight": 0}, "max_in_flight=0"),
        ({"filter": {"equals": 1}}, "filter="),
        ({"partition_key_path": "value.day"}, "'value.day'"),
        ({"group_id": ""}, "group_id must not be empty"),
    ],
)
def test_invalid_options_are_named(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[")):
        KafkaTrigger(bootstrap_servers="127.0.0.1:9092", **{"topics": ["t"], **options})


@pytest.mark.parametrize(
    ("value", "key"), [("day-1", "day-1"), (7, "7"), (1.5, "1.5"), (None, None), (True, None)]
)
def test_the_partition_key_is_lenient_as_it_always_was(value: Any, key: str | None) -> None:
    """Unlike the other providers' (a ValueError, so a dead letter), a Kafka partition key path
    that leads to no text or number gives no key, and a float is its text."""
    trigger = KafkaTrigger(bootstrap_servers="b:9092", topics=["t"], partition_key_path="$.day")

    assert trigger._processing.prepare({"day": value}) == ({"day": value}, key)
    assert trigger._processing.prepare({}) == ({}, None)


def test_connection_settings_become_client_options(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "PLAIN",
        "sasl_plain_username": "user",
        "sasl_plain_password": "secret",
    }
    monkeypatch.setattr(kafka, "get_connection", {"prod": settings}.__getitem__)
    trigger = KafkaTrigger(bootstrap_servers="127.0.0.1:9092", topics=["t"], connection="prod")

    assert kafka.security_options(trigger.connection) == settings
    assert "secret" not in repr(trigger)


def test_unknown_connection_setting_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kafka, "get_connection", lambda name: {"sasl_password": "x"})
    trigger = KafkaTrigger(bootstrap_servers="127.0.0.1:9092", topics=["t"], connection="prod")

    with pytest.raises(ValueError, match=r"connection 'prod'.*sasl_password"):
        trigger.consumer_settings()
