"""Loading a pipelines folder: every ``.py`` file, each on its own, errors reported per file."""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import importlib.util
import os
import sys
import traceback
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

import structlog

from triggerer.airflow import install as install_airflow_shim
from triggerer.assets import Asset, AssetAlias, BaseAsset
from triggerer.pipelines import Pipeline, Recording, recording
from triggerer.service.file_checks import hidden_pipelines, unusable_watchers

if TYPE_CHECKING:
    from triggerer.sites import Site

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
    made_by_their_files: dict[str, int] = dataclasses.field(
        default_factory=dict, repr=False, compare=False
    )
    """The ids of the pipelines that their file's own code made (rather than imported), each
    with the line of the file that made it."""


def load_pipelines(
    folder: Path, on_import: Callable[[Path], object] | None = None
) -> LoadedPipelines:
    """Import every ``.py`` file under ``folder`` (sorted) and collect its definitions;
    ``on_import`` hears of each file as its import starts. See :class:`PipelinesFolder`."""
    return PipelinesFolder(folder).load(on_import)


@dataclasses.dataclass(frozen=True)
class _Definitions:
    """What one file defines, in its order."""

    items: tuple[Pipeline | BaseAsset, ...] = ()
    made: Mapping[int, int] = dataclasses.field(default_factory=dict)
    """By ``id()``, each of its pipelines that the file's own code made (or declared), rather
    than imported from another module, and the line of the file that made it."""


@dataclasses.dataclass(frozen=True)
class _File:
    """What one file defined when it was imported, and the stamp it had then."""

    stamp: tuple[int, int]
    """Its modification time (ns) and size: a file saved again differs in one of them."""
    definitions: _Definitions
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
        definitions = _read_file(path, self.folder, errors) or _Definitions()
        return _File(stamp, definitions, tuple(errors))


def load_paths(paths: Sequence[Path], folder: Path | None = None) -> LoadedPipelines:
    """What the pipeline files at ``paths`` (files, or folders of them) define together,
    each read as the daemon reads its folder: a path under ``folder`` (the configured pipelines
    folder) imports with that folder on the import path, as the daemon's files do; a path
    elsewhere, with its own folder (a file's, or the folder given)."""
    result = LoadedPipelines()
    for given in paths:
        if given.is_dir():
            files, importable = pipeline_files(given, result.errors), given
        elif given.is_file():
            files, importable = [given], given.parent
        else:
            result.errors.append(LoadError(str(given), None, "no such file or folder"))
            continue
        if folder is not None and _is_under(given, folder):
            importable = folder
        for path in files:
            definitions = _read_file(path, importable, result.errors) or _Definitions()
            _collect(definitions, path, result)
    return result


def _is_under(path: Path, folder: Path) -> bool:
    """Whether ``path`` is ``folder`` or in it, links followed on both sides."""
    return Path(os.path.realpath(path)).is_relative_to(os.path.realpath(folder))


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
        subfolders[:] = [name for name in subfolders if not name.startswith(_NOT_LOADED)]
        found += [
            Path(directory, name)
            for name in names
            if name.endswith(".py") and not name.startswith(_NOT_LOADED)
        ]
    return sorted(found)


_NOT_LOADED = (".", "_")
"""How the names of the files and folders that :func:`pipeline_files` skips start."""


def _is_pipeline_file(filename: str, folder: Path) -> bool:
    """Whether ``filename`` is one of the pipeline files of ``folder``, which the loader
    imports on their own."""
    try:
        relative = Path(os.path.realpath(filename)).relative_to(os.path.realpath(folder))
    except ValueError:
        return False
    return relative.suffix == ".py" and not any(
        part.startswith(_NOT_LOADED) for part in relative.parts
    )


def import_pipeline_file(path: Path, folder: Path | None = None) -> dict[str, Pipeline]:
    """The pipelines one file defines, imported as the daemon imports it: with ``folder`` (the
    configured pipelines folder) on the import path when the file is in it, else its own
    folder. An import error propagates (used by a run's process)."""
    errors: list[LoadError] = []
    importable = folder if folder is not None and _is_under(path, folder) else path.parent
    definitions = _read_file(path, importable, errors)
    if definitions is None:
        raise ImportError(str(errors[0]))
    result = LoadedPipelines()
    _collect(definitions, path, result)
    return result.pipelines


def _read_file(path: Path, folder: Path, errors: list[LoadError]) -> _Definitions | None:
    """Import one file: what it defines (``None`` if its import failed), and in ``errors``
    why, or why the daemon would refuse part of it."""
    with recording() as recorded:
        module = _import_file(path, folder, errors)
    if module is None:
        return None
    origin = module.__file__ or str(path)
    definitions = _definitions(path, origin, module, recorded, folder, errors)
    found = hidden_pipelines(origin, recorded, definitions) + unusable_watchers(origin, definitions)
    errors += [LoadError(str(path), line, message) for line, message in found]
    items = _one_per_id(path, origin, definitions, recorded, errors)
    made = {
        id(item): modules[0][1]
        for item in items
        if (modules := recorded.modules.get(id(item))) and modules[0][0] == origin
    }
    return _Definitions(items, made)


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


