"""The DAGs and tasks of an Airflow file: their dependencies, the order they run in, and the
one triggerer pipeline each DAG becomes when its definition ends."""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from typing import Any

from triggerer.airflow import executor
from triggerer.airflow.errors import NotSupported
from triggerer.airflow.options import (
    TaskSettings,
    check_default_args,
    dag_options,
    pipeline_options,
    task_settings,
)
from triggerer.airflow.schedules import schedule_of
from triggerer.pipelines import Pipeline, declare
from triggerer.sites import caller_site

_TASK_ID = re.compile(r"^[\w.-]{1,250}$")
_active: list[DAG] = []
"""The DAGs whose definition is running: ``with`` blocks and ``@dag`` functions, innermost
last."""


def current_dag() -> DAG | None:
    """The DAG a task made now belongs to."""
    return _active[-1] if _active else None


class DAG:
    """Airflow's ``DAG``: used as a context manager (``with DAG(...)``), or made by an ``@dag``
    function. When its block ends it becomes the pipeline ``dag_id`` of the file."""

    def __init__(
        self,
        dag_id: str,
        *,
        schedule: object = None,
        default_args: Mapping[str, Any] | None = None,
        schedule_interval: object = None,
        timetable: object = None,
        **kwargs: Any,
    ) -> None:
        if not isinstance(dag_id, str):
            raise TypeError(f"DAG() needs a dag_id string, got {dag_id!r}")
        given = [s for s in (schedule, schedule_interval, timetable) if s is not None]
        if len(given) > 1:
            raise ValueError(f"DAG({dag_id!r}): give schedule= alone")
        self.dag_id = dag_id
        self.defined_at = caller_site()
        check_default_args(dag_id, default_args or {})
        self.default_args = dict(default_args or {})
        # As in Airflow, a DAG without a start_date of its own takes default_args' one.
        start_date = kwargs.get("start_date")
        if start_date is None:
            start_date = self.default_args.get("start_date")
        self.schedule = schedule_of(given[0] if given else None, start_date)
        # The context names a run of this DAG cannot give its tasks, each with the reason.
        self.unprovided = executor.unprovided_in(self.schedule)
        self.options = dag_options(dag_id, kwargs)
        self.task_dict: dict[str, Task] = {}
        self.pipeline: Pipeline | None = None

    @property
    def params(self) -> dict[str, Any]:
        return dict(self.options.params)

    @property
    def tasks(self) -> list[Task]:
        return list(self.task_dict.values())

    @property
    def task_ids(self) -> list[str]:
        return list(self.task_dict)

    @property
    def description(self) -> str | None:
        return self.options.description

    def __enter__(self) -> DAG:
        if self.pipeline is not None:
            raise NotSupported(
                f"entering DAG {self.dag_id!r} again",
                "a DAG is complete when its first with block ends",
            )
        _active.append(self)
        return self

    def __exit__(self, error_type: type[BaseException] | None, *_: object) -> None:
        _active.remove(self)
        if error_type is None:
            self.complete()

    def unique_task_id(self, task_id: str) -> str:
        """``task_id``, or ``task_id__N`` when taken (a ``@task`` called twice)."""
        if task_id not in self.task_dict:
            return task_id
        number = 1
        while f"{task_id}__{number}" in self.task_dict:
            number += 1
        return f"{task_id}__{number}"

    def add_task(self, task: Task) -> None:
        if self.pipeline is not None:
            raise NotSupported(
                f"adding task {task.task_id!r} to DAG {self.dag_id!r} after its with block",
                "make every task of a DAG inside its with block (or its @dag function)",
            )
        if task.task_id in self.task_dict:
            raise ValueError(f"DAG {self.dag_id!r} has a task {task.task_id!r} already")
        self.task_dict[task.task_id] = task

    def complete(self) -> Pipeline:
        """Make the pipeline of this DAG and add it to the file being loaded."""
        order = ordered(self.tasks)
        options = pipeline_options(self.options, (task.settings for task in order))
        self.pipeline = Pipeline(
            self.dag_id,
            schedule=self.schedule,
            function=executor.runner(self, order),
            defined_at=self.defined_at,
            **options,
        )
        declare(self.pipeline)
        return self.pipeline

    def __repr__(self) -> str:
        return f"<DAG: {self.dag_id}>"


