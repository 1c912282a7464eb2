"""Airflow DAGs as triggerer pipelines, made in code: the order tasks run in, the values they
pass, the context they are given by parameter name, and the DAG's options."""

from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.airflow import event, run_pipeline
from triggerer.airflow.decorators import dag, task
from triggerer.airflow.errors import NotSupported
from triggerer.airflow.executor import TaskTimeout, get_current_context
from triggerer.airflow.graph import DAG, chain, chain_linear, cross_downstream, ordered
from triggerer.airflow.operators import EmptyOperator, PythonOperator
from triggerer.airflow.options import Param
from triggerer.airflow.schedules import AssetOrTimeSchedule, CronTriggerTimetable
from triggerer.assets import Asset, AssetAlias, AssetAll, AssetAny
from triggerer.pipelines import Metadata
from triggerer.schedules import AssetOrTimeSchedule as TimeOrAssets
from triggerer.schedules import CronSchedule

orders, payments, report = Asset("orders"), Asset("payments"), Asset("report")


def ids(tasks: list[Any]) -> list[str]:
    return [task.task_id for task in tasks]


def empty(*names: str) -> list[EmptyOperator]:
    return [EmptyOperator(task_id=name) for name in names]


# --- the order tasks run in -----------------------------------------------------------------


def test_shift_operators_and_lists_order_tasks() -> None:
    with DAG("shifts") as made:
        a, b, c, d, e = empty("a", "b", "c", "d", "e")
        e << d
        a >> [c, b] >> d
    assert ids(ordered(made.tasks)) == ["a", "b", "c", "d", "e"]
    assert ids(made.task_dict["d"].upstream_list) == ["c", "b"]


def test_without_dependencies_tasks_run_in_the_order_they_were_defined() -> None:
    with DAG("loose") as made:
        empty("z", "y", "x")
    assert ids(ordered(made.tasks)) == ["z", "y", "x"]


def test_chain_chain_linear_and_cross_downstream() -> None:
    with DAG("chained") as made:
        a, b1, b2, c1, c2, d, e1, e2 = empty("a", "b1", "b2", "c1", "c2", "d", "e1", "e2")
        chain(a, [b1, b2], [c1, c2], d)
        chain_linear(d, [e1, e2])
    assert ids(made.task_dict["c1"].upstream_list) == ["b1"]
    assert ids(made.task_dict["c2"].upstream_list) == ["b2"]
    assert ids(made.task_dict["d"].upstream_list) == ["c1", "c2"]
    assert ids(made.task_dict["e2"].upstream_list) == ["d"]
    with DAG("crossed") as crossed:
        x, y, z, w = empty("x", "y", "z", "w")
        cross_downstream([x, y], [z, w])
    assert ids(crossed.task_dict["w"].upstream_list) == ["x", "y"]


def test_chain_of_two_lists_of_other_lengths_is_an_error() -> None:
    made = DAG("uneven")
    with made:
        a, b, c = empty("a", "b", "c")
        with pytest.raises(ValueError, match="one length, got 2 and 1"):
            chain([a, b], [c])


def test_a_dependency_after_the_with_block_is_refused() -> None:
    with DAG("closed"):
        a, b = empty("a", "b")
    for join in (lambda: a >> b, lambda: b << a, lambda: chain(a, b)):
        with pytest.raises(NotSupported, match="a >> b in DAG 'closed' after its with block"):
            join()
    assert b.upstream_list == []


def test_a_cycle_is_an_error_naming_its_tasks() -> None:
    made = DAG("cycle")
    made.__enter__()
    a, b = empty("a", "b")
    a >> b >> a
    with pytest.raises(ValueError, match="tasks a, b form a cycle"):
        made.__exit__(None)


def test_a_dag_becomes_one_pipeline_named_by_its_dag_id() -> None:
    with DAG("named", description="what it does", schedule=[orders]) as made:
        EmptyOperator(task_id="only", outlets=[report])
    pipeline = made.pipeline
    assert pipeline is not None
    assert (pipeline.pipeline_id, pipeline.description) == ("named", "what it does")
    assert (pipeline.schedule, pipeline.outlets) == (AssetAll(orders), (report,))
    assert pipeline.defined_at is not None
    assert pipeline.defined_at[0] == __file__


