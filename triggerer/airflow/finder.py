"""The module finder that gives a pipeline file the ``airflow.*`` modules it imports when
Airflow itself is not installed: each a small module whose names come from the shim (or
triggerer's SDK), imported when first asked for; a name or a module not provided is an
import error naming it."""

from __future__ import annotations

import dataclasses
import importlib
import importlib.abc
import importlib.machinery
import os
import sys
import sysconfig
from collections.abc import Mapping, Sequence
from types import FrameType, ModuleType
from typing import Any

from triggerer.airflow.errors import DOCS, ModuleNotProvided, NotSupported
from triggerer.airflow.mixing import check_file


@dataclasses.dataclass(frozen=True)
class Provided:
    """One ``airflow.*`` module: its names (each ``"module:attribute"``), the names refused
    with the reason, and whether it is a package."""

    names: Mapping[str, str] = dataclasses.field(default_factory=dict)
    refused: Mapping[str, str] = dataclasses.field(default_factory=dict)
    package: bool = False


_SHIM = "triggerer.airflow"
_ASSETS = {
    "Asset": "triggerer.assets:Asset",
    "AssetAlias": "triggerer.assets:AssetAlias",
    "AssetAll": "triggerer.assets:AssetAll",
    "AssetAny": "triggerer.assets:AssetAny",
    "AssetWatcher": "triggerer.assets:AssetWatcher",
    "BaseAsset": "triggerer.assets:BaseAsset",
}
_NO_OPERATORS = "a run runs PythonOperator, BashOperator, EmptyOperator and @task functions"
_NO_TASK_GROUPS = "tasks run one after another in one run; group them in a function instead"
_NO_BRANCHES = "every task of a run runs, after all before it succeeded: no branch is skipped"
_NO_SETUP = "a run has no setup or teardown tasks"
_NO_AIRFLOW_STATE = "triggerer has no Airflow variables, connections or object storage"
_SDK_REFUSED = {
    "BaseOperator": "an operator of one's own is not run; " + _NO_OPERATORS,
    "BaseSensorOperator": "a run does not wait on sensors; schedule on an asset instead",
    "PokeReturnValue": "a run does not wait on sensors; schedule on an asset instead",
    "TaskGroup": _NO_TASK_GROUPS,
    "task_group": _NO_TASK_GROUPS,
    "setup": _NO_SETUP,
    "teardown": _NO_SETUP,
    "Label": "edge labels belong to Airflow's graph view",
    "EdgeModifier": "edge labels belong to Airflow's graph view",
    "Variable": _NO_AIRFLOW_STATE,
    "Connection": _NO_AIRFLOW_STATE,
    "ObjectStoragePath": _NO_AIRFLOW_STATE,
    "SecretCache": _NO_AIRFLOW_STATE,
    "asset": "the @asset shorthand is not mapped; write the DAG with a @task and outlets",
    "BaseNotifier": "triggerer sends no notifications; a listener hears of runs",
    "BaseOperatorLink": "operator links belong to Airflow's UI",
    "literal": "a run does not render templates",
    "get_parsing_context": "a run does not parse DAGs",
}
_PYTHON_REFUSED = dict.fromkeys(
    (
        "BranchPythonOperator",
        "ShortCircuitOperator",
        "BranchPythonVirtualenvOperator",
        "BranchExternalPythonOperator",
    ),
    _NO_BRANCHES,
) | dict.fromkeys(
    ("PythonVirtualenvOperator", "ExternalPythonOperator"),
    "a run runs Python in its own process, where its SparkSession is",
)
_PYTHON = {
    "PythonOperator": f"{_SHIM}.operators:PythonOperator",
    "get_current_context": f"{_SHIM}.executor:get_current_context",
}
_BASH = {"BashOperator": f"{_SHIM}.operators:BashOperator"}
_EMPTY = {"EmptyOperator": f"{_SHIM}.operators:EmptyOperator"}
_PACKAGE = Provided(package=True)

