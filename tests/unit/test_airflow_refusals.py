"""What an Airflow file may hold that triggerer would run differently is a load error naming
the construct, the file and its line, never a silent difference; so is an Airflow module
the shim does not provide, and a file that imports both Airflow and triggerer."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING

import pytest

from tests.fixtures.airflow import load_source

if TYPE_CHECKING:
    from pathlib import Path

pytestmark = pytest.mark.usefixtures("isolated_imports")

HEAD = """\
from datetime import timedelta
import pendulum
from airflow.sdk import DAG, Asset, dag, task
from airflow.providers.standard.operators.bash import BashOperator
from airflow.providers.standard.operators.python import PythonOperator
"""
"""Five lines: each case's own line numbers start at 6."""

CASES = {
    "another operator": (
        "from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator\n",
        6,
        "ModuleNotProvided: airflow.providers.standard.operators.trigger_dagrun is not provided",
    ),
    "a module not provided": (
        "import airflow.models.baseoperator\n",
        6,
        "airflow.models.baseoperator is not provided: Airflow is not installed",
    ),
    "a name not provided": (
        "from airflow.sdk import NotAThing\n",
        6,
        "airflow.sdk.NotAThing is not provided",
    ),
    "BaseOperator": (
        "from airflow.sdk import BaseOperator\n",
        6,
        "NotSupported: airflow.sdk.BaseOperator is not supported: an operator of one's own",
    ),
    "an operator subclass": (
        "class Loud(BashOperator):\n    pass\n",
        6,
        "class Loud(BashOperator) is not supported",
    ),
    "a sensor": (
        "from airflow.sdk import BaseSensorOperator\n",
        6,
        "airflow.sdk.BaseSensorOperator is not supported: a run does not wait on sensors",
    ),
    "a sensor module": (
        "from airflow.providers.standard.sensors.filesystem import FileSensor\n",
        6,
        "airflow.providers.standard.sensors.filesystem is not provided",
    ),
    "a task group": (
        "from airflow.sdk import TaskGroup\n",
        6,
        "airflow.sdk.TaskGroup is not supported",
    ),
    "task_group from airflow.decorators": (
        "from airflow.decorators import task_group\n",
        6,
        "airflow.decorators.task_group is not supported",
    ),
    "setup and teardown": (
        "from airflow.sdk import setup\n",
        6,
        "airflow.sdk.setup is not supported: a run has no setup or teardown tasks",
    ),
    "branching": (
        "from airflow.providers.standard.operators.python import BranchPythonOperator\n",
        6,
        "BranchPythonOperator is not supported: every task of a run runs",
    ),
    "a branch decorator": (
        "with DAG('d'):\n    @task.branch\n    def pick():\n        return 'a'\n",
        7,
        "@task.branch is not supported",
    ),
    "a Jinja template": (
        "with DAG('d'):\n    BashOperator(task_id='b', bash_command='echo {{ ds }}')\n",
        7,
        "BashOperator(task_id='b'): a Jinja template in bash_command ('echo {{ ds }}') is not "
        "supported: a run does not render templates",
    ),
    "a template in op_kwargs": (
        "with DAG('d'):\n"
        "    PythonOperator(task_id='p', python_callable=print,\n"
        "                   op_kwargs={'day': '{{ ds }}'})\n",
        7,
        "a Jinja template in op_kwargs",
    ),
    "a bash script as template file": (
        "with DAG('d'):\n    BashOperator(task_id='b', bash_command='run.sh')\n",
        7,
        "bash_command='run.sh' is not supported: Airflow reads a command ending in .sh",
    ),
    "a schedule of intervals": (
        "with DAG('d', schedule=timedelta(hours=1)):\n    pass\n",
        6,
        "schedule=datetime.timedelta(seconds=3600) is not supported",
    ),
    "@once": ("with DAG('d', schedule='@once'):\n    pass\n", 6, "schedule='@once'"),
    "a cron in another time zone": (
        "with DAG('d', schedule='0 6 * * *',\n"
        "         start_date=pendulum.datetime(2024, 1, 1, tz='Europe/Paris')):\n    pass\n",
        6,
        "a cron schedule with start_date in Europe/Paris is not supported",
    ),
    "dynamic task mapping": (
        "with DAG('d'):\n    @task\n    def f(x):\n        return x\n    f.expand(x=[1, 2])\n",
        10,
        "dynamic task mapping (.expand) is not supported",
    ),
    "partial": (
        "with DAG('d'):\n    @task\n    def f(x, y):\n        return x\n    f.partial(y=1)\n",
        10,
        "dynamic task mapping (.partial)",
    ),
    "a trigger rule": (
        "with DAG('d'):\n    BashOperator(task_id='b', bash_command='true', "
        "trigger_rule='all_done')\n",
        7,
        "trigger_rule='all_done' is not supported",
    ),
    "a callback": (
        "with DAG('d', default_args={'on_failure_callback': print}):\n    pass\n",
        6,
        "on_failure_callback is not supported: triggerer calls no callback",
    ),
    "mail on failure": (
        "with DAG('d', default_args={'email': ['a@example.com']}):\n    pass\n",
        6,
        "email=['a@example.com'] is not supported: triggerer sends no mail",
    ),
    "depends_on_past": (
        "with DAG('d'):\n    BashOperator(task_id='b', bash_command='true', "
        "depends_on_past=True)\n",
        7,
        "depends_on_past=True is not supported",
    ),
    "end_date": (
        "with DAG('d', end_date=pendulum.datetime(2030, 1, 1)):\n    pass\n",
        6,
        "DAG('d', end_date=...) is not supported",
    ),
    "a context name a run lacks": (
        "with DAG('d'):\n    @task\n    def f(ds=None):\n        return ds\n    f()\n",
        10,
        "@task 'f': the parameter 'ds' is not supported: a triggerer run has no 'ds'",
    ),
    "a context read a run lacks": (
        "with DAG('d'):\n    @task\n    def f(**context):\n        return context.get('ts')\n"
        "    f()\n",
        10,
        "reading 'ts' from the context (line 3 of the function) is not supported",
    ),
    "a context read through a variable": (
        "from airflow.sdk import get_current_context\n"
        "with DAG('d'):\n    @task\n    def f():\n        ctx = get_current_context()\n"
        "        return ctx.get('ts')\n    f()\n",
        12,
        "@task 'f': reading 'ts' from the context (line 4 of the function) is not supported",
    ),
    "a context read without **kwargs": (
        "from airflow.sdk import get_current_context\n"
        "with DAG('d'):\n    @task\n    def f():\n"
        "        return get_current_context().get('ds')\n    f()\n",
        11,
        "@task 'f': reading 'ds' from the context (line 3 of the function) is not supported",
    ),
    "logical_date in a DAG with a cron": (
        "with DAG('d', schedule='@daily'):\n    @task\n    def f(logical_date=None):\n"
        "        return logical_date\n    f()\n",
        10,
        "@task 'f': the parameter 'logical_date' is not supported: a triggerer run has no "
        "'logical_date': Airflow gives a run of a cron schedule its tick",
    ),
    "a data interval read in a DAG with a cron": (
        "def g(**context):\n    return context['data_interval_end']\n"
        "with DAG('d', schedule='0 * * * *'):\n"
        "    PythonOperator(task_id='p', python_callable=g)\n",
        9,
        "PythonOperator(task_id='p'): reading 'data_interval_end' from the context (line 2 of "
        "the function) is not supported",
    ),
    "a template in a @task's arguments": (
        "with DAG('d'):\n    @task\n    def f(day):\n        return day\n    f(day='{{ ds }}')\n",
        10,
        "@task 'f': a Jinja template in its arguments ('{{ ds }}') is not supported",
    ),
    "a task's output in an f-string": (
        "with DAG('d'):\n    @task\n    def f():\n        return 'x'\n"
        "    BashOperator(task_id='b', bash_command=f'echo {f()}')\n",
        10,
        "an XComArg (the output of task 'f') in a string is not supported",
    ),
    "a dependency after the with block": (
        "with DAG('d'):\n    a = BashOperator(task_id='a', bash_command='true')\n"
        "    b = BashOperator(task_id='b', bash_command='true')\na >> b\n",
        9,
        "a >> b in DAG 'd' after its with block is not supported: the order of a DAG's tasks "
        "is fixed when its block ends; set dependencies inside the with block",
    ),
    "a cron with a start_date of default_args in another time zone": (
        "with DAG('d', schedule='0 6 * * *', default_args={\n"
        "        'start_date': pendulum.datetime(2024, 1, 1, tz='Europe/Paris')}):\n    pass\n",
        6,
        "a cron schedule with start_date in Europe/Paris is not supported",
    ),
    "a task outside its DAG": (
        "made = DAG('d')\nBashOperator(task_id='b', bash_command='true', dag=made)\n",
        7,
        "BashOperator(task_id='b') outside a DAG's with block is not supported",
    ),
    "a param without a default": (
        "from airflow.sdk import Param\n"
        "with DAG('d', params={'day': Param(type='string')}):\n    pass\n",
        7,
        "params['day'] = Param(no default) is not supported: a param needs a default",
    ),
    "a plain trigger": (
        "from airflow.triggers.base import BaseTrigger\n",
        6,
        "airflow.triggers.base.BaseTrigger is not supported",
    ),
    "MessageQueueTrigger's apply_function": (
        "from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger\n"
        "MessageQueueTrigger(queue='kafka://localhost:9092/t', apply_function='m.f')\n",
        7,
        "MessageQueueTrigger(apply_function=...) is not supported: Airflow calls it with",
    ),
    "MessageQueueTrigger by scheme, its brokers in a connection": (
        "from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger\n"
        "MessageQueueTrigger(scheme='kafka', topics=['t'])\n",
        7,
        "MessageQueueTrigger(scheme='kafka') is not supported: the scheme form reads the queue's",
    ),
    "a MessageQueueTrigger option without a meaning here": (
        "from airflow.providers.common.messaging.triggers.msg_queue import MessageQueueTrigger\n"
        "MessageQueueTrigger(queue='kafka://localhost:9092/t', poll_interval=5)\n",
        7,
        "MessageQueueTrigger(poll_interval=...) of 'kafka://localhost:9092/t' is not supported",
    ),
}


