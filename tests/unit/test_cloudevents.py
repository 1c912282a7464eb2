"""CloudEvents read from messages: both modes, each transport's binding, each malformed case,
the dedup key that makes a CloudEvent one event whichever way it came (pure logic)."""

from __future__ import annotations

import base64
import datetime as dt
import json
from typing import Any

import pytest

from triggerer.cloudevents import (
    DEDUP_KEY_MAX_CHARS,
    CloudEvent,
    MalformedCloudEvent,
    dedup_key,
    extensions_of,
    is_json_type,
    of_binary,
    of_json,
    of_structured,
    same_event,
)
from triggerer.triggers import TriggerEvent
from watchers import cloudevents
from watchers.cloudevents import AMQP, BODY, HTTP, KAFKA, MQTT, NATS, PUBSUB, Binding
from watchers.processing import Processing
from watchers.schemas.decoding import BodyFormat, Decoded, Undecodable

ATTRIBUTES = {
    "specversion": "1.0",
    "id": "A-1",
    "source": "https://shop.example/orders",
    "type": "com.example.order.created",
}
DOCUMENT = {
    **ATTRIBUTES,
    "subject": "order/7",
    "time": "2026-03-16T09:37:51.5Z",
    "data": {"order": 7},
}
EXTRA = {
    **ATTRIBUTES,
    "subject": "order/7",
    "time": "2026-03-16T09:37:51.5Z",
    "data": {"order": 7},
    "extensions": {},
}


def malformed(attribute: str | None, *fragments: str) -> Any:
    """A check that the error raised names ``attribute`` and says each of ``fragments``."""

    def check(error: MalformedCloudEvent) -> None:
        assert error.attribute == attribute, str(error)
        for fragment in fragments:
            assert fragment in str(error), str(error)

    return check


def with_prefix(prefix: str, attributes: dict[str, Any]) -> list[tuple[str, Any]]:
    return [(prefix + name, value) for name, value in attributes.items()]


# -- structured mode: the JSON event format


def test_a_structured_cloudevent_gives_its_attributes_and_json_data() -> None:
    event = of_structured(json.dumps({**DOCUMENT, "traceparent": "00-ab-cd-01", "n": 5}))
    assert event.extra == {**EXTRA, "extensions": {"traceparent": "00-ab-cd-01", "n": 5}}
    assert event.extensions["traceparent"] == "00-ab-cd-01"
    assert event.dedup_key == 'cloudevent:["https://shop.example/orders","A-1"]'


def test_structured_data_follows_its_content_type() -> None:
    xml = of_json({**ATTRIBUTES, "datacontenttype": "application/xml", "data": "<a/>"})
    assert (xml.data, xml.extra["datacontenttype"]) == ("<a/>", "application/xml")
    raw = base64.b64encode(b'{"order": 7}').decode()
    as_json = of_json({**ATTRIBUTES, "datacontenttype": "application/json", "data_base64": raw})
    assert as_json.data == {"order": 7}
    opaque = of_json({**ATTRIBUTES, "data_base64": base64.b64encode(b"\x00\xff").decode()})
    assert opaque.data == {"base64": "AP8="}
    assert of_json(ATTRIBUTES).data is None
    # null is unset, in attributes and extensions alike
    assert of_json({**ATTRIBUTES, "subject": None, "x": None}).extra["subject"] is None


