"""CloudEvents 1.0: an event read from its JSON format (structured mode) or from attributes a
transport carried beside its data (binary mode), checked, and the dedup key its ``source`` and
``id`` make (pure logic).

The spec makes ``source`` + ``id`` unique for each distinct event and lets a consumer take two
events with the same pair for one: :attr:`CloudEvent.dedup_key` is made of that pair alone, so
a producer's retry is one event whichever way it came (a broker, another broker, the REST API).
How each transport carries the attributes (their prefixes, the content type) is the bindings'
part: :mod:`watchers.cloudevents`.
"""

from __future__ import annotations

import base64
import binascii
import dataclasses
import datetime as dt
import hashlib
import json
import re
from collections.abc import Mapping
from typing import Any

import msgspec

SPECVERSION = "1.0"
"""The one version read: a ``specversion`` of another is malformed."""
STRUCTURED_JSON = "application/cloudevents+json"
"""The media type of the JSON event format, which structured mode's content type names."""
CLOUDEVENTS_MEDIA = "application/cloudevents"
"""What every CloudEvents media type starts with (``+json``, ``+avro``, ``-batch+json``)."""
REQUIRED = ("id", "source", "specversion", "type")
"""The attributes every CloudEvent has."""
_OPTIONAL = ("subject", "time", "datacontenttype", "dataschema")
_DATA_MEMBERS = ("data", "data_base64")
"""Members of the JSON format that hold the data, not attributes."""
DEDUP_KEY_PREFIX = "cloudevent:"
DEDUP_KEY_MAX_CHARS = 1000
"""A longer readable key (a very long ``source`` or ``id``) is replaced by a digest of it: the
store's dedup keys hold 1,500 characters."""

ATTRIBUTE_NAME = re.compile(r"[a-z0-9]+")
"""What an attribute's name is made of (the spec: lower-case ASCII letters and digits)."""
#: ASCII digits only: ``\d`` matches any Unicode digit (full-width, Arabic-Indic), which
#: ``int()`` reads, so such a time would pass.
_RFC3339 = re.compile(
    r"([0-9]{4})-([0-9]{2})-([0-9]{2})[Tt]([0-9]{2}):([0-9]{2}):([0-9]{2})(?:\.[0-9]+)?"
    r"(?:[Zz]|([+-])([0-9]{2}):([0-9]{2}))"
)
_JSON = msgspec.json.Decoder()
TOO_DEEP = "is JSON nested too deeply to read (over about 1,000 levels)"
"""Why JSON that msgspec's decoder refuses with a ``RecursionError`` is not read."""
_SHOWN_CHARS = 80


class MalformedCloudEvent(ValueError):
    """A message that is a CloudEvent by its form (its content type, its attributes) but not a
    valid one; ``attribute`` names the attribute at fault (``None``: the event as a whole)."""

    def __init__(self, message: str, attribute: str | None = None) -> None:
        super().__init__(message)
        self.attribute = attribute


@dataclasses.dataclass(frozen=True, slots=True)
class CloudEvent:
    """A valid CloudEvent: its attributes as their canonical text (extensions as given), and
    its ``data`` decoded: JSON when ``datacontenttype`` says JSON (or, in the JSON format,
    says nothing), else text, else ``{"base64": ...}`` of its bytes; ``None`` without data."""

    id: str
    source: str
    type: str
    specversion: str = SPECVERSION
    subject: str | None = None
    time: str | None = None
    datacontenttype: str | None = None
    dataschema: str | None = None
    data: Any = None
    extensions: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """Its extension attributes by name (``traceparent`` and ``tracestate`` of the distributed
    tracing extension among them): text in binary mode, JSON values in structured mode."""

    @property
    def dedup_key(self) -> str:
        """The key of its event: the same for every copy of it, by whatever way it came."""
        return dedup_key(self.source, self.id)

    @property
    def extra(self) -> dict[str, Any]:
        """What an asset event's ``extra["cloudevent"]`` holds of it: ``specversion``, ``id``,
        ``source``, ``type``, ``subject``, ``time``, ``datacontenttype`` and ``dataschema``
        (those two only when given), ``data`` and ``extensions``."""
        extra: dict[str, Any] = {
            "specversion": self.specversion,
            "id": self.id,
            "source": self.source,
            "type": self.type,
            "subject": self.subject,
            "time": self.time,
        }
        if self.datacontenttype is not None:
            extra["datacontenttype"] = self.datacontenttype
        if self.dataschema is not None:
            extra["dataschema"] = self.dataschema
        extra["data"] = self.data
        extra["extensions"] = dict(self.extensions)
        return extra


