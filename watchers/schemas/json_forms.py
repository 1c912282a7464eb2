"""The JSON form of a decoded Avro record's values, which an event's payload must be.

Avro's own JSON encoding is made for round trips (bytes as ISO-8859-1 text, unions wrapped in a
type name); an event's payload is read by people and pipelines, so the forms here follow
Protobuf's canonical JSON mapping (ProtoJSON) where the two meet, and ISO 8601 for time:

- ``bytes`` and ``fixed``: base64 text (standard alphabet, padded);
- ``float`` and ``double``: numbers; NaN and the infinities as the texts ``"NaN"``,
  ``"Infinity"`` and ``"-Infinity"``;
- ``decimal``: its exact decimal text, never in exponent form (``"1234.50"``);
- ``uuid``: its text; ``date``: ``"2024-05-06"``; ``time-millis``/``time-micros``:
  ``"13:14:15.123000"``; ``timestamp-millis``/``timestamp-micros``: ISO 8601 in UTC ending in
  ``Z`` (``"2024-05-06T13:14:15.123000Z"``); ``local-timestamp-*``: ISO 8601 without a zone;
- ``enum``: its symbol; a union: the value of the branch it holds, untagged; records and maps:
  objects; arrays: lists.

Pure functions, no I/O.
"""

from __future__ import annotations

import base64
import datetime
import decimal
import math
import uuid
from typing import Any

#: The Avro types whose decoded values are not already JSON (besides any logical type).
_CONVERTED_TYPES = frozenset({"bytes", "fixed", "float", "double"})


def needs_conversion(schema: Any) -> bool:
    """Whether records of the Avro ``schema`` (its JSON, parsed) may hold values that are not
    JSON as decoded: ``False`` lets a decoder skip :func:`json_form`. Errs towards ``True``:
    any text in the schema naming such a type (a field's name too) counts."""
    if isinstance(schema, str):
        return schema in _CONVERTED_TYPES
    if isinstance(schema, list):
        return any(needs_conversion(item) for item in schema)
    if isinstance(schema, dict):
        return "logicalType" in schema or any(needs_conversion(v) for v in schema.values())
    return False


def json_form(value: Any) -> Any:
    """``value``, as fastavro decodes a record, in the JSON forms of this module's docstring.
    A value of another type is a ``TypeError`` naming it."""
    kind = type(value)
    if value is None or kind is str or kind is int or kind is bool:
        return value
    if kind is dict:
        return {key: json_form(item) for key, item in value.items()}
    if kind is list:
        return [json_form(item) for item in value]
    if kind is float:
        return json_float(value)
    if isinstance(value, bytes | bytearray | memoryview):
        return base64.b64encode(value).decode("ascii")
    if isinstance(value, decimal.Decimal):
        return format(value, "f")
    if isinstance(value, datetime.datetime):
        return _datetime_text(value)
    if isinstance(value, datetime.date | datetime.time):
        return value.isoformat()
    if isinstance(value, uuid.UUID):
        return str(value)
    raise TypeError(f"a decoded value of type {kind.__name__} has no JSON form: {value!r}")


def json_float(number: float) -> float | str:
    """``number``, or the ProtoJSON text of NaN and the infinities (which JSON cannot hold)."""
    if math.isfinite(number):
        return number
    if math.isnan(number):
        return "NaN"
    return "Infinity" if number > 0 else "-Infinity"


def _datetime_text(moment: datetime.datetime) -> str:
    if moment.tzinfo is None:
        return moment.isoformat()
    return moment.astimezone(datetime.UTC).replace(tzinfo=None).isoformat() + "Z"
