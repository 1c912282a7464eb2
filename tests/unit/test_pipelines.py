"""The pipeline decorator, Pipeline and Metadata."""

from __future__ import annotations

import re
import sys
from datetime import date, timedelta
from typing import Any

import pytest

from triggerer import (
    Asset,
    AssetAlias,
    AssetAll,
    AssetOrTimeSchedule,
    CronPartitionTimetable,
    Metadata,
    PartitionedAssetTimetable,
    Pipeline,
    ToDaily,
    pipeline,
)
from triggerer.schedules import Batch, CronSchedule
from triggerer.service.runs.launcher import MAX_RETRY_S, retry_at
from triggerer.service.store.types import utcnow

orders, customers, report = Asset("orders"), Asset("customers"), Asset("report")


def job(spark: Any, context: Any) -> None:
    """Build the report."""


# --- decorator ------------------------------------------------------------------------------


def test_decorator_id_defaults_to_the_function_name() -> None:
    @pipeline(schedule=orders)
    def daily_report(spark: Any, context: Any) -> None:
        pass

    assert isinstance(daily_report, Pipeline)
    assert daily_report.pipeline_id == "daily_report"
    assert daily_report.function is not None
    assert daily_report.function.__name__ == "daily_report"


def test_decorator_takes_an_explicit_id() -> None:
    assert pipeline("report.v2")(job).pipeline_id == "report.v2"
    assert pipeline(pipeline_id="other")(job).pipeline_id == "other"


def test_description_comes_from_the_docstring() -> None:
    assert pipeline()(job).description == "Build the report."


def test_description_option_beats_the_docstring() -> None:
    assert pipeline(description="given")(job).description == "given"


def test_no_docstring_means_no_description() -> None:
    def bare(spark: Any, context: Any) -> None:
        pass

    assert pipeline()(bare).description is None


def test_decorator_without_parentheses_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="parentheses"):
        pipeline(job)  # type: ignore[arg-type]


def test_decorator_passes_options() -> None:
    p = pipeline(
        schedule=orders & customers,
        outlets=[report],
        max_active_runs=2,
        run_policy="per_event",
        retries=3,
        spark_conf={"spark.sql.shuffle.partitions": "4"},
    )(job)
    assert p.schedule == AssetAll(orders, customers)
    assert p.outlets == (report,)
    assert (p.max_active_runs, p.run_policy, p.retries) == (2, "per_event", 3)
    assert p.spark_conf == {"spark.sql.shuffle.partitions": "4"}


def test_defaults() -> None:
    p = pipeline()(job)
    assert p.schedule is None
    assert (p.outlets, p.inlets) == ((), ())
    assert (p.max_active_runs, p.run_policy, p.retries) == (16, "coalesce", 0)
    assert p.max_events_per_run is None


# --- option validation ----------------------------------------------------------------------


@pytest.mark.parametrize("pipeline_id", ["", ".hidden", "-x", "has space", "x" * 251, "caf\u00e9"])
def test_bad_pipeline_id_is_named(pipeline_id: str) -> None:
    with pytest.raises(ValueError, match="pipeline_id"):
        Pipeline(pipeline_id, function=job)


def test_run_policy_must_be_known() -> None:
    with pytest.raises(ValueError, match=r"run_policy='sometimes'.*coalesce.*per_event"):
        pipeline(run_policy="sometimes")(job)


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("max_active_runs", 0),
        ("max_active_runs", "4"),
        ("max_active_runs", 1.5),
        ("retries", -1),
        ("retries", "1"),
        ("max_events_per_run", 0),
    ],
)
def test_integer_options_are_validated(option: str, value: object) -> None:
    with pytest.raises(ValueError, match=f"{option}={value!r}") as info:
        pipeline(**{option: value})(job)
    assert "'job'" in str(info.value)


def test_bool_is_not_an_integer_option() -> None:
    with pytest.raises(ValueError, match="max_active_runs"):
        pipeline(max_active_runs=True)(job)


@pytest.mark.parametrize("delay", [-1, float("nan"), float("inf"), "10", True, timedelta(1)])
def test_retry_delay_must_be_seconds(delay: object) -> None:
    with pytest.raises(ValueError, match=rf"'job': retry_delay_s={re.escape(repr(delay))}; must"):
        pipeline(retry_delay_s=delay)(job)


