"""mqtt:// URIs and MqttTrigger's options: what is accepted and how a bad one is named."""

from __future__ import annotations

import re
from typing import Any

import pytest

from triggerer.triggers import UnusableTrigger
from watchers import MessageQueueTrigger, MqttTrigger
from watchers.mqtt.address import MqttAddress, parse_mqtt_uri


@pytest.mark.parametrize(
    ("uri", "address"),
    [
        ("mqtt://broker/sensors/t", MqttAddress("broker", 1883, "sensors/t", tls=False)),
        ("mqtt://broker:1884/a", MqttAddress("broker", 1884, "a", tls=False)),
        ("MQTT://broker/a/+/c", MqttAddress("broker", 1883, "a/+/c", tls=False)),
        ("mqtt://broker/sensors/%23", MqttAddress("broker", 1883, "sensors/#", tls=False)),
        ("mqtt://broker/%23", MqttAddress("broker", 1883, "#", tls=False)),
        ("mqtt://broker/+", MqttAddress("broker", 1883, "+", tls=False)),
        ("mqtts://broker/a", MqttAddress("broker", 8883, "a", tls=True)),
        ("mqtt://[::1]:1883/a", MqttAddress("::1", 1883, "a", tls=False)),
        ("mqtt://broker/a%20b", MqttAddress("broker", 1883, "a b", tls=False)),
        ("mqtt://broker//leading", MqttAddress("broker", 1883, "/leading", tls=False)),
    ],
)
def test_uri_forms(uri: str, address: MqttAddress) -> None:
    assert parse_mqtt_uri(uri) == address


@pytest.mark.parametrize(
    ("uri", "message"),
    [
        ("mqtt://broker/sensors/#", "write the topic wildcard '#' as %23"),
        ("mqtt://broker/#", "write the topic wildcard '#' as %23"),
        ("mqtt://user:secret@broker/a", "connection='NAME'"),
        ("mqtt://user@broker/a", "holds credentials"),
        ("mqtt://broker/a?qos=1", "must not have a query"),
        ("mqtt://broker:port/a", "port that is not a number"),
        ("mqtt://broker", "mqtt://HOST[:1883]/TOPIC"),
        ("mqtt://broker/", "mqtt://HOST[:1883]/TOPIC"),
        ("mqtt:///topic", "mqtt://HOST[:1883]/TOPIC"),
        ("mqtt://broker/a/%23/b", "only as its whole last level"),
        ("mqtt://broker/a%23", "only as its whole last level"),
        ("mqtt://broker/a+/b", "only as a whole level"),
        ("mqtt://broker/a%00b", "not a valid MQTT topic"),
        ("amqp://broker/a", "mqtt://HOST[:1883]/TOPIC"),
    ],
)
def test_bad_uris_name_the_value_and_the_form(uri: str, message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)) as raised:
        parse_mqtt_uri(uri)
    assert repr(re.sub(r"//[^/]*@", "//***@", uri)) in str(raised.value)  # credentials masked
    assert "secret" not in str(raised.value)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"session_expiry_s": 0}, "session_expiry_s=0 must be an integer from 1"),
        ({"session_expiry_s": 2**32}, "session_expiry_s=4294967296"),
        ({"max_deliveries": 0}, "max_deliveries=0"),
        ({"max_in_flight": 70_000}, "max_in_flight=70000 must be an integer from 1 to 65535"),
        ({"keepalive_s": True}, "keepalive_s=True"),
        ({"client_id": ""}, "client_id=''"),
        ({"dedup_property": ""}, "dedup_property=''"),
        ({"filter": {"path": "value"}}, "filter="),
        ({"partition_key_path": "body"}, "JSON path 'body' must start with '$'"),
        ({"apply_function": "nodots"}, "apply_function='nodots' must be a dotted path"),
    ],
)
def test_bad_options_name_the_value(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        MqttTrigger(uri="mqtt://broker/a", **options)


def test_message_queue_trigger_picks_mqtt() -> None:
    trigger = MessageQueueTrigger(queue="mqtt://broker:1884/a/%23", max_deliveries=2)
    assert isinstance(trigger, MqttTrigger)
    assert trigger.serialize() == (
        "watchers.mqtt.MqttTrigger",
        {
            "uri": "mqtt://broker:1884/a/%23",
            "client_id": None,
            "session_expiry_s": 86_400,
            "dedup_property": "message-id",
            "apply_function": None,
            "filter": None,
            "partition_key_path": None,
            "max_deliveries": 2,
            "max_in_flight": 1_000,
            "keepalive_s": 60,
            "connection": None,
        },
    )
    assert trigger.lag is None
    assert not trigger.shareable  # one session per client id: it runs on one instance
    assert isinstance(MessageQueueTrigger(queue="mqtts://broker/a"), MqttTrigger)


def test_a_bad_uri_is_an_unusable_trigger_naming_it() -> None:
    trigger = MessageQueueTrigger(queue="mqtt://broker/sensors/#")
    assert isinstance(trigger, UnusableTrigger)
    assert "'mqtt://broker/sensors/#'" in trigger.error
    assert "%23" in trigger.error


def test_the_default_client_id_is_stable_per_broker_and_topic() -> None:
    one = MqttTrigger(uri="mqtt://broker/a")
    assert one.session_client_id == MqttTrigger(uri="mqtt://broker:1883/a").session_client_id
    assert one.session_client_id != MqttTrigger(uri="mqtt://broker/b").session_client_id
    assert MqttTrigger(uri="mqtt://broker/a", client_id="mine").reads_as == "mine"
