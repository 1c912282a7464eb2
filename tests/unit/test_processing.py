"""watchers.processing: a queue trigger's filter, apply_function and partition key, and the
check of its integer options."""

from __future__ import annotations

import re
from typing import Any

import pytest

from watchers.filters import PayloadFilter
from watchers.processing import Processing, check_range


def shout(payload: dict[str, Any]) -> dict[str, Any] | None:
    """Drops "quiet", upper-cases the rest."""
    if payload["body"] == "quiet":
        return None
    return {**payload, "body": payload["body"].upper()}


def not_json(payload: Any) -> Any:
    return {"body": {1, 2}}


def fails(payload: Any) -> Any:
    raise RuntimeError("bad message")


async def asynchronous(payload: Any) -> Any:
    return payload


NOT_CALLABLE = 3


def processing(**options: Any) -> Processing:
    return Processing.of_options(
        filter=options.pop("filter", None),
        apply_function=options.pop("apply_function", None),
        partition_key_path=options.pop("partition_key_path", None),
        **options,
    )


def test_nothing_set_keeps_the_payload_as_it_is() -> None:
    payload = {"body": "x"}
    prepared = processing().prepare(payload)
    assert prepared == (payload, None)
    assert prepared is not None
    assert prepared[0] is payload  # not copied


def test_the_filter_drops_what_does_not_match() -> None:
    steps = processing(filter={"path": "$.body.kind", "one_of": ["a", "b"]})
    assert steps.filter == PayloadFilter("$.body.kind", one_of=("a", "b"))
    assert steps.prepare({"body": {"kind": "c"}}) is None
    assert steps.prepare({"body": "text"}) is None
    assert steps.prepare({"body": {"kind": "b"}}) == ({"body": {"kind": "b"}}, None)


def test_the_function_replaces_or_drops_the_payload_after_the_filter() -> None:
    steps = processing(
        filter={"path": "$.keep", "equals": True}, apply_function=f"{__name__}.shout"
    )
    assert steps.prepare({"keep": True, "body": "hi"}) == ({"keep": True, "body": "HI"}, None)
    assert steps.prepare({"keep": True, "body": "quiet"}) is None
    assert steps.prepare({"keep": False, "body": "quiet"}) is None  # filtered before the call


def test_the_partition_key_comes_from_the_final_payload() -> None:
    steps = processing(apply_function=f"{__name__}.shout", partition_key_path="$.body")
    assert steps.prepare({"body": "eu"}) == ({"body": "EU"}, "EU")
    by_number = processing(partition_key_path="$.region")
    assert by_number.prepare({"region": 7}) == ({"region": 7}, "7")


@pytest.mark.parametrize("value", [True, 1.5, None, {"a": 1}, ["eu"]])
def test_a_partition_key_that_is_not_text_or_integer_fails_the_message(value: Any) -> None:
    steps = processing(partition_key_path="$.region")
    with pytest.raises(ValueError, match=r"partition_key_path '\$\.region' does not lead to"):
        steps.prepare({"region": value})
    with pytest.raises(ValueError, match="does not lead to"):
        steps.prepare({})  # missing


def test_what_the_function_raises_or_returns_not_json_fails_the_message() -> None:
    with pytest.raises(RuntimeError, match="bad message"):
        processing(apply_function=f"{__name__}.fails").prepare({"body": 1})
    with pytest.raises(TypeError, match="apply_function result must be JSON"):
        processing(apply_function=f"{__name__}.not_json").prepare({"body": 1})
    with pytest.raises(TypeError, match="transform result must be JSON"):
        processing(apply_function=f"{__name__}.not_json", option="transform").prepare({})


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"filter": {"path": "value"}}, "filter="),
        ({"filter": {"path": "$.a", "equals": 1, "one_of": [1]}}, "filter="),
        ({"partition_key_path": "region"}, "JSON path 'region' must start with '$'"),
        ({"apply_function": "nodots"}, "apply_function='nodots' must be a dotted path"),
        ({"apply_function": ".leading"}, "apply_function='.leading' must be a dotted path"),
        ({"apply_function": 7}, "apply_function=7 must be a dotted path"),
        (
            {"apply_function": "nodots", "option": "transform"},
            "transform='nodots' must be a dotted path",
        ),
    ],
)
def test_a_bad_option_is_an_error_naming_it(options: dict[str, Any], message: str) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        processing(**options)


def test_the_function_is_imported_at_first_use_not_when_made() -> None:
    steps = processing(apply_function="no_such_module_here.function")  # no error yet
    with pytest.raises(ImportError, match=r"apply_function='no_such_module_here\.function'"):
        steps.load()
    with pytest.raises(ImportError):
        steps.prepare({"body": 1})  # a trigger calls load() first: this would fail the message
    with pytest.raises(TypeError, match="is not callable"):
        processing(apply_function=f"{__name__}.NOT_CALLABLE").load()
    with pytest.raises(ValueError, match="must be a plain function, not async"):
        processing(apply_function=f"{__name__}.asynchronous").load()
    loaded = processing(apply_function=f"{__name__}.shout")
    loaded.load()
    loaded.load()  # once imported, kept
    assert loaded.prepare({"body": "a"}) == ({"body": "A"}, None)


def test_processing_compares_by_its_options() -> None:
    assert processing(partition_key_path="$.a") == processing(partition_key_path="$.a")
    assert processing(partition_key_path="$.a") != processing(partition_key_path="$.b")


@pytest.mark.parametrize(
    ("value", "low", "high", "message"),
    [
        (0, 1, 10, "pullers=0 must be an integer from 1 to 10"),
        (11, 1, 10, "pullers=11 must be an integer from 1 to 10"),
        (True, 0, 10, "pullers=True must be an integer from 0 to 10"),
        ("3", 1, 10, "pullers='3' must be an integer from 1 to 10"),
        (2.0, 1, 10, "pullers=2.0 must be an integer"),
        (0, 1, None, "pullers=0 must be an integer >= 1"),
    ],
)
def test_check_range_names_the_option_and_its_bounds(
    value: object, low: int, high: int | None, message: str
) -> None:
    with pytest.raises(ValueError, match=re.escape(message)):
        check_range("pullers", value, low, high)


@pytest.mark.parametrize(("value", "high"), [(1, 10), (10, 10), (10**12, None)])
def test_check_range_takes_the_bounds_themselves(value: int, high: int | None) -> None:
    check_range("pullers", value, 1, high)
