"""A DAG's run inside one triggerer run: its tasks one after another in the run's process,
each return value kept as the XCom the next tasks read, and the context Airflow hands a task
by the names of its parameters."""

from __future__ import annotations

import ast
import contextlib
import contextvars
import dataclasses
import inspect
import signal
import sys
import textwrap
import threading
import typing
from collections.abc import Callable, Generator, Iterator, Mapping, Sequence
from types import FrameType
from typing import TYPE_CHECKING, Any, Protocol

from triggerer.airflow.errors import NotSupported
from triggerer.airflow.events import InletEvents, TriggeringEvents, run_type
from triggerer.pipelines import Metadata
from triggerer.schedules import AssetOrTimeSchedule, CronSchedule

if TYPE_CHECKING:
    from triggerer.context import RunContext

RETURN_VALUE = "return_value"
"""The key of a task's return value among its XComs."""

PROVIDED = frozenset(
    {
        "dag",
        "dag_run",
        "run_id",
        "params",
        "ti",
        "task_instance",
        "task",
        "outlet_events",
        "inlet_events",
        "triggering_asset_events",
        "logical_date",
        "data_interval_start",
        "data_interval_end",
        "inlets",
        "outlets",
        "spark",
    }
)
"""The context a task can ask for by parameter name (``spark`` is triggerer's own)."""

UNPROVIDED = {
    **dict.fromkeys(
        (
            "ds",
            "ds_nodash",
            "ts",
            "ts_nodash",
            "ts_nodash_with_tz",
            "execution_date",
            "next_execution_date",
            "prev_execution_date",
            "next_ds",
            "next_ds_nodash",
            "prev_ds",
            "prev_ds_nodash",
            "yesterday_ds",
            "yesterday_ds_nodash",
            "tomorrow_ds",
            "tomorrow_ds_nodash",
            "prev_data_interval_start_success",
            "prev_data_interval_end_success",
            "prev_start_date_success",
            "prev_end_date_success",
        ),
        "it is derived from a run's logical date, which a triggerer run does not have",
    ),
    **dict.fromkeys(
        ("macros", "var", "conn", "conf"),
        "Airflow's macros, variables, connections and configuration do not exist in triggerer",
    ),
    **dict.fromkeys(
        ("test_mode", "expanded_ti_count", "map_index_template", "task_reschedule_count"),
        "it belongs to an Airflow feature triggerer does not have",
    ),
}
"""Context names of Airflow's that a triggerer run cannot give, each with the reason."""

LOGICAL_DATE_NAMES = ("logical_date", "data_interval_start", "data_interval_end")
"""What Airflow 3 gives a run of a cron schedule (its tick) and an asset-triggered run
(``None``): a triggerer run has ``None`` for each."""

CRON_UNPROVIDED = {
    **UNPROVIDED,
    **dict.fromkeys(
        LOGICAL_DATE_NAMES,
        "Airflow gives a run of a cron schedule its tick as logical date and data interval, "
        "where a triggerer run has None (Airflow gives None only to a run started by assets)",
    ),
}
"""What a run of a DAG whose schedule has a cron cannot give, each with the reason."""


def unprovided_in(schedule: object) -> Mapping[str, str]:
    """The context names a run of a DAG scheduled on ``schedule`` cannot give, by reason."""
    if isinstance(schedule, (CronSchedule, AssetOrTimeSchedule)):
        return CRON_UNPROVIDED
    return UNPROVIDED


class Context(dict[str, Any]):
    """A task's context: reading a name of Airflow's that a run does not have (by ``[]`` or
    ``get()``) says why."""

    def __init__(
        self, values: Mapping[str, Any], unprovided: Mapping[str, str] = UNPROVIDED
    ) -> None:
        super().__init__(values)
        self.unprovided = unprovided

    def __missing__(self, key: str) -> Any:
        raise self._unavailable(key)

    def get(self, key: str, default: Any = None) -> Any:
        # Going on with None would be a silent difference: Airflow gives these names a value.
        if key in self.unprovided and key not in self:
            raise self._unavailable(key)
        return super().get(key, default)

    def _unavailable(self, key: str) -> KeyError:
        why = self.unprovided.get(key, "it is not a name of a task's context")
        return KeyError(f"context[{key!r}] is not available: {why}")


class TaskLike(Protocol):
    """A task as the executor runs it (:class:`triggerer.airflow.graph.Task`)."""

    task_id: str
    multiple_outputs: bool

    @property
    def settings(self) -> Any: ...

    @property
    def inlets(self) -> list[Any]: ...

    @property
    def outlets(self) -> list[Any]: ...

    def execute(self, context: Context, run: TaskRun) -> Any: ...


@typing.runtime_checkable
class Placeholder(Protocol):
    """What stands in a task's arguments for a value known only in the run."""

    def value_in_run(self, run: TaskRun) -> Any: ...