class Task:
    """A task of a DAG: its settings, its place in the graph, and what it does in a run."""

    kind = "task"
    multiple_outputs = False

    def __init__(self, task_id: str, given: Mapping[str, Any], dag: object = None) -> None:
        current = current_dag()
        owner = f"{self.kind}(task_id={task_id!r})"
        if current is None or (dag is not None and dag is not current):
            raise NotSupported(
                f"{owner} outside a DAG's with block",
                "make tasks inside `with DAG(...)` or an @dag function, not with dag=",
            )
        if not isinstance(task_id, str) or not _TASK_ID.match(task_id):
            raise ValueError(f"{owner}: a task_id is 1-250 letters, digits, '_', '.' and '-'")
        self.task_id = task_id
        self.dag = current
        self.settings: TaskSettings = task_settings(owner, given, current.default_args)
        self.upstream_list: list[Task] = []
        self.downstream_list: list[Task] = []
        current.add_task(self)

    @property
    def dag_id(self) -> str:
        return self.dag.dag_id

    @property
    def outlets(self) -> list[Any]:
        return list(self.settings.outlets)

    @property
    def inlets(self) -> list[Any]:
        return list(self.settings.inlets)

    @property
    def retries(self) -> int:
        return self.settings.retries

    @property
    def output(self) -> XComArg:
        """This task's return value, for another task's argument."""
        return XComArg(self)

    def execute(self, context: executor.Context, run: executor.TaskRun) -> Any:
        """What the task does in a run; its return value is its XCom."""
        raise NotImplementedError

    def depends_on(self, values: object) -> None:
        """Make every task whose output is in ``values`` (arguments) upstream of this one."""
        for upstream in tasks_in(values):
            upstream.set_downstream(self)

    def set_downstream(self, other: object) -> None:
        for task in _tasks_of(other):
            if self.dag.pipeline is not None:
                raise NotSupported(
                    f"{self.task_id} >> {task.task_id} in DAG {self.dag_id!r} after its with block",
                    "the order of a DAG's tasks is fixed when its block ends; set "
                    "dependencies inside the with block (or its @dag function)",
                )
            if task.dag is not self.dag:
                raise NotSupported(
                    f"{self.task_id} >> {task.task_id} across DAGs",
                    "a dependency joins two tasks of one DAG; across DAGs, use an asset",
                )
            if task not in self.downstream_list:
                self.downstream_list.append(task)
                task.upstream_list.append(self)

    def set_upstream(self, other: object) -> None:
        for task in _tasks_of(other):
            task.set_downstream(self)

    def __rshift__(self, other: Any) -> Any:
        self.set_downstream(other)
        return other

    def __lshift__(self, other: Any) -> Any:
        self.set_upstream(other)
        return other

    def __rrshift__(self, other: Any) -> Task:
        self.set_upstream(other)
        return self

    def __rlshift__(self, other: Any) -> Task:
        self.set_downstream(other)
        return self

    def expand(self, **_: Any) -> Any:
        raise NotSupported("dynamic task mapping (.expand)", "a run runs each task once")

    def partial(self, **_: Any) -> Any:
        raise NotSupported("dynamic task mapping (.partial)", "a run runs each task once")

    def __repr__(self) -> str:
        return f"<Task({self.kind}): {self.task_id}>"