def dedup_key(source: str, event_id: str) -> str:
    """``cloudevent:["<source>","<id>"]`` (the pair as JSON, ASCII only, so no two pairs give one
    key), or ``cloudevent:sha256:<digest of that>`` when it would be longer than
    :data:`DEDUP_KEY_MAX_CHARS`."""
    pair = json.dumps([source, event_id], separators=(",", ":"))
    if len(DEDUP_KEY_PREFIX) + len(pair) <= DEDUP_KEY_MAX_CHARS:
        return DEDUP_KEY_PREFIX + pair
    return f"{DEDUP_KEY_PREFIX}sha256:{hashlib.sha256(pair.encode()).hexdigest()}"


def media_type(content_type: str | None) -> str | None:
    """The media type of a content type, without its parameters, in lower case."""
    if content_type is None:
        return None
    return content_type.partition(";")[0].strip().lower() or None


def is_json_type(content_type: str | None) -> bool:
    """Whether a content type says JSON: ``*/json`` or ``*/*+json``."""
    media = media_type(content_type)
    if media is None or "/" not in media:
        return False
    subtype = media.partition("/")[2]
    return subtype == "json" or subtype.endswith("+json")


def of_structured(body: bytes | str) -> CloudEvent:
    """The CloudEvent of a message body in the JSON event format."""
    try:
        document = _JSON.decode(body)
    except msgspec.DecodeError as error:
        raise MalformedCloudEvent(f"CloudEvent in JSON format is not JSON: {error}") from None
    except RecursionError:
        raise MalformedCloudEvent(f"CloudEvent in JSON format {TOO_DEEP}") from None
    return of_json(document)


def of_json(document: Any) -> CloudEvent:
    """The CloudEvent of a decoded JSON document in the JSON event format: every member but
    ``data`` and ``data_base64`` an attribute (``null``: not set), those not of the spec
    extensions; a member whose name is no attribute name is not read."""
    if not isinstance(document, dict):
        raise MalformedCloudEvent(
            f"CloudEvent in JSON format must be a JSON object, got {_shown(document)}"
        )
    attributes = {
        name: value
        for name, value in document.items()
        if value is not None and name not in _DATA_MEMBERS and ATTRIBUTE_NAME.fullmatch(name)
    }
    for name, value in attributes.items():
        if name in REQUIRED or name in _OPTIONAL:
            if not isinstance(value, str):
                raise MalformedCloudEvent(
                    f"CloudEvent attribute {name!r} must be a string, got {_shown(value)}", name
                )
        elif not isinstance(value, str | int):  # bool is an int
            raise MalformedCloudEvent(
                f"CloudEvent attribute {name!r} must be a string, an integer or a boolean, "
                f"got {_shown(value)}",
                name,
            )
    content_type = attributes.get("datacontenttype")
    if document.get("data_base64") is not None:
        if "data" in document:
            raise MalformedCloudEvent("CloudEvent has both data and data_base64", "data_base64")
        data = decode_data(_base64(document["data_base64"]), content_type)
    else:
        # Without a datacontenttype the JSON format's data is JSON; with another it is the
        # text the producer encoded. Either way, the member's value as it is.
        data = document.get("data")
    return _checked(attributes, data)


def of_binary(
    attributes: Mapping[str, str], data: bytes | None, content_type: str | None = None
) -> CloudEvent:
    """The CloudEvent of attributes a transport carried as text (canonical strings, names
    without their prefix) and its data: ``content_type`` is the transport's (the
    ``datacontenttype`` attribute when it has none)."""
    attributes = dict(attributes)
    if content_type is not None:
        attributes["datacontenttype"] = content_type
    return _checked(attributes, decode_data(data, attributes.get("datacontenttype")))


def decode_data(raw: bytes | None, content_type: str | None) -> Any:
    """Data bytes as :class:`CloudEvent` keeps them: ``None`` when there are none; JSON when
    ``content_type`` says so (malformed when they are not); else UTF-8 text, unless it holds
    a NUL character (which the store cannot hold), else ``{"base64": ...}``."""
    if not raw:
        return None
    if is_json_type(content_type):
        try:
            return _JSON.decode(raw)
        except msgspec.DecodeError as error:
            raise MalformedCloudEvent(
                f"CloudEvent data is not JSON, though its datacontenttype {content_type!r} "
                f"says so: {error}",
                "data",
            ) from None
        except RecursionError:
            raise MalformedCloudEvent(f"CloudEvent data {TOO_DEEP}", "data") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        pass
    else:
        if "\x00" not in text:
            return text
    return {"base64": base64.b64encode(raw).decode("ascii")}


