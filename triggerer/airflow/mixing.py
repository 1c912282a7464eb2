"""A pipeline file is written for Airflow or for triggerer: one that imports both is refused,
naming the line of each."""

from __future__ import annotations

import ast
from pathlib import Path

from triggerer.airflow.errors import DOCS, MixedImports

TRIGGERER_PACKAGES = ("triggerer", "watchers")
"""What counts as importing triggerer: its SDK and its providers."""


def check_file(path: str) -> None:
    """Raise :class:`MixedImports` when the file at ``path`` imports both ``airflow`` and
    ``triggerer`` or ``watchers`` (anywhere in it, at any depth)."""
    try:
        tree = ast.parse(Path(path).read_bytes(), path)
    except (OSError, SyntaxError, ValueError):
        return  # its import reports what is wrong with it
    airflow = triggerer = None
    for node in ast.walk(tree):
        for line, module in _imported(node):
            top = module.split(".")[0]
            if top == "airflow" and (airflow is None or line < airflow[0]):
                airflow = (line, module)
            elif top in TRIGGERER_PACKAGES and (triggerer is None or line < triggerer[0]):
                triggerer = (line, module)
    if airflow is not None and triggerer is not None:
        raise MixedImports(
            f"this file imports Airflow (line {airflow[0]}: {airflow[1]}) and triggerer "
            f"(line {triggerer[0]}: {triggerer[1]}): a pipeline file is written for one of "
            f"them; keep Airflow DAGs and triggerer pipelines in files of their own, they "
            f"share assets across files (see {DOCS})"
        )


def _imported(node: ast.AST) -> list[tuple[int, str]]:
    """The line and the modules an import statement imports (none for other nodes)."""
    if isinstance(node, ast.Import):
        return [(node.lineno, alias.name) for alias in node.names]
    if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
        return [(node.lineno, node.module)]
    return []
