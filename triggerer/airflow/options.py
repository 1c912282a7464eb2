"""An Airflow DAG's keyword arguments, its ``default_args`` and its tasks' settings as the
options of one triggerer pipeline: what has a meaning maps, what only describes is accepted
and ignored, and what asks for behaviour triggerer does not have is refused."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Mapping
from datetime import timedelta
from typing import Any

from triggerer.airflow.errors import NotSupported
from triggerer.assets import Asset, AssetAlias

IGNORED_DAG_KWARGS = frozenset(
    {
        "start_date",
        "catchup",
        "tags",
        "doc_md",
        "owner_links",
        "dag_display_name",
        "access_control",
        "template_searchpath",
        "template_undefined",
        "user_defined_macros",
        "user_defined_filters",
        "jinja_environment_kwargs",
        "render_template_as_native_obj",
        "max_active_tasks",
        "concurrency",
        "fail_fast",
        "auto_register",
        "disable_bundle_versioning",
        "default_view",
        "orientation",
    }
)
"""DAG arguments that describe the DAG, or ask for what a triggerer run does anyway (one task
at a time, failing at the first failed task): accepted and ignored."""

IGNORED_TASK_SETTINGS = frozenset(
    {
        "owner",
        "doc",
        "doc_md",
        "doc_json",
        "doc_yaml",
        "doc_rst",
        "task_display_name",
        "pool",
        "pool_slots",
        "queue",
        "priority_weight",
        "weight_rule",
        "executor",
        "executor_config",
        "max_active_tis_per_dag",
        "max_active_tis_per_dagrun",
        "task_concurrency",
        "run_as_user",
        "resources",
        "show_return_value_in_logs",
        "retry_exponential_backoff",
        "max_retry_delay",
        "start_date",
        "map_index_template",
        "allow_nested_operators",
        "logger_name",
        "ignore_first_depends_on_past",
        "wait_for_past_depends_before_skipping",
    }
)
"""Task arguments that describe the task or place it among Airflow's workers: accepted and
ignored."""

_CALLBACKS = (
    "on_failure_callback",
    "on_success_callback",
    "on_retry_callback",
    "on_execute_callback",
    "on_skipped_callback",
    "sla_miss_callback",
)
_MAPPED_TASK_SETTINGS = frozenset(
    {
        "retries",
        "retry_delay",
        "execution_timeout",
        "outlets",
        "inlets",
        "trigger_rule",
        "do_xcom_push",
        "params",
        "pre_execute",
        "post_execute",
        "depends_on_past",
        "wait_for_downstream",
        "end_date",
        "email",
        "email_on_failure",
        "email_on_retry",
        "sla",
        *_CALLBACKS,
    }
)
TASK_SETTINGS = _MAPPED_TASK_SETTINGS | IGNORED_TASK_SETTINGS
"""Every argument an operator (and ``@task``) takes besides its own."""


@dataclasses.dataclass(frozen=True)
class TaskSettings:
    """What a triggerer run makes of one task's settings."""

    retries: int = 0
    retry_delay_s: float | None = None
    timeout_s: float | None = None
    outlets: tuple[Asset | AssetAlias, ...] = ()
    inlets: tuple[Asset | AssetAlias, ...] = ()
    do_xcom_push: bool = True
    params: dict[str, Any] = dataclasses.field(default_factory=dict)
    pre_execute: Callable[..., Any] | None = None
    post_execute: Callable[..., Any] | None = None


@dataclasses.dataclass(frozen=True)
class DagOptions:
    """What a triggerer pipeline makes of a DAG's own arguments."""

    description: str | None = None
    params: dict[str, Any] = dataclasses.field(default_factory=dict)
    max_active_runs: int = 16
    timeout_s: float | None = None


class Param:
    """Airflow's ``Param(default, description=None, **schema)``: its default is the
    pipeline's param; the JSON schema is kept but not checked."""

    def __init__(self, default: Any = ..., description: str | None = None, **schema: Any):
        self.value = default
        self.description = description
        self.schema = schema

    @property
    def has_default(self) -> bool:
        return self.value is not ...

    def __repr__(self) -> str:
        shown = "no default" if not self.has_default else repr(self.value)
        return f"Param({shown})"


