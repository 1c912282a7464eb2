"""CloudEvents as each transport carries them (the protocol bindings): which message is one, in
which mode, and the event it makes; the one place every provider (and the REST API) reads them.

A message is a CloudEvent when:

- its content type (the transport's: a Kafka or NATS ``content-type`` header, AMQP's and MQTT
  5's content type property, a Pub/Sub ``content-type`` attribute) is
  ``application/cloudevents+json``: structured mode, the body in the JSON event format. Another
  event format (``application/cloudevents+avro``) is not read, and the message stays a plain
  one; a batch (``application/cloudevents-batch+json``) is malformed;
- else, one of the required attributes is among its headers under the binding's prefix
  (``ce_id``, ``cloudEvents:source``, ``ce-type`` ...; MQTT, whose user properties have no
  prefix: a ``specversion`` one): binary mode, the body the event's data, the transport's
  content type its ``datacontenttype``;
- else, when its content type is none or JSON: a body that is a JSON object with a
  ``specversion`` member, structured mode without a content type to say so (the only way on
  the transports that have none, and a common one on those that have).

A message that is one by its form but not a valid one is malformed
(:class:`~triggerer.cloudevents.MalformedCloudEvent`): its provider makes it a dead letter, the
REST API a 422. See docs/cloudevents.md.
"""

from __future__ import annotations

import dataclasses
import datetime as dt
import re
import urllib.parse
from collections.abc import Iterable
from typing import Any

import msgspec

from triggerer.cloudevents import (
    ATTRIBUTE_NAME,
    CLOUDEVENTS_MEDIA,
    REQUIRED,
    STRUCTURED_JSON,
    CloudEvent,
    MalformedCloudEvent,
    is_json_type,
    media_type,
    of_binary,
    of_json,
    of_structured,
)
from triggerer.triggers import TriggerEvent

Headers = Iterable[tuple[str, Any]]
"""A message's headers (attributes, properties) as ``(name, value)`` pairs."""

_JSON = msgspec.json.Decoder()
_BATCH = CLOUDEVENTS_MEDIA + "-batch"
_ESCAPED = re.compile(r"\\(.)")
_KEPT = ("ack", "partition_key", "sent_at", "checkpoint", "fence")
"""What the event of a CloudEvent keeps of its message's event."""


@dataclasses.dataclass(frozen=True)
class Binding:
    """How one transport carries a CloudEvent in binary mode, and whether a body alone may be
    one in structured mode."""

    transport: str
    prefixes: tuple[str, ...] = ()
    """What a header's name starts with when it is an attribute (in lower case: names are
    matched in lower case)."""
    content_type_header: str | None = None
    """The header holding the content type, when the transport keeps it among the headers."""
    percent_encoded: bool = False
    """Values are percent-encoded, maybe double-quoted (HTTP and NATS headers)."""
    markers: frozenset[str] = frozenset(REQUIRED)
    """The attributes whose presence makes a message a CloudEvent in binary mode."""
    structured_by_body: bool = True
    """A JSON body with ``specversion`` is a CloudEvent without a content type to say so."""

    def recognise(
        self,
        headers: Headers = (),
        body: bytes | str | None = None,
        content_type: str | None = None,
    ) -> CloudEvent | None:
        """The CloudEvent a message is, ``None`` when it is none; ``content_type`` is the
        transport's when it keeps it apart from the headers. Raises
        :class:`~triggerer.cloudevents.MalformedCloudEvent` naming what is wrong."""
        found = self.found(headers, body, content_type)
        if isinstance(found, BinaryMode):
            return found.event(body.encode() if isinstance(body, str) else body)
        return found

    def found(
        self,
        headers: Headers = (),
        body: bytes | str | None = None,
        content_type: str | None = None,
    ) -> CloudEvent | BinaryMode | None:
        """What :meth:`recognise` finds before it reads a binary-mode event's data: the
        CloudEvent a message is in structured mode, its attributes in binary mode, or ``None``
        (for a trigger that decodes the data itself: a registry's record)."""
        attributes: dict[str, Any] = {}
        if headers and (self.prefixes or self.content_type_header):
            found_type = self._read(headers, attributes)
            if content_type is None:
                content_type = found_type
        if content_type is None and not attributes:  # most messages: their body alone
            return _of_body(body) if self.structured_by_body else None
        media = media_type(content_type)
        if media is not None and media.startswith(CLOUDEVENTS_MEDIA):
            if media == STRUCTURED_JSON:
                return of_structured(body or b"")
            if media.startswith(_BATCH):
                raise MalformedCloudEvent(
                    f"CloudEvents in batched mode ({content_type!r}) are not read: send one "
                    "CloudEvent a message"
                )
            return None  # an event format not read: the message as it is
        if not self.markers.isdisjoint(attributes):
            return BinaryMode(
                {name: self._text(name, value) for name, value in attributes.items()},
                content_type,
            )
        if self.structured_by_body and (media is None or is_json_type(media)):
            return _of_body(body)
        return None

    def claims(self, headers: Headers, content_type: str | None) -> bool:
        """Whether a message with these headers and content type is a CloudEvent by its form
        (valid or not), its body aside: structured or binary mode."""
        media = media_type(content_type)
        if media is not None and media.startswith(CLOUDEVENTS_MEDIA):
            return True
        attributes: dict[str, Any] = {}
        self._read(headers, attributes)
        return not self.markers.isdisjoint(attributes)

    def _read(self, headers: Headers, attributes: dict[str, Any]) -> str | None:
        """Put the attributes among ``headers`` into ``attributes`` (by name, values as
        given); the content type among them, if the transport keeps it there."""
        content_type = None
        for name, value in headers:
            lowered = name.lower()
            if lowered == self.content_type_header:
                content_type = self._canonical("datacontenttype", value)
                continue
            for prefix in self.prefixes:
                if lowered.startswith(prefix):
                    attribute = lowered[len(prefix) :]
                    if ATTRIBUTE_NAME.fullmatch(attribute):
                        attributes[attribute] = value
                    break
        return content_type

    def _text(self, name: str, value: Any) -> str:
        """A header's value as an attribute's canonical text."""
        text = self._canonical(name, value)
        return _unescaped(name, text) if self.percent_encoded else text

    def _canonical(self, name: str, value: Any) -> str:
        """A header's value as text: UTF-8 bytes decoded, AMQP's own types (a boolean, an
        integer, a timestamp) in their canonical form."""
        if isinstance(value, str):
            return value
        if isinstance(value, bytes | bytearray | memoryview):
            try:
                return bytes(value).decode("utf-8")
            except UnicodeDecodeError:
                raise MalformedCloudEvent(
                    f"CloudEvent attribute {name!r} in {self.transport} is not UTF-8 text", name
                ) from None
        if isinstance(value, bool):  # before int, as a bool is one
            return "true" if value else "false"
        if isinstance(value, int):
            return str(value)
        if isinstance(value, dt.datetime):
            return _rfc3339(value)
        raise MalformedCloudEvent(
            f"CloudEvent attribute {name!r} in {self.transport} must be text, got "
            f"{type(value).__name__}",
            name,
        )