@pytest.mark.parametrize(("body", "line", "message"), CASES.values(), ids=list(CASES))
def test_a_construct_run_differently_is_a_load_error_at_its_line(
    tmp_path: Path, body: str, line: int, message: str
) -> None:
    loaded = load_source(tmp_path, HEAD + body)
    assert loaded.pipelines == {}
    (error,) = loaded.errors
    assert (error.path, error.line) == (str(tmp_path / "dags.py"), line)
    assert message in error.message
    if "NotSupported" in error.message:
        assert "(see docs/from-airflow.md)" in error.message


@pytest.mark.parametrize(
    ("first", "second", "line"),
    [
        ("from airflow.sdk import DAG", "from triggerer import Asset", 1),
        ("from watchers import MessageQueueTrigger", "import airflow.sdk", 2),
    ],
    ids=["airflow_first", "triggerer_first"],
)
def test_a_file_importing_airflow_and_triggerer_is_refused_naming_both_lines(
    tmp_path: Path, first: str, second: str, line: int
) -> None:
    loaded = load_source(tmp_path, f"{first}\n{second}\n")
    (error,) = loaded.errors
    assert error.line == line
    assert error.message.startswith("MixedImports: this file imports Airflow (line ")
    airflow_line, triggerer_line = (1, 2) if line == 1 else (2, 1)
    assert f"(line {airflow_line}: airflow" in error.message
    assert f"triggerer (line {triggerer_line}: " in error.message