def dag_options(dag_id: str, kwargs: Mapping[str, Any]) -> DagOptions:
    """The options of ``DAG(dag_id, **kwargs)``, every argument other than ``schedule`` and
    ``default_args`` checked; an argument Airflow does not know is a TypeError as there."""
    for name, value in kwargs.items():
        if name in IGNORED_DAG_KWARGS or name in ("description", "params", "max_active_runs"):
            continue
        if name == "dagrun_timeout":
            continue
        if name in _CALLBACKS or name == "deadline":
            _refuse_if_set(
                f"DAG({dag_id!r}, {name}=...)",
                value,
                "triggerer calls no callback "
                "of a DAG; a listener hears of runs (docs/listeners.md)",
            )
        elif name == "end_date":
            _refuse_if_set(
                f"DAG({dag_id!r}, end_date=...)",
                value,
                "triggerer has no date after which a pipeline stops running",
            )
        elif name == "is_paused_upon_creation":
            if value:
                raise NotSupported(
                    f"DAG({dag_id!r}, is_paused_upon_creation=True)",
                    "a pipeline starts unpaused; pause it with 'triggerer pipelines pause'",
                )
        elif name == "max_consecutive_failed_dag_runs":
            if value:
                raise NotSupported(
                    f"DAG({dag_id!r}, max_consecutive_failed_dag_runs={value!r})",
                    "triggerer does not pause a pipeline after failed runs",
                )
        else:
            raise TypeError(f"DAG({dag_id!r}) got an unexpected keyword argument {name!r}")
    params = kwargs.get("params") or {}
    if not isinstance(params, Mapping):
        raise TypeError(f"DAG({dag_id!r}) params must be a dict, got {type(params).__name__}")
    return DagOptions(
        description=kwargs.get("description"),
        params={name: param_default(dag_id, name, value) for name, value in params.items()},
        max_active_runs=kwargs.get("max_active_runs", 16),
        timeout_s=seconds(kwargs.get("dagrun_timeout"), f"DAG({dag_id!r}) dagrun_timeout"),
    )


def param_default(where: str, name: str, value: Any) -> Any:
    """The value a param has in a run: its default, or the plain value given."""
    if not isinstance(value, Param):
        return value
    if not value.has_default:
        raise NotSupported(
            f"{where}: params[{name!r}] = {value!r}",
            "a param needs a default: a run started by assets or by cron has no form to ask "
            "for its value",
        )
    return value.value


def check_default_args(dag_id: str, default_args: Mapping[str, Any]) -> None:
    """Refuse in ``default_args`` what every task would refuse, at the DAG's line. Keys no
    operator takes are ignored, as Airflow ignores them."""
    if not isinstance(default_args, Mapping):
        raise TypeError(f"DAG({dag_id!r}) default_args must be a dict")
    task_settings(f"DAG({dag_id!r}) default_args", {}, default_args)