# --- values passed between tasks ------------------------------------------------------------


def test_task_outputs_are_passed_as_airflow_passes_xcoms() -> None:
    seen: dict[str, Any] = {}

    with DAG("xcoms") as made:

        @task
        def extract() -> dict[str, int]:
            return {"rows": 3, "bad": 1}

        @task
        def count(rows: int, bad: int) -> int:
            return rows - bad

        @task
        def report_it(good: int, every: dict[str, int], ti: Any = None) -> None:
            seen.update(good=good, every=every, pulled=ti.xcom_pull(task_ids="count"))
            seen["keys"] = ti.xcom_pull(task_ids=["extract", "count"], key="rows")

        extracted = extract()
        report_it(count(extracted["rows"], extracted["bad"]), extracted)

    run_pipeline(made.pipeline)
    assert seen == {
        "good": 2,
        "every": {"rows": 3, "bad": 1},
        "pulled": 2,
        "keys": [3, None],
    }


def test_xcom_push_and_pull_through_ti_and_python_operator_arguments() -> None:
    seen: list[Any] = []

    def push(ti: Any) -> str:
        ti.xcom_push(key="path", value="/data/x")
        return "pushed"

    def pull(returned: str, *, ti: Any, **context: Any) -> None:
        seen.extend([returned, ti.xcom_pull(task_ids="push", key="path"), context["run_id"]])

    with DAG("operators") as made:
        first = PythonOperator(task_id="push", python_callable=push)
        PythonOperator(task_id="pull", python_callable=pull, op_args=[first.output])

    run_pipeline(made.pipeline, run_id="operators__manual__7")
    assert seen == ["pushed", "/data/x", "operators__manual__7"]


def test_a_task_s_output_in_a_string_is_refused() -> None:
    with DAG("strings"):

        @task
        def made() -> str:
            return "x"

        output = made()
        for write in (str, "{}".format, lambda value: f"{value:>9}"):
            with pytest.raises(NotSupported, match=r"XComArg \(the output of task 'made'\)"):
                write(output)


def test_a_task_called_twice_gets_a_second_id() -> None:
    with DAG("twice") as made:

        @task
        def step() -> None:
            pass

        step() >> step()
    assert ids(ordered(made.tasks)) == ["step", "step__1"]


# --- the context by parameter name ----------------------------------------------------------


def test_context_names_are_given_by_parameter_name_and_to_kwargs() -> None:
    seen: dict[str, Any] = {}
    spark = object()

    with DAG("context", schedule=orders, params={"limit": 10, "mode": Param("full")}) as made:

        @task(inlets=[payments], outlets=[report])
        def read(
            spark: Any,
            params: dict[str, Any],
            triggering_asset_events: Any,
            inlet_events: Any,
            outlet_events: Any,
            run_id: str,
            **context: Any,
        ) -> None:
            seen["spark"] = spark
            seen["params"] = params
            (triggering,) = triggering_asset_events[orders]
            seen["triggering"] = (triggering.extra, triggering.source_dag_id, triggering.uri)
            seen["dag_run"] = (triggering.source_dag_run.run_id, context["dag_run"].run_type)
            seen["inlet"] = [e.extra for e in inlet_events[payments]]
            outlet_events[report].extra = {"run": run_id}
            seen["current"] = get_current_context()["task"].task_id
            seen["logical_date"] = context["logical_date"]

        read()

    emitted = run_pipeline(
        made.pipeline,
        run_id="context__asset__5",
        triggering=[event(5, orders, {"n": 1}, source_run_id="loader__manual__ab12")],
        inlet_events={payments: [event(3, payments, {"paid": True})]},
        params={"limit": 20},
        spark=spark,
    )
    assert seen == {
        "spark": spark,
        "params": {"limit": 20, "mode": "full"},
        "triggering": ({"n": 1}, "loader", "orders"),
        "dag_run": ("loader__manual__ab12", "asset_triggered"),
        "inlet": [{"paid": True}],
        "current": "read",
        "logical_date": None,
    }
    assert emitted["assets"] == [
        {"name": "report", "uri": "report", "extra": {"run": "context__asset__5"}}
    ]