class DagLike(Protocol):
    """A DAG as the executor runs it (:class:`triggerer.airflow.graph.DAG`)."""

    dag_id: str
    unprovided: Mapping[str, str]

    @property
    def params(self) -> dict[str, Any]: ...


class XComs:
    """The values the tasks of one run pushed, by task and key, in memory."""

    def __init__(self) -> None:
        self._values: dict[tuple[str, str], Any] = {}

    def push(self, task_id: str, key: str, value: Any) -> None:
        self._values[task_id, key] = value

    def pull(self, task_id: str, key: str = RETURN_VALUE, default: Any = None) -> Any:
        return self._values.get((task_id, key), default)

    def has(self, task_id: str, key: str) -> bool:
        return (task_id, key) in self._values


@dataclasses.dataclass
class TaskRun:
    """What a running task's arguments are resolved against: the run's XComs and its
    context."""

    xcoms: XComs
    context: Context


class TaskInstance:
    """Airflow's ``ti``: the running task's identity and its XComs."""

    map_index = -1

    def __init__(self, task: TaskLike, dag: DagLike, run: RunContext, xcoms: XComs) -> None:
        self.task = task
        self.task_id = task.task_id
        self.dag_id = dag.dag_id
        self.run_id = run.run_id
        self.try_number = run.try_number
        self._xcoms = xcoms

    def xcom_push(self, key: str, value: Any) -> None:
        self._xcoms.push(self.task_id, key, value)

    def xcom_pull(
        self,
        task_ids: str | Sequence[str] | None = None,
        dag_id: str | None = None,
        key: str | None = RETURN_VALUE,
        include_prior_dates: bool = False,
        map_indexes: object = None,
        default: Any = None,
        run_id: str | None = None,
    ) -> Any:
        """The value ``key`` pushed by ``task_ids`` in this run (a list for a list of ids;
        the current task when none is named), ``default`` where there is none."""
        if dag_id not in (None, self.dag_id) or run_id not in (None, self.run_id):
            raise NotSupported(
                "xcom_pull from another DAG or run",
                "XComs live in memory for the length of one run",
            )
        if include_prior_dates:
            raise NotSupported(
                "xcom_pull(include_prior_dates=True)",
                "XComs live in memory for the length of one run",
            )
        wanted = key or RETURN_VALUE
        if task_ids is None or isinstance(task_ids, str):
            return self._xcoms.pull(task_ids or self.task_id, wanted, default)
        return [self._xcoms.pull(task_id, wanted, default) for task_id in task_ids]

    def __repr__(self) -> str:
        return f"<TaskInstance: {self.dag_id}.{self.task_id} {self.run_id}>"


@dataclasses.dataclass(frozen=True)
class DagRun:
    """Airflow's ``dag_run`` as far as a triggerer run has one: no logical date, no data
    interval (``None``, as Airflow gives a run started by assets; an error in a DAG with a
    cron, whose runs Airflow gives their tick); ``conf`` is the run's params."""

    dag_id: str
    run_id: str
    run_type: str | None
    conf: dict[str, Any]
    unprovided: Mapping[str, str] = dataclasses.field(default_factory=dict, repr=False)

    @property
    def logical_date(self) -> None:
        return self._none("logical_date")

    @property
    def data_interval_start(self) -> None:
        return self._none("data_interval_start")

    @property
    def data_interval_end(self) -> None:
        return self._none("data_interval_end")

    def _none(self, name: str) -> None:
        if name in self.unprovided:
            raise AttributeError(f"dag_run.{name} is not available: {self.unprovided[name]}")


class TaskTimeout(Exception):
    """A task ran past its ``execution_timeout``."""


_current: contextvars.ContextVar[Context] = contextvars.ContextVar("airflow_task_context")


def get_current_context() -> Context:
    """The context of the task running now (Airflow's ``get_current_context``)."""
    try:
        return _current.get()
    except LookupError:
        raise RuntimeError("get_current_context() is only available while a task runs") from None


def runner(
    dag: DagLike, tasks: Sequence[TaskLike]
) -> Callable[[Any, RunContext], Iterator[Metadata]]:
    """The function of a DAG's pipeline: ``(spark, context)``, running ``tasks`` in order."""

    def run_dag(spark: Any, context: RunContext) -> Iterator[Metadata]:
        return run_tasks(dag, tasks, spark, context)

    run_dag.__qualname__ = run_dag.__name__ = f"dag_{dag.dag_id}"
    return run_dag