MODULES: dict[str, Provided] = {
    "airflow": Provided({"DAG": f"{_SHIM}.graph:DAG"}, package=True),
    "airflow.sdk": Provided(
        {
            **_ASSETS,
            "DAG": f"{_SHIM}.graph:DAG",
            "dag": f"{_SHIM}.decorators:dag",
            "task": f"{_SHIM}.decorators:task",
            "chain": f"{_SHIM}.graph:chain",
            "chain_linear": f"{_SHIM}.graph:chain_linear",
            "cross_downstream": f"{_SHIM}.graph:cross_downstream",
            "XComArg": f"{_SHIM}.graph:XComArg",
            "Metadata": "triggerer.pipelines:Metadata",
            "Param": f"{_SHIM}.options:Param",
            "Context": f"{_SHIM}.executor:Context",
            "get_current_context": f"{_SHIM}.executor:get_current_context",
        },
        _SDK_REFUSED,
        package=True,
    ),
    "airflow.sdk.definitions": _PACKAGE,
    "airflow.sdk.definitions.asset": Provided(_ASSETS, package=True),
    "airflow.sdk.definitions.asset.metadata": Provided(
        {"Metadata": "triggerer.pipelines:Metadata"}
    ),
    "airflow.sdk.definitions.param": Provided({"Param": f"{_SHIM}.options:Param"}),
    "airflow.decorators": Provided(
        {"dag": f"{_SHIM}.decorators:dag", "task": f"{_SHIM}.decorators:task"},
        {name: _SDK_REFUSED[name] for name in ("task_group", "setup", "teardown")},
        package=True,
    ),
    "airflow.triggers": _PACKAGE,
    "airflow.triggers.base": Provided(
        {
            "BaseEventTrigger": f"{_SHIM}.triggers:BaseEventTrigger",
            "TriggerEvent": "triggerer.triggers:TriggerEvent",
        },
        {"BaseTrigger": "only a BaseEventTrigger can watch an asset (Airflow's rule too)"},
    ),
    "airflow.providers": _PACKAGE,
    "airflow.providers.common": _PACKAGE,
    "airflow.providers.common.messaging": _PACKAGE,
    "airflow.providers.common.messaging.triggers": _PACKAGE,
    "airflow.providers.common.messaging.triggers.msg_queue": Provided(
        {"MessageQueueTrigger": f"{_SHIM}.messaging:MessageQueueTrigger"}
    ),
    "airflow.providers.standard": _PACKAGE,
    "airflow.providers.standard.operators": _PACKAGE,
    "airflow.providers.standard.operators.python": Provided(_PYTHON, _PYTHON_REFUSED),
    "airflow.providers.standard.operators.bash": Provided(_BASH),
    "airflow.providers.standard.operators.empty": Provided(_EMPTY),
    # Airflow 2's homes of the same.
    "airflow.operators": _PACKAGE,
    "airflow.operators.python": Provided(_PYTHON, _PYTHON_REFUSED),
    "airflow.operators.bash": Provided(_BASH),
    "airflow.operators.empty": Provided(_EMPTY),
    "airflow.timetables": _PACKAGE,
    "airflow.timetables.assets": Provided(
        {"AssetOrTimeSchedule": f"{_SHIM}.schedules:AssetOrTimeSchedule"}
    ),
    "airflow.timetables.trigger": Provided(
        {"CronTriggerTimetable": f"{_SHIM}.schedules:CronTriggerTimetable"},
        dict.fromkeys(
            ("MultipleCronTriggerTimetable", "DeltaTriggerTimetable"),
            "the time part of a schedule is one cron expression in UTC",
        ),
    ),
}
"""Every ``airflow.*`` module the shim provides."""

_LIBRARIES = tuple(
    os.path.join(path, "")
    for path in {sysconfig.get_paths()[key] for key in ("stdlib", "purelib", "platlib")}
)
_IMPORTLIB = os.path.join(os.path.dirname(importlib.__file__), "")


class AirflowFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds ``airflow`` and its modules for pipeline files when no other finder does (it is
    last on ``sys.meta_path``, so an installed Airflow wins). A library that looks for
    Airflow does not find this one."""

    def __init__(self) -> None:
        self.made: set[str] = set()

    def find_spec(
        self,
        fullname: str,
        path: Sequence[str] | None,
        target: ModuleType | None = None,
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != "airflow" and not fullname.startswith("airflow."):
            return None
        if fullname != "airflow" and sys.modules.get("airflow") is not self._made("airflow"):
            return None  # another Airflow (or none) is imported: not this finder's module
        importer = _importer(sys._getframe(1))
        if importer is None or importer.startswith(_LIBRARIES):
            return None
        if fullname == "airflow" and os.path.isfile(importer):
            check_file(importer)  # the file's first Airflow import since it started loading
        provided = MODULES.get(fullname)
        if provided is None:
            raise ModuleNotProvided(_requested(sys._getframe(1), fullname))
        return importlib.machinery.ModuleSpec(fullname, self, is_package=provided.package)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return None

    def exec_module(self, module: ModuleType) -> None:
        name = module.__name__
        provided = MODULES[name]
        module.__dict__["__all__"] = list(provided.names)
        module.__dict__["__getattr__"] = _attributes(name, provided, module)
        self.made.add(name)

    def forget(self) -> None:
        """Drop the modules made so far from ``sys.modules``: the next file's first Airflow
        import comes here again, and its file is checked."""
        for name in self.made:
            module = sys.modules.get(name)
            if module is not None and getattr(module, "__loader__", None) is self:
                del sys.modules[name]
        self.made.clear()

    def _made(self, name: str) -> ModuleType | None:
        module = sys.modules.get(name)
        return module if getattr(module, "__loader__", None) is self else None


def _attributes(name: str, provided: Provided, module: ModuleType) -> Any:
    def attribute(attribute: str) -> Any:
        if attribute.startswith("__") or f"{name}.{attribute}" in MODULES:
            # A submodule not imported yet: ``from package import submodule`` imports it.
            raise AttributeError(f"module {name!r} has no attribute {attribute!r}")
        home = provided.names.get(attribute)
        if home is not None:
            module_name, _, value_name = home.partition(":")
            value = getattr(importlib.import_module(module_name), value_name)
            module.__dict__[attribute] = value  # found once: later lookups skip this function
            return value
        if attribute in provided.refused:
            raise NotSupported(f"{name}.{attribute}", provided.refused[attribute])
        raise ImportError(
            f"{name}.{attribute} is not provided: Airflow is not installed, and triggerer's "
            f"Airflow compatibility covers only what {DOCS} lists",
            name=name,
        )

    return attribute


def _importer(frame: FrameType | None) -> str | None:
    """The file whose code is importing now: the first frame outside importlib and this
    module."""
    while frame is not None:
        filename = frame.f_code.co_filename
        if not (filename.startswith(("<frozen", _IMPORTLIB)) or filename == __file__):
            return filename
        frame = frame.f_back
    return None


def _requested(frame: FrameType | None, fullname: str) -> str:
    """The module the import statement asked for (``a.b.c``), of which ``fullname`` (``a.b``)
    is the first part not found: the import machinery's outermost frame names it."""
    requested = fullname
    while frame is not None:
        name = frame.f_locals.get("name") if frame.f_code.co_name == "_find_and_load" else None
        if isinstance(name, str) and name.startswith(f"{fullname}."):
            requested = name
        frame = frame.f_back
    return requested


_FINDER = AirflowFinder()


def install() -> None:
    """Make ``airflow`` importable by the pipeline file about to be imported (idempotent;
    the loader calls it before each file). Where Airflow is installed, its modules win."""
    if _FINDER not in sys.meta_path:
        sys.meta_path.append(_FINDER)
    _FINDER.forget()
