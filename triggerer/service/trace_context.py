"""The trace context a message carries (W3C Trace Context, or AWS X-Ray's header), read from
an event's payload where the providers put its headers and attributes, or from the CloudEvent
its extra holds (pure logic).

Every provider's payload keeps the message's headers or attributes under one of a few keys
(``headers``: Kafka, NATS, RabbitMQ; ``message_attributes`` and ``attributes``: SQS;
``attributes``: Pub/Sub; ``user_properties``: MQTT 5), so :func:`carried` reads them all in
one place, for any trigger whose payload has that shape. A CloudEvent's distributed tracing
extension (its ``traceparent`` and ``tracestate`` attributes, in either mode) is one more
carrier, read by :func:`of_cloudevent` when the transport carried none. A value that is not a
valid ``traceparent`` is ignored (logged at debug): a producer's malformed header is never an
error.
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Iterable, Mapping
from typing import Any

from triggerer.cloudevents import extensions_of

TRACEPARENT = "traceparent"
TRACESTATE = "tracestate"
TRACEPARENT_LENGTH = 55
"""A version-00 ``traceparent``: ``00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>``."""
TRACESTATE_MAX_LENGTH = 512
"""The longest ``tracestate`` kept (W3C: vendors propagate at least 512 characters); a longer
one is dropped, its ``traceparent`` kept."""
TRACESTATE_MAX_MEMBERS = 32

# Where a payload keeps a message's headers or attributes, and the names a traceparent goes by
# there, in the order they are read: the one list of the transports' carriers (a CloudEvent's
# extension is read from the event's extra: of_cloudevent). Pub/Sub's client libraries, with
# their OpenTelemetry option on, send theirs as ``googclient_traceparent``.
_CARRIERS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("headers", (TRACEPARENT,)),
    ("message_attributes", (TRACEPARENT,)),
    ("attributes", (TRACEPARENT, "googclient_traceparent")),
    ("user_properties", (TRACEPARENT,)),
)
XRAY_ATTRIBUTE = "AWSTraceHeader"
"""SQS's system attribute holding an X-Ray trace header, in the payload's ``attributes``."""

_TRACEPARENT = re.compile(r"([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?")
_KEY = r"(?:[a-z][_0-9a-z\-*/]{0,255}|[a-z0-9][_0-9a-z\-*/]{0,240}@[a-z][_0-9a-z\-*/]{0,13})"
_VALUE = r"[\x20-\x2b\x2d-\x3c\x3e-\x7e]{0,255}[\x21-\x2b\x2d-\x3c\x3e-\x7e]"
_MEMBER = re.compile(rf"{_KEY}={_VALUE}")
_XRAY_ROOT = re.compile(r"1-([0-9a-f]{8})-([0-9a-f]{24})")
_XRAY_PARENT = re.compile(r"[0-9a-f]{16}")
_ZERO_TRACE = "0" * 32
_ZERO_SPAN = "0" * 16


@dataclasses.dataclass(frozen=True, slots=True)
class TraceContext:
    """A valid W3C trace context: ``traceparent`` in its version-00 form, and the
    ``tracestate`` that came with it, if any."""

    traceparent: str
    tracestate: str | None = None

    @property
    def trace_id(self) -> str:
        """The 32 hex digits of the trace."""
        return self.traceparent[3:35]

    @property
    def span_id(self) -> str:
        """The 16 hex digits of the span (the parent id)."""
        return self.traceparent[36:52]

    @property
    def sampled(self) -> bool:
        return bool(int(self.traceparent[53:55], 16) & 1)


def carried(payload: Any) -> TraceContext | None:
    """The trace context a message carries, from its event's payload: a ``traceparent`` (and
    ``tracestate``) among the payload's headers, attributes or user properties, else SQS's
    ``AWSTraceHeader`` (X-Ray) converted; of a batch (SQS ``message_batch``), its first
    message's that has one. ``None`` when there is none, or no valid one."""
    if type(payload) is not dict:
        return None
    for key, names in _CARRIERS:
        carrier = payload.get(key)
        if not carrier or type(carrier) is not dict:
            continue
        for name in names:
            value = carrier.get(name)
            if value is not None:
                traceparent = parse_traceparent(value)
                if traceparent is not None:
                    return TraceContext(traceparent, parse_tracestate(carrier.get(TRACESTATE)))
    attributes = payload.get("attributes")
    if attributes and type(attributes) is dict and XRAY_ATTRIBUTE in attributes:
        traceparent = from_xray(attributes[XRAY_ATTRIBUTE])
        if traceparent is not None:
            return TraceContext(traceparent)
    batch = payload.get("message_batch")
    if batch and type(batch) is list:
        for message in batch:
            context = carried(message)
            if context is not None:
                return context
    return None


def of_cloudevent(extra: Mapping[str, Any]) -> TraceContext | None:
    """The trace context of the CloudEvent an event's ``extra`` holds (a watcher's or the REST
    API's, :func:`triggerer.cloudevents.extensions_of`): its distributed tracing extension's
    ``traceparent`` and ``tracestate``. ``None`` when it has none, or no valid one."""
    extensions = extensions_of(extra)
    traceparent = extensions.get(TRACEPARENT)
    if traceparent is None or (valid := parse_traceparent(traceparent)) is None:
        return None
    return TraceContext(valid, parse_tracestate(extensions.get(TRACESTATE)))


