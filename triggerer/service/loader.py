"""Loading a pipelines folder: every ``.py`` file, each on its own, errors reported per file."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import importlib.util
import os
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from types import ModuleType

import structlog

from triggerer.airflow import install as install_airflow_shim
from triggerer.assets import Asset, AssetAlias, BaseAsset
from triggerer.pipelines import Pipeline, Recording, recording
from triggerer.service.file_checks import hidden_pipelines, unusable_watchers

log = structlog.get_logger(__name__)


TRACEBACK_FRAMES = 8
"""How many of a failed import's innermost frames its traceback keeps."""
TRACEBACK_CHARS = 10_000
"""Longest traceback kept (an exception's message may be a whole data set)."""


@dataclasses.dataclass(frozen=True)
class LoadError:
    """Why one file (or one definition in it) could not be loaded: ``line`` is the line in
    the file where its import failed, when known, and ``traceback`` the traceback's last frames
    from the file on (both ``None`` for what no import raised)."""

    path: str
    line: int | None
    message: str
    traceback: str | None = dataclasses.field(default=None, compare=False)

    def __str__(self) -> str:
        where = f"{self.path}:{self.line}" if self.line else self.path
        return f"{where}: {self.message}"


@dataclasses.dataclass
class LoadedPipelines:
    """What a pipelines folder defines."""

    pipelines: dict[str, Pipeline] = dataclasses.field(default_factory=dict)
    assets: dict[Asset, Asset] = dataclasses.field(default_factory=dict)
    aliases: set[AssetAlias] = dataclasses.field(default_factory=set)
    errors: list[LoadError] = dataclasses.field(default_factory=list)


def load_pipelines(
    folder: Path, on_import: Callable[[Path], object] | None = None
) -> LoadedPipelines:
    """Import every ``.py`` file under ``folder`` (sorted) and collect its definitions;
    ``on_import`` hears of each file as its import starts. See :class:`PipelinesFolder`."""
    return PipelinesFolder(folder).load(on_import)


@dataclasses.dataclass(frozen=True)
class _File:
    """What one file defined when it was imported, and the stamp it had then."""

    stamp: tuple[int, int]
    """Its modification time (ns) and size: a file saved again differs in one of them."""
    definitions: tuple[Pipeline | BaseAsset, ...]
    errors: tuple[LoadError, ...]


class PipelinesFolder:
    """A pipelines folder, loaded again after each change: a file is imported again only when
    it changed, so a reload after a change to one of many files costs that file's import.

    A file that fails to import is reported with its path and line and skipped; a pipeline id
    defined twice is reported naming both files, and the first definition is kept.
    """

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self._files: dict[Path, _File] = {}

    def load(self, on_import: Callable[[Path], object] | None = None) -> LoadedPipelines:
        """What the folder defines now; ``on_import`` hears of each file as its import
        starts."""
        result = LoadedPipelines()
        if not self.folder.is_dir():
            result.errors.append(
                LoadError(str(self.folder), None, "pipelines folder does not exist")
            )
            return result
        files = {}
        for path in pipeline_files(self.folder, result.errors):
            files[path] = self._load_file(path, on_import)
            result.errors.extend(files[path].errors)
            _collect(files[path].definitions, path, result)
        self._files = files  # files gone from the folder are forgotten
        return result

    def _load_file(self, path: Path, on_import: Callable[[Path], object] | None) -> _File:
        try:
            status = path.stat()
            stamp = (status.st_mtime_ns, status.st_size)
        except OSError:
            stamp = (-1, -1)  # gone since the folder was listed: the import reports it
        known = self._files.get(path)
        if known is not None and known.stamp == stamp:
            return known
        if on_import is not None:
            on_import(path)
        errors: list[LoadError] = []
        definitions = _read_file(path, self.folder, errors) or ()
        return _File(stamp, definitions, tuple(errors))


def load_paths(paths: Sequence[Path]) -> LoadedPipelines:
    """What the pipeline files at ``paths`` (files, or folders of them) define together,
    each read as the daemon reads its folder; a file given alone has its own folder on the
    import path."""
    result = LoadedPipelines()
    for given in paths:
        if given.is_dir():
            files = [(path, given) for path in pipeline_files(given, result.errors)]
        elif given.is_file():
            files = [(given, given.parent)]
        else:
            result.errors.append(LoadError(str(given), None, "no such file or folder"))
            continue
        for path, folder in files:
            _collect(_read_file(path, folder, result.errors) or (), path, result)
    return result