def test_a_context_name_a_run_does_not_have_says_why() -> None:
    wanted = "macros"
    with DAG("missing") as made:

        @task
        def read() -> None:
            get_current_context()[wanted]

        read()
    with pytest.raises(KeyError, match=r"context\['macros'\] is not available: Airflow's macros"):
        run_pipeline(made.pipeline)


def test_get_of_a_context_name_a_run_does_not_have_says_why() -> None:
    wanted = "ds"  # a name the check at load cannot see
    with DAG("missing_get") as made:

        @task
        def read() -> None:
            get_current_context().get(wanted)

        read()
    with pytest.raises(KeyError, match=r"context\['ds'\] is not available: it is derived"):
        run_pipeline(made.pipeline)


def test_a_dag_with_a_cron_has_no_logical_date_a_dag_on_assets_has_none() -> None:
    wanted = "logical_date"  # names the check at load cannot see
    seen: list[Any] = []
    dags = []
    for schedule in ("@daily", orders):
        with DAG(f"dated_{len(dags)}", schedule=schedule) as made:

            @task
            def read(dag_run: Any) -> None:
                seen.append(get_current_context().get(wanted))
                seen.append(dag_run.data_interval_start)

            read()
        dags.append(made)
    cron, assets = dags
    with pytest.raises(KeyError, match=r"context\['logical_date'\] is not available: Airflow"):
        run_pipeline(cron.pipeline)
    run_pipeline(assets.pipeline)
    assert seen == [None, None]


def test_dag_run_of_a_dag_with_a_cron_has_no_data_interval() -> None:
    with DAG("interval", schedule="0 * * * *") as made:

        @task
        def read(dag_run: Any) -> Any:
            return dag_run.data_interval_start

        read()
    with pytest.raises(AttributeError, match=r"dag_run.data_interval_start is not available"):
        run_pipeline(made.pipeline)


def test_what_the_trigger_gives_wins_over_a_task_s_params() -> None:
    seen: list[dict[str, Any]] = []
    with DAG("layered", params={"limit": 10, "mode": "full"}) as made:

        @task(params={"limit": 5, "mode": "task", "extra": 1})
        def read(params: dict[str, Any]) -> None:
            seen.append(dict(params))

        read()
    run_pipeline(made.pipeline)
    run_pipeline(made.pipeline, params={"limit": 20, "extra": 2})
    assert seen == [
        {"limit": 5, "mode": "task", "extra": 1},
        {"limit": 20, "mode": "task", "extra": 2},
    ]


def test_get_current_context_outside_a_task_is_an_error() -> None:
    with pytest.raises(RuntimeError, match="only available while a task runs"):
        get_current_context()


def test_dag_function_parameters_are_params_read_in_each_run() -> None:
    seen: list[Any] = []

    @dag(schedule=None)
    def with_params(limit: int = 5) -> None:
        @task
        def read(value: int) -> None:
            seen.append(value)

        read(limit)

    made = with_params()
    assert made.pipeline is not None
    assert made.pipeline.params == {"limit": 5}
    run_pipeline(made.pipeline)
    run_pipeline(made.pipeline, params={"limit": 9})
    assert seen == [5, 9]


# --- outlets, Metadata and aliases ----------------------------------------------------------


def test_metadata_yielded_and_alias_additions_are_the_run_s_outlet_events() -> None:
    alias = AssetAlias("written")
    with DAG("emits") as made:

        @task(outlets=[report])
        def by_yield() -> Any:
            yield Metadata(report, {"rows": 3})
            return "done"

        @task(outlets=[alias])
        def by_alias(previous: str, *, outlet_events: Any) -> Any:
            outlet_events[alias].add(Asset("s3://lake/a"), extra={"from": previous})
            yield Metadata(Asset("s3://lake/b"), {"k": 1}, alias="written")

        by_alias(by_yield())

    assert made.pipeline is not None
    assert made.pipeline.outlets == (report, alias)
    emitted = run_pipeline(made.pipeline)
    assert emitted["assets"] == [{"name": "report", "uri": "report", "extra": {"rows": 3}}]
    assert [(a["name"], a["extra"]) for a in emitted["alias_adds"]] == [
        ("s3://lake/a", {"from": "done"}),
        ("s3://lake/b", {"k": 1}),
    ]


