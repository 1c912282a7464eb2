"""What a pipeline file that imports may still hold that the daemon would refuse later: a
pipeline no module-level name holds (a second definition of its name took it), a watcher whose
trigger could not be made. The loader reports each as an error of the file, at its line."""

from __future__ import annotations

import ast
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from triggerer.triggers import UnusableTrigger

if TYPE_CHECKING:
    from triggerer.assets import AssetWatcher, BaseAsset
    from triggerer.pipelines import Pipeline, Recording

Problem = tuple[int | None, str]
"""The line in the file (if it is there) and the message."""


def hidden_pipelines(
    origin: str, recorded: Recording, definitions: Sequence[Pipeline | BaseAsset]
) -> list[Problem]:
    """The pipelines the file made and no longer holds: a second definition of one name at
    module level took the name of the first (the first would vanish without a word)."""
    held = {id(definition) for definition in definitions}
    errors: list[Problem] = []
    for pipeline in recorded.made:
        if id(pipeline) in held or pipeline.defined_at is None:
            continue
        made_in, line = pipeline.defined_at
        if made_in != origin:  # a helper module's pipeline: its own file holds it or not
            continue
        name = getattr(pipeline.function, "__name__", None)
        again = None if name is None else _bound_again(origin, name, line)
        if again is None:
            message = (
                f"pipeline {pipeline.pipeline_id!r} made at line {line} is held by no "
                "module-level name, so it would not be loaded; assign it to one"
            )
        else:
            message = (
                f"pipeline {pipeline.pipeline_id!r} (line {line}) is hidden: the name {name!r} "
                f"is defined again at line {again}, so the file no longer holds the pipeline; "
                "give one of them another name"
            )
        errors.append((line, message))
    return errors


def _bound_again(origin: str, name: str, line: int) -> int | None:
    """The first line after ``line`` where the module at ``origin`` binds ``name`` at its top
    level, if it does (read only for a hidden pipeline's message)."""
    try:
        tree = ast.parse(Path(origin).read_bytes(), origin)
    except (OSError, SyntaxError, ValueError):
        return None
    starts = sorted(start for bound, start in _top_level_bindings(tree.body) if bound == name)
    later = [start for start in starts if start > line]
    return later[0] if later else None


def _top_level_bindings(body: list[ast.stmt]) -> Iterator[tuple[str, int]]:
    """Each module-level name a statement of ``body`` binds, with the line its statement
    starts at (a decorated definition's first decorator), into ``if``/``try``/``with``/
    ``for`` blocks but not into functions or classes."""
    for statement in body:
        start = statement.lineno
        if isinstance(statement, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            decorators = [decorator.lineno for decorator in statement.decorator_list]
            yield statement.name, min([start, *decorators])
            continue
        if isinstance(statement, (ast.Import, ast.ImportFrom)):
            for alias in statement.names:
                yield (alias.asname or alias.name.split(".")[0]), start
            continue
        targets: list[ast.expr] = []
        if isinstance(statement, ast.Assign):
            targets = statement.targets
        elif isinstance(statement, (ast.AnnAssign, ast.AugAssign, ast.For, ast.AsyncFor)):
            targets = [statement.target]
        for target in targets:
            yield from ((name, start) for name in _assigned(target))
        blocks = [getattr(statement, block, []) for block in ("body", "orelse", "finalbody")]
        blocks += [handler.body for handler in getattr(statement, "handlers", [])]
        for block in blocks:
            yield from _top_level_bindings(block)


def _assigned(target: ast.expr) -> Iterator[str]:
    """The names an assignment to ``target`` binds (``a``, ``a, *b``; not ``a[k]``, ``a.b``)."""
    if isinstance(target, ast.Name):
        yield target.id
    elif isinstance(target, (ast.Tuple, ast.List)):
        for item in target.elts:
            yield from _assigned(item)
    elif isinstance(target, ast.Starred):
        yield from _assigned(target.value)


def unusable_watchers(origin: str, definitions: Sequence[Pipeline | BaseAsset]) -> list[Problem]:
    """A watcher whose trigger could not be made (an unknown queue scheme, a bad URI or
    option): the daemon would fail it when it starts, so the file reports it now."""
    errors: list[Problem] = []
    seen: set[int] = set()
    for definition in definitions:
        for asset in definition.iter_assets():
            for watcher in asset.watchers:
                if id(watcher) in seen or not isinstance(watcher.trigger, UnusableTrigger):
                    continue
                seen.add(id(watcher))
                line, where = _site_in(origin, watcher)
                errors.append(
                    (
                        line,
                        f"watcher {watcher.name!r} of asset {asset.name!r}{where}: "
                        f"{watcher.trigger.error}",
                    )
                )
    return errors


def _site_in(origin: str, watcher: AssetWatcher) -> tuple[int | None, str]:
    """The line of ``watcher`` in the file at ``origin``, or where else it was made."""
    if watcher.defined_at is None:
        return None, ""
    made_in, line = watcher.defined_at
    if made_in == origin:
        return line, ""
    return None, f" (made at {made_in}:{line})"
