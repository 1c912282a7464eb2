"""KafkaTrigger options: serialisation, validation and named connections (no broker needed)."""

from __future__ import annotations

from typing import Any

import pytest

from triggerer.triggers import load_trigger
from watchers import kafka
from watchers.kafka import KafkaTrigger


def test_serialize_round_trips_with_the_derived_group_id() -> None:
    trigger = KafkaTrigger(
        bootstrap_servers="127.0.0.1:9092,127.0.0.1:9093",
        topics=["orders", "customers"],
        filter={"path": "$.value.type", "equals": "order"},
        max_in_flight=10,
    )

    classpath, options = trigger.serialize()

    assert classpath == "watchers.kafka.KafkaTrigger"
    assert options["group_id"] == "triggerer-customers,orders"
    assert "messages" not in options
    assert load_trigger(classpath, options).serialize() == (classpath, options)
    explicit = KafkaTrigger(
        bootstrap_servers="127.0.0.1:9092,127.0.0.1:9093",
        topics=["orders", "customers"],
        group_id="triggerer-customers,orders",
        filter={"path": "$.value.type", "equals": "order"},
        max_in_flight=10,
    )
    assert explicit.serialize() == trigger.serialize()
    assert KafkaTrigger.shareable


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"topics": []}, "topics"),
        ({"auto_offset_reset": "oldest"}, "auto_offset_reset='oldest'"),
        ({"max_attempts": 0}, "max_attempts=0"),
        ({"max_in_flight": 0}, "max_in_flight=0"),
        ({"filter": {"equals": 1}}, "filter="),
        ({"partition_key_path": "value.day"}, "'value.day'"),
    ],
)
def test_invalid_options_are_named(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("[", r"\[")):
        KafkaTrigger(bootstrap_servers="127.0.0.1:9092", **{"topics": ["t"], **options})


def test_connection_settings_become_client_options(monkeypatch: pytest.MonkeyPatch) -> None:
    settings = {
        "security_protocol": "SASL_PLAINTEXT",
        "sasl_mechanism": "PLAIN",
        "sasl_plain_username": "user",
        "sasl_plain_password": "secret",
    }
    monkeypatch.setattr(kafka, "get_connection", {"prod": settings}.__getitem__)
    trigger = KafkaTrigger(bootstrap_servers="127.0.0.1:9092", topics=["t"], connection="prod")

    assert trigger._security_options() == settings
    assert "secret" not in repr(trigger)


def test_unknown_connection_setting_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kafka, "get_connection", lambda name: {"sasl_password": "x"})
    trigger = KafkaTrigger(bootstrap_servers="127.0.0.1:9092", topics=["t"], connection="prod")

    with pytest.raises(ValueError, match=r"connection 'prod'.*sasl_password"):
        trigger._security_options()
