"""The asset-scheduling examples of Airflow's documentation, in files of the same shape (the
same constructs, other names and words), loaded unchanged: each DAG a pipeline with the
schedule, outlets and inlets Airflow gives it, its tasks doing what Airflow's would."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from tests.fixtures.airflow import event, load_source, run_pipeline
from tests.fixtures.triggers import running, take
from triggerer.airflow import triggers as airflow_triggers
from triggerer.assets import Asset, AssetAlias, AssetAll, AssetAny
from triggerer.schedules import AssetOrTimeSchedule, CronSchedule
from triggerer.triggers import load_trigger
from watchers.kafka import KafkaTrigger
from watchers.sqs import SqsTrigger

if TYPE_CHECKING:
    from pathlib import Path

    from triggerer.service.loader import LoadedPipelines

pytestmark = pytest.mark.usefixtures("isolated_imports")


def loaded(folder: Path, source: str) -> LoadedPipelines:
    result = load_source(folder, source)
    assert result.errors == []
    return result


# Producer and consumer; several assets; conditions (asset-scheduling.rst, example_assets.py).
CONDITIONS = """
import pendulum

from airflow.providers.standard.operators.bash import BashOperator
from airflow.sdk import DAG, Asset
from airflow.timetables.assets import AssetOrTimeSchedule
from airflow.timetables.trigger import CronTriggerTimetable

daily_sales = Asset("s3://shop/sales/daily.parquet", extra={"owner": "finance"})
stock = Asset("s3://shop/stock/levels.parquet")
prices = Asset("s3://shop/prices/current.parquet")
START = pendulum.datetime(2024, 6, 1, tz="UTC")

with DAG(dag_id="sales_loader", start_date=START, schedule="@daily", catchup=False,
         tags=["loads"]):
    BashOperator(task_id="load_sales", outlets=[daily_sales], bash_command="true")

with DAG(dag_id="stock_loader", start_date=START, schedule=None):
    BashOperator(task_id="load_stock", outlets=[stock], bash_command="true")

with DAG(dag_id="sales_report", start_date=START, schedule=[daily_sales]):
    BashOperator(task_id="report", bash_command="true",
                 outlets=[Asset("s3://shop/reports/sales.html")])

with DAG(dag_id="sales_and_stock", start_date=START, schedule=[daily_sales, stock]):
    BashOperator(task_id="join", bash_command="true")

with DAG(dag_id="either_one", schedule=(daily_sales | stock)):
    BashOperator(task_id="react", bash_command="true")

with DAG(dag_id="sales_or_both_others", schedule=(daily_sales | (stock & prices))):
    BashOperator(task_id="react", bash_command="true")

with DAG(
    dag_id="weekly_or_when_both_land",
    catchup=False,
    start_date=START,
    schedule=AssetOrTimeSchedule(
        timetable=CronTriggerTimetable("0 3 * * 1", timezone="UTC"),
        assets=(daily_sales & stock),
    ),
):
    BashOperator(task_id="rebuild", bash_command="true")
"""


def test_producers_consumers_and_conditions(tmp_path: Path) -> None:
    pipelines = loaded(tmp_path, CONDITIONS).pipelines
    sales, stock, prices = (
        Asset("s3://shop/sales/daily.parquet"),
        Asset("s3://shop/stock/levels.parquet"),
        Asset("s3://shop/prices/current.parquet"),
    )
    assert {pid: p.schedule for pid, p in pipelines.items()} == {
        "sales_loader": CronSchedule("@daily"),
        "stock_loader": None,
        "sales_report": AssetAll(sales),
        "sales_and_stock": AssetAll(sales, stock),
        "either_one": AssetAny(sales, stock),
        "sales_or_both_others": AssetAny(sales, AssetAll(stock, prices)),
        "weekly_or_when_both_land": AssetOrTimeSchedule(cron="0 3 * * 1", assets=sales & stock),
    }
    assert pipelines["sales_loader"].outlets == (sales,)
    assert pipelines["sales_loader"].outlets[0].extra == {"owner": "finance"}
    assert pipelines["sales_report"].outlets == (Asset("s3://shop/reports/sales.html"),)
    assert pipelines["sales_and_stock"].outlets == ()


# Aliases, with TaskFlow and without (example_asset_alias*.py, assets.rst).
ALIASES = """
import pendulum

from airflow.providers.standard.operators.python import PythonOperator
from airflow.sdk import DAG, Asset, AssetAlias, task

with DAG(dag_id="plain_writer", start_date=pendulum.datetime(2024, 1, 1, tz="UTC"),
         schedule=None, catchup=False):

    @task(outlets=[Asset("s3://archive/exports")])
    def write_export():
        pass

    write_export()

