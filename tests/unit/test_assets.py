"""Assets, aliases, watchers and the conditions built with ``&`` and ``|``."""

from __future__ import annotations

import re
from collections.abc import AsyncIterator
from datetime import timedelta

import pytest

from triggerer import (
    Asset,
    AssetAlias,
    AssetAll,
    AssetAny,
    AssetWatcher,
    BaseEventTrigger,
    TriggerEvent,
)
from triggerer.service.reads.explain import condition_from_tree
from triggerer.uri import AssetUriWarning, InvalidAssetName, InvalidAssetUri


class _NoopTrigger(BaseEventTrigger):
    def serialize(self) -> tuple[str, dict[str, object]]:
        return self.classpath(), {}

    async def run(self) -> AsyncIterator[TriggerEvent]:
        yield TriggerEvent({})


a, b, c, d = Asset("a"), Asset("b"), Asset("c"), Asset("d")


# --- construction and identity -------------------------------------------------------------


def test_first_positional_argument_is_the_name() -> None:
    asset = Asset("orders", "s3://bucket/orders")
    assert (asset.name, asset.uri) == ("orders", "s3://bucket/orders")


def test_name_only_makes_the_uri_equal_to_the_name() -> None:
    asset = Asset("orders")
    assert asset.uri == "orders"


def test_uri_only_makes_the_name_equal_to_the_uri() -> None:
    asset = Asset(uri="s3://bucket/orders")
    assert asset.name == "s3://bucket/orders"


def test_uri_only_assets_with_equivalent_uris_are_equal() -> None:
    assert Asset(uri="s3://b") == Asset(uri="s3://b/")


def test_a_folder_is_one_asset_with_or_without_its_trailing_slash() -> None:
    """Was: ``file:///123/456/`` kept its slash, so it and ``file:///123/456`` were two."""
    assert Asset("file:///123/456/").uri == "file:///123/456"
    assert Asset(uri="file:///123/456/") == Asset(uri="file:///123/456")


def test_uri_only_asset_keeps_no_password_in_its_name() -> None:
    with pytest.warns(AssetUriWarning):
        asset = Asset(uri="postgres://user:hunter2@db.example/app/public/orders")
    assert "hunter2" not in asset.name


def test_neither_name_nor_uri_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="name or a uri"):
        Asset()


def test_identity_is_name_and_uri() -> None:
    assert Asset("x", "s3://b/x") == Asset("x", "s3://b/x")
    assert Asset("x", "s3://b/x") != Asset("y", "s3://b/x")
    assert Asset("x", "s3://b/x") != Asset("x", "s3://b/y")


def test_extra_does_not_affect_equality_or_hash() -> None:
    one, two = Asset("x", extra={"owner": "a"}), Asset("x", extra={"owner": "b"})
    assert one == two
    assert hash(one) == hash(two)
    assert len({one, two}) == 1


def test_asset_is_not_equal_to_an_alias_of_the_same_name() -> None:
    assert Asset("x") != AssetAlias("x")


def test_uri_is_normalised() -> None:
    assert Asset("x", "S3://bucket/key/").uri == "s3://bucket/key"


def test_extra_must_be_json_serialisable() -> None:
    with pytest.raises(TypeError, match="JSON"):
        Asset("x", extra={"when": object()})


def test_bad_uri_error_from_uri_module_surfaces() -> None:
    with pytest.raises(InvalidAssetUri, match="reserved"):
        Asset("x", "triggerer://y")


def test_bad_name_error_from_uri_module_surfaces() -> None:
    with pytest.raises(InvalidAssetName, match="reserved"):
        Asset("self")


def test_non_ascii_name_is_rejected() -> None:
    with pytest.raises(InvalidAssetName):
        Asset("caf\u00e9")


def test_watchers_are_kept_as_a_tuple() -> None:
    watcher = AssetWatcher("w", _NoopTrigger())
    assert Asset("x", watchers=[watcher]).watchers == (watcher,)


def test_watchers_must_be_asset_watchers() -> None:
    with pytest.raises(TypeError, match="_NoopTrigger"):
        Asset("x", watchers=[_NoopTrigger()])  # type: ignore[list-item]


def test_asset_watcher_rejects_a_non_trigger() -> None:
    with pytest.raises(TypeError, match=r"BaseEventTrigger.*str"):
        AssetWatcher("w", "sqs://queue")  # type: ignore[arg-type]


def test_alias_identity_is_its_name() -> None:
    assert AssetAlias("x") == AssetAlias("x")
    assert hash(AssetAlias("x")) == hash(AssetAlias("x"))
    assert AssetAlias("x") != AssetAlias("y")


# --- expressions ----------------------------------------------------------------------------


def test_and_builds_asset_all() -> None:
    expr = a & b
    assert isinstance(expr, AssetAll)
    assert expr.objects == (a, b)


def test_or_builds_asset_any() -> None:
    expr = a | b
    assert isinstance(expr, AssetAny)
    assert expr.objects == (a, b)