@pytest.mark.parametrize(
    ("document", "check"),
    [
        ({k: v for k, v in DOCUMENT.items() if k != "id"}, malformed("id", "'id' is missing")),
        ({**DOCUMENT, "source": None}, malformed("source", "'source' is missing")),
        (
            {"data": 1},
            malformed("id", "'id', 'source', 'specversion', 'type' are missing"),
        ),
        ({**DOCUMENT, "type": ""}, malformed("type", "must not be empty")),
        ({**DOCUMENT, "specversion": "0.3"}, malformed("specversion", "'0.3'", "1.0")),
        ({**DOCUMENT, "specversion": 1.0}, malformed("specversion", "must be a string")),
        ({**DOCUMENT, "id": 42}, malformed("id", "must be a string, got 42")),
        ({**DOCUMENT, "time": "2026-03-16 09:37"}, malformed("time", "RFC 3339")),
        ({**DOCUMENT, "time": "2026-02-30T00:00:00Z"}, malformed("time", "RFC 3339")),
        ({**DOCUMENT, "time": "2026-03-16T09:37:51+25:00"}, malformed("time")),
        # Digits of other scripts (full-width, Arabic-Indic) are digits to Python, not to RFC 3339.
        (
            {**DOCUMENT, "time": "\uff12\uff10\uff12\uff16-03-16T09:37:51Z"},
            malformed("time", "RFC 3339"),
        ),
        ({**DOCUMENT, "time": "2026-03-16T09:37:51.\uff15Z"}, malformed("time", "RFC 3339")),
        ({**DOCUMENT, "time": "2026-03-16T09:37:51+0\u0661:00"}, malformed("time", "RFC 3339")),
        ({**DOCUMENT, "subject": ""}, malformed("subject", "must not be empty")),
        ({**DOCUMENT, "colour": {"r": 1}}, malformed("colour", "string, an integer or a boolean")),
        ({**DOCUMENT, "data_base64": "AA=="}, malformed("data_base64", "both")),
        (
            {**ATTRIBUTES, "data_base64": "not base64!"},
            malformed("data_base64", "not base64"),
        ),
        ([DOCUMENT], malformed(None, "must be a JSON object")),
    ],
)
def test_a_malformed_structured_cloudevent_names_its_attribute(document: Any, check: Any) -> None:
    with pytest.raises(MalformedCloudEvent) as raised:
        of_json(document)
    check(raised.value)


def test_a_structured_body_that_is_not_json_is_malformed() -> None:
    with pytest.raises(MalformedCloudEvent, match="not JSON"):
        of_structured(b"{not json")


DEEP = b"[" * 5000 + b"]" * 5000
"""JSON nested deeper than msgspec goes: it raises a RecursionError, not a DecodeError."""


def test_json_nested_too_deep_is_malformed_or_no_cloudevent() -> None:
    deep_event = json.dumps(ATTRIBUTES).encode()[:-1] + b', "data": ' + DEEP + b"}"
    with pytest.raises(MalformedCloudEvent, match="nested too deeply") as raised:
        of_structured(deep_event)
    assert raised.value.attribute is None
    with pytest.raises(MalformedCloudEvent, match="data is JSON nested too deeply") as raised:
        of_binary(ATTRIBUTES, DEEP, "application/json")
    assert raised.value.attribute == "data"
    # A body that only its content could make a CloudEvent is none, as it is no JSON to read
    # (its payload holds it as text).
    assert KAFKA.recognise([], deep_event) is None
    with pytest.raises(MalformedCloudEvent, match="nested too deeply"):
        KAFKA.recognise([("content-type", b"application/cloudevents+json")], deep_event)


@pytest.mark.parametrize(
    "time",
    ["2026-03-16T09:37:51Z", "2026-03-16t09:37:51.123456789z", "1990-12-31T15:59:60-08:00"],
)
def test_rfc3339_times_are_kept_as_given(time: str) -> None:
    assert of_json({**ATTRIBUTES, "time": time}).time == time


# -- binary mode: attributes beside the data


