"""Payload decoding, dotted-path imports and JSON-path filters."""

from __future__ import annotations

from typing import Any

import pytest

from watchers.filters import PayloadFilter, lookup, parse_path
from watchers.payloads import decode_body, import_callable


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, None),
        (b'{"a": 1}', {"a": 1}),
        ('{"a": 1}', {"a": 1}),
        (b"42", 42),
        (b"plain text", "plain text"),
        ("caf\u00e9", "caf\u00e9"),
        ("caf\u00e9".encode(), "caf\u00e9"),
        (b"", ""),
        # Not UTF-8: base64. An SQS body is always valid text, so through SQS this happens
        # only with Binary message attributes (tested against moto in test_sqs.py).
        (b"\xff\xfe\x00", {"base64": "//4A"}),
        (b"\xc3", {"base64": "ww=="}),
        # Only strict JSON decodes, so what decodes can always be stored as JSON.
        (b"123456789012345678901234567890", 123456789012345678901234567890),
        (b"NaN", "NaN"),
        (b"[1e999]", "[1e999]"),
        (b'"\\ud800"', '"\\ud800"'),
        (b'{"a": 1} trailing', '{"a": 1} trailing'),
    ],
)
def test_decode_body(raw: bytes | str | None, expected: Any) -> None:
    assert decode_body(raw) == expected


def test_import_callable() -> None:
    assert import_callable("json.dumps", option="transform")([1]) == "[1]"
    with pytest.raises(ValueError, match="transform='dumps' must be a dotted path"):
        import_callable("dumps", option="transform")
    with pytest.raises(ImportError, match=r"apply_function='no_such_module\.f' cannot be imported"):
        import_callable("no_such_module.f", option="apply_function")
    with pytest.raises(ImportError, match=r"'json\.nope' cannot be imported"):
        import_callable("json.nope", option="transform")
    with pytest.raises(TypeError, match=r"transform='json\.decoder\.NaN' is not callable"):
        import_callable("json.decoder.NaN", option="transform")


PAYLOAD = {"body": {"kind": "order", "items": [{"sku": "a-1"}], "odd key": True}}


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("$", PAYLOAD),
        ("$.body.kind", "order"),
        ("$.body.items[0].sku", "a-1"),
        ('$.body.items[0]["sku"]', "a-1"),
        ('$.body["odd key"]', True),
    ],
)
def test_lookup(path: str, expected: Any) -> None:
    assert lookup(PAYLOAD, path) == expected


def test_filter_matches() -> None:
    assert PayloadFilter("$.body.kind", "order").matches(PAYLOAD)
    assert not PayloadFilter("$.body.kind", "refund").matches(PAYLOAD)
    assert PayloadFilter("$.body.kind", one_of=("refund", "order")).matches(PAYLOAD)
    assert not PayloadFilter("$.body.missing", None).matches(PAYLOAD)  # missing never matches
    assert not PayloadFilter("$.body.items[5]", None).matches(PAYLOAD)
    assert PayloadFilter.from_option({"path": "$.body.kind", "equals": "order"}).matches(PAYLOAD)


@pytest.mark.parametrize(
    ("option", "message"),
    [
        ({"path": "$.a", "colour": 1}, "must be a mapping with 'path'"),
        ({"equals": 1}, "must be a mapping with 'path'"),
        ({"path": "$.a", "equals": 1, "one_of": [1]}, "either 'equals' .* or 'one_of'"),
        ({"path": "$.a", "one_of": "ab"}, "'one_of' \\(a list of values\\)"),
        ({"path": "a.b", "equals": 1}, "JSON path 'a.b' must start with '\\$'"),
    ],
)
def test_filter_errors(option: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        PayloadFilter.from_option(option)


def test_parse_path_names_the_bad_position() -> None:
    with pytest.raises(ValueError, match=r"'\$\.a\.\.b' is malformed at position 3"):
        parse_path("$.a..b")