@pytest.mark.parametrize("timeout", [0, -5, float("nan"), float("inf"), "60", True])
def test_a_timeout_must_be_seconds_above_zero(timeout: object) -> None:
    with pytest.raises(ValueError, match=rf"'job': timeout_s={re.escape(repr(timeout))}; must"):
        pipeline(timeout_s=timeout)(job)


def test_a_timeout_is_none_by_default_or_the_seconds_given() -> None:
    assert pipeline()(job).timeout_s is None
    assert pipeline(timeout_s=1.5)(job).timeout_s == 1.5


def test_the_wait_before_a_retry_doubles_up_to_a_day() -> None:
    now = utcnow()
    assert retry_at(3, 10.0) - now == pytest.approx(timedelta(seconds=40), abs=timedelta(seconds=1))
    for try_number in (30, 10_000):
        assert retry_at(try_number, 10.0) - now <= timedelta(seconds=MAX_RETRY_S + 1)


def test_params_must_be_json() -> None:
    with pytest.raises(TypeError, match=r"pipeline 'job' params must be JSON-serialisable"):
        pipeline(params={"since": date(2024, 1, 1)})(job)


@pytest.mark.parametrize("outlet", ["report", 1, orders & customers])
def test_outlets_must_be_assets_or_aliases(outlet: object) -> None:
    with pytest.raises(TypeError, match="outlets must be Asset or AssetAlias"):
        pipeline(outlets=[outlet])(job)


def test_alias_outlet_is_allowed() -> None:
    alias = AssetAlias("out")
    assert pipeline(outlets=[report, alias])(job).outlets == (report, alias)


def test_single_asset_outlet_gets_a_clear_error() -> None:
    with pytest.raises(TypeError, match="outlets"):
        pipeline(outlets=report)(job)


def test_inlets_are_assets_or_aliases() -> None:
    alias = AssetAlias("x")
    assert pipeline(inlets=[report, alias])(job).inlets == (report, alias)
    with pytest.raises(TypeError, match=r"inlets must be Asset or AssetAlias, got str"):
        pipeline(inlets=["x"])(job)


# --- schedules ------------------------------------------------------------------------------


def test_schedule_none_is_manual() -> None:
    p = pipeline(schedule=None)(job)
    assert (p.schedule, p.condition, p.cron) == (None, None, None)


@pytest.mark.parametrize("cron", ["*/5 * * * *", "@daily"])
def test_schedule_cron_string(cron: str) -> None:
    p = pipeline(schedule=cron)(job)
    assert p.schedule == CronSchedule(cron)
    assert (p.cron, p.condition) == (cron, None)


def test_bad_cron_error_names_the_expression() -> None:
    with pytest.raises(ValueError, match="'every day'"):
        pipeline(schedule="every day")(job)


def test_schedule_asset() -> None:
    p = pipeline(schedule=orders)(job)
    assert p.schedule is orders
    assert p.condition is orders
    assert p.cron is None


def test_schedule_alias() -> None:
    alias = AssetAlias("al")
    p = pipeline(schedule=alias)(job)
    assert p.condition is alias
    assert list(p.iter_assets()) == []


@pytest.mark.parametrize("schedule", [[orders, customers], (orders, customers)])
def test_schedule_list_means_all(schedule: Any) -> None:
    assert pipeline(schedule=schedule)(job).condition == AssetAll(orders, customers)


def test_schedule_list_with_a_non_asset_is_a_type_error() -> None:
    with pytest.raises(TypeError, match="str"):
        pipeline(schedule=[orders, "customers"])(job)


def test_schedule_expression() -> None:
    expr = (orders | customers) & report
    assert pipeline(schedule=expr)(job).condition == expr


def test_schedule_asset_or_time() -> None:
    schedule = AssetOrTimeSchedule(cron="@hourly", assets=[orders])
    p = pipeline(schedule=schedule)(job)
    assert p.schedule is schedule
    assert p.condition == AssetAll(orders)
    assert p.cron == "@hourly"


def test_schedule_partitioned_assets() -> None:
    schedule = PartitionedAssetTimetable(assets=orders, partition_key_mapper=ToDaily())
    p = pipeline(schedule=schedule)(job)
    assert (p.condition, p.cron) == (orders, None)