def test_binary_data_is_json_text_or_base64_by_its_content_type() -> None:
    assert of_binary(ATTRIBUTES, b'{"order": 7}', "application/json").data == {"order": 7}
    assert of_binary(ATTRIBUTES, b"[1]", "application/cloudevents-x+json").data == [1]
    # Without a content type no assumption is made: JSON text stays text.
    assert of_binary(ATTRIBUTES, b'{"order": 7}').data == '{"order": 7}'
    assert of_binary(ATTRIBUTES, b"a\x00b", "text/plain").data == {"base64": "YQBi"}
    assert of_binary(ATTRIBUTES, b"\xff", None).data == {"base64": "/w=="}
    assert of_binary(ATTRIBUTES, None, "application/json").data is None
    with pytest.raises(MalformedCloudEvent) as raised:
        of_binary(ATTRIBUTES, b"{oops", "application/json; charset=utf-8")
    malformed("data", "not JSON", "application/json")(raised.value)


def test_a_content_type_says_json_by_its_subtype() -> None:
    assert is_json_type("Application/JSON; charset=utf-8")
    assert is_json_type("application/vnd.api+json")
    assert not is_json_type("text/plain")
    assert not is_json_type(None)


# -- the dedup key


def test_the_dedup_key_is_the_source_and_id_alone() -> None:
    one = of_json(DOCUMENT)
    other_way = of_binary({**ATTRIBUTES, "traceparent": "x"}, b"{}", "application/json")
    assert one.dedup_key == other_way.dedup_key
    # No two pairs give one key, whatever characters they hold.
    assert dedup_key("a,b", "c") != dedup_key("a", "b,c")
    assert dedup_key('a"', "b") != dedup_key("a", '"b')
    assert dedup_key("é", "\x00").isascii()
    long = dedup_key("s" * 2000, "1")
    assert long.startswith("cloudevent:sha256:")
    assert len(long) < DEDUP_KEY_MAX_CHARS
    assert long == dedup_key("s" * 2000, "1") != dedup_key("s" * 2000, "2")


def test_one_cloudevent_by_two_ways_is_the_same_event_but_for_extensions() -> None:
    structured = of_json({**DOCUMENT, "traceparent": "00-a"}).extra
    binary = of_binary(
        {**ATTRIBUTES, "subject": "order/7", "time": "2026-03-16T09:37:51.5Z"},
        b'{"order":7}',
        "application/json",
    ).extra
    assert same_event(structured, binary)
    assert not same_event({**structured, "data": {"order": 8}}, binary)
    assert not same_event(None, binary)


# -- the bindings: which message is a CloudEvent, in which mode


def test_kafka_binary_mode_ce_underscore_headers_and_content_type() -> None:
    headers = [
        *with_prefix("ce_", {k: v.encode() for k, v in DOCUMENT.items() if k != "data"}),
        ("content-type", b"application/json"),
        ("ce_traceparent", b"00-aa-bb-01"),
        ("trace-id", b"not an attribute"),
    ]
    event = KAFKA.recognise(headers, b'{"order": 7}')
    assert event is not None
    assert event.extra == {
        **EXTRA,
        "datacontenttype": "application/json",
        "extensions": {"traceparent": "00-aa-bb-01"},
    }


def test_kafka_structured_mode_by_content_type_or_by_its_body() -> None:
    body = json.dumps(DOCUMENT).encode()
    declared = KAFKA.recognise([("content-type", b"application/cloudevents+json")], body)
    assert declared is not None
    assert declared.extra == EXTRA
    assert KAFKA.recognise([], body) == declared
    assert KAFKA.recognise([("content-type", b"application/json")], body) == declared
    # Another content type says the body is something else; another event format is not read.
    assert KAFKA.recognise([("content-type", b"text/plain")], body) is None
    assert KAFKA.recognise([("content-type", b"application/cloudevents+avro")], body) is None


def test_a_plain_message_is_no_cloudevent() -> None:
    assert KAFKA.recognise([("ce-id", b"1"), ("id", b"2")], b'{"order": 7}') is None
    assert KAFKA.recognise([], b'{"note": "specversion is a word"}') is None
    assert KAFKA.recognise([], b"specversion") is None
    assert KAFKA.recognise([], None) is None
    assert BODY.recognise(body='["specversion"]') is None


