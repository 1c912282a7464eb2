"""How every benchmark reports: a table of dotted names on stdout, and the JSON file."""

from __future__ import annotations

import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any


def flatten(prefix: str, value: Any) -> Iterator[tuple[str, Any]]:
    if isinstance(value, dict):
        for key, inner in value.items():
            yield from flatten(f"{prefix}.{key}" if prefix else key, inner)
    else:
        yield prefix, value


def table(results: dict[str, Any]) -> str:
    rows = list(flatten("", results))
    width = max(len(name) for name, _ in rows)
    return "\n".join(f"{name:<{width}}  {value}" for name, value in rows) + "\n"


def publish(results: dict[str, Any], out: Path) -> None:
    """Print ``results`` as a table and write them to ``out`` as JSON."""
    sys.stdout.write(table(results))
    out.write_text(json.dumps(results, indent=2) + "\n")
