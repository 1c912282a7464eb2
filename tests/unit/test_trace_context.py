"""The trace context a message carries, as :mod:`triggerer.service.trace_context` reads it from
the payloads the providers build: W3C ``traceparent`` and ``tracestate`` checked as the spec
says, X-Ray's header converted, anything invalid ignored (logged at debug), never an error."""

from __future__ import annotations

from typing import Any

import aiomqtt
import pytest
from aiokafka.structs import ConsumerRecord
from google.pubsub_v1.types import PubsubMessage, ReceivedMessage
from paho.mqtt.packettypes import PacketTypes
from paho.mqtt.properties import Properties
from structlog.testing import capture_logs

from triggerer.cloudevents import of_json
from triggerer.service.trace_context import (
    TraceContext,
    carried,
    from_xray,
    of_cloudevent,
    of_http_headers,
    parse_traceparent,
    parse_tracestate,
)
from watchers.cloudevents import KAFKA
from watchers.kafka import KafkaTrigger
from watchers.mqtt.trigger import message_payload as mqtt_payload
from watchers.nats.trigger import message_payload as nats_payload
from watchers.pubsub.puller import message_payload as pubsub_payload
from watchers.redis.streams import entry_payload
from watchers.schemas.decoding import Decoded
from watchers.sqs import message_payload as sqs_payload

TRACE = "0af7651916cd43dd8448eb211c80319c"
SPAN = "b7ad6b7169203331"
PARENT = f"00-{TRACE}-{SPAN}-01"
OTHER = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-00"
STATE = "rojo=00f067aa0ba902b7,congo=t61rcWkgMzE"
XRAY = "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=1"
XRAY_PARENT = "00-5759e988bd862e3fe1be46a994272793-53995c3f42cd8ad8-01"


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (PARENT, PARENT),
        (OTHER, OTHER),  # not sampled: still a context to link to
        (f"  {PARENT}\t", PARENT),  # optional whitespace around a header value
        # A later version is read by its first four fields, and kept as version 00.
        (f"01-{TRACE}-{SPAN}-01", PARENT),
        (f"cc-{TRACE}-{SPAN}-01-what-comes-later", PARENT),
        (f"00-{TRACE}-{SPAN}-01-more", None),  # version 00 has four fields exactly
        (f"ff-{TRACE}-{SPAN}-01", None),  # version ff is forbidden
        (f"00-{TRACE.upper()}-{SPAN}-01", None),  # lowercase hex only
        (f"00-{'0' * 32}-{SPAN}-01", None),
        (f"00-{TRACE}-{'0' * 16}-01", None),
        (f"00-{TRACE[:-1]}-{SPAN}-01", None),
        (f"00-{TRACE}-{SPAN}-1", None),
        (f"00_{TRACE}_{SPAN}_01", None),
        ("", None),
        (42, None),
        ({"base64": "AAAA"}, None),  # a header that was not text
        (None, None),
    ],
)
def test_traceparent(value: object, expected: str | None) -> None:
    assert parse_traceparent(value) == expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (STATE, STATE),
        (" rojo=00f067aa0ba902b7 ,, congo=t61rcWkgMzE ", STATE),  # spaces and empty members go
        ("tenant@vendor=x", "tenant@vendor=x"),
        ("", None),
        (None, None),
        ("Rojo=1", None),  # keys are lowercase
        ("rojo", None),
        ("rojo=1,rojo=2", None),  # a key once
        ("rojo=a b,", "rojo=a b"),  # a space inside a value, not at its end
        ("rojo=a=b", None),
        (",".join(f"k{n}=v" for n in range(33)), None),  # 32 members at most
        ("k=" + "v" * 255, "k=" + "v" * 255),
        ("a=" + "v" * 255 + ",b=" + "v" * 255, None),  # over 512 characters: dropped
        (7, None),
    ],
)
def test_tracestate(value: object, expected: str | None) -> None:
    assert parse_tracestate(value) == expected


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        (XRAY, XRAY_PARENT),
        (
            "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=0",
            XRAY_PARENT[:-2] + "00",
        ),
        # Sampling left to the receiver ("?"), or not said: not sampled.
        (
            "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8;Sampled=?",
            XRAY_PARENT[:-2] + "00",
        ),
        (
            "Root=1-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8",
            XRAY_PARENT[:-2] + "00",
        ),
        # Fields in any order, spaces, other fields (Lineage), upper-case hex.
        (
            " Sampled=1 ; Lineage=a87bd80c:1|68fd508a:5 ; Parent=53995C3F42CD8AD8 ;"
            " Root=1-5759E988-BD862E3FE1BE46A994272793",
            XRAY_PARENT,
        ),
        ("Root=1-5759e988-bd862e3fe1be46a994272793;Sampled=1", None),  # no span to link to
        ("Root=2-5759e988-bd862e3fe1be46a994272793;Parent=53995c3f42cd8ad8", None),
        ("Root=1-5759e988-bd862e3f;Parent=53995c3f42cd8ad8", None),
        ("Root=1-00000000-000000000000000000000000;Parent=53995c3f42cd8ad8", None),
        ("Root=1-5759e988-bd862e3fe1be46a994272793;Parent=0000000000000000", None),
        ("garbage", None),
        (None, None),
    ],
)
def test_xray_header(header: object, expected: str | None) -> None:
    assert from_xray(header) == expected