def extensions_of(extra: Mapping[str, Any]) -> Mapping[str, Any]:
    """The extension attributes of the CloudEvent an asset event's ``extra`` holds (a watcher's
    or the REST API's; empty when it holds none): ``traceparent`` and ``tracestate`` of the
    distributed tracing extension among them."""
    cloudevent = extra.get("cloudevent")
    extensions = cloudevent.get("extensions") if isinstance(cloudevent, Mapping) else None
    return extensions if isinstance(extensions, Mapping) else {}


def same_event(stored: Any, received: Mapping[str, Any]) -> bool:
    """Whether two events' ``extra["cloudevent"]`` are one CloudEvent: the same attributes
    and data. Extensions may differ (an intermediary may set its own ``traceparent``), and so
    may the form of an implied content type."""
    if not isinstance(stored, Mapping):
        return False
    ignored = ("extensions", "datacontenttype")
    return {k: v for k, v in stored.items() if k not in ignored} == {
        k: v for k, v in received.items() if k not in ignored
    }


def _checked(attributes: Mapping[str, Any], data: Any) -> CloudEvent:
    missing = [name for name in REQUIRED if attributes.get(name) is None]
    if len(missing) == 1:
        raise MalformedCloudEvent(f"CloudEvent attribute {missing[0]!r} is missing", missing[0])
    if missing:
        named = ", ".join(repr(name) for name in missing)
        raise MalformedCloudEvent(f"CloudEvent attributes {named} are missing", missing[0])
    for name in REQUIRED:
        if not attributes[name]:
            raise MalformedCloudEvent(f"CloudEvent attribute {name!r} must not be empty", name)
    if attributes["specversion"] != SPECVERSION:
        raise MalformedCloudEvent(
            f"CloudEvent attribute 'specversion' is {_shown(attributes['specversion'])}: "
            f"only CloudEvents {SPECVERSION} is read",
            "specversion",
        )
    for name in ("subject", "dataschema", "datacontenttype"):
        if attributes.get(name) == "":
            raise MalformedCloudEvent(f"CloudEvent attribute {name!r} must not be empty", name)
    time = attributes.get("time")
    if time is not None and not _is_rfc3339(time):
        raise MalformedCloudEvent(
            f"CloudEvent attribute 'time' is not an RFC 3339 timestamp: {_shown(time)}", "time"
        )
    known = {*REQUIRED, *_OPTIONAL}
    return CloudEvent(
        id=attributes["id"],
        source=attributes["source"],
        type=attributes["type"],
        specversion=attributes["specversion"],
        subject=attributes.get("subject"),
        time=time,
        datacontenttype=attributes.get("datacontenttype"),
        dataschema=attributes.get("dataschema"),
        data=data,
        extensions={name: value for name, value in attributes.items() if name not in known},
    )


def _is_rfc3339(text: str) -> bool:
    match = _RFC3339.fullmatch(text)
    if match is None:
        return False
    year, month, day, hour, minute, second, sign, offset_h, offset_m = match.groups()
    if sign is not None and (int(offset_h) > 23 or int(offset_m) > 59):
        return False
    try:
        # RFC 3339 allows a leap second (60), which datetime does not hold.
        dt.datetime(  # noqa: DTZ001 - only the fields are checked, in no time zone
            int(year), int(month), int(day), int(hour), int(minute), min(int(second), 59)
        )
    except ValueError:
        return False
    return int(second) <= 60


def _base64(value: Any) -> bytes:
    if not isinstance(value, str):
        raise MalformedCloudEvent(
            f"CloudEvent data_base64 must be a base64 string, got {_shown(value)}", "data_base64"
        )
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as error:
        raise MalformedCloudEvent(
            f"CloudEvent data_base64 is not base64: {error}", "data_base64"
        ) from None


def _shown(value: Any) -> str:
    shown = repr(value)
    return shown if len(shown) <= _SHOWN_CHARS else shown[: _SHOWN_CHARS - 1] + "…"