def of_http_headers(headers: Iterable[tuple[bytes, bytes]]) -> TraceContext | None:
    """The trace context of an HTTP request's headers (ASGI's: lower-case names, as bytes):
    its one ``traceparent``, with its ``tracestate`` headers joined (W3C: several are one
    list); two ``traceparent`` headers are none."""
    traceparents: list[str] = []
    tracestates: list[str] = []
    for name, value in headers:
        if name == b"traceparent":
            traceparents.append(value.decode("latin-1"))
        elif name == b"tracestate":
            tracestates.append(value.decode("latin-1"))
    if len(traceparents) != 1:
        if traceparents:
            _ignored(TRACEPARENT, traceparents, "more than one traceparent header")
        return None
    valid = parse_traceparent(traceparents[0])
    if valid is None:
        return None
    return TraceContext(valid, parse_tracestate(",".join(tracestates)) if tracestates else None)


def parse_traceparent(value: object) -> str | None:
    """``value`` as a version-00 ``traceparent`` when it is a valid one (W3C Trace Context
    level 1; a later version read by its first four fields, as the spec says), else None."""
    if not isinstance(value, str):
        return _ignored(TRACEPARENT, value, "not text")
    text = value.strip(" \t")
    match = _TRACEPARENT.fullmatch(text)
    if match is None:
        return _ignored(TRACEPARENT, value, "not version-trace_id-parent_id-flags in lowercase hex")
    version, trace_id, span_id, flags, rest = match.groups()
    if version == "ff":
        return _ignored(TRACEPARENT, value, "version ff is invalid")
    if version == "00" and rest is not None:
        return _ignored(TRACEPARENT, value, "version 00 has exactly four fields")
    if trace_id == _ZERO_TRACE or span_id == _ZERO_SPAN:
        return _ignored(TRACEPARENT, value, "an all-zero trace id or parent id is invalid")
    if version == "00":
        return text
    return f"00-{trace_id}-{span_id}-{flags}"


def parse_tracestate(value: object) -> str | None:
    """``value`` when it is a valid ``tracestate`` of at most 512 characters, with the spaces
    around its members and empty members dropped; else None."""
    if value is None:
        return None
    if not isinstance(value, str):
        return _ignored(TRACESTATE, value, "not text")
    if len(value) > TRACESTATE_MAX_LENGTH:
        return _ignored(TRACESTATE, value, f"longer than {TRACESTATE_MAX_LENGTH} characters")
    members = [member.strip(" \t") for member in value.split(",")]
    members = [member for member in members if member]
    if len(members) > TRACESTATE_MAX_MEMBERS:
        return _ignored(TRACESTATE, value, f"more than {TRACESTATE_MAX_MEMBERS} members")
    keys = set()
    for member in members:
        if _MEMBER.fullmatch(member) is None:
            return _ignored(TRACESTATE, value, f"{member!r} is not key=value")
        key = member.partition("=")[0]
        if key in keys:
            return _ignored(TRACESTATE, value, f"key {key!r} repeated")
        keys.add(key)
    return ",".join(members) or None


def from_xray(value: object) -> str | None:
    """An X-Ray trace header (``Root=1-<8 hex>-<24 hex>;Parent=<16 hex>;Sampled=1``) as a
    ``traceparent``: the trace id is the root's two hex parts joined (as OpenTelemetry's X-Ray
    propagator maps them), the parent id is ``Parent``, sampled when ``Sampled=1``. A header
    with no ``Parent`` names no span to link to: None."""
    if not isinstance(value, str):
        return _ignored(XRAY_ATTRIBUTE, value, "not text")
    fields: dict[str, str] = {}
    for part in value.split(";"):
        name, _, field = part.partition("=")
        fields[name.strip()] = field.strip().lower()
    root = _XRAY_ROOT.fullmatch(fields.get("Root", ""))
    parent = fields.get("Parent", "")
    if root is None or _XRAY_PARENT.fullmatch(parent) is None:
        return _ignored(XRAY_ATTRIBUTE, value, "no Root=1-<8 hex>-<24 hex> and Parent=<16 hex>")
    trace_id = root.group(1) + root.group(2)
    if trace_id == _ZERO_TRACE or parent == _ZERO_SPAN:
        return _ignored(XRAY_ATTRIBUTE, value, "an all-zero trace id or parent id is invalid")
    flags = "01" if fields.get("Sampled") == "1" else "00"
    return f"00-{trace_id}-{parent}-{flags}"


def stored(traceparent: str | None, tracestate: str | None) -> TraceContext | None:
    """The trace context of an event as the store holds it (its columns), if any."""
    return None if traceparent is None else TraceContext(traceparent, tracestate)


def _ignored(name: str, value: object, reason: str) -> str | None:
    """None, what an invalid value of ``name`` gives, once it is logged with ``reason``."""
    # Imported here: the store's tables import this module for its lengths, and the CLI's
    # reading verbs, which import the store, do without structlog's import (a tenth of a run).
    import structlog

    structlog.get_logger(__name__).debug(
        "trace_context_ignored", carrier=name, value=repr(value)[:200], reason=reason
    )
    return None
