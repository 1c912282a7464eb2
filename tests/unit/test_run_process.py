"""How the launcher starts a run's process: its argv and environment (no process is started)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

from triggerer import lifeline, runner
from triggerer.config import Settings
from triggerer.daemon.launcher import _command
from triggerer.processes import spark_env

SPEC, RESULT = Path("/runs/spec.json"), Path("/runs/result-1.json")


@pytest.fixture(autouse=True)
def _no_spark_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("SPARK_HOME", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON"):
        monkeypatch.delenv(name, raising=False)


def test_every_run_starts_tied_to_the_daemon() -> None:
    command = _command(Settings(), SPEC, RESULT, "/spark")
    assert command == [
        *(sys.executable, "-I", lifeline.__file__, str(os.getpid())),
        *(sys.executable, "-m", "triggerer.runner", str(SPEC), str(RESULT)),
    ]


def test_submit_runs_spark_submit_of_spark_home_with_the_conf() -> None:
    spark = {"mode": "submit", "master": "spark://h:7077", "conf": {"spark.pyspark.python": "/p"}}
    command = _command(Settings.model_validate({"spark": spark}), SPEC, RESULT, "/spark")
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