@pytest.mark.parametrize(
    ("headers", "body", "check"),
    [
        ([("ce_id", b"1")], b"", malformed("source", "'source', 'specversion', 'type'")),
        (
            with_prefix("ce_", {**ATTRIBUTES, "specversion": "2.0"}),
            b"",
            malformed("specversion", "'2.0'"),
        ),
        (
            with_prefix("ce_", {**ATTRIBUTES, "time": "tomorrow"}),
            b"",
            malformed("time", "'tomorrow'"),
        ),
        (with_prefix("ce_", {**ATTRIBUTES, "id": b"\xff"}), b"", malformed("id", "not UTF-8")),
        (
            [("content-type", b"application/cloudevents+json")],
            b'{"specversion": "1.0"}',
            malformed("id", "missing"),
        ),
        (
            [("content-type", b"application/cloudevents-batch+json")],
            b"[]",
            malformed(None, "batched mode"),
        ),
        ([], b'{"specversion": "1.0", "id": "1"}', malformed("source", "missing")),
    ],
)
def test_a_malformed_kafka_cloudevent_names_its_attribute(
    headers: list[tuple[str, bytes]], body: bytes, check: Any
) -> None:
    with pytest.raises(MalformedCloudEvent) as raised:
        KAFKA.recognise(headers, body)
    check(raised.value)


def test_amqp_application_properties_with_either_separator_and_amqp_types() -> None:
    for prefix in ("cloudEvents:", "cloudEvents_"):
        properties = {
            **dict(with_prefix(prefix, ATTRIBUTES)),
            prefix + "time": dt.datetime(2026, 3, 16, 9, 37, 51),  # noqa: DTZ001 - as AMQP gives it
            prefix + "sequence": 12,
            prefix + "sampled": True,
            "x-delivery-count": 2,
        }
        event = AMQP.recognise(properties.items(), b"hello", "text/plain; charset=utf-8")
        assert event is not None
        assert (event.time, event.data) == ("2026-03-16T09:37:51Z", "hello")
        assert event.extensions == {"sequence": "12", "sampled": "true"}
    with pytest.raises(MalformedCloudEvent) as raised:
        AMQP.recognise([*with_prefix("cloudEvents_", ATTRIBUTES), ("cloudEvents_id", 1.5)])
    malformed("id", "must be text, got float")(raised.value)
    structured = AMQP.recognise([], json.dumps(DOCUMENT).encode(), STRUCTURED)
    assert structured is not None
    assert structured.extra == EXTRA


STRUCTURED = "application/cloudevents+json; charset=UTF-8"


def test_nats_and_http_headers_are_percent_encoded_and_maybe_quoted() -> None:
    headers = {
        "Ce-Specversion": "1.0",
        "ce-id": "Euro%20%E2%82%AC%20%F0%9F%98%80",
        "ce-source": '"/orders/\\"a b\\""',
        "ce-type": "t",
        "ce-datacontenttype": "application/json",
    }
    event = NATS.recognise(headers.items(), b'{"n": 1}')
    assert event is not None
    assert (event.id, event.source, event.data) == ("Euro € 😀", '/orders/"a b"', {"n": 1})
    over_http = HTTP.recognise(
        [(name.lower(), value.encode()) for name, value in headers.items()],
        b'{"n": 1}',
        "application/json",
    )
    assert over_http == event
    with pytest.raises(MalformedCloudEvent) as raised:
        NATS.recognise({**headers, "ce-id": "%C0%A0"}.items(), b"")
    malformed("id", "not UTF-8")(raised.value)
    structured = NATS.recognise([("Content-Type", STRUCTURED)], json.dumps(DOCUMENT))
    assert structured is not None
    assert structured.extra == EXTRA


