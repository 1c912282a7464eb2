"""Pipelines: a PySpark function (or script) with a schedule, inlets and outlets."""

from __future__ import annotations

import contextlib
import dataclasses
import inspect
import math
import re
from collections.abc import Callable, Iterator, Sequence
from typing import Any, Literal

from triggerer.assets import Asset, AssetAlias, BaseAsset, json_mapping
from triggerer.schedules import (
    AssetOrTimeSchedule,
    Batch,
    CronPartitionTimetable,
    CronSchedule,
    PartitionedAssetTimetable,
    Schedule,
    as_condition,
)
from triggerer.sites import Site, caller_site, module_sites

RunPolicy = Literal["coalesce", "per_event"]
_PIPELINE_ID = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,249}$")


@dataclasses.dataclass(frozen=True)
class Metadata:
    """Yielded by a pipeline function to attach ``extra`` to the outlet event of ``asset``.

    With ``alias`` (an :class:`AssetAlias` or its name), the event is emitted through that
    alias (and ``asset`` is added to it).
    """

    asset: Asset
    extra: dict[str, Any]
    alias: AssetAlias | None = None

    def __init__(
        self, asset: Asset, extra: dict[str, Any], alias: AssetAlias | str | None = None
    ) -> None:
        if not isinstance(asset, Asset):
            raise TypeError(f"Metadata asset must be an Asset, got {type(asset).__name__}")
        json_mapping(extra, f"Metadata({asset!r}) extra")
        if isinstance(alias, str):
            alias = AssetAlias(alias)
        if alias is not None and not isinstance(alias, AssetAlias):
            raise TypeError(
                "Metadata alias must be an AssetAlias or an alias's name, "
                f"got {type(alias).__name__}"
            )
        object.__setattr__(self, "asset", asset)
        object.__setattr__(self, "extra", extra)
        object.__setattr__(self, "alias", alias)