class XComArg:
    """A task's return value (or one key of it) as another task's argument: the value it
    returned in the same run."""

    def __init__(self, operator: Task, key: str = executor.RETURN_VALUE) -> None:
        self.operator = operator
        self.key = key

    def value_in_run(self, run: executor.TaskRun) -> Any:
        return run.xcoms.pull(self.operator.task_id, self.key)

    def __getitem__(self, key: str) -> XComArg:
        return XComArg(self.operator, key)

    def __iter__(self) -> Iterator[Any]:
        raise TypeError(f"the output of task {self.operator.task_id!r} is not iterable in a DAG")

    def __rshift__(self, other: Any) -> Any:
        return self.operator >> other

    def __lshift__(self, other: Any) -> Any:
        return self.operator << other

    def __rrshift__(self, other: Any) -> XComArg:
        self.operator.set_upstream(other)
        return self

    def __rlshift__(self, other: Any) -> XComArg:
        self.operator.set_downstream(other)
        return self

    def map(self, *_: Any) -> Any:
        raise NotSupported("XComArg.map", "dynamic task mapping: a run runs each task once")

    def zip(self, *_: Any, **__: Any) -> Any:
        raise NotSupported("XComArg.zip", "dynamic task mapping: a run runs each task once")

    def concat(self, *_: Any) -> Any:
        raise NotSupported("XComArg.concat", "dynamic task mapping: a run runs each task once")

    def __str__(self) -> str:
        # Airflow's str() is a Jinja template of the value, rendered only in a templated field.
        raise NotSupported(
            f"an XComArg (the output of task {self.operator.task_id!r}) in a string",
            "Airflow puts a template there, which a run does not render; pass task.output "
            "as an argument and make the string inside the task",
        )

    def __format__(self, format_spec: str) -> str:
        return str(self)

    def __repr__(self) -> str:
        return f"XComArg({self.operator.task_id!r}, {self.key!r})"


def tasks_in(value: object) -> Iterator[Task]:
    """The tasks whose outputs ``value`` holds (in lists, tuples, sets and dict values)."""
    if isinstance(value, XComArg):
        yield value.operator
    elif isinstance(value, (list, tuple, set, frozenset)):
        for item in value:
            yield from tasks_in(item)
    elif isinstance(value, dict):
        for item in value.values():
            yield from tasks_in(item)


def _tasks_of(value: object) -> list[Task]:
    if isinstance(value, Task):
        return [value]
    if isinstance(value, XComArg):
        return [value.operator]
    if isinstance(value, (list, tuple, set)):
        return [task for item in value for task in _tasks_of(item)]
    raise TypeError(f"a dependency joins tasks, got {value!r}")


def chain(*elements: Any) -> None:
    """Airflow's ``chain``: each element upstream of the next; two lists of one length
    pairwise."""
    for upstream, downstream in itertools.pairwise(elements):
        if isinstance(upstream, (list, tuple)) and isinstance(downstream, (list, tuple)):
            if len(upstream) != len(downstream):
                raise ValueError(
                    f"chain() of two lists needs one length, got {len(upstream)} and "
                    f"{len(downstream)}"
                )
            for up, down in zip(upstream, downstream, strict=True):
                for task in _tasks_of(up):
                    task.set_downstream(down)
        else:
            for task in _tasks_of(upstream):
                task.set_downstream(downstream)


def chain_linear(*elements: Any) -> None:
    """Airflow's ``chain_linear``: every task of each element upstream of every task of the
    next."""
    for upstream, downstream in itertools.pairwise(elements):
        for task in _tasks_of(upstream):
            task.set_downstream(downstream)


def cross_downstream(from_tasks: Sequence[Any], to_tasks: Any) -> None:
    """Airflow's ``cross_downstream``: each of ``from_tasks`` upstream of each of ``to_tasks``."""
    for task in _tasks_of(list(from_tasks)):
        task.set_downstream(to_tasks)


def ordered(tasks: Iterable[Task]) -> list[Task]:
    """``tasks`` in an order where each comes after all its upstream tasks: of the tasks
    ready, the one defined first. A cycle is a ValueError naming its tasks."""
    pending = list(tasks)
    waiting = {id(task): len(task.upstream_list) for task in pending}
    order: list[Task] = []
    while pending:
        ready = next((task for task in pending if waiting[id(task)] == 0), None)
        if ready is None:
            names = ", ".join(task.task_id for task in pending)
            raise ValueError(f"the dependencies of tasks {names} form a cycle")
        pending.remove(ready)
        order.append(ready)
        for task in ready.downstream_list:
            waiting[id(task)] -= 1
    return order