def _definitions(
    path: Path,
    origin: str,
    module: ModuleType,
    recorded: Recording,
    folder: Path,
    errors: list[LoadError],
) -> tuple[Pipeline | BaseAsset, ...]:
    """The pipelines and assets the module of the file at ``path`` defines at its top level,
    in its order, then the pipelines its code declared (:func:`triggerer.pipelines.declare`),
    each once.

    A pipeline declared by a helper module's top-level code as the file imports it is an
    error (in ``errors``) at the file's import: a module runs once, so the next file to import
    it, or this one loaded again, would not have it. One declared by another pipeline file of
    ``folder`` as the file imports it is that file's, which is loaded on its own."""
    found = {id(v): v for v in vars(module).values() if isinstance(v, (Pipeline, BaseAsset))}
    for pipeline in recorded.declared:
        modules = recorded.modules[id(pipeline)]
        if id(pipeline) in found:
            continue  # held by a name of the file as well
        if not modules or modules[0][0] == origin:
            found[id(pipeline)] = pipeline
        elif not _is_pipeline_file(modules[0][0], folder):
            errors.append(_made_by_an_import(path, origin, pipeline, modules))
    return tuple(found.values())


def _made_by_an_import(
    path: Path, origin: str, pipeline: Pipeline, modules: tuple[Site, ...]
) -> LoadError:
    """The error of a pipeline (an Airflow file's DAG) declared by the top-level code of the
    module first in ``modules``, which the file at ``path`` (compiled as ``origin``) imports.
    That module, and those on the way from the file to it, are forgotten (``sys.modules``): the
    next file that imports them, or this one loaded again, runs them again and has this error
    too, where it would otherwise lose the DAG without a word."""
    helper = modules[0][0]
    at_file = next((i for i, (made_in, _) in enumerate(modules) if made_in == origin), None)
    # Not the file's own module, nor one importing it (__main__), nor any when the file's own
    # code is not among them (a thread the file started).
    on_the_way = {made_in for made_in, _ in modules[:at_file]} if at_file is not None else set()
    for name, imported in list(sys.modules.items()):
        if getattr(imported, "__file__", None) in on_the_way:
            del sys.modules[name]
    _, line = (
        pipeline.defined_at
        if pipeline.defined_at is not None and pipeline.defined_at[0] == helper
        else modules[0]
    )
    return LoadError(
        str(path),
        None if at_file is None else modules[at_file][1],
        f"DAG {pipeline.pipeline_id!r} is made in helper module {helper}, line {line}, as it "
        "is imported: make it in the pipeline file, or in a function the file calls (a module "
        "runs once, on its first import: this file loaded again would not have the DAG)",
    )


def _one_per_id(
    path: Path,
    origin: str,
    definitions: tuple[Pipeline | BaseAsset, ...],
    recorded: Recording,
    errors: list[LoadError],
) -> tuple[Pipeline | BaseAsset, ...]:
    """``definitions`` with the first pipeline of each id: another of that id in the file
    (made in a loop, by a factory called twice) is an error naming both lines, and ignored."""
    first: dict[str, Pipeline] = {}
    kept = []
    for definition in definitions:
        if isinstance(definition, Pipeline):
            known = first.setdefault(definition.pipeline_id, definition)
            if known is not definition:
                where = _place(str(path), _line_in_file(origin, known, recorded))
                line = _line_in_file(origin, definition, recorded)
                errors.append(LoadError(str(path), line, _duplicate(definition, where)))
                continue
        kept.append(definition)
    return tuple(kept)


def _line_in_file(origin: str, pipeline: Pipeline, recorded: Recording) -> int | None:
    """The line of the file compiled as ``origin`` whose top-level code made (or declared)
    ``pipeline``, else the line of its definition if that is in the file."""
    for made_in, line in recorded.modules.get(id(pipeline), ()):
        if made_in == origin:
            return line
    if pipeline.defined_at is not None and pipeline.defined_at[0] == origin:
        return pipeline.defined_at[1]
    return None


def _collect(definitions: _Definitions, path: Path, result: LoadedPipelines) -> None:
    """Add the ``definitions`` of the file at ``path`` to ``result``."""
    for definition in definitions.items:
        if isinstance(definition, Pipeline):
            line = definitions.made.get(id(definition))
            _add_pipeline(dataclasses.replace(definition, fileloc=str(path)), line, result)
        else:
            _add_condition(definition, result)


def _add_pipeline(pipeline: Pipeline, made_at: int | None, result: LoadedPipelines) -> None:
    """Add ``pipeline``, which its file made at line ``made_at`` (``None``: imported)."""
    made = result.made_by_their_files
    existing = result.pipelines.get(pipeline.pipeline_id)
    if existing is not None:
        # The same definition imported into a second file is not a second pipeline, nor is one
        # file's given twice (to pipelines check; one file's pipelines each have another id,
        # see _one_per_id). Two files that each made one, by one factory, have two.
        both_made = made_at is not None and existing.pipeline_id in made
        if existing.fileloc != pipeline.fileloc and (
            both_made or _source(existing) != _source(pipeline)
        ):
            first_line = made.get(existing.pipeline_id) or _line_in_own_file(existing)
            result.errors.append(
                LoadError(
                    str(pipeline.fileloc),
                    made_at or _line_in_own_file(pipeline),
                    _duplicate(pipeline, _place(str(existing.fileloc), first_line)),
                )
            )
        return
    result.pipelines[pipeline.pipeline_id] = pipeline
    if made_at is not None:
        made[pipeline.pipeline_id] = made_at
    if pipeline.condition is not None:
        _add_condition(pipeline.condition, result)
    for outlet in pipeline.outlets:
        _add_condition(outlet, result)
    for inlet in pipeline.inlets:
        _add_condition(inlet, result)


def _duplicate(pipeline: Pipeline, first: str) -> str:
    return (
        f"pipeline id {pipeline.pipeline_id!r} is already defined at {first}; ids must be "
        "unique (this definition is ignored)"
    )


def _place(path: str, line: int | None) -> str:
    return f"{path}:{line}" if line else path


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
