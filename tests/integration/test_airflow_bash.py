"""BashOperator and @task.bash of an Airflow file, run as Airflow runs them: bash in a new
temporary folder, output into the run's log, the last line the XCom, and an exit code other
than 0 the run's failure."""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import pytest

from tests.fixtures.airflow import run_pipeline
from triggerer.airflow.decorators import task
from triggerer.airflow.executor import TaskTimeout
from triggerer.airflow.graph import DAG
from triggerer.airflow.operators import BashOperator


def test_bash_output_goes_to_the_log_and_its_last_line_is_the_xcom(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    seen: list[Any] = []
    with DAG("bash") as made:
        listed = BashOperator(
            task_id="list",
            bash_command='echo "in $(basename "$PWD")"; echo "$GREETING $AIRFLOW_CTX_TASK_ID"',
            env={"GREETING": "hello"},
        )
        here = BashOperator(
            task_id="here",
            bash_command="pwd; echo ${HOME:+home set}",
            cwd=str(tmp_path),
            env={"X": "1"},
            append_env=True,
        )

        @task
        def read(last: str, where: str) -> None:
            seen.extend([last, where])

        read(listed.output, here.output)

    run_pipeline(made.pipeline)
    assert seen == ["hello list", "home set"]
    log = capsys.readouterr().out
    assert "in airflowtmp" in log
    assert f"{tmp_path}\n" in log


def test_task_bash_runs_the_command_its_function_returns() -> None:
    seen: list[str] = []
    with DAG("task_bash") as made:

        @task.bash
        def command(name: str) -> str:
            return f"echo starting; echo {name}-done"

        @task
        def read(last: str) -> None:
            seen.append(last)

        read(command("export"))

    run_pipeline(made.pipeline)
    assert seen == ["export-done"]


@pytest.mark.parametrize(
    ("command", "message"),
    [
        ("echo out; exit 3", "the bash command failed: it returned exit code 3"),
        ("exit 99", "exited 99, which asks Airflow to skip the task"),
    ],
)
def test_an_exit_code_other_than_0_fails_the_run(command: str, message: str) -> None:
    with DAG("failing") as made:
        BashOperator(task_id="fails", bash_command=command)
    with pytest.raises(RuntimeError, match=message):
        run_pipeline(made.pipeline)


def test_a_command_past_its_execution_timeout_is_stopped() -> None:
    with DAG("slow_bash") as made:
        BashOperator(
            task_id="sleeps", bash_command="sleep 60", execution_timeout=timedelta(seconds=0.5)
        )
    with pytest.raises(TaskTimeout, match="'sleeps' timed out"):
        run_pipeline(made.pipeline)
