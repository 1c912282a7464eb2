"""The broker clients that are optional extras of triggerer, imported when first needed, and
the check of the settings a named connection gives a client.

A provider module imports its client through :func:`require` in the code that uses it, so that
importing the module (as the daemon does for every built-in provider at start) costs nothing,
and a trigger made without its client installed fails with the ``pip install`` that brings it.
"""

from __future__ import annotations

import importlib
from collections.abc import Collection, Mapping
from types import ModuleType
from typing import Any


def require(module: str, extra: str) -> ModuleType:
    """The module ``module``; a ``ValueError`` naming ``pip install 'triggerer[EXTRA]'`` when the
    package that holds it is not installed."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as error:
        if error.name is None or not module.startswith(error.name):
            raise  # installed, but broken inside: its own error says more
        raise ValueError(
            f"this queue needs the Python package of {module!r}, which is not installed: "
            f"pip install 'triggerer[{extra}]'"
        ) from None


def check_settings(
    connection: str | None, settings: Mapping[str, Any], known: Collection[str], reader: str
) -> None:
    """A ``ValueError`` naming the settings of the named ``connection`` that ``reader`` (the
    provider that reads them) does not know, and the valid ones."""
    unknown = set(settings) - set(known)
    if unknown:
        raise ValueError(
            f"connection {connection!r} has settings {reader} does not know: "
            f"{', '.join(sorted(unknown))}; valid: {', '.join(sorted(known))}"
        )