def test_pre_and_post_execute_run_around_the_task() -> None:
    calls: list[Any] = []
    with DAG("around") as made:
        EmptyOperator(
            task_id="e",
            outlets=[report],
            pre_execute=lambda context: calls.append(("pre", context["task"].task_id)),
            post_execute=lambda context, result: context["outlet_events"][report].extra.update(
                seen=result is None
            ),
        )
    emitted = run_pipeline(made.pipeline)
    assert calls == [("pre", "e")]
    assert emitted["assets"][0]["extra"] == {"seen": True}


# --- options ---------------------------------------------------------------------------------


def test_dag_and_task_options_map_to_the_pipeline() -> None:
    with DAG(
        "options",
        max_active_runs=2,
        dagrun_timeout=timedelta(hours=1),
        default_args={"retries": 1, "retry_delay": timedelta(minutes=2), "owner": "data"},
        start_date=None,
        catchup=True,
        tags=["a"],
        doc_md="# doc",
    ) as made:
        EmptyOperator(task_id="a")
        EmptyOperator(task_id="b", retries=3, retry_delay=timedelta(seconds=30))
        EmptyOperator(task_id="c", retries=3, retry_delay=90)
    pipeline = made.pipeline
    assert pipeline is not None
    assert (pipeline.max_active_runs, pipeline.timeout_s) == (2, 3600.0)
    assert (pipeline.retries, pipeline.retry_delay_s) == (3, 90.0)


def test_retries_without_a_delay_wait_airflow_s_five_minutes() -> None:
    with DAG("default_delay", default_args={"retries": 2}) as made:
        EmptyOperator(task_id="a")
    assert made.pipeline is not None
    assert (made.pipeline.retries, made.pipeline.retry_delay_s) == (2, 300.0)


def test_execution_timeout_stops_the_task() -> None:
    with DAG("slow") as made:
        PythonOperator(
            task_id="sleeps",
            python_callable=lambda: time.sleep(60),
            execution_timeout=timedelta(seconds=0.2),
        )
    with pytest.raises(TaskTimeout, match=r"'sleeps' timed out after 0\.2 s"):
        run_pipeline(made.pipeline)


def test_an_unknown_dag_argument_is_a_type_error_as_in_airflow() -> None:
    with pytest.raises(TypeError, match="unexpected keyword argument 'shedule'"):
        DAG("typo", shedule="@daily")


# --- schedules -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("schedule", "expected"),
    [
        (None, None),
        ("@daily", CronSchedule("@daily")),
        ("@quarterly", CronSchedule("0 0 1 */3 *")),
        ("*/5 * * * *", CronSchedule("*/5 * * * *")),
        (CronTriggerTimetable("0 1 * * 3", timezone="UTC"), CronSchedule("0 1 * * 3")),
        (orders, orders),
        ([orders, payments], AssetAll(orders, payments)),
        (orders | (payments & report), AssetAny(orders, AssetAll(payments, report))),
        (
            AssetOrTimeSchedule(
                timetable=CronTriggerTimetable("0 1 * * 3", timezone="UTC"),
                assets=(orders & payments),
            ),
            TimeOrAssets(cron="0 1 * * 3", assets=orders & payments),
        ),
    ],
)
def test_schedules(schedule: object, expected: object) -> None:
    with DAG("scheduled", schedule=schedule) as made:
        EmptyOperator(task_id="a")
    assert made.pipeline is not None
    assert made.pipeline.schedule == expected


def test_arguments_keep_their_own_objects_as_they_are() -> None:
    seen: list[Any] = []
    relative = Path("data/in")  # Path has a resolve() of its own
    with DAG("plain_values") as made:
        PythonOperator(task_id="p", python_callable=seen.append, op_args=[relative])
    run_pipeline(made.pipeline)
    assert seen == [relative]
