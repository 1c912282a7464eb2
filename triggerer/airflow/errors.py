"""What the Airflow shim raises for a construct it does not run the way Airflow would."""

from __future__ import annotations

DOCS = "docs/from-airflow.md"
"""The page that says what maps from Airflow, what does not, and why."""


class NotSupported(Exception):
    """An Airflow construct that triggerer would run differently, so the file does not load.

    Raised where the file uses it: the loader names the file and that line.
    """

    def __init__(self, construct: str, why: str) -> None:
        super().__init__(f"{construct} is not supported: {why} (see {DOCS})")
        self.construct = construct


class ModuleNotProvided(ModuleNotFoundError):
    """An ``airflow.*`` module that the shim does not provide (Airflow itself is not
    installed)."""

    def __init__(self, module: str) -> None:
        super().__init__(
            f"{module} is not provided: Airflow is not installed, and triggerer's Airflow "
            f"compatibility covers only the modules listed in {DOCS}",
            name=module,
        )


class MixedImports(ImportError):
    """A file that imports both Airflow and triggerer (or its ``watchers``)."""
