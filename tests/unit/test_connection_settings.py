"""A named connection with a setting its provider does not know is one error naming the setting,
the provider and the valid settings, the same for every provider (watchers.clients)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pytest

from watchers.kafka import trigger as kafka
from watchers.mqtt import trigger as mqtt
from watchers.mqtt.address import parse_mqtt_uri
from watchers.nats import client as nats_client
from watchers.redis import address as redis_address

READERS: list[tuple[Any, Callable[[str], object], str, str]] = [
    (kafka, kafka.security_options, "KafkaTrigger", "sasl_mechanism"),
    (
        mqtt,
        lambda name: mqtt._connection_settings(name, parse_mqtt_uri("mqtt://b/t")),
        "MQTT",
        "username",
    ),
    (nats_client, nats_client.connect_options, "the NATS provider", "token"),
    (redis_address, redis_address.connection_options, "the Redis provider", "password"),
]


@pytest.mark.parametrize(("module", "read", "reader", "valid"), READERS)
def test_an_unknown_setting_is_named_with_the_valid_ones(
    monkeypatch: pytest.MonkeyPatch,
    module: Any,
    read: Callable[[str], object],
    reader: str,
    valid: str,
) -> None:
    monkeypatch.setattr(module, "get_connection", lambda name: {"colour": "red"})

    with pytest.raises(ValueError, match="valid: ") as raised:
        read("prod")

    message = str(raised.value)
    assert message.startswith(f"connection 'prod' has settings {reader} does not know: colour;")
    assert valid in message.partition("valid: ")[2]