def pipeline_files(folder: Path, errors: list[LoadError] | None = None) -> list[Path]:
    """The ``.py`` files under ``folder`` that are pipeline files, sorted: not those whose
    name, or a folder's on the way, starts with ``_`` (helpers) or ``.`` (hidden, editors'
    lock and backup files). A subfolder that cannot be listed goes to ``errors``; one removed
    while the folder is walked (a deploy, a checkout) is no longer there to list."""

    def unlisted(error: OSError) -> None:
        if errors is not None and not isinstance(error, FileNotFoundError):
            errors.append(LoadError(str(error.filename), None, f"cannot list the folder: {error}"))

    found = []
    for directory, subfolders, names in os.walk(folder, onerror=unlisted):
        subfolders[:] = [name for name in subfolders if not name.startswith((".", "_"))]
        found += [
            Path(directory, name)
            for name in names
            if name.endswith(".py") and not name.startswith((".", "_"))
        ]
    return sorted(found)


def import_pipeline_file(path: Path) -> dict[str, Pipeline]:
    """The pipelines one file defines; an import error propagates (used by a run's process)."""
    errors: list[LoadError] = []
    definitions = _read_file(path, path.parent, errors)
    if definitions is None:
        raise ImportError(str(errors[0]))
    result = LoadedPipelines()
    _collect(definitions, path, result)
    return result.pipelines


def _read_file(
    path: Path, folder: Path, errors: list[LoadError]
) -> tuple[Pipeline | BaseAsset, ...] | None:
    """Import one file: what it defines (``None`` if its import failed), and in ``errors``
    why, or why the daemon would refuse part of it."""
    with recording() as recorded:
        module = _import_file(path, folder, errors)
    if module is None:
        return None
    definitions = _definitions(module, recorded)
    origin = module.__file__ or str(path)
    found = hidden_pipelines(origin, recorded, definitions) + unusable_watchers(origin, definitions)
    errors += [LoadError(str(path), line, message) for line, message in found]
    return definitions