def test_schedule_cron_partitions() -> None:
    p = pipeline(schedule=CronPartitionTimetable(cron="@daily"))(job)
    assert (p.condition, p.cron) == (None, "@daily")


@pytest.mark.parametrize("schedule", [5, {orders}, {"cron": "@daily"}])
def test_unsupported_schedule_is_a_type_error(schedule: object) -> None:
    with pytest.raises(TypeError, match="schedule="):
        pipeline(schedule=schedule)(job)


# --- Pipeline -------------------------------------------------------------------------------


def test_pipeline_with_an_application() -> None:
    p = Pipeline("script", application="jobs/x.py", schedule=orders)
    assert (p.application, p.function) == ("jobs/x.py", None)


@pytest.mark.parametrize(
    "kwargs", [{}, {"function": job, "application": "jobs/x.py"}], ids=["neither", "both"]
)
def test_pipeline_needs_exactly_one_of_function_and_application(kwargs: dict[str, Any]) -> None:
    with pytest.raises(TypeError, match="exactly one of function, application"):
        Pipeline("p", **kwargs)


def test_iter_assets_covers_schedule_inlets_and_outlets() -> None:
    dim = Asset("dim")
    p = Pipeline(
        "p",
        function=job,
        schedule=orders | customers,
        inlets=[dim],
        outlets=[report, AssetAlias("al")],
    )
    assert list(p.iter_assets()) == [orders, customers, dim, report]


def test_pipeline_is_frozen() -> None:
    p = pipeline()(job)
    with pytest.raises(AttributeError):
        p.pipeline_id = "other"  # type: ignore[misc]


def test_pipeline_copies_mutable_options() -> None:
    conf = {"k": "v"}
    p = pipeline(spark_conf=conf)(job)
    conf["k"] = "changed"
    assert p.spark_conf == {"k": "v"}


# --- Metadata -------------------------------------------------------------------------------


def test_metadata() -> None:
    alias = AssetAlias("al")
    meta = Metadata(report, {"row_count": 3}, alias=alias)
    assert (meta.asset, meta.extra, meta.alias) == (report, {"row_count": 3}, alias)
    assert Metadata(report, {}).alias is None


def test_metadata_asset_must_be_an_asset() -> None:
    with pytest.raises(TypeError, match="Metadata asset must be an Asset, got str"):
        Metadata("report", {})  # type: ignore[arg-type]


def test_metadata_alias_must_be_an_alias() -> None:
    with pytest.raises(
        TypeError, match="Metadata alias must be an AssetAlias or an alias's name, got Asset"
    ):
        Metadata(report, {}, alias=orders)  # type: ignore[arg-type]


def test_metadata_alias_may_be_named() -> None:
    assert Metadata(report, {}, alias="al").alias == AssetAlias("al")


@pytest.mark.parametrize(
    ("function", "reason"),
    [
        (lambda: None, "too many positional arguments"),
        (lambda spark: None, "too many positional arguments"),
        (lambda spark, context, table: None, "missing a required argument: 'table'"),
        (lambda *, spark, context: None, "too many positional arguments"),
    ],
)
def test_a_function_that_cannot_take_spark_and_context_is_refused_when_defined(
    function: Any, reason: str
) -> None:
    message = (
        rf"^pipeline 'p': <lambda>\(.*\) cannot be called with the run's \(spark, context\) "
        rf"\({reason}\); write it as def <lambda>\(spark, context\)$"
    )
    with pytest.raises(TypeError, match=message):
        Pipeline("p", function=function)


@pytest.mark.parametrize(
    "function",
    [
        lambda spark, context: None,
        lambda *args: None,
        lambda spark, context, table="t": None,
        lambda spark, /, context, **options: None,
        print,
    ],
)
def test_a_function_that_can_take_spark_and_context_is_accepted(function: Any) -> None:
    assert Pipeline("p", function=function).function is function


def test_a_pipeline_knows_the_line_that_defined_it() -> None:
    @pipeline()
    def defined_here(spark: object, context: object) -> None:
        pass

    line = sys._getframe().f_lineno - 4  # the decorator's
    assert defined_here.defined_at == (__file__, line)
    assert Pipeline("p", function=print, defined_at=("f.py", 3)).defined_at == ("f.py", 3)


