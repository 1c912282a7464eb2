"""How the launcher (and ``pipelines test``) starts a run's process: its argv and environment
(no process is started)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from triggerer.service.config import Settings
from triggerer.service.runs import lifeline, runner
from triggerer.service.runs.forks import modules_ahead
from triggerer.service.runs.processes import spark_conf, spark_env
from triggerer.service.runs.run_process import run_command
from triggerer.service.runs.spark_server import LocalSparkServer

SPEC, RESULT = Path("/runs/spec.json"), Path("/runs/result-1.json")


@pytest.fixture(autouse=True)
def _no_spark_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SPARK_HOME", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON", "SPARK_LOCAL_IP"):
        monkeypatch.delenv(name, raising=False)


def test_every_run_starts_tied_to_the_daemon() -> None:
    command = run_command(Settings().spark, SPEC, RESULT, "/spark")
    assert command == [
        *(sys.executable, "-I", lifeline.__file__, str(os.getpid())),
        *(sys.executable, "-m", "triggerer.service.runs.runner", str(SPEC), str(RESULT)),
    ]


def test_submit_runs_spark_submit_of_spark_home_with_the_conf() -> None:
    spark = {"mode": "submit", "master": "spark://h:7077", "conf": {"spark.pyspark.python": "/p"}}
    command = run_command(Settings.model_validate({"spark": spark}).spark, SPEC, RESULT, "/spark")
    assert command[4:] == [
        "/spark/bin/spark-submit",
        *("--master", "spark://h:7077", "--conf=spark.pyspark.python=/p"),
        *(runner.__file__, str(SPEC), str(RESULT)),
    ]


def test_the_run_gets_spark_home_and_the_daemons_python() -> None:
    env = spark_env()
    assert Path(env["SPARK_HOME"], "bin", "spark-submit").is_file()
    assert env["PYSPARK_PYTHON"] == env["PYSPARK_DRIVER_PYTHON"] == sys.executable


def test_the_daemons_environment_overrides_them(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARK_HOME", "/opt/spark")
    monkeypatch.setenv("PYSPARK_PYTHON", "/opt/python")
    env = spark_env()
    assert (env["SPARK_HOME"], env["PYSPARK_PYTHON"]) == ("/opt/spark", "/opt/python")
    assert env["PYSPARK_DRIVER_PYTHON"] == sys.executable


LOOPBACK_CONF = {"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"}


@pytest.mark.parametrize("master", ["local", "local[*]", "local[2,3]", "local-cluster[2,1,1024]"])
def test_a_local_spark_listens_on_loopback(master: str) -> None:
    """Was: its driver and block manager listened on the machine's external address, its UI
    on every address."""
    assert spark_conf(master, {"spark.sql.shuffle.partitions": "4"}) == {
        **LOOPBACK_CONF,
        "spark.sql.shuffle.partitions": "4",
    }
    assert spark_env(master)["SPARK_LOCAL_IP"] == "127.0.0.1"


@pytest.mark.parametrize("master", ["spark://h:7077", "yarn", "k8s://https://h:6443"])
def test_a_cluster_reaches_the_driver_where_spark_puts_it(master: str) -> None:
    assert spark_conf(master, {"spark.executor.cores": "2"}) == {"spark.executor.cores": "2"}
    assert "SPARK_LOCAL_IP" not in spark_env(master)
    assert "SPARK_LOCAL_IP" not in spark_env()


def test_where_the_user_places_the_driver_wins(monkeypatch: pytest.MonkeyPatch) -> None:
    # A host of their own is also where it listens (Spark's default bind address is the host).
    assert spark_conf("local[*]", {"spark.driver.host": "10.0.0.5"}) == {
        "spark.driver.host": "10.0.0.5"
    }
    assert spark_conf("local[*]", {"spark.driver.bindAddress": "10.0.0.9"}) == {
        "spark.driver.host": "127.0.0.1",
        "spark.driver.bindAddress": "10.0.0.9",
    }
    monkeypatch.setenv("SPARK_LOCAL_IP", "10.0.0.5")
    assert spark_env("local[*]")["SPARK_LOCAL_IP"] == "10.0.0.5"


def test_submit_to_a_local_master_keeps_the_driver_on_loopback() -> None:
    spark = {"mode": "submit", "master": "local[2]", "conf": {"spark.driver.memory": "1g"}}
    command = run_command(Settings.model_validate({"spark": spark}).spark, SPEC, RESULT, "/spark")
    assert command[4:] == [
        "/spark/bin/spark-submit",
        *("--master", "local[2]"),
        "--conf=spark.driver.host=127.0.0.1",
        "--conf=spark.driver.bindAddress=127.0.0.1",
        "--conf=spark.driver.memory=1g",
        *(runner.__file__, str(SPEC), str(RESULT)),
    ]


def test_the_local_connect_server_listens_on_loopback_only() -> None:
    spark = {"mode": "local", "conf": {"spark.ui.enabled": "true"}}
    settings = Settings.model_validate({"spark": spark}).spark
    command = LocalSparkServer(settings, restart_backoff_max_s=1)._command(15002)
    confs = [argument for argument in command if argument.startswith("--conf=")]
    assert confs == [
        "--conf=spark.ui.enabled=true",
        "--conf=spark.driver.host=127.0.0.1",
        "--conf=spark.driver.bindAddress=127.0.0.1",
        "--conf=spark.connect.grpc.binding.address=127.0.0.1",
        "--conf=spark.connect.grpc.binding.port=15002",
    ]


def test_the_forker_imports_ahead_the_modules_of_installed_triggers_only(tmp_path: Path) -> None:
    """A trigger class of the pipelines folder (a helper module there) is imported by each run
    afresh; one of an installed package is imported once, in the forker."""
    from watchers.file import FileTrigger

    pipelines = tmp_path / "pipelines"
    helper = type(sys)("helper_of_the_pipelines")
    helper.__file__ = str(pipelines / "helper_of_the_pipelines.py")
    custom = type("Custom", (), {"__module__": helper.__name__})
    sys.modules[helper.__name__] = helper
    try:
        triggers = [FileTrigger(str(tmp_path / "in")), custom(), custom()]
        assert modules_ahead(triggers, pipelines) == {FileTrigger.__module__}
    finally:
        del sys.modules[helper.__name__]