def test_objects_is_a_tuple() -> None:
    assert isinstance((a | b).objects, tuple)
    assert isinstance(AssetAll(a, b).objects, tuple)


def test_chained_or_is_one_asset_any_of_three() -> None:
    expr = a | b | c
    assert isinstance(expr, AssetAny)
    assert expr.objects == (a, b, c)


def test_nested_and_is_flattened_on_both_sides() -> None:
    assert ((a & b) & c).objects == (a, b, c)
    assert (a & (b & c)).objects == (a, b, c)
    assert AssetAll(AssetAll(a, b), AssetAll(c, d)).objects == (a, b, c, d)


def test_mixed_nesting_is_kept() -> None:
    expr = (a | b) & c
    assert isinstance(expr, AssetAll)
    assert expr.objects == (AssetAny(a, b), c)
    inner = a | (b & c)
    assert inner.objects == (a, AssetAll(b, c))


def test_aliases_combine_with_assets() -> None:
    alias = AssetAlias("al")
    assert (a & alias).objects == (a, alias)
    assert (alias | a).objects == (alias, a)


@pytest.mark.parametrize("operand", [1, "b", None, [Asset("b")]])
def test_non_asset_right_operand_is_a_type_error_naming_its_type(operand: object) -> None:
    name = type(operand).__name__
    with pytest.raises(TypeError, match=name):
        a & operand
    with pytest.raises(TypeError, match=name):
        a | operand


def test_non_asset_left_operand_is_a_type_error_naming_its_type() -> None:
    with pytest.raises(TypeError, match="int"):
        1 & a
    with pytest.raises(TypeError, match="int"):
        1 | a


def test_condition_constructor_rejects_a_non_asset() -> None:
    with pytest.raises(TypeError, match="str"):
        AssetAny(a, "b")  # type: ignore[arg-type]


def test_empty_condition_is_a_type_error() -> None:
    with pytest.raises(TypeError):
        AssetAll()


def test_conditions_compare_by_kind_and_operands() -> None:
    assert (a & b) == AssetAll(a, b)
    assert (a & b) != (a | b)
    assert hash(a & b) == hash(AssetAll(a, b))


# --- evaluate -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("updated", "expected"),
    [(set(), False), ({a}, True), ({b}, False)],
)
def test_asset_evaluate(updated: set[Asset], expected: bool) -> None:
    assert a.evaluate(updated) is expected


@pytest.mark.parametrize(
    ("updated", "all_expected", "any_expected"),
    [
        (set(), False, False),
        ({a}, False, True),
        ({b}, False, True),
        ({a, b}, True, True),
        ({c}, False, False),
    ],
)
def test_and_or_truth_tables(updated: set[Asset], all_expected: bool, any_expected: bool) -> None:
    assert (a & b).evaluate(updated) is all_expected
    assert (a | b).evaluate(updated) is any_expected


@pytest.mark.parametrize(
    ("updated", "expected"),
    [
        ({a}, False),
        ({c}, False),
        ({a, c}, True),
        ({b, c}, True),
        ({a, b}, False),
        ({d}, True),
        ({a, d}, True),
        (set(), False),
    ],
)
def test_nested_evaluate(updated: set[Asset], expected: bool) -> None:
    assert (((a | b) & c) | d).evaluate(updated) is expected


def test_evaluate_uses_identity_not_extra() -> None:
    assert a.evaluate({Asset("a", extra={"k": 1})})


def test_alias_evaluate() -> None:
    alias = AssetAlias("al")
    assert alias.evaluate({alias})
    assert not alias.evaluate({Asset("al")})
    assert (a & alias).evaluate({a, alias})
    assert not (a & alias).evaluate({a})


def test_iter_assets_and_aliases_depth_first() -> None:
    alias = AssetAlias("al")
    expr = (a | alias) & (b | c)
    assert list(expr.iter_assets()) == [a, b, c]
    assert list(expr.iter_aliases()) == [alias]


def test_as_json_describes_the_tree() -> None:
    assert (a & (b | AssetAlias("al"))).as_json() == {
        "all": [
            {"asset": {"name": "a", "uri": "a"}},
            {
                "any": [
                    {"asset": {"name": "b", "uri": "b"}},
                    {"alias": {"name": "al"}},
                ]
            },
        ]
    }


def test_str_parenthesises_nested_conditions() -> None:
    assert str((a | b) & c) == "(a | b) & c"


# --- time: an AND's window and reset ---------------------------------------------------------

HOUR = timedelta(hours=1)


@pytest.mark.parametrize("span", [timedelta(0), timedelta(seconds=-1), 60, "1h", True])
def test_a_window_must_be_a_positive_timedelta(span: object) -> None:
    with pytest.raises(ValueError, match=rf"a & b: within={re.escape(repr(span))} must be a "):
        AssetAll(a, b, within=span)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match=r"e\.g\. within=timedelta\(hours=2\)"):
        (a & b).within(span)  # type: ignore[arg-type]