def test_http_reads_structured_mode_only_by_its_content_type() -> None:
    assert HTTP.recognise([], json.dumps(DOCUMENT).encode(), "application/json") is None
    assert HTTP.claims([], STRUCTURED)
    assert HTTP.claims([("ce-id", b"1")], "application/json")
    assert not HTTP.claims([("ce-traceparent", b"x")], "application/json")


def test_pubsub_attributes_and_the_content_type_attribute() -> None:
    attributes = {**dict(with_prefix("ce-", ATTRIBUTES)), "content-type": "application/json"}
    event = PUBSUB.recognise(attributes.items(), b'{"order": 7}')
    assert event is not None
    assert (event.datacontenttype, event.data) == ("application/json", {"order": 7})
    attributes = {**dict(with_prefix("ce-", ATTRIBUTES)), "ce-datacontenttype": "text/csv"}
    event = PUBSUB.recognise(attributes.items(), b"a,b")
    assert event is not None
    assert (event.datacontenttype, event.data) == ("text/csv", "a,b")


def test_mqtt5_user_properties_are_the_attributes_themselves() -> None:
    properties = [*ATTRIBUTES.items(), ("message-id", "m1"), ("region", "eu")]
    event = MQTT.recognise(properties, b'{"order": 7}', "application/json")
    assert event is not None
    assert (event.data, event.extensions) == ({"order": 7}, {"region": "eu"})
    # Only specversion marks binary mode: an application's own "id" property does not.
    assert MQTT.recognise([("id", "7"), ("source", "s")], b"{}", "application/json") is None


@pytest.mark.parametrize("binding", [BODY, KAFKA, NATS, PUBSUB, MQTT, AMQP])
def test_a_body_alone_is_structured_mode_on_every_binding_but_http(binding: Binding) -> None:
    event = binding.recognise(body=json.dumps(DOCUMENT))
    assert event is not None
    assert event.extra == EXTRA


# -- with a registry's value_format: one step decodes the bytes and finds the CloudEvent

RECORD = {"order": 7, "total": 2.5}
WIRE = b"\x00" + json.dumps(RECORD).encode()
"""A record in the wire format of the registry :func:`registry` fakes: a zero byte, then
JSON."""


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> Processing:
    """A trigger's processing with ``value_format="avro"``, whose registry's records are a zero
    byte and then JSON, of schema 7 (a fake: no registry is asked)."""

    async def decode(self: BodyFormat, raw: bytes | None) -> Decoded:
        if raw is None or not raw.startswith(b"\x00"):
            raise Undecodable("value_format='avro': not the wire format", raw or b"")
        return Decoded(json.loads(raw[1:]), 7)

    monkeypatch.setattr(BodyFormat, "decode", decode)
    return Processing(body_format=BodyFormat("avro", "http://registry.invalid:8081"))


def binary_headers(**attributes: str) -> list[tuple[str, bytes]]:
    return with_prefix("ce_", {k: v.encode() for k, v in {**ATTRIBUTES, **attributes}.items()})


async def test_a_binary_cloudevents_data_is_its_record_decoded(registry: Processing) -> None:
    payload = {"topic": "t", "body": {"base64": "..."}}
    headers = [*binary_headers(), ("content-type", b"application/avro")]
    decoded, cloudevent = await registry.decoded(payload, WIRE, KAFKA, headers)
    assert decoded == {"topic": "t", "body": RECORD, "schema_id": 7}
    assert cloudevent is not None
    assert (cloudevent.data, cloudevent.datacontenttype) == (RECORD, "application/avro")
    assert cloudevent.dedup_key == dedup_key(ATTRIBUTES["source"], ATTRIBUTES["id"])
    assert await registry.read(WIRE, KAFKA, headers) == (Decoded(RECORD, 7), cloudevent)


