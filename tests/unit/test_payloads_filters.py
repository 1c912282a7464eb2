"""Payload decoding, dotted-path callables and the JSON-path payload filter."""

from __future__ import annotations

import base64
import re
from typing import Any

import pytest

from watchers.filters import PayloadFilter, lookup, parse_path
from watchers.payloads import decode_body, import_callable

# --- decode_body ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (b'{"a": [1, 2]}', {"a": [1, 2]}),
        ('{"a": 1}', {"a": 1}),
        (b"42", 42),
        (b'"quoted"', "quoted"),
        (b"null", None),
        (b"hello world", "hello world"),
        ("caf\u00e9", "caf\u00e9"),
        ("caf\u00e9".encode(), "caf\u00e9"),
        (b"", ""),
        (None, None),
    ],
)
def test_decode_body_json_then_text(raw: bytes | str | None, expected: Any) -> None:
    assert decode_body(raw) == expected


def test_decode_body_non_utf8_is_base64() -> None:
    raw = b"\xff\xfe\x00binary"
    assert decode_body(raw) == {"base64": base64.b64encode(raw).decode("ascii")}


@pytest.mark.parametrize("raw", [b"NaN", b"Infinity", b'{"v": -Infinity}'])
def test_decode_body_non_json_constants_stay_text(raw: bytes) -> None:
    assert decode_body(raw) == raw.decode()


@pytest.mark.parametrize("raw", [b"[" * 5000 + b"]" * 5000, "[" * 5000 + "]" * 5000])
def test_decode_body_json_nested_too_deep_stays_text(raw: bytes | str) -> None:
    """msgspec refuses it with a RecursionError, not a DecodeError."""
    assert decode_body(raw) == "[" * 5000 + "]" * 5000


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        # JSON that would hold a NUL character stays the text it is, which jsonb can store.
        (b'{"name": "a\\u0000b"}', '{"name": "a\\u0000b"}'),
        ('["\\u0000"]', '["\\u0000"]'),
        # Text that holds one is kept as its bytes.
        (b"a\x00b", {"base64": base64.b64encode(b"a\x00b").decode()}),
        ("a\x00b", {"base64": base64.b64encode(b"a\x00b").decode()}),
    ],
)
def test_decode_body_keeps_a_nul_character_out_of_the_payload(
    raw: bytes | str, expected: Any
) -> None:
    assert decode_body(raw) == expected


# --- import_callable ------------------------------------------------------------------------


def test_import_callable_returns_the_function() -> None:
    assert import_callable("base64.b64encode", option="transform") is base64.b64encode


def test_import_callable_without_a_dot_is_a_value_error() -> None:
    with pytest.raises(ValueError, match=r"transform='b64encode'.*dotted path"):
        import_callable("b64encode", option="transform")


@pytest.mark.parametrize("path", ["no_such_module_xyz.fn", "base64.no_such_function"])
def test_import_callable_unimportable_names_option_and_path(path: str) -> None:
    with pytest.raises(ImportError, match=f"apply_function={path!r}"):
        import_callable(path, option="apply_function")


def test_import_callable_not_callable_is_a_type_error() -> None:
    with pytest.raises(TypeError, match=r"transform='string.digits'.*not callable"):
        import_callable("string.digits", option="transform")


# --- paths ----------------------------------------------------------------------------------

PAYLOAD = {
    "value": {"type": "order", "items": [{"sku": "A1"}, {"sku": "B2"}], "x y": 5},
    "key": None,
    "flag": False,
}


@pytest.mark.parametrize(
    ("path", "steps"),
    [
        ("$", ()),
        ("$.a.b", ("a", "b")),
        ("$[0]", (0,)),
        ('$["x y"]', ("x y",)),
        ('$.body.items[0]["sku"]', ("body", "items", 0, "sku")),
        ("$.with-dash", ("with-dash",)),
    ],
)
def test_parse_path(path: str, steps: tuple[str | int, ...]) -> None:
    assert parse_path(path) == steps