with DAG(dag_id="alias_writer", schedule=None):

    @task(outlets=[AssetAlias("exports-alias")])
    def write_through_alias(*, outlet_events=None):
        folder = "exports"
        outlet_events[AssetAlias("exports-alias")].add(
            Asset(f"s3://archive/{folder}"), extra={"files": 2}
        )

    write_through_alias()

with DAG(dag_id="export_reader", schedule=[Asset("s3://archive/exports")]):

    @task
    def read_export():
        pass

    read_export()

with DAG(dag_id="alias_reader", schedule=[AssetAlias("exports-alias")]):

    @task(inlets=[AssetAlias("exports-alias")])
    def read_through_alias(*, inlet_events=None):
        return [e.extra["files"] for e in inlet_events[AssetAlias("exports-alias")]]

    read_through_alias()

with DAG(dag_id="alias_writer_classic", schedule=None):

    def write_classic(*, outlet_events=None):
        outlet_events[AssetAlias("classic-alias")].add(Asset("s3://archive/classic"))

    PythonOperator(task_id="write_classic", outlets=[AssetAlias("classic-alias")],
                   python_callable=write_classic)

with DAG(dag_id="alias_reader_classic", schedule=[AssetAlias("classic-alias")]):

    def read_classic(*, inlet_events=None):
        for found in inlet_events[AssetAlias("classic-alias")]:
            print(found)

    PythonOperator(task_id="read_classic", python_callable=read_classic,
                   inlets=[AssetAlias("classic-alias")])
"""


def test_aliases_as_schedules_inlets_and_outlets(tmp_path: Path) -> None:
    result = loaded(tmp_path, ALIASES)
    pipelines = result.pipelines
    exports, alias = Asset("s3://archive/exports"), AssetAlias("exports-alias")
    assert pipelines["alias_writer"].outlets == (alias,)
    assert pipelines["alias_reader"].schedule == AssetAll(alias)
    assert pipelines["alias_reader"].inlets == (alias,)
    assert pipelines["export_reader"].schedule == AssetAll(exports)
    assert pipelines["alias_reader_classic"].inlets == (AssetAlias("classic-alias"),)
    assert {AssetAlias("exports-alias"), AssetAlias("classic-alias")} <= result.aliases

    emitted = run_pipeline(pipelines["alias_writer"])
    assert emitted["alias_adds"] == [
        {"alias": "exports-alias", "name": exports.name, "uri": exports.uri, "extra": {"files": 2}}
    ]
    through = [event(1, exports, {"files": 2}), event(4, exports, {"files": 5})]
    run_pipeline(pipelines["alias_reader"], inlet_events={alias: through})


# Extras on outlet events and reading them back (example_outlet_event_extra.py,
# example_inlet_event_extra.py).
EXTRAS = """
import datetime

from airflow.providers.standard.operators.bash import BashOperator
from airflow.sdk import DAG, Asset, Metadata, task

ledger = Asset(uri="s3://books/ledger.csv", name="ledger")

with DAG(dag_id="extra_by_yield", catchup=False, start_date=datetime.datetime.min,
         schedule="@daily"):

    @task(outlets=[ledger])
    def post_by_yield():
        yield Metadata(ledger, {"lines": 12})

    post_by_yield()

with DAG(dag_id="extra_by_context", schedule="@daily"):

    @task(outlets=[ledger])
    def post_by_context(*, outlet_events=None):
        outlet_events[ledger].extra = {"lines": 7}

    post_by_context()

with DAG(dag_id="extra_from_classic", schedule="@daily"):

    def after(context, result):
        context["outlet_events"][ledger].extra = {"lines": 1}

    BashOperator(task_id="post", outlets=[ledger], bash_command=":", post_execute=after)

with DAG(dag_id="read_extras", catchup=False, start_date=datetime.datetime(1970, 1, 1),
         schedule="@daily"):

    @task(inlets=[ledger])
    def read_extras(*, inlet_events=None):
        return [found.extra["lines"] for found in inlet_events[ledger][:-1]]

    read_extras()
"""


def test_extras_set_on_outlet_events_and_read_from_inlets(tmp_path: Path) -> None:
    pipelines = loaded(tmp_path, EXTRAS).pipelines
    ledger = Asset("ledger", "s3://books/ledger.csv")
    for pipeline_id, lines in (("extra_by_yield", 12), ("extra_by_context", 7)):
        emitted = run_pipeline(pipelines[pipeline_id])
        assert emitted["assets"] == [
            {"name": "ledger", "uri": "s3://books/ledger.csv", "extra": {"lines": lines}}
        ]
    assert pipelines["extra_from_classic"].outlets == (ledger,)
    assert pipelines["read_extras"].inlets == (ledger,)
    run_pipeline(
        pipelines["read_extras"],
        inlet_events={ledger: [event(1, ledger, {"lines": 3}), event(2, ledger, {"lines": 4})]},
    )


# Reading the triggering events in Python (asset-scheduling.rst), Airflow 2's imports.
TRIGGERING = """
from airflow import DAG
from airflow.decorators import task
from airflow.sdk import Asset