async def test_a_structured_cloudevent_is_json_whatever_the_value_format(
    registry: Processing,
) -> None:
    body = json.dumps(DOCUMENT).encode()
    payload = {"body": DOCUMENT}
    for headers in ([], [("content-type", b"application/cloudevents+json")]):
        decoded, cloudevent = await registry.decoded(payload, body, KAFKA, headers)
        assert decoded == payload  # no record, so no schema id: the registry is not asked
        assert cloudevent is not None
        assert cloudevent.extra == EXTRA
    value, cloudevent = await registry.read(body, BODY)
    assert (value, cloudevent) == (Decoded(DOCUMENT), of_json(DOCUMENT))


async def test_a_plain_record_is_decoded_and_no_cloudevent(registry: Processing) -> None:
    decoded, cloudevent = await registry.decoded({"body": None}, WIRE, KAFKA, [("k", b"v")])
    assert (decoded, cloudevent) == ({"body": RECORD, "schema_id": 7}, None)


async def test_unreadable_messages_with_a_registry(registry: Processing) -> None:
    # A malformed CloudEvent is found before its data is decoded: no schema is fetched for it.
    source_missing = [(k, v) for k, v in binary_headers() if k != "ce_source"]
    with pytest.raises(MalformedCloudEvent, match="'source' is missing"):
        await registry.decoded({}, b"not the wire format", KAFKA, source_missing)
    # A binary CloudEvent whose data is not a record is as undecodable as any message.
    with pytest.raises(Undecodable, match="not the wire format"):
        await registry.decoded({}, b"text", KAFKA, binary_headers())
    with pytest.raises(MalformedCloudEvent, match="not JSON"):
        await registry.decoded({}, WIRE, KAFKA, [("content-type", b"application/cloudevents+json")])


async def test_json_finds_the_cloudevent_in_the_payload_it_has() -> None:
    plain = Processing()
    payload = {"body": {"order": 7}}
    headers = [*binary_headers(), ("content-type", b"application/json")]
    decoded, cloudevent = await plain.decoded(payload, b'{"order": 7}', KAFKA, headers)
    assert decoded is payload
    assert cloudevent is not None
    assert cloudevent.data == {"order": 7}
    assert await plain.decoded(payload, b'{"order": 7}') == (payload, None)


# -- an event keyed by its CloudEvent


def test_an_event_of_a_cloudevent_is_keyed_by_it_and_carries_it() -> None:
    cloudevent = of_json(DOCUMENT)
    event = TriggerEvent(
        {"value": 1},
        dedup_key="topic/0/5@1",
        partition_key="p",
        sent_at=1.0,
        checkpoint=("kinesis/s/r/shard", "12"),
    )
    keyed = cloudevents.with_cloudevent(event, cloudevent)
    assert keyed.dedup_key == cloudevent.dedup_key
    assert keyed.cloudevent is cloudevent
    assert (keyed.payload, keyed.partition_key, keyed.sent_at, keyed.checkpoint) == (
        {"value": 1},
        "p",
        1.0,
        ("kinesis/s/r/shard", "12"),
    )
    assert cloudevents.with_cloudevent(event, None) is event
    letter = TriggerEvent({}, dedup_key="k", dead_letter="failed")
    assert cloudevents.with_cloudevent(letter, cloudevent) is letter


def test_the_extensions_of_an_events_extra_carry_its_trace_context() -> None:
    cloudevent = of_json({**DOCUMENT, "traceparent": "00-ab-cd-01", "tracestate": "k=v"})
    extra = {"from_trigger": True, "payload": {}, "cloudevent": cloudevent.extra}
    assert extensions_of(extra) == {"traceparent": "00-ab-cd-01", "tracestate": "k=v"}
    assert extensions_of({"from_rest_api": True}) == {}
    assert extensions_of({"cloudevent": "not one"}) == {}


def test_a_cloudevent_is_a_frozen_value() -> None:
    event = of_json(DOCUMENT)
    assert isinstance(event, CloudEvent)
    assert event == of_json(DOCUMENT)
    with pytest.raises(AttributeError):
        event.id = "other"  # type: ignore[misc]  # frozen: the point of the test