@dataclasses.dataclass(frozen=True, slots=True)
class BinaryMode:
    """A message that is a CloudEvent in binary mode, its data not read yet: its attributes as
    text (names without their prefix) and the transport's content type."""

    attributes: dict[str, str]
    content_type: str | None

    def event(self, data: bytes | None) -> CloudEvent:
        """The CloudEvent of these attributes and the data's bytes, decoded as the content type
        says (:func:`~triggerer.cloudevents.decode_data`); checked."""
        return of_binary(self.attributes, data, self.content_type)


KAFKA = Binding("Kafka", prefixes=("ce_",), content_type_header="content-type")
"""Kafka headers ``ce_<attribute>``, UTF-8; the ``content-type`` header."""
AMQP = Binding("AMQP", prefixes=("cloudevents:", "cloudevents_"))
"""AMQP application properties (RabbitMQ's headers) ``cloudEvents:<attribute>`` or
``cloudEvents_<attribute>``, as text or AMQP's own types; the content type property."""
NATS = Binding("NATS", prefixes=("ce-",), content_type_header="content-type", percent_encoded=True)
"""NATS headers ``ce-<attribute>``, percent-encoded; ``Content-Type`` says structured mode only
(in binary mode ``ce-datacontenttype`` is the data's)."""
HTTP = Binding("HTTP", prefixes=("ce-",), percent_encoded=True, structured_by_body=False)
"""HTTP headers ``ce-<attribute>``, percent-encoded; the ``Content-Type`` header. Structured
mode only with ``application/cloudevents+json``."""
PUBSUB = Binding("Pub/Sub", prefixes=("ce-",), content_type_header="content-type")
"""Pub/Sub attributes ``ce-<attribute>`` (Google's binding); the ``content-type`` attribute."""
MQTT = Binding("MQTT", prefixes=("",), markers=frozenset({"specversion"}))
"""MQTT 5 user properties named as the attributes, no prefix (so ``specversion`` marks binary
mode); the Content Type property."""
BODY = Binding("a body")
"""Transports without headers (Kinesis, Redis) or no binding (SQS): structured mode only."""


def with_cloudevent(event: TriggerEvent, cloudevent: CloudEvent | None) -> TriggerEvent:
    """``event``, the event of a message, once the message is known to be ``cloudevent``:
    keyed by the CloudEvent's ``source`` and ``id``, and carrying it into the asset event's
    extra. A dead letter keeps its message's key."""
    if cloudevent is None or event.dead_letter is not None:
        return event
    kept = {name: getattr(event, name) for name in _KEPT}
    return TriggerEvent.of_decoded_json(
        event.payload, dedup_key=cloudevent.dedup_key, cloudevent=cloudevent, **kept
    )


def _of_body(body: bytes | str | None) -> CloudEvent | None:
    """The CloudEvent a body is by its content alone: a JSON object with ``specversion``."""
    if not body or (
        "specversion" not in body if isinstance(body, str) else b"specversion" not in body
    ):
        return None
    try:
        document = _JSON.decode(body)
    # RecursionError: JSON nested deeper than the decoder goes (about 1,000 levels), which
    # decode_body keeps as text too.
    except (msgspec.DecodeError, RecursionError):
        return None  # text that names it: not a CloudEvent
    if not isinstance(document, dict) or "specversion" not in document:
        return None
    return of_json(document)


def _unescaped(name: str, value: str) -> str:
    """A header's value: unquoted when double-quoted, then percent-decoded (the HTTP and NATS
    bindings)."""
    value = value.strip(" \t")
    if len(value) >= 2 and value[0] == value[-1] == '"':
        value = _ESCAPED.sub(r"\1", value[1:-1])
    if "%" not in value:
        return value
    try:
        return urllib.parse.unquote_to_bytes(value).decode("utf-8")
    except UnicodeDecodeError:
        raise MalformedCloudEvent(
            f"CloudEvent attribute {name!r}: its percent-encoded value is not UTF-8", name
        ) from None


def _rfc3339(value: dt.datetime) -> str:
    if value.tzinfo is None:
        value = value.replace(tzinfo=dt.UTC)  # AMQP timestamps are UTC
    return value.astimezone(dt.UTC).isoformat().replace("+00:00", "Z")