def kafka_payload(headers: list[tuple[str, bytes]]) -> Any:
    """The payload a KafkaTrigger makes of a record with ``headers``."""
    record = ConsumerRecord("orders", 0, 5, 1_764_000_000_000, 0, None, b"{}", None, 0, 2, headers)
    trigger = KafkaTrigger(bootstrap_servers="kafka:9092", topics=["orders"])
    return trigger._payload(record, Decoded(None), Decoded({}))


def sqs_message(attributes: dict[str, str], system: dict[str, str] | None = None) -> Any:
    return sqs_payload(
        {
            "MessageId": "m-1",
            "Body": "{}",
            "Attributes": system or {},
            "MessageAttributes": {
                name: {"DataType": "String", "StringValue": value}
                for name, value in attributes.items()
            },
        }
    )


def pubsub_message(attributes: dict[str, str]) -> Any:
    message = PubsubMessage(data=b"{}", message_id="1", attributes=attributes)
    return pubsub_payload(ReceivedMessage.pb(ReceivedMessage(ack_id="a", message=message)))


def mqtt_message(properties: list[tuple[str, str]]) -> Any:
    publish = Properties(PacketTypes.PUBLISH)  # type: ignore[no-untyped-call]  # paho: no annotations
    publish.UserProperty = properties
    return mqtt_payload(aiomqtt.Message("t", b"{}", 1, False, 1, publish))[0]


@pytest.mark.parametrize(
    ("payload", "expected"),
    [
        # Kafka headers (bytes, decoded as the payload decodes them).
        (
            kafka_payload([("traceparent", PARENT.encode()), ("tracestate", STATE.encode())]),
            TraceContext(PARENT, STATE),
        ),
        (kafka_payload([]), None),
        # NATS headers, and AMQP's (RabbitMQ's payload keeps them under "headers" too).
        (nats_payload("S", "a.b", 7, None, b"{}", {"traceparent": PARENT}), TraceContext(PARENT)),
        ({"body": {}, "headers": {"traceparent": PARENT, "x-other": 1}}, TraceContext(PARENT)),
        # SQS: a message attribute, else X-Ray's system attribute converted; the W3C one wins.
        (sqs_message({"traceparent": PARENT, "tracestate": STATE}), TraceContext(PARENT, STATE)),
        (sqs_message({}, {"AWSTraceHeader": XRAY}), TraceContext(XRAY_PARENT)),
        (sqs_message({"traceparent": PARENT}, {"AWSTraceHeader": XRAY}), TraceContext(PARENT)),
        # An invalid traceparent: the next carrier is read.
        (sqs_message({"traceparent": "nope"}, {"AWSTraceHeader": XRAY}), TraceContext(XRAY_PARENT)),
        (sqs_message({"traceparent": "nope"}), None),
        # An SQS batch: its first message's that carries one.
        (
            {"message_batch": [sqs_message({}), sqs_message({"traceparent": OTHER})]},
            TraceContext(OTHER),
        ),
        # Pub/Sub attributes, as producers set them or as Google's client libraries do.
        (pubsub_message({"traceparent": PARENT}), TraceContext(PARENT)),
        (pubsub_message({"googclient_traceparent": PARENT}), TraceContext(PARENT)),
        # MQTT 5 user properties.
        (
            mqtt_message([("traceparent", PARENT), ("tracestate", STATE)]),
            TraceContext(PARENT, STATE),
        ),
        # Redis stream entries have no convention for one: a field is not read as a carrier.
        (
            entry_payload("s", "1-0", {b"body": b"{}", b"traceparent": PARENT.encode()}, "body"),
            None,
        ),
        # A valid traceparent with an invalid tracestate: the traceparent alone.
        ({"headers": {"traceparent": PARENT, "tracestate": "Bad State"}}, TraceContext(PARENT)),
        # Shapes that hold no carrier: an apply_function's result, a custom trigger's payload.
        ({"headers": "traceparent"}, None),
        ({"headers": [["traceparent", PARENT]]}, None),
        ([{"headers": {"traceparent": PARENT}}], None),
        ("text", None),
        (None, None),
    ],
)
def test_carried(payload: Any, expected: TraceContext | None) -> None:
    assert carried(payload) == expected