def run_tasks(
    dag: DagLike, tasks: Sequence[TaskLike], spark: Any, run: RunContext
) -> Iterator[Metadata]:
    """Run ``tasks`` one after another; the ``Metadata`` they yield is yielded on to the
    run. The first task that raises ends the run (its error is the run's)."""
    xcoms = XComs()
    unprovided = dag.unprovided
    shared = {
        "dag": dag,
        "dag_run": DagRun(
            dag.dag_id, run.run_id, run_type(run.run_id), dict(run.params), unprovided
        ),
        "run_id": run.run_id,
        "outlet_events": run.outlet_events,
        "inlet_events": InletEvents(run.inlet_events),
        "triggering_asset_events": TriggeringEvents(run.triggering_asset_events),
        **{name: None for name in LOGICAL_DATE_NAMES if name not in unprovided},
        "spark": spark,
    }
    given = given_params(run.params, dag.params)
    for task in tasks:
        ti = TaskInstance(task, dag, run, xcoms)
        context = Context(shared, unprovided)
        context.update(
            ti=ti,
            task_instance=ti,
            task=task,
            # Airflow's order: the DAG's params, the task's own, then what the trigger gave.
            params={**run.params, **task.settings.params, **given},
            inlets=task.inlets,
            outlets=task.outlets,
        )
        _say(f"task {task.task_id} started")
        result = yield from _run_task(task, context, TaskRun(xcoms, context))
        _push(task, xcoms, result)
        _say(f"task {task.task_id} succeeded")


def given_params(params: Mapping[str, Any], defaults: Mapping[str, Any]) -> dict[str, Any]:
    """Of a run's ``params`` (the DAG's ``defaults`` with what the trigger gave over them),
    those the trigger gave: a name the DAG has no default for, or a value other than its
    default. A given value equal to the default cannot be told from it, and counts as not
    given."""
    return {
        name: value
        for name, value in params.items()
        if name not in defaults or value != defaults[name]
    }


def _run_task(task: TaskLike, context: Context, run: TaskRun) -> Generator[Metadata, None, Any]:
    settings = task.settings
    token = _current.set(context)
    try:
        with time_limit(settings.timeout_s, task.task_id):
            if settings.pre_execute is not None:
                settings.pre_execute(context)
            result = task.execute(context, run)
            if inspect.isgenerator(result):
                result = yield from _metadata(
                    task, typing.cast("Generator[Any, None, Any]", result)
                )
            if settings.post_execute is not None:
                settings.post_execute(context, result)
            return result
    finally:
        _current.reset(token)


def _metadata(
    task: TaskLike, produced: Generator[Any, None, Any]
) -> Generator[Metadata, None, Any]:
    """Yield on what ``produced`` yields, all ``Metadata``; its return value."""
    while True:
        try:
            item = next(produced)
        except StopIteration as end:
            return end.value
        if not isinstance(item, Metadata):
            raise TypeError(
                f"task {task.task_id!r} may only yield Metadata, got {type(item).__name__}"
            )
        yield item


def _push(task: TaskLike, xcoms: XComs, result: Any) -> None:
    if not task.settings.do_xcom_push:
        return
    xcoms.push(task.task_id, RETURN_VALUE, result)
    if task.multiple_outputs and result is not None:
        if not isinstance(result, Mapping) or not all(isinstance(k, str) for k in result):
            raise TypeError(
                f"task {task.task_id!r} has multiple_outputs and returned {result!r}; it must "
                "return a dict with string keys"
            )
        for key, value in result.items():
            xcoms.push(task.task_id, key, value)


def resolve(value: Any, run: TaskRun) -> Any:
    """``value`` with every task output (and ``@dag`` parameter) in it replaced by its value
    in this run, inside lists, tuples, sets and dicts."""
    # Only the shim's own placeholders (a task's output, an @dag parameter): a user's object
    # with a method of that name of its own is a value like any other.
    if isinstance(value, Placeholder):
        return value.value_in_run(run)
    if isinstance(value, list):
        return [resolve(item, run) for item in value]
    if isinstance(value, tuple):
        return tuple(resolve(item, run) for item in value)
    if isinstance(value, (set, frozenset)):
        return type(value)(resolve(item, run) for item in value)
    if isinstance(value, dict):
        return {key: resolve(item, run) for key, item in value.items()}
    return value