def _import_file(path: Path, folder: Path, errors: list[LoadError]) -> ModuleType | None:
    # A name unique per path keeps two files called jobs.py in different subfolders apart.
    digest = hashlib.sha1(str(path).encode(), usedforsecurity=False).hexdigest()[:10]
    name = f"triggerer_pipelines.{path.stem}_{digest}"
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        errors.append(LoadError(str(path), None, "not an importable Python file"))
        return None
    # The file's code, and so its frames, carry the file name the import gave it: absolute
    # (importlib makes it so), where ``path`` is relative when the folder is.
    origin = spec.origin or str(path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    # The folder is importable so pipeline files can share helper modules.
    if str(folder) not in sys.path:
        sys.path.append(str(folder))
    # An Airflow file's `import airflow...` finds triggerer's shim, checked for this file.
    install_airflow_shim()
    try:
        spec.loader.exec_module(module)
    except SyntaxError as error:
        del sys.modules[name]
        errors.append(_syntax_error(path, origin, error))
        return None
    # Importing a pipeline file runs user code; any failure is reported for that file alone.
    except Exception as error:  # noqa: BLE001
        del sys.modules[name]
        errors.append(
            LoadError(
                str(path), _line_in(origin, error), _describe(error), _traceback(origin, error)
            )
        )
        return None
    # sys.exit() or argparse's parse_args() at module level: a script, which must not end the
    # daemon (nor a run's process) either.
    except SystemExit as error:
        del sys.modules[name]
        message = (
            f"the file called exit({error.code!r}) while being imported: keep a "
            "script's own code under `if __name__ == '__main__':`"
        )
        errors.append(
            LoadError(str(path), _line_in(origin, error), message, _traceback(origin, error))
        )
        return None
    return module


def _syntax_error(path: Path, origin: str, error: SyntaxError) -> LoadError:
    """A syntax error in the file itself is at its own line; one in a module the file
    imports is reported at the file's import, naming the module's file and line."""
    kind = type(error).__name__  # IndentationError and TabError say more
    if error.filename == origin:
        return LoadError(str(path), error.lineno, f"{kind}: {error.msg}", _traceback(origin, error))
    return LoadError(
        str(path),
        _line_in(origin, error),
        f"{kind} in {error.filename}, line {error.lineno}: {error.msg}",
        _traceback(origin, error),
    )


def _definitions(module: ModuleType, recorded: Recording) -> tuple[Pipeline | BaseAsset, ...]:
    """The pipelines and assets a module defines at its top level, in its order, then the
    pipelines it declared (:func:`triggerer.pipelines.declare`)."""
    named = tuple(v for v in vars(module).values() if isinstance(v, (Pipeline, BaseAsset)))
    held = {id(definition) for definition in named}
    return named + tuple(p for p in recorded.declared if id(p) not in held)


def _collect(
    definitions: tuple[Pipeline | BaseAsset, ...], path: Path, result: LoadedPipelines
) -> None:
    """Add the ``definitions`` of the file at ``path`` to ``result``."""
    for definition in definitions:
        if isinstance(definition, Pipeline):
            _add_pipeline(dataclasses.replace(definition, fileloc=str(path)), result)
        else:
            _add_condition(definition, result)


def _add_pipeline(pipeline: Pipeline, result: LoadedPipelines) -> None:
    existing = result.pipelines.get(pipeline.pipeline_id)
    if existing is not None:
        # The same definition imported into a second file is not a second pipeline.
        reexported = _source(existing) == _source(pipeline)
        if not reexported:
            first_line = _line_in_own_file(existing)
            first = f"{existing.fileloc}:{first_line}" if first_line else existing.fileloc
            result.errors.append(
                LoadError(
                    str(pipeline.fileloc),
                    _line_in_own_file(pipeline),
                    f"pipeline id {pipeline.pipeline_id!r} is already defined at {first}; "
                    "ids must be unique (this definition is ignored)",
                )
            )
        return
    result.pipelines[pipeline.pipeline_id] = pipeline
    if pipeline.condition is not None:
        _add_condition(pipeline.condition, result)
    for outlet in pipeline.outlets:
        _add_condition(outlet, result)
    for inlet in pipeline.inlets:
        _add_condition(inlet, result)


def _source(pipeline: Pipeline) -> tuple[object, ...]:
    """Where a pipeline was defined: the same definition imported twice has one source."""
    code = getattr(pipeline.function, "__code__", None)
    if code is not None:
        return pipeline.defined_at, code.co_filename, code.co_firstlineno
    return pipeline.defined_at, pipeline.application


def _line_in_own_file(pipeline: Pipeline) -> int | None:
    """The line of ``pipeline``'s definition, when it is in the file that holds it."""
    if pipeline.defined_at is None or pipeline.fileloc is None:
        return None
    made_in, line = pipeline.defined_at
    return line if made_in == os.path.abspath(pipeline.fileloc) else None


def _add_condition(condition: BaseAsset, result: LoadedPipelines) -> None:
    for asset in condition.iter_assets():
        known = result.assets.setdefault(asset, asset)
        # One asset declared in several places: its watchers are the union of all of them,
        # on a copy (the declarations are kept for the next load, and must stay as written).
        if known is not asset and asset.watchers:
            names = {watcher.name for watcher in known.watchers}
            extra = tuple(w for w in asset.watchers if w.name not in names)
            if extra:
                merged = copy.copy(known)
                merged.watchers = known.watchers + extra
                result.assets[asset] = merged
    result.aliases.update(condition.iter_aliases())


def _line_in(origin: str, error: BaseException) -> int | None:
    """The line of the innermost frame of ``error`` in the file compiled as ``origin``."""
    lines = [f.lineno for f in traceback.extract_tb(error.__traceback__) if f.filename == origin]
    return lines[-1] if lines else None


def _traceback(origin: str, error: BaseException) -> str:
    """The traceback of ``error`` as Python prints it, from the file's first frame on (the
    loader's and importlib's frames before it say nothing about the file), at most its last
    ``TRACEBACK_FRAMES`` frames and ``TRACEBACK_CHARS`` characters."""
    frames = traceback.extract_tb(error.__traceback__)
    start = next((i for i, frame in enumerate(frames) if frame.filename == origin), len(frames))
    shown = frames[start:][-TRACEBACK_FRAMES:]
    text = "".join(traceback.format_exception_only(error))
    if shown:
        skipped = len(frames) - start - len(shown)
        head = "Traceback (most recent call last):\n"
        if skipped:
            head += f"  ... {skipped} earlier frames not shown\n"
        text = head + "".join(traceback.format_list(shown)) + text
    if len(text) > TRACEBACK_CHARS:
        text = text[: TRACEBACK_CHARS - 1] + "…"
    return text


def _describe(error: BaseException) -> str:
    return f"{type(error).__name__}: {error}"
