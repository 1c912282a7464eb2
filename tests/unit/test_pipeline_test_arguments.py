"""``triggerer pipelines test``'s arguments: ``--event ASSET=JSON`` and ``--params JSON`` as
parsed, the events as the run's triggering events, and the Spark a test run uses."""

from __future__ import annotations

import argparse

import pytest

from triggerer import Asset, AssetAlias, pipeline
from triggerer.service.cli.main import build_parser
from triggerer.service.cli.pipeline_test import (
    GivenEvent,
    event_arg,
    foreground_spark,
    params_arg,
    spark_named,
    triggering_events,
)
from triggerer.service.cli.store import CliError
from triggerer.service.config import SparkSettings
from triggerer.service.runs.run_process import run_spec

ORDERS = Asset("orders")
CUSTOMERS = Asset("customers", "s3://lake/customers")
RAW = Asset("raw")


@pipeline(schedule=ORDERS & CUSTOMERS, inlets=[RAW], params={"limit": 5, "region": "eu"})
def join(spark: object, context: object) -> None: ...


@pipeline(schedule=AssetAlias("days") | ORDERS)
def by_day(spark: object, context: object) -> None: ...


@pipeline()
def manual(spark: object, context: object) -> None: ...


@pipeline(schedule=ORDERS, inlets=[AssetAlias("days"), RAW])
def reads_days(spark: object, context: object) -> None: ...


@pipeline(inlets=[AssetAlias("days")])
def reads_only_days(spark: object, context: object) -> None: ...


@pytest.mark.parametrize(
    ("text", "event"),
    [
        ('orders={"n": 1}', GivenEvent("orders", {"n": 1})),
        ("orders={}", GivenEvent("orders", {})),
        # The first '=' followed by JSON: one in the URI, one in the JSON.
        ('s3://lake/orders?v=2={"n": 1}', GivenEvent("s3://lake/orders?v=2", {"n": 1})),
        ('orders={"q": "a=b"}', GivenEvent("orders", {"q": "a=b"})),
    ],
)
def test_an_event_is_an_asset_and_a_json_object(text: str, event: GivenEvent) -> None:
    assert event_arg(text) == event


@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("orders", """'orders' is not ASSET=JSON, e.g. orders='{"rows": 10}'"""),
        ("={}", "'={}' names no asset before '=' (ASSET=JSON)"),
        ("orders=", "the extra of 'orders' is not JSON (Expecting value: line 1 column 1"),
        ("orders=[1]", """the extra of 'orders' must be a JSON object, e.g. {"rows": 10}, got"""),
        ('orders={"n": NaN}', "the extra of 'orders' must be JSON-serialisable, got {'n': nan}"),
    ],
)
def test_a_bad_event_names_what_is_wrong(text: str, error: str) -> None:
    with pytest.raises(argparse.ArgumentTypeError) as raised:
        event_arg(text)
    assert str(raised.value).startswith(error)


def test_params_are_a_json_object() -> None:
    assert params_arg('{"limit": 7}') == {"limit": 7}
    for text in ("[1]", "7", "{"):
        with pytest.raises(argparse.ArgumentTypeError, match="the params"):
            params_arg(text)


def test_the_parser_says_which_argument_is_bad(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as exited:
        build_parser().parse_args(["pipelines", "test", "join", "--event", "orders=[1]"])
    assert exited.value.code == 2
    assert "error: argument --event: the extra of 'orders' must be a JSON object" in (
        capsys.readouterr().err
    )
    arguments = build_parser().parse_args(
        ["pipelines", "test", "join", "--event=orders={}", "--event=raw={}", "--params={}"]
    )
    assert arguments.events == [GivenEvent("orders", {}), GivenEvent("raw", {})]
    assert arguments.params == {}


def test_events_keep_their_order_by_name_or_uri_and_inlets_count() -> None:
    given = [
        GivenEvent("orders", {"n": 1}),
        GivenEvent("s3://lake/customers", {"c": 1}),
        GivenEvent("orders", {"n": 2}),
        GivenEvent("raw", {}),
    ]
    events = triggering_events(join, given)
    assert [(e.id, e.asset.name, e.asset.uri, e.extra) for e in events] == [
        (1, "orders", "orders", {"n": 1}),
        (2, "customers", "s3://lake/customers", {"c": 1}),
        (3, "orders", "orders", {"n": 2}),
        (4, "raw", "raw", {}),
    ]
    assert {(e.source, e.partition_key, e.source_run_id) for e in events} == {("cli", None, None)}


def test_an_asset_the_pipeline_does_not_know_is_an_error_listing_those_it_does() -> None:
    with pytest.raises(CliError) as raised:
        triggering_events(join, [GivenEvent("payments", {})])
    assert str(raised.value) == (
        "--event payments=...: pipeline 'join' knows no asset 'payments'; give one of its "
        "schedule's assets or inlets, by name or URI: orders, customers (s3://lake/customers), "
        "raw"
    )
    with pytest.raises(CliError, match="'manual' is scheduled on no asset and has no inlets"):
        triggering_events(manual, [GivenEvent("orders", {})])


def test_an_alias_inlet_is_not_an_asset_an_event_names() -> None:
    """Was: AttributeError (an alias has no URI) for every pipeline with an alias inlet."""
    events = triggering_events(reads_days, [GivenEvent("orders", {}), GivenEvent("raw", {})])
    assert [e.asset.name for e in events] == ["orders", "raw"]
    with pytest.raises(CliError) as raised:
        triggering_events(reads_days, [GivenEvent("days", {})])
    assert str(raised.value) == (
        "--event days=...: pipeline 'reads_days' knows no asset 'days'; give one of its "
        "schedule's assets or inlets, by name or URI: orders, raw"
    )
    assert triggering_events(reads_only_days, []) == []
    with pytest.raises(
        CliError, match="'reads_only_days' is scheduled on no asset and has only alias inlets"
    ):
        triggering_events(reads_only_days, [GivenEvent("days", {})])


def test_on_an_alias_any_asset_may_have_come() -> None:
    [event] = triggering_events(by_day, [GivenEvent("s3://lake/day=1", {"day": 1})])
    assert (event.asset.name, event.extra) == ("s3://lake/day=1", {"day": 1})
    with pytest.raises(CliError, match=r"^--event self=\.\.\.: asset name 'self' is reserved"):
        triggering_events(by_day, [GivenEvent("self", {})])


def test_params_go_over_the_pipelines_as_a_manual_run_takes_them() -> None:
    spec = run_spec(
        join,
        "join.py",
        SparkSettings(),
        run_id="join__test__x",
        try_number=1,
        partition_key=None,
        params={"limit": 7},
        events=[],
        pipelines_dir="pipelines",
    )
    assert spec.params == {"limit": 7, "region": "eu"}


def test_local_mode_tests_on_classic_spark_on_its_master() -> None:
    local = SparkSettings(mode="local", master="local[2]", conf={"spark.a": "1"})
    spark = foreground_spark(local)
    assert (spark.mode, spark.master, spark.conf) == ("classic", "local[2]", {"spark.a": "1"})
    assert spark_named(spark, "local").startswith("classic Spark on master local[2] (for local")
    for mode, extra in (("classic", {}), ("submit", {}), ("connect", {"remote": "sc://h:1"})):
        configured = SparkSettings.model_validate({"mode": mode, **extra})
        assert foreground_spark(configured) == configured