def call_with_context(
    function: Callable[..., Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    context: Mapping[str, Any],
) -> Any:
    """Call ``function`` with ``args`` and ``kwargs``, adding the context values its
    parameters name (all of them to a ``**kwargs``), as Airflow does."""
    return function(*args, **with_context(function, args, kwargs, context))


def with_context(
    function: Callable[..., Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    context: Mapping[str, Any],
) -> dict[str, Any]:
    """``kwargs`` and the context values ``function`` asks for that the call does not give."""
    signature = inspect.signature(function)
    bound = signature.bind_partial(*args, **kwargs).arguments
    parameters = signature.parameters.values()
    takes_all = any(p.kind is p.VAR_KEYWORD for p in parameters)
    named = {
        p.name
        for p in parameters
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name not in bound
    }
    added = {
        name: value
        for name, value in context.items()
        if name not in bound and (takes_all or name in named)
    }
    return {**added, **kwargs}


def check_call(
    owner: str,
    function: Callable[..., Any],
    args: Sequence[Any],
    kwargs: Mapping[str, Any],
    unprovided: Mapping[str, str],
    extra: frozenset[str] = frozenset(),
) -> None:
    """Raise now what calling ``function`` in a run would: a parameter naming context a run
    does not have (``unprovided``, by reason), a read of such context in its body, or a
    parameter that neither the call nor the context gives."""
    signature = inspect.signature(function)
    try:
        bound = signature.bind_partial(*args, **kwargs).arguments
    except TypeError as error:
        raise TypeError(f"{owner}: {error}") from None
    var_keyword = [p.name for p in signature.parameters.values() if p.kind is p.VAR_KEYWORD]
    _check_reads(owner, function, var_keyword[0] if var_keyword else None, unprovided)
    for parameter in signature.parameters.values():
        if parameter.name in bound or parameter.kind in (
            parameter.VAR_POSITIONAL,
            parameter.VAR_KEYWORD,
        ):
            continue
        if parameter.name in unprovided:
            raise NotSupported(
                f"{owner}: the parameter {parameter.name!r}",
                f"a triggerer run has no {parameter.name!r}: {unprovided[parameter.name]}",
            )
        if (
            parameter.default is parameter.empty
            and parameter.name not in PROVIDED
            and parameter.name not in extra
        ):
            raise TypeError(f"{owner}: missing a required argument: {parameter.name!r}")


def _check_reads(
    owner: str, function: Callable[..., Any], kwargs_name: str | None, unprovided: Mapping[str, str]
) -> None:
    """Refuse a read of context a run does not have (``unprovided``) from the function's
    ``**kwargs`` (``context["ds"]``, ``context.get("ds")``), from ``get_current_context()``
    or a variable assigned it: ``[]`` fails only when the run gets there, and ``get()`` of
    the ``**kwargs`` goes on with ``None``."""
    try:
        tree = ast.parse(textwrap.dedent(inspect.getsource(function)))
    except (OSError, TypeError, SyntaxError):
        return  # no source to read (a lambda in an expression, a builtin): checked at run time
    names = _context_variables(tree) | ({kwargs_name} if kwargs_name else set())
    for node in ast.walk(tree):
        key = _key_read(node, names)
        if key is not None and key in unprovided and isinstance(node, (ast.Subscript, ast.Call)):
            raise NotSupported(
                f"{owner}: reading {key!r} from the context (line {node.lineno} of the function)",
                f"a triggerer run has no {key!r}: {unprovided[key]}",
            )


def _context_variables(tree: ast.AST) -> set[str]:
    """The names assigned ``get_current_context()`` in ``tree``."""
    return {
        target.id
        for node in ast.walk(tree)
        if isinstance(node, (ast.Assign, ast.AnnAssign)) and _is_current_context(node.value)
        for target in (node.targets if isinstance(node, ast.Assign) else [node.target])
        if isinstance(target, ast.Name)
    }


def _is_current_context(node: ast.AST | None) -> bool:
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id == "get_current_context"
    )


def _key_read(node: ast.AST, names: set[str]) -> str | None:
    """The constant key ``node`` reads from the context: ``NAME[KEY]``, ``NAME.get(KEY)``
    (``NAME`` one of ``names``), ``get_current_context()[KEY]``."""
    target: ast.AST | None = None
    key: ast.AST | None = None
    if isinstance(node, ast.Subscript):
        target, key = node.value, node.slice
    elif (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr == "get"
        and node.args
    ):
        target, key = node.func.value, node.args[0]
    is_context = (isinstance(target, ast.Name) and target.id in names) or _is_current_context(
        target
    )
    if is_context and isinstance(key, ast.Constant) and isinstance(key.value, str):
        return key.value
    return None


@contextlib.contextmanager
def time_limit(seconds: float | None, task_id: str) -> Iterator[None]:
    """Raise :class:`TaskTimeout` in the task when it runs past ``seconds`` (a signal, as
    Airflow does; only in the main thread, where the run's tasks run)."""
    if seconds is None or threading.current_thread() is not threading.main_thread():
        yield
        return

    def expired(signum: int, frame: FrameType | None) -> None:
        raise TaskTimeout(f"task {task_id!r} timed out after {seconds:g} s (execution_timeout)")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.setitimer(signal.ITIMER_REAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)


def _say(line: str) -> None:
    """A line of the run's log (its stdout)."""
    sys.stdout.write(f"[airflow] {line}\n")
    sys.stdout.flush()