@dataclasses.dataclass(frozen=True, eq=False)
class Pipeline:
    """A unit of PySpark work the scheduler starts.

    Exactly one of ``function`` (called as ``function(spark, context)``) and ``application``
    (a PySpark script run with spark-submit semantics) is given.
    """

    pipeline_id: str
    schedule: Schedule | None = None
    function: Callable[..., Any] | None = None
    application: str | None = None
    outlets: tuple[Asset | AssetAlias, ...] = ()
    inlets: tuple[Asset | AssetAlias, ...] = ()
    max_active_runs: int = 16
    run_policy: RunPolicy = "coalesce"
    max_events_per_run: int | None = None
    batch: Batch | None = None
    debounce_s: float | None = None
    max_backlog: int | None = None
    retries: int = 0
    retry_delay_s: float = 10.0
    timeout_s: float | None = None
    spark_conf: dict[str, str] = dataclasses.field(default_factory=dict)
    params: dict[str, Any] = dataclasses.field(default_factory=dict)
    description: str | None = None
    fileloc: str | None = None
    defined_at: Site | None = None

    def __init__(
        self,
        pipeline_id: str,
        *,
        schedule: str | BaseAsset | Sequence[BaseAsset] | Schedule | None = None,
        function: Callable[..., Any] | None = None,
        application: str | None = None,
        outlets: Sequence[Asset | AssetAlias] = (),
        inlets: Sequence[Asset | AssetAlias] = (),
        max_active_runs: int = 16,
        run_policy: RunPolicy = "coalesce",
        max_events_per_run: int | None = None,
        batch: Batch | None = None,
        debounce_s: float | None = None,
        max_backlog: int | None = None,
        retries: int = 0,
        retry_delay_s: float = 10.0,
        timeout_s: float | None = None,
        spark_conf: dict[str, str] | None = None,
        params: dict[str, Any] | None = None,
        description: str | None = None,
        fileloc: str | None = None,
        defined_at: Site | None = None,
    ) -> None:
        """``fileloc`` is the pipeline file that holds it (the loader sets it); ``defined_at``
        the file and line of its definition (by default, the code that calls this)."""
        if not isinstance(pipeline_id, str) or not _PIPELINE_ID.match(pipeline_id):
            raise ValueError(
                f"pipeline_id {pipeline_id!r} must be 1-250 characters of letters, digits, "
                "'_', '.', '-', not starting with '.' or '-'"
            )
        if (function is None) == (application is None):
            raise TypeError(f"pipeline {pipeline_id!r} needs exactly one of function, application")
        if function is not None:
            _check_callable(pipeline_id, function)
        if run_policy not in ("coalesce", "per_event"):
            raise ValueError(
                f"pipeline {pipeline_id!r}: run_policy={run_policy!r}; "
                "use 'coalesce' or 'per_event'"
            )
        for name, value, minimum in (
            ("max_active_runs", max_active_runs, 1),
            ("retries", retries, 0),
            ("max_events_per_run", max_events_per_run, 1),
            ("max_backlog", max_backlog, 1),
        ):
            if value is not None and (
                not isinstance(value, int) or isinstance(value, bool) or value < minimum
            ):
                raise ValueError(
                    f"pipeline {pipeline_id!r}: {name}={value!r}; must be an integer >= {minimum}"
                )
        if (
            not isinstance(retry_delay_s, (int, float))
            or isinstance(retry_delay_s, bool)
            or not 0 <= retry_delay_s < math.inf
        ):
            raise ValueError(
                f"pipeline {pipeline_id!r}: retry_delay_s={retry_delay_s!r}; must be a number "
                "of seconds >= 0, e.g. retry_delay_s=300 for five minutes"
            )
        if timeout_s is not None and (
            not isinstance(timeout_s, (int, float))
            or isinstance(timeout_s, bool)
            or not 0 < timeout_s < math.inf
        ):
            raise ValueError(
                f"pipeline {pipeline_id!r}: timeout_s={timeout_s!r}; must be a number of seconds "
                "above 0, e.g. timeout_s=3600 for an hour (or None: no limit)"
            )
        _check_timing(pipeline_id, schedule, run_policy, max_events_per_run, batch, debounce_s)
        if params is not None:
            json_mapping(params, f"pipeline {pipeline_id!r} params")
        for name, items in (("outlets", outlets), ("inlets", inlets)):
            if isinstance(items, BaseAsset):
                raise TypeError(
                    f"pipeline {pipeline_id!r}: {name} must be a list, e.g. [{items!r}]"
                )
        for outlet in outlets:
            if not isinstance(outlet, (Asset, AssetAlias)):
                raise TypeError(
                    f"pipeline {pipeline_id!r} outlets must be Asset or AssetAlias, "
                    f"got {type(outlet).__name__}"
                )
        for inlet in inlets:
            if not isinstance(inlet, (Asset, AssetAlias)):
                raise TypeError(
                    f"pipeline {pipeline_id!r} inlets must be Asset or AssetAlias, "
                    f"got {type(inlet).__name__}"
                )
        values: dict[str, object] = {
            "pipeline_id": pipeline_id,
            "schedule": normalize_schedule(schedule),
            "function": function,
            "application": application,
            "outlets": tuple(outlets),
            "inlets": tuple(inlets),
            "max_active_runs": max_active_runs,
            "run_policy": run_policy,
            "max_events_per_run": max_events_per_run,
            "batch": batch,
            "debounce_s": debounce_s,
            "max_backlog": max_backlog,
            "retries": retries,
            "retry_delay_s": retry_delay_s,
            "timeout_s": timeout_s,
            "spark_conf": dict(spark_conf or {}),
            "params": dict(params or {}),
            "description": description,
            "fileloc": fileloc,
            "defined_at": defined_at or caller_site(),
        }
        for field_name, field_value in values.items():
            object.__setattr__(self, field_name, field_value)
        if _recording is not None:
            _recording.made.append(self)
            _recording.modules[id(self)] = module_sites()

    @property
    def condition(self) -> BaseAsset | None:
        """The asset condition of the schedule, if it has one."""
        if isinstance(self.schedule, BaseAsset):
            return self.schedule
        if isinstance(self.schedule, (AssetOrTimeSchedule, PartitionedAssetTimetable)):
            return self.schedule.assets
        return None

    @property
    def cron(self) -> str | None:
        """The cron expression of the schedule, if it has one."""
        if isinstance(self.schedule, (CronSchedule, AssetOrTimeSchedule, CronPartitionTimetable)):
            return self.schedule.cron
        return None

    def iter_assets(self) -> Iterator[Asset]:
        """Every asset the pipeline names: schedule, inlets and outlets."""
        if self.condition is not None:
            yield from self.condition.iter_assets()
        yield from (inlet for inlet in self.inlets if isinstance(inlet, Asset))
        yield from (outlet for outlet in self.outlets if isinstance(outlet, Asset))

    def __repr__(self) -> str:
        return f"<Pipeline {self.pipeline_id!r} schedule={self.schedule}>"


def _check_callable(pipeline_id: str, function: Callable[..., Any]) -> None:
    """A pipeline function is called as ``function(spark, context)``: refuse one that cannot
    be, when it is defined rather than when it first runs."""
    if not callable(function):
        raise TypeError(f"pipeline {pipeline_id!r}: function={function!r} is not callable")
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):  # a builtin or C function without a signature to check
        return
    try:
        signature.bind(None, None)
    except TypeError as error:
        name = getattr(function, "__name__", repr(function))
        raise TypeError(
            f"pipeline {pipeline_id!r}: {name}{signature} cannot be called with the run's "
            f"(spark, context) ({error}); write it as def {name}(spark, context)"
        ) from None


