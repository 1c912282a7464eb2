"""The three operators a triggerer run can run as Airflow does: ``PythonOperator``,
``BashOperator`` and ``EmptyOperator``. Templated fields are taken as they are written, so a
Jinja template in one is refused; any other operator, or a subclass, is refused."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

from triggerer.airflow import executor
from triggerer.airflow.errors import NotSupported
from triggerer.airflow.graph import Task
from triggerer.airflow.options import TASK_SETTINGS

BASH_SETTINGS = frozenset(
    {"env", "append_env", "output_encoding", "skip_on_exit_code", "cwd", "output_processor"}
)
"""What ``BashOperator`` (and ``@task.bash``) take besides the command."""

TEMPLATE_MARKS = ("{{", "{%", "{#")
BASH_SCRIPT_SUFFIXES = (".sh", ".bash")
"""A ``bash_command`` ending so is a template file in Airflow, rendered before it runs."""


class _Operator(Task):
    """What every operator here has: a task id, a task's settings, and refusing a subclass
    (an operator of one's own runs code triggerer cannot check)."""

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if cls.__module__ != __name__:
            base = cls.__mro__[1].__name__
            raise NotSupported(
                f"class {cls.__name__}({base})",
                "an operator of one's own is not run; call its code from a @task or a "
                "PythonOperator",
            )

    def __init__(self, task_id: str, settings: Mapping[str, Any], dag: object = None) -> None:
        unknown = sorted(set(settings) - TASK_SETTINGS)
        if unknown:
            raise TypeError(
                f"Invalid arguments were passed to {type(self).__name__} (task_id: {task_id}): "
                f"{unknown}"
            )
        super().__init__(task_id, settings, dag)


class EmptyOperator(_Operator):
    """A task that does nothing (its outlets still get events when the run succeeds)."""

    kind = "EmptyOperator"

    def __init__(self, *, task_id: str, dag: object = None, **settings: Any) -> None:
        super().__init__(task_id, settings, dag)

    def execute(self, context: executor.Context, run: executor.TaskRun) -> Any:
        return None


class PythonOperator(_Operator):
    """``python_callable(*op_args, **op_kwargs)``, given the context its parameters name."""

    kind = "PythonOperator"

    def __init__(
        self,
        *,
        task_id: str,
        python_callable: Callable[..., Any],
        op_args: Sequence[Any] | None = None,
        op_kwargs: Mapping[str, Any] | None = None,
        templates_dict: Mapping[str, Any] | None = None,
        templates_exts: Sequence[str] | None = None,
        dag: object = None,
        **settings: Any,
    ) -> None:
        if not callable(python_callable):
            raise TypeError(f"PythonOperator {task_id!r}: python_callable must be callable")
        super().__init__(task_id, settings, dag)
        owner = f"PythonOperator(task_id={task_id!r})"
        self.python_callable = python_callable
        self.op_args = list(op_args or [])
        self.op_kwargs = dict(op_kwargs or {})
        self.templates_dict = None if templates_dict is None else dict(templates_dict)
        for field in ("op_args", "op_kwargs", "templates_dict"):
            check_untemplated(owner, field, getattr(self, field))
        executor.check_call(
            owner,
            python_callable,
            self.op_args,
            self.op_kwargs,
            self.dag.unprovided,
            extra=frozenset({"templates_dict"}),
        )
        self.depends_on((self.op_args, self.op_kwargs, self.templates_dict))

    def execute(self, context: executor.Context, run: executor.TaskRun) -> Any:
        context["templates_dict"] = executor.resolve(self.templates_dict, run)
        return executor.call_with_context(
            self.python_callable,
            executor.resolve(self.op_args, run),
            executor.resolve(self.op_kwargs, run),
            context,
        )


class BashOperator(_Operator):
    """``bash -c bash_command`` in a new temporary folder (or ``cwd``); its output goes to
    the run's log, its last line is its XCom, and an exit code other than 0 fails the run."""

    kind = "BashOperator"

    def __init__(
        self,
        *,
        task_id: str,
        bash_command: Any,
        dag: object = None,
        **settings: Any,
    ) -> None:
        """``settings``: a task's, and those of :func:`run_bash` (``env``, ``append_env``,
        ``cwd``, ``output_encoding``, ``skip_on_exit_code``, ``output_processor``)."""
        self.bash_settings = {k: v for k, v in settings.items() if k in BASH_SETTINGS}
        super().__init__(
            task_id, {k: v for k, v in settings.items() if k not in BASH_SETTINGS}, dag
        )
        owner = f"BashOperator(task_id={task_id!r})"
        check_untemplated(owner, "bash_command", bash_command)
        if isinstance(bash_command, str) and bash_command.endswith(BASH_SCRIPT_SUFFIXES):
            raise NotSupported(
                f"{owner}: bash_command={bash_command!r}",
                "Airflow reads a command ending in .sh as a Jinja template file; run the "
                "script with 'bash script.sh ' (a space after it) or a full command",
            )
        for field in ("env", "cwd"):
            check_untemplated(owner, field, self.bash_settings.get(field))
        self.bash_command = bash_command
        self.depends_on((bash_command, self.bash_settings.get("env")))

    def execute(self, context: executor.Context, run: executor.TaskRun) -> Any:
        command = executor.resolve(self.bash_command, run)
        if not isinstance(command, str):
            raise TypeError(f"BashOperator {self.task_id!r}: bash_command must be a string")
        check_untemplated(f"BashOperator {self.task_id!r}", "bash_command", command)
        return run_bash(command, context, **executor.resolve(self.bash_settings, run))


def check_untemplated(owner: str, field: str, value: object) -> None:
    """Refuse a Jinja template in a templated field: a run does not render them."""
    for text in _strings(value):
        if any(mark in text for mark in TEMPLATE_MARKS):
            raise NotSupported(
                f"{owner}: a Jinja template in {field} ({text[:60]!r})",
                "a run does not render templates; read the value in Python from the "
                "context (a @task's parameters, or get_current_context())",
            )


def _strings(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, Mapping):
        return [text for item in value.values() for text in _strings(item)]
    if isinstance(value, (list, tuple, set, frozenset)):
        return [text for item in value for text in _strings(item)]
    return []


def run_bash(
    command: str,
    context: Mapping[str, Any],
    *,
    env: Mapping[str, str] | None = None,
    append_env: bool = False,
    output_encoding: str = "utf-8",
    skip_on_exit_code: int | Collection[int] | None = 99,
    cwd: str | None = None,
    output_processor: Callable[[str], Any] | None = None,
) -> Any:
    """Run ``command`` as Airflow's ``BashOperator`` does; its last line of output."""
    bash = shutil.which("bash")
    if bash is None:
        raise RuntimeError("BashOperator needs bash on the PATH of the run's process")
    environment = dict(os.environ) if env is None or append_env else {}
    environment.update(env or {})
    environment.update(_airflow_variables(context))
    if cwd is not None and not os.path.isdir(cwd):
        raise RuntimeError(f"cwd {cwd!r} of the bash command is not a folder")
    with tempfile.TemporaryDirectory(prefix="airflowtmp") as scratch:
        last, code = _stream(bash, command, environment, cwd or scratch, output_encoding)
    if skip_on_exit_code is None:
        skip: set[int] = set()
    elif isinstance(skip_on_exit_code, int):
        skip = {skip_on_exit_code}
    else:
        skip = set(skip_on_exit_code)
    if code in skip:
        raise RuntimeError(
            f"the bash command exited {code}, which asks Airflow to skip the task; a "
            "triggerer run has no skipped tasks, so the run fails"
        )
    if code != 0:
        raise RuntimeError(f"the bash command failed: it returned exit code {code}")
    return last if output_processor is None else output_processor(last)


def _stream(
    bash: str, command: str, environment: dict[str, str], cwd: str, encoding: str
) -> tuple[str, int]:
    """Run the command, copying its output (stderr with stdout) into the run's log; its last
    line and exit code."""
    last = ""
    with subprocess.Popen(  # noqa: S603 - the user's command, run as Airflow runs it
        [bash, "-c", command],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        env=environment,
        cwd=cwd,
    ) as process:
        try:
            assert process.stdout is not None  # noqa: S101 - asked for with PIPE
            for raw in process.stdout:
                last = raw.decode(encoding, errors="backslashreplace").rstrip("\n")
                sys.stdout.write(last + "\n")
                sys.stdout.flush()
            return last, process.wait()
        finally:
            if process.poll() is None:  # a timeout in the middle: the command goes too
                process.kill()


def _airflow_variables(context: Mapping[str, Any]) -> dict[str, str]:
    """The ``AIRFLOW_CTX_*`` variables Airflow gives a bash command, as far as a run has
    them."""
    ti = context["ti"]
    return {
        "AIRFLOW_CTX_DAG_ID": ti.dag_id,
        "AIRFLOW_CTX_TASK_ID": ti.task_id,
        "AIRFLOW_CTX_DAG_RUN_ID": ti.run_id,
        "AIRFLOW_CTX_TRY_NUMBER": str(ti.try_number),
    }