parts = Asset("s3://plant/parts.json")
seen = []

with DAG(dag_id="show_triggers", schedule=[parts]):

    @task
    def show_triggering_events(triggering_asset_events=None):
        for asset, events in triggering_asset_events.items():
            for found in events:
                seen.append((asset.uri, found.source_dag_run.dag_id, found.source_dag_run.run_id,
                             found.source_dag_run.data_interval_start, found.timestamp.year))

    show_triggering_events()
"""


def test_triggering_events_name_the_run_and_dag_that_emitted_them(tmp_path: Path) -> None:
    import sys

    result = loaded(tmp_path, TRIGGERING)
    parts = Asset("s3://plant/parts.json")
    run_pipeline(
        result.pipelines["show_triggers"],
        triggering=[event(8, parts, {}, source_run_id="parts_loader__cron__2026-01-01")],
    )
    module = next(m for n, m in sys.modules.items() if n.startswith("triggerer_pipelines.dags"))
    assert module.seen == [
        ("s3://plant/parts.json", "parts_loader", "parts_loader__cron__2026-01-01", None, 2026)
    ]


# Event-driven DAGs: an asset watched through a message queue (event-scheduling.rst, the
# common-messaging provider's examples), and a trigger of one's own written for Airflow.
WATCHERS = """
from collections.abc import AsyncIterator

from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger
from airflow.providers.standard.operators.empty import EmptyOperator
from airflow.sdk import DAG, Asset, AssetWatcher, chain, task
from airflow.triggers.base import BaseEventTrigger, TriggerEvent

sqs = MessageQueueTrigger(queue="https://sqs.eu-west-1.amazonaws.com/123456789012/arrivals",
                          wait_time_seconds=10)
kafka = MessageQueueTrigger(queue="kafka://broker.internal:9092/unused", topics=["arrivals"],
                            kafka_config_id="kafka_sasl")
by_scheme = MessageQueueTrigger(scheme="sqs",
                                sqs_queue="https://sqs.eu-west-1.amazonaws.com/123456789012/late")


class CountdownTrigger(BaseEventTrigger):
    def __init__(self, start: int, **kwargs):
        super().__init__(**kwargs)
        self.start = start

    def serialize(self):
        return ("my_company.triggers.CountdownTrigger", {"start": self.start})

    async def run(self) -> AsyncIterator[TriggerEvent]:
        self.log.info("counting down from %s", self.start)
        yield TriggerEvent({"left": self.start})


arrivals = Asset("arrivals", watchers=[AssetWatcher(name="arrivals_sqs", trigger=sqs),
                                       AssetWatcher(name="arrivals_kafka", trigger=kafka)])
ticks = Asset("ticks", watchers=[AssetWatcher(name="countdown", trigger=CountdownTrigger(3))])

with DAG(dag_id="on_arrival", schedule=[arrivals]):
    EmptyOperator(task_id="noted")

with DAG(dag_id="on_tick", schedule=[ticks], catchup=False):

    @task
    def say_tick():
        print("tick")

    chain(say_tick())
"""


async def test_watched_assets_with_queue_triggers_and_a_trigger_of_one_s_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    result = loaded(tmp_path, WATCHERS)
    arrivals = result.assets[Asset("arrivals")]
    sqs, kafka = (watcher.trigger for watcher in arrivals.watchers)
    assert isinstance(sqs, SqsTrigger)
    assert sqs.serialize()[1]["queue"].endswith("/123456789012/arrivals")
    assert sqs.serialize()[1]["wait_time_s"] == 10
    assert isinstance(kafka, KafkaTrigger)
    assert (kafka.bootstrap_servers, kafka.topics, kafka.connection) == (
        "broker.internal:9092",
        ["arrivals"],
        "kafka_sasl",
    )
    assert result.pipelines["on_arrival"].schedule == AssetAll(Asset("arrivals"))

    (watcher,) = result.assets[Asset("ticks")].watchers
    countdown = watcher.trigger
    classpath, kwargs = countdown.serialize()
    assert classpath.startswith("triggerer_pipelines.dags_")
    assert kwargs == {"start": 3}
    assert load_trigger(classpath, kwargs).serialize() == (classpath, kwargs)
    # Airflow runs the trigger again after its run() ends: so does triggerer.
    monkeypatch.setattr(airflow_triggers, "RESTART_DELAY_S", 0.0)
    async with running(countdown) as events:
        assert [e.payload for e in await take(events, 2)] == [{"left": 3}, {"left": 3}]