def _check_timing(
    pipeline_id: str,
    schedule: object,
    run_policy: str,
    max_events_per_run: int | None,
    batch: object,
    debounce_s: object,
) -> None:
    """A ``batch`` and a ``debounce_s`` hold back runs of an asset condition: refuse them
    where they mean nothing or contradict another option."""
    where = f"pipeline {pipeline_id!r}"
    if batch is not None and not isinstance(batch, Batch):
        raise TypeError(
            f"{where}: batch={batch!r} must be a Batch, e.g. "
            "batch=Batch(max_events=500, max_wait_s=60)"
        )
    if debounce_s is not None and not (
        isinstance(debounce_s, (int, float))
        and not isinstance(debounce_s, bool)
        and 0 < debounce_s < math.inf
    ):
        raise ValueError(
            f"{where}: debounce_s={debounce_s!r}; must be a number of seconds above 0, "
            "e.g. debounce_s=30"
        )
    timed = [
        f"{name}={value!r}"
        for name, value in (("batch", batch), ("debounce_s", debounce_s))
        if value is not None
    ]
    if not timed:
        return
    if isinstance(schedule, (str, CronSchedule, CronPartitionTimetable)) or schedule is None:
        raise ValueError(
            f"{where}: {timed[0]} holds back runs of assets, and schedule={schedule!r} names "
            "none; schedule on assets, e.g. schedule=Asset('orders')"
        )
    if batch is not None and run_policy == "per_event":
        raise ValueError(
            f"{where}: batch={batch!r} with run_policy='per_event': a per-event run takes one "
            "event per asset, a batch many; use run_policy='coalesce'"
        )
    if batch is not None and max_events_per_run is not None:
        raise ValueError(
            f"{where}: batch={batch!r} with max_events_per_run={max_events_per_run}: the "
            "batch's max_events bounds a run's events; give one of them"
        )


def normalize_schedule(schedule: object) -> Schedule | None:
    """The schedule object for any accepted ``schedule=`` value; anything else is a TypeError."""
    if schedule is None or isinstance(
        schedule,
        (
            BaseAsset,
            CronSchedule,
            AssetOrTimeSchedule,
            PartitionedAssetTimetable,
            CronPartitionTimetable,
        ),
    ):
        return schedule
    if isinstance(schedule, str):
        return CronSchedule(schedule)
    if isinstance(schedule, (list, tuple)):
        return as_condition(schedule)
    raise TypeError(
        f"schedule={schedule!r} is not supported: use None, a cron string, an Asset, an "
        "AssetAlias, a list or expression of them, or a schedule class"
    )


def pipeline(
    pipeline_id: str | None = None, **options: Any
) -> Callable[[Callable[..., Any]], Pipeline]:
    """Make a :class:`Pipeline` of a function ``fn(spark, context)``; the id defaults to its name.

    ``options`` are the keyword arguments of :class:`Pipeline`.
    """

    if callable(pipeline_id):
        raise TypeError("use the decorator with parentheses: @pipeline(schedule=...)")

    def decorate(function: Callable[..., Any]) -> Pipeline:
        settings = {"description": (function.__doc__ or "").strip() or None, **options}
        return Pipeline(pipeline_id or function.__name__, function=function, **settings)

    return decorate


@dataclasses.dataclass
class Recording:
    """The pipelines made while one pipeline file is imported, and those it declares."""

    made: list[Pipeline] = dataclasses.field(default_factory=list)
    declared: list[Pipeline] = dataclasses.field(default_factory=list)
    modules: dict[int, tuple[Site, ...]] = dataclasses.field(default_factory=dict)
    """By ``id()`` of each pipeline made or declared: the modules whose top-level code was
    running as it was declared, or else made (:func:`triggerer.sites.module_sites`), which say
    whether the file's own code made it, or a module's import, and at which line of the file."""


_recording: Recording | None = None


@contextlib.contextmanager
def recording() -> Iterator[Recording]:
    """Record the pipelines made and declared until the block ends (the loader, around the
    import of one file)."""
    global _recording  # one file is imported at a time
    outer, _recording = _recording, Recording()
    try:
        yield _recording
    finally:
        _recording = outer


def declare(pipeline: Pipeline) -> None:
    """Add ``pipeline`` to the pipeline file being imported, as a module-level name holding it
    would (for definitions that no name holds: a DAG of an Airflow file). Outside the loader's
    import of a file, nothing happens."""
    if _recording is not None:
        _recording.declared.append(pipeline)
        _recording.modules[id(pipeline)] = module_sites()
