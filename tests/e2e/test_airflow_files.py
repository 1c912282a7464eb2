"""A file written for Airflow, through ``triggerer run --config FILE`` on SQLite and Spark
Connect: a producer DAG of two ``@task``s passing a value, one of them on Spark, with an
outlet whose event carries an extra, and a consumer DAG scheduled on that asset, loaded
unchanged. Triggered by the CLI, the producer's run emits the event; the consumer runs and
sees it. A file using an operator triggerer does not run is an import error naming it."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING

import pytest

from tests.e2e.daemon import (
    Deployment,
    events_of,
    runs,
    sqlite_url,
    triggerer_cli,
    write_pipelines,
)

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.timeout(300)

DAGS = """\
import pendulum

from airflow.sdk import Asset, dag, task

stock = Asset("s3://depot/stock.parquet")
checked = Asset("s3://depot/stock-checked.json")


@dag(schedule=None, start_date=pendulum.datetime(2024, 1, 1, tz="UTC"), catchup=False,
     tags=["depot"])
def stock_count():
    @task
    def count_pallets(spark):
        return spark.range(7).count()

    @task(outlets=[stock])
    def publish(pallets, *, outlet_events):
        outlet_events[stock].extra = {"pallets": pallets}

    publish(count_pallets())


stock_count()


@dag(schedule=[stock], start_date=pendulum.datetime(2024, 1, 1, tz="UTC"))
def stock_check():
    @task
    def received(triggering_asset_events=None):
        (event,) = triggering_asset_events[stock]
        return {"pallets": event.extra["pallets"], "from": event.source_dag_id}

    @task(outlets=[checked])
    def record(seen, *, outlet_events):
        outlet_events[checked].extra = seen

    record(received())


stock_check()
"""
UNSUPPORTED = """\
from airflow.sdk import DAG
from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator

with DAG("hands_over"):
    TriggerDagRunOperator(task_id="next", trigger_dag_id="stock_count")
"""
RUN_TIMEOUT_S = 180.0


def cli_env() -> dict[str, str]:
    """A CLI process that reads only its ``--config``."""
    return {k: v for k, v in os.environ.items() if not k.startswith("TRIGGERER_")}


async def test_an_airflow_file_runs_unchanged_and_an_unsupported_one_is_an_import_error(
    tmp_path: Path, spark_remote: str
) -> None:
    deployment = Deployment(tmp_path, sqlite_url(tmp_path), spark_remote, bootstrap="", topic="")
    # As written for Airflow: not a template to fill in.
    write_pipelines(tmp_path / "pipelines", DAGS, name="depot.py")
    write_pipelines(tmp_path / "pipelines", UNSUPPORTED, name="hand_over.py")
    config = deployment.config_file()
    with deployment.process_with_config(config) as daemon:
        daemon.start()
        (loaded,) = await daemon.wait_logged("pipelines_loaded")
        assert loaded["errors"] == 1, daemon.tail()

        listed = await triggerer_cli(
            cli_env(), "--config", str(config), "pipelines", "list", "--json"
        )
        assert listed.returncode == 0, listed.stderr.decode()
        rows = json.loads(listed.stdout)
        assert sorted(row["pipeline_id"] for row in rows if "pipeline_id" in row) == [
            "stock_check",
            "stock_count",
        ]
        (error,) = [row for row in rows if "pipeline_id" not in row]
        assert error["fileloc"].endswith("hand_over.py")
        assert error["line"] == 2
        assert (
            "airflow.providers.standard.operators.trigger_dagrun is not provided" in error["error"]
        )

        triggered = await triggerer_cli(
            cli_env(), "--config", str(config), "pipelines", "trigger", "stock_count"
        )
        assert triggered.returncode == 0, triggered.stderr.decode()
        finished = await deployment.wait_for(
            runs,
            lambda rs: (
                sorted((r.pipeline_id, r.state) for r in rs)
                == [("stock_check", "success"), ("stock_count", "success")]
                or any(r.state == "failed" for r in rs)
            ),
            timeout_s=RUN_TIMEOUT_S,
        )
        assert {r.state for r in finished} == {"success"}, daemon.tail()

    (produced,) = await deployment.query(lambda s: events_of(s, "s3://depot/stock.parquet"))
    assert produced.extra == {"pallets": 7}
    (seen,) = await deployment.query(lambda s: events_of(s, "s3://depot/stock-checked.json"))
    assert seen.extra == {"pallets": 7, "from": "stock_count"}