def cloudevent_extra(**extensions: Any) -> dict[str, Any]:
    """A watcher's event's extra of a CloudEvent in structured mode with ``extensions``."""
    document = {"specversion": "1.0", "id": "1", "source": "/orders", "type": "t", **extensions}
    return {"from_trigger": True, "payload": {}, "cloudevent": of_json(document).extra}


def kafka_binary_extra(headers: list[tuple[str, bytes]]) -> dict[str, Any]:
    """A watcher's event's extra of a CloudEvent in Kafka's binary mode with ``headers`` too."""
    attributes = [
        ("ce_specversion", b"1.0"),
        ("ce_id", b"1"),
        ("ce_source", b"/"),
        ("ce_type", b"t"),
    ]
    cloudevent = KAFKA.recognise([*attributes, *headers], b"{}")
    assert cloudevent is not None
    return {"from_trigger": True, "payload": {}, "cloudevent": cloudevent.extra}


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        # The distributed tracing extension, in structured mode or in binary mode.
        (cloudevent_extra(traceparent=PARENT, tracestate=STATE), TraceContext(PARENT, STATE)),
        (
            kafka_binary_extra([("ce_traceparent", PARENT.encode()), ("traceparent", b"x")]),
            TraceContext(PARENT),
        ),
        # Checked as any carrier's: invalid, ignored; an invalid tracestate alone, dropped.
        (cloudevent_extra(traceparent=f"00-{TRACE}-{SPAN}"), None),
        (cloudevent_extra(traceparent=1), None),
        (cloudevent_extra(traceparent=PARENT, tracestate="Bad State"), TraceContext(PARENT)),
        # No extension, or no CloudEvent (a plain REST post's extra).
        (cloudevent_extra(partitionkey="p"), None),
        ({"from_rest_api": True, "order": 7}, None),
    ],
)
def test_a_cloudevents_tracing_extension(extra: Any, expected: TraceContext | None) -> None:
    assert of_cloudevent(extra) == expected


def test_a_trace_context_names_its_trace_and_span() -> None:
    context = TraceContext(PARENT)
    assert (context.trace_id, context.span_id, context.sampled) == (TRACE, SPAN, True)
    assert not TraceContext(OTHER).sampled


@pytest.mark.parametrize(
    ("headers", "expected"),
    [
        ([(b"traceparent", PARENT.encode())], TraceContext(PARENT)),
        (
            [
                (b"tracestate", b"rojo=1"),
                (b"traceparent", PARENT.encode()),
                (b"tracestate", b"congo=2"),
            ],
            TraceContext(PARENT, "rojo=1,congo=2"),  # several tracestate headers are one list
        ),
        ([(b"content-type", b"application/json")], None),
        ([(b"traceparent", PARENT.encode()), (b"traceparent", OTHER.encode())], None),
        ([(b"traceparent", b"00-bad")], None),
        ([(b"traceparent", PARENT.encode()), (b"tracestate", b"=")], TraceContext(PARENT)),
    ],
)
def test_http_headers(headers: list[tuple[bytes, bytes]], expected: TraceContext | None) -> None:
    assert of_http_headers(headers) == expected


def test_an_invalid_value_is_logged_at_debug_and_ignored() -> None:
    with capture_logs() as logs:
        assert carried({"headers": {"traceparent": "00-nope"}}) is None
    assert logs == [
        {
            "event": "trace_context_ignored",
            "log_level": "debug",
            "carrier": "traceparent",
            "value": "'00-nope'",
            "reason": "not version-trace_id-parent_id-flags in lowercase hex",
        }
    ]