def test_each_file_is_checked_though_another_imported_airflow_before(tmp_path: Path) -> None:
    first = load_source(tmp_path, "from airflow.sdk import DAG\n", "first.py")
    mixed = load_source(
        tmp_path, "from airflow.sdk import Asset\nfrom triggerer import pipeline\n", "mixed.py"
    )
    assert first.errors == []
    assert [error.line for error in mixed.errors] == [1]


def test_an_airflow_file_and_a_triggerer_file_share_assets(tmp_path: Path) -> None:
    from triggerer.service.loader import load_paths

    (tmp_path / "airflow_side.py").write_text(
        "from airflow.sdk import DAG, Asset\n"
        "from airflow.providers.standard.operators.empty import EmptyOperator\n"
        "with DAG('writer'):\n"
        "    EmptyOperator(task_id='w', outlets=[Asset('s3://lake/t')])\n"
    )
    (tmp_path / "triggerer_side.py").write_text(
        "from triggerer import Asset, pipeline\n"
        "@pipeline(schedule=Asset('s3://lake/t'))\n"
        "def reader(spark, context):\n"
        "    pass\n"
    )
    loaded = load_paths([tmp_path])
    assert loaded.errors == []
    assert sorted(loaded.pipelines) == ["reader", "writer"]
    assert loaded.pipelines["writer"].outlets == (loaded.pipelines["reader"].schedule,)


def test_an_installed_airflow_wins_over_the_shim(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    site = tmp_path / "site"
    (site / "airflow").mkdir(parents=True)
    (site / "airflow" / "__init__.py").write_text("INSTALLED = True\n")
    (site / "airflow" / "sdk.py").write_text("DAG = 'the real one'\n")
    monkeypatch.syspath_prepend(str(site))
    try:
        loaded = load_source(
            tmp_path / "dags", "from airflow.sdk import DAG\nassert DAG == 'the real one'\n"
        )
        missing = load_source(tmp_path / "dags", "import airflow.models\n", "other.py")
    finally:
        for name in [name for name in sys.modules if name.split(".")[0] == "airflow"]:
            del sys.modules[name]
    assert loaded.errors == []
    (error,) = missing.errors
    assert error.message == "ModuleNotFoundError: No module named 'airflow.models'"
