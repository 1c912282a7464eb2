"""``mqtt://`` URIs: the broker and topic filter an ``MqttTrigger`` reads (no I/O)."""

from __future__ import annotations

import dataclasses
import urllib.parse

from watchers.uris import masked_uri, split_uri

DEFAULT_PORT = 1883
DEFAULT_TLS_PORT = 8883
_FORM = "mqtt://HOST[:1883]/TOPIC or mqtts://HOST[:8883]/TOPIC"


@dataclasses.dataclass(frozen=True)
class MqttAddress:
    """Where an ``mqtt://`` URI points: a broker and a topic filter."""

    host: str
    port: int
    topic: str
    tls: bool


def parse_mqtt_uri(uri: str) -> MqttAddress:
    """The broker and topic filter of ``mqtt://HOST[:PORT]/TOPIC`` (``mqtts://`` for TLS).

    The topic is percent-decoded: ``%23`` is the multi-level wildcard ``#``, which a URI cannot
    hold as it is (it begins the URI's fragment); ``+`` stands as it is.
    """
    if not isinstance(uri, str):
        raise ValueError(f"MQTT URI {uri!r} must be text of the form {_FORM}")
    if "#" in uri:
        raise ValueError(
            f"MQTT URI {masked_uri(uri)!r} holds '#', which begins a URI's fragment and cuts the "
            "topic short: write the topic wildcard '#' as %23, e.g. mqtt://HOST/sensors/%23"
        )
    parts, _ = split_uri(uri, kind="MQTT", form=_FORM, schemes=("mqtt", "mqtts"))
    scheme = parts.scheme.lower()
    try:
        port = parts.port
    except ValueError:
        raise ValueError(f"MQTT URI {uri!r} has a port that is not a number: {_FORM}") from None
    host = parts.hostname
    topic = urllib.parse.unquote(parts.path[1:])
    if not host or not topic:
        raise ValueError(f"MQTT URI {uri!r} must have the form {_FORM}")
    check_topic_filter(topic, uri)
    tls = scheme == "mqtts"
    return MqttAddress(host, port or (DEFAULT_TLS_PORT if tls else DEFAULT_PORT), topic, tls)


def check_topic_filter(topic: str, uri: str) -> None:
    """A ``ValueError`` naming ``uri`` unless ``topic`` is a valid MQTT topic filter."""
    levels = topic.split("/")
    for number, level in enumerate(levels):
        if "#" in level and (level != "#" or number != len(levels) - 1):
            raise ValueError(
                f"MQTT URI {uri!r}: topic {topic!r} may hold '#' (%23) only as its whole last "
                "level, e.g. sensors/%23"
            )
        if "+" in level and level != "+":
            raise ValueError(
                f"MQTT URI {uri!r}: topic {topic!r} may hold '+' only as a whole level, "
                "e.g. sensors/+/temperature"
            )
    if "\x00" in topic or len(topic.encode()) > 65_535:
        raise ValueError(f"MQTT URI {uri!r}: topic {topic!r} is not a valid MQTT topic")
