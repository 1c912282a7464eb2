"""Airflow's TaskFlow decorators: ``@task`` (and ``@task.bash``) functions as tasks, an
``@dag`` function as a DAG."""

from __future__ import annotations

import functools
import inspect
import typing
from collections.abc import Callable, Mapping
from typing import Any

from triggerer.airflow import executor
from triggerer.airflow.errors import NotSupported
from triggerer.airflow.graph import DAG, Task, XComArg, current_dag
from triggerer.airflow.operators import BASH_SETTINGS, check_untemplated, run_bash
from triggerer.airflow.options import TASK_SETTINGS

_FLAVOURS = {"python": frozenset(), "bash": BASH_SETTINGS}
"""The ``@task`` flavours a run can run, and the arguments each takes besides a task's."""


class TaskFunction:
    """A function decorated with ``@task``: each call inside a DAG makes a task of it and
    gives its output."""

    def __init__(self, function: Callable[..., Any], flavour: str, settings: dict[str, Any]):
        if not callable(function):
            raise TypeError(f"@task decorates a function, got {function!r}")
        unknown = (
            set(settings) - TASK_SETTINGS - _FLAVOURS[flavour] - {"task_id", "multiple_outputs"}
        )
        if unknown:
            raise TypeError(f"@task.{flavour}: unexpected arguments {sorted(unknown)}")
        self.function = function
        self.flavour = flavour
        self.settings = settings
        functools.update_wrapper(self, function)

    def __call__(self, *args: Any, **kwargs: Any) -> XComArg:
        dag = current_dag()
        name = self.settings.get("task_id") or self.function.__name__
        if dag is None:
            raise NotSupported(
                f"calling @task {name!r} outside a DAG",
                "call @task functions inside `with DAG(...)` or an @dag function",
            )
        task = FunctionTask(dag.unique_task_id(name), self, args, kwargs)
        return XComArg(task)

    def override(self, **settings: Any) -> TaskFunction:
        """The same function with some of its task's settings replaced."""
        return TaskFunction(self.function, self.flavour, {**self.settings, **settings})

    def expand(self, **_: Any) -> Any:
        raise NotSupported("dynamic task mapping (.expand)", "a run runs each task once")

    def expand_kwargs(self, *_: Any) -> Any:
        raise NotSupported("dynamic task mapping (.expand_kwargs)", "a run runs each task once")

    def partial(self, **_: Any) -> Any:
        raise NotSupported("dynamic task mapping (.partial)", "a run runs each task once")


class FunctionTask(Task):
    """The task of one call of a ``@task`` function."""

    def __init__(
        self, task_id: str, made_of: TaskFunction, args: tuple[Any, ...], kwargs: dict[str, Any]
    ) -> None:
        self.kind = f"@task.{made_of.flavour}" if made_of.flavour != "python" else "@task"
        settings = made_of.settings
        super().__init__(task_id, settings)
        self.function = made_of.function
        self.flavour = made_of.flavour
        self.args = args
        self.kwargs = kwargs
        self.bash_settings = {k: v for k, v in settings.items() if k in BASH_SETTINGS}
        self.multiple_outputs = bool(
            settings.get("multiple_outputs", _returns_dict(made_of.function))
        )
        owner = f"{self.kind} {task_id!r}"
        # Airflow renders a @task's arguments as templated fields (op_args, op_kwargs).
        check_untemplated(owner, "its arguments", (args, kwargs))
        executor.check_call(owner, self.function, args, kwargs, self.dag.unprovided)
        self.depends_on((args, kwargs))

    def execute(self, context: executor.Context, run: executor.TaskRun) -> Any:
        args = executor.resolve(list(self.args), run)
        kwargs = executor.resolve(self.kwargs, run)
        result = executor.call_with_context(self.function, args, kwargs, context)
        if self.flavour != "bash":
            return result
        if not isinstance(result, str) or not result.strip():
            raise TypeError(
                f"@task.bash {self.task_id!r} must return the command to run, a non-empty "
                f"string; it returned {result!r}"
            )
        check_untemplated(f"@task.bash {self.task_id!r}", "its command", result)
        return run_bash(result, context, **self.bash_settings)


class TaskDecorator:
    """``task``: ``@task``, ``@task(...)``, ``@task.python`` and ``@task.bash``. Other
    flavours (``@task.branch``, ``@task.sensor``, ``@task.virtualenv`` ...) are refused."""

    def __call__(self, python_callable: Callable[..., Any] | None = None, **settings: Any) -> Any:
        return _decorate("python", python_callable, settings)

    def python(self, python_callable: Callable[..., Any] | None = None, **settings: Any) -> Any:
        return _decorate("python", python_callable, settings)

    def bash(self, python_callable: Callable[..., Any] | None = None, **settings: Any) -> Any:
        return _decorate("bash", python_callable, settings)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        raise NotSupported(
            f"@task.{name}",
            "a run runs Python (@task) and Bash (@task.bash) tasks in its own process, one "
            "after another",
        )


task = TaskDecorator()


def _decorate(flavour: str, function: Callable[..., Any] | None, settings: dict[str, Any]) -> Any:
    if function is not None:
        return TaskFunction(function, flavour, settings)
    return lambda decorated: TaskFunction(decorated, flavour, settings)


def _returns_dict(function: Callable[..., Any]) -> bool:
    """Whether the function says it returns a dict, from which Airflow infers
    ``multiple_outputs``."""
    returned = inspect.signature(function).return_annotation
    if isinstance(returned, str):
        return returned.replace("typing.", "").startswith(("dict", "Dict"))
    return returned is dict or typing.get_origin(returned) is dict


class DagParam:
    """A parameter of an ``@dag`` function inside it: the param's value in each run."""

    def __init__(self, name: str) -> None:
        self.name = name

    def value_in_run(self, run: executor.TaskRun) -> Any:
        return run.context["params"][self.name]

    def __repr__(self) -> str:
        return f"DagParam({self.name!r})"


def dag(dag_id: Any = None, **dag_kwargs: Any) -> Any:
    """Airflow's ``@dag`` (with or without arguments): calling the function makes the DAG,
    named by ``dag_id`` or the function; its parameters are the DAG's params."""
    if callable(dag_id):
        return _dag_maker(dag_id, None, dag_kwargs)
    return lambda function: _dag_maker(function, dag_id, dag_kwargs)


def _dag_maker(
    function: Callable[..., Any], dag_id: str | None, dag_kwargs: Mapping[str, Any]
) -> Callable[..., DAG]:
    signature = inspect.signature(function)

    @functools.wraps(function)
    def make(*args: Any, **kwargs: Any) -> DAG:
        bound = signature.bind_partial(*args, **kwargs)
        bound.apply_defaults()
        params = {**(dag_kwargs.get("params") or {}), **bound.arguments}
        settings = {**dag_kwargs, "params": params}
        if settings.get("description") is None and function.__doc__:
            settings["description"] = inspect.cleandoc(function.__doc__)
        with DAG(dag_id or function.__name__, **settings) as made:
            function(**{name: DagParam(name) for name in bound.arguments})
        return made

    return make