@pytest.mark.parametrize(
    ("path", "expected"),
    [
        ("$", PAYLOAD),
        ("$.value.type", "order"),
        ("$.value.items[1].sku", "B2"),
        ('$.value.items[0]["sku"]', "A1"),
        ('$.value["x y"]', 5),
        ("$.key", None),
    ],
)
def test_lookup(path: str, expected: Any) -> None:
    assert lookup(PAYLOAD, path) == expected


@pytest.mark.parametrize("path", ["value.type", "$.", "$..a", "$[x]", "$['a']", "$.a b", "$[-1]"])
def test_malformed_path_names_it(path: str) -> None:
    with pytest.raises(ValueError, match=re.escape(repr(path))):
        parse_path(path)


def test_filter_rejects_a_malformed_path() -> None:
    with pytest.raises(ValueError, match="'nope'"):
        PayloadFilter("nope", equals=1)


# --- matching -------------------------------------------------------------------------------


def test_equals() -> None:
    assert PayloadFilter("$.value.type", equals="order").matches(PAYLOAD)
    assert not PayloadFilter("$.value.type", equals="refund").matches(PAYLOAD)


def test_one_of() -> None:
    assert PayloadFilter("$.value.type", one_of=("refund", "order")).matches(PAYLOAD)
    assert not PayloadFilter("$.value.type", one_of=("refund",)).matches(PAYLOAD)


def test_equals_a_structure() -> None:
    assert PayloadFilter("$.value.items[0]", equals={"sku": "A1"}).matches(PAYLOAD)


def test_equals_null_matches_a_null_value() -> None:
    assert PayloadFilter("$.key", equals=None).matches(PAYLOAD)


@pytest.mark.parametrize(
    "path", ["$.missing", "$.value.items[5]", "$.value.type.deeper", "$[0]", "$.key.x"]
)
def test_missing_path_never_matches(path: str) -> None:
    assert not PayloadFilter(path, equals=None).matches(PAYLOAD)
    assert not PayloadFilter(path, one_of=(None, "order")).matches(PAYLOAD)


def test_index_on_a_dict_and_field_on_a_list_are_missing() -> None:
    assert not PayloadFilter("$.value[0]", equals=None).matches(PAYLOAD)
    assert not PayloadFilter("$.value.items.sku", equals=None).matches(PAYLOAD)


def test_false_is_not_zero() -> None:
    assert not PayloadFilter("$.flag", equals=0).matches(PAYLOAD)


def test_equals_and_one_of_together_is_an_error() -> None:
    with pytest.raises(ValueError, match="either 'equals' or 'one_of'"):
        PayloadFilter("$.a", equals=1, one_of=(2,))


# --- from_option ----------------------------------------------------------------------------


def test_from_option_equals() -> None:
    assert PayloadFilter.from_option({"path": "$.a", "equals": 1}) == PayloadFilter("$.a", 1)


def test_from_option_one_of_becomes_a_tuple() -> None:
    built = PayloadFilter.from_option({"path": "$.a", "one_of": ["x", "y"]})
    assert built.one_of == ("x", "y")
    assert built.matches({"a": "y"})


@pytest.mark.parametrize(
    "option",
    [{"equals": 1}, {"path": "$.a", "equal": 1}, {"path": "$.a", "equals": 1, "other": 2}],
)
def test_from_option_rejects_bad_keys(option: dict[str, Any]) -> None:
    with pytest.raises(ValueError, match="must be a mapping with 'path'"):
        PayloadFilter.from_option(option)


def test_from_option_rejects_a_malformed_path() -> None:
    with pytest.raises(ValueError, match=r"'a\.b'"):
        PayloadFilter.from_option({"path": "a.b", "equals": 1})


def test_from_option_needs_equals_or_one_of() -> None:
    with pytest.raises(ValueError, match="equals"):
        PayloadFilter.from_option({"path": "$.a"})


def test_from_option_one_of_must_be_a_list() -> None:
    with pytest.raises((TypeError, ValueError), match="one_of"):
        PayloadFilter.from_option({"path": "$.a", "one_of": "paid"})