def test_a_window_needs_two_operands() -> None:
    with pytest.raises(ValueError, match=r"^a: within=.*two or more operands, e\.g\. \(a & b\)"):
        AssetAll(a, within=HOUR)


@pytest.mark.parametrize("condition", [a | b, a, AssetAlias("al")], ids=["or", "asset", "alias"])
def test_only_an_and_has_a_window(condition: AssetAll) -> None:
    with pytest.raises(
        TypeError, match=rf"^\({re.escape(str(condition))}\)\.within\(.*only an AND"
    ):
        condition.within(HOUR)


@pytest.mark.parametrize("cron", ["every day", "61 * * * *", 5])
def test_a_bad_reset_cron_is_named(cron: object) -> None:
    with pytest.raises(ValueError, match=rf"^a & b: reset={re.escape(repr(cron))}: .*five fields"):
        AssetAll(a, b, reset=cron)  # type: ignore[arg-type]


@pytest.mark.parametrize("zone", ["Mars/Olympus", "", 5])
def test_a_bad_reset_timezone_is_named(zone: object) -> None:
    with pytest.raises(ValueError, match=rf"reset_timezone={re.escape(repr(zone))} is not an IANA"):
        AssetAll(a, b, reset="@daily", reset_timezone=zone)  # type: ignore[arg-type]


def test_a_reset_timezone_needs_a_reset() -> None:
    with pytest.raises(ValueError, match="reset_timezone='Europe/Paris' without a reset"):
        AssetAll(a, b, reset_timezone="Europe/Paris")


def test_within_keeps_the_reset() -> None:
    windowed = AssetAll(a, b, reset="@daily", reset_timezone="Europe/Paris").within(HOUR)
    assert (windowed.window, windowed.reset, windowed.reset_timezone) == (
        HOUR,
        "@daily",
        "Europe/Paris",
    )


def test_window_and_reset_take_part_in_equality_and_hash() -> None:
    assert (a & b).within(HOUR) == AssetAll(a, b, within=timedelta(minutes=60))
    assert hash((a & b).within(HOUR)) == hash(AssetAll(a, b, within=timedelta(minutes=60)))
    variants = [
        a & b,
        (a & b).within(HOUR),
        (a & b).within(2 * HOUR),
        AssetAll(a, b, reset="@daily"),
        AssetAll(a, b, reset="@hourly"),
        AssetAll(a, b, reset="@daily", reset_timezone="Europe/Paris"),
        AssetAll(a, b, within=HOUR, reset="@daily"),
    ]
    assert len(set(variants)) == len(variants)
    assert all(x != y for i, x in enumerate(variants) for y in variants[i + 1 :])


def test_str_and_repr_show_window_and_reset() -> None:
    assert str((a & b).within(HOUR)) == "(a & b) within 1:00:00"
    assert str(AssetAll(a, b, reset="0 6 * * *")) == "(a & b) reset at '0 6 * * *' UTC"
    both = AssetAll(a, b, within=HOUR, reset="@daily", reset_timezone="Europe/Paris")
    assert str(both) == "((a & b) within 1:00:00) reset at '@daily' Europe/Paris"
    assert str(c | (a & b).within(HOUR)) == "c | ((a & b) within 1:00:00)"
    assert repr((a & b).within(HOUR)) == (
        "AssetAll(Asset('a'), Asset('b'), within=datetime.timedelta(seconds=3600))"
    )


def test_as_json_holds_window_and_reset() -> None:
    both = AssetAll(a, b, within=timedelta(minutes=90), reset="@daily", reset_timezone="UTC")
    assert both.as_json() == {
        "all": [{"asset": {"name": "a", "uri": "a"}}, {"asset": {"name": "b", "uri": "b"}}],
        "within_s": 5400.0,
        "reset": "@daily",
        "reset_timezone": "UTC",
    }
    assert "within_s" not in (a & b).as_json()


def test_a_windowed_and_stays_one_operand_of_an_outer_and() -> None:
    windowed = (a & b).within(HOUR)
    assert (windowed & c).objects == (windowed, c)
    assert (c & windowed).objects == (c, windowed)
    reset = AssetAll(a, b, reset="@daily")
    assert (reset & c).objects == (reset, c)
    assert ((a & b) & c).objects == (a, b, c)


@pytest.mark.parametrize(
    "condition",
    [
        (a & b).within(HOUR),
        AssetAll(a, b, reset="*/10 * * * *"),
        AssetAll(a, b, within=timedelta(seconds=1.5), reset="@daily", reset_timezone="Asia/Tokyo"),
        c | (a & b).within(HOUR),
        (a & b).within(HOUR) & (c | AssetAlias("al")),
        ((a & b).within(HOUR) & c).within(2 * HOUR),
    ],
    ids=str,
)
def test_a_timed_condition_survives_the_stored_tree(condition: AssetAll) -> None:
    assert condition_from_tree(condition.as_json()) == condition