def task_settings(
    owner: str, given: Mapping[str, Any], default_args: Mapping[str, Any]
) -> TaskSettings:
    """The settings of a task made as ``owner`` (``BashOperator(task_id='x')``) with the
    arguments ``given``, ``default_args`` filling in what it does not give."""
    values = {name: value for name, value in default_args.items() if name in _MAPPED_TASK_SETTINGS}
    values.update({name: value for name, value in given.items() if name in TASK_SETTINGS})
    for name in _CALLBACKS:
        _refuse_if_set(
            f"{owner}: {name}",
            values.get(name),
            "triggerer calls no callback of a task; a listener hears of runs (docs/listeners.md)",
        )
    _refuse_if_set(f"{owner}: sla", values.get("sla"), "triggerer has no SLAs")
    _refuse_if_set(
        f"{owner}: end_date",
        values.get("end_date"),
        "triggerer has no date after which a task stops running",
    )
    for name in ("depends_on_past", "wait_for_downstream"):
        if values.get(name):
            raise NotSupported(
                f"{owner}: {name}=True", "a run does not wait for the runs before it"
            )
    rule = str(getattr(values.get("trigger_rule"), "value", values.get("trigger_rule")))
    if values.get("trigger_rule") is not None and rule != "all_success":
        raise NotSupported(
            f"{owner}: trigger_rule={rule!r}",
            "a run stops at its first failed task, so every task runs only "
            "when all before it succeeded (all_success)",
        )
    if values.get("email") and (
        values.get("email_on_failure", True) or values.get("email_on_retry", True)
    ):
        raise NotSupported(
            f"{owner}: email={values['email']!r}",
            "triggerer sends no mail; set email_on_failure=False and "
            "email_on_retry=False, or hear of failed runs through a listener "
            "(docs/listeners.md)",
        )
    retries = values.get("retries", 0) or 0
    if not isinstance(retries, int) or isinstance(retries, bool) or retries < 0:
        raise ValueError(f"{owner}: retries={retries!r} must be an integer >= 0")
    params = values.get("params") or {}
    return TaskSettings(
        retries=retries,
        retry_delay_s=seconds(values.get("retry_delay"), f"{owner}: retry_delay"),
        timeout_s=seconds(values.get("execution_timeout"), f"{owner}: execution_timeout"),
        outlets=assets_of(owner, "outlets", values.get("outlets")),
        inlets=assets_of(owner, "inlets", values.get("inlets")),
        do_xcom_push=bool(values.get("do_xcom_push", True)),
        params={name: param_default(owner, name, value) for name, value in params.items()},
        pre_execute=values.get("pre_execute"),
        post_execute=values.get("post_execute"),
    )


def pipeline_options(dag: DagOptions, tasks: Iterable[TaskSettings]) -> dict[str, Any]:
    """The keyword arguments of the :class:`~triggerer.pipelines.Pipeline` of a DAG with
    these tasks. A run is tried again as a whole, as often as its most retried task asks,
    after the longest delay of those tasks."""
    settings = list(tasks)
    outlets: dict[Asset | AssetAlias, None] = {}
    inlets: dict[Asset | AssetAlias, None] = {}
    for task in settings:
        outlets.update(dict.fromkeys(task.outlets))
        inlets.update(dict.fromkeys(task.inlets))
    retries = max((task.retries for task in settings), default=0)
    delays = [
        task.retry_delay_s
        for task in settings
        if task.retries == retries and task.retry_delay_s is not None
    ]
    options: dict[str, Any] = {
        "outlets": list(outlets),
        "inlets": list(inlets),
        "retries": retries,
        "max_active_runs": dag.max_active_runs,
        "timeout_s": dag.timeout_s,
        "params": dag.params,
        "description": dag.description,
    }
    if retries and delays:
        options["retry_delay_s"] = max(delays)
    elif retries:
        options["retry_delay_s"] = AIRFLOW_RETRY_DELAY_S
    return options


AIRFLOW_RETRY_DELAY_S = 300.0
"""Airflow's default ``retry_delay``: five minutes."""


def seconds(value: object, what: str) -> float | None:
    """A duration given as a ``timedelta`` or a number of seconds, in seconds."""
    if value is None:
        return None
    if isinstance(value, timedelta):
        return value.total_seconds()
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    raise TypeError(f"{what}={value!r} must be a timedelta or a number of seconds")


def assets_of(owner: str, name: str, value: object) -> tuple[Asset | AssetAlias, ...]:
    """A task's ``outlets`` or ``inlets``: assets and aliases, one or a list of them."""
    if value is None:
        return ()
    items = [value] if isinstance(value, (Asset, AssetAlias)) else value
    if not isinstance(items, (list, tuple, set)):
        raise TypeError(f"{owner}: {name} must be a list of assets, got {value!r}")
    for item in items:
        if not isinstance(item, (Asset, AssetAlias)):
            raise NotSupported(
                f"{owner}: {name} holding {item!r}",
                "a task's inlets and outlets are assets and asset aliases",
            )
    return tuple(items)


def _refuse_if_set(construct: str, value: object, why: str) -> None:
    if value is not None and value != [] and value != ():
        raise NotSupported(construct, why)