@pytest.mark.parametrize("extra", ["row_count=3", {"when": object()}])
def test_metadata_extra_must_be_a_json_dict(extra: Any) -> None:
    with pytest.raises(TypeError, match="extra"):
        Metadata(report, extra)


# --- batch, debounce_s and max_backlog -------------------------------------------------------

BATCH = Batch(max_events=10, max_wait_s=60)


@pytest.mark.parametrize("max_events", [0, -1, True, 1.5, "10"])
def test_a_batch_needs_a_whole_number_of_events(max_events: object) -> None:
    with pytest.raises(ValueError, match=rf"^Batch max_events={re.escape(repr(max_events))} must"):
        Batch(max_events=max_events, max_wait_s=60)  # type: ignore[arg-type]


@pytest.mark.parametrize("wait", [0, -1, float("inf"), float("nan"), "x", True])
def test_a_batch_needs_a_wait_above_zero(wait: object) -> None:
    with pytest.raises(ValueError, match=rf"^Batch max_wait_s={re.escape(repr(wait))} must.*e\.g"):
        Batch(max_events=10, max_wait_s=wait)  # type: ignore[arg-type]


def test_batch_and_debounce_are_kept() -> None:
    p = pipeline(schedule=orders, batch=BATCH, debounce_s=2.5, max_backlog=100)(job)
    assert (p.batch, p.debounce_s, p.max_backlog) == (BATCH, 2.5, 100)
    assert str(BATCH) == "batch of 10 or 60 s"


@pytest.mark.parametrize("debounce", [0, -5, True, float("inf"), "30"])
def test_debounce_must_be_seconds_above_zero(debounce: object) -> None:
    with pytest.raises(
        ValueError, match=rf"^pipeline 'job': debounce_s={re.escape(repr(debounce))}"
    ):
        pipeline(schedule=orders, debounce_s=debounce)(job)


def test_max_backlog_must_be_at_least_one() -> None:
    with pytest.raises(
        ValueError, match=r"^pipeline 'job': max_backlog=0; must be an integer >= 1"
    ):
        pipeline(schedule=orders, max_backlog=0)(job)


def test_batch_must_be_a_batch() -> None:
    with pytest.raises(
        TypeError, match=r"'job': batch=\{'max_events': 5\} must be a Batch, e\.g\."
    ):
        pipeline(schedule=orders, batch={"max_events": 5})(job)


def test_a_batch_is_not_per_event() -> None:
    with pytest.raises(
        ValueError, match=r"'job': batch=Batch\(.*run_policy='per_event'.*'coalesce'"
    ):
        pipeline(schedule=orders, batch=BATCH, run_policy="per_event")(job)


def test_a_batch_bounds_the_events_of_a_run_alone() -> None:
    with pytest.raises(
        ValueError, match=r"'job': batch=Batch\(.*max_events_per_run=5.*one of them"
    ):
        pipeline(schedule=orders, batch=BATCH, max_events_per_run=5)(job)


@pytest.mark.parametrize(
    "schedule", [None, "@daily", CronSchedule("@hourly"), CronPartitionTimetable("@daily")]
)
@pytest.mark.parametrize(
    "option", [{"batch": BATCH}, {"debounce_s": 30}], ids=["batch", "debounce"]
)
def test_batch_and_debounce_need_an_asset_schedule(
    schedule: object, option: dict[str, Any]
) -> None:
    ((name, value),) = option.items()
    with pytest.raises(
        ValueError,
        match=rf"^pipeline 'job': {name}={re.escape(repr(value))} holds back runs of assets, and "
        rf"schedule={re.escape(repr(schedule))} names none; .*e\.g\. schedule=Asset",
    ):
        pipeline(schedule=schedule, **option)(job)


@pytest.mark.parametrize(
    "schedule",
    [
        AssetOrTimeSchedule(cron="@daily", assets=orders),
        PartitionedAssetTimetable(assets=orders, partition_key_mapper=ToDaily()),
        [orders, customers],
    ],
)
def test_batch_and_debounce_go_with_any_asset_condition(schedule: Any) -> None:
    p = pipeline(schedule=schedule, batch=BATCH, debounce_s=30)(job)
    assert p.condition is not None
