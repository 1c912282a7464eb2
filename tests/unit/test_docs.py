"""The README and docs/ hold together: every relative link points to a file that exists, the
README links nowhere outside the repository, and docs/architecture.md's module map lists every
Python module of ``triggerer/`` and ``watchers/``, and no other, and names what each of the two
packages re-exports (its ``__all__``), and nothing else."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
README = ROOT / "README.md"
ARCHITECTURE = ROOT / "docs" / "architecture.md"
PAGES = (README, *sorted((ROOT / "docs").glob("*.md")))

FENCED = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
INLINE_CODE = re.compile(r"`[^`\n]*`")
LINK = re.compile(r"\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")


def links(page: Path) -> list[str]:
    """The targets of the markdown links ``[text](target)`` of ``page``, code left out."""
    text = INLINE_CODE.sub("", FENCED.sub("", page.read_text(encoding="utf-8")))
    return LINK.findall(text)


@pytest.mark.parametrize("page", PAGES, ids=lambda page: str(page.relative_to(ROOT)))
def test_relative_links_point_to_files_that_exist(page: Path) -> None:
    missing = [
        target
        for target in links(page)
        if not SCHEME.match(target)
        and not target.startswith("#")
        and not (page.parent / target.split("#", 1)[0]).exists()
    ]
    assert not missing, f"{page.relative_to(ROOT)} links to files that do not exist: {missing}"


def test_the_readme_links_only_inside_the_repository() -> None:
    outside = [target for target in links(README) if SCHEME.match(target)]
    assert not outside, f"README.md links outside the repository: {outside}"


def module_map() -> str:
    """The text of docs/architecture.md's "Module map" section."""
    text = ARCHITECTURE.read_text(encoding="utf-8")
    start = text.index("\n## Module map\n")
    end = text.find("\n## ", start + 1)
    return text[start : end if end != -1 else None]


def test_the_module_map_lists_every_module_and_only_those() -> None:
    named = set(re.findall(r"`((?:triggerer|watchers)/[\w/.]*)`", module_map()))
    listed = {name for name in named if name.endswith(".py")}
    # A folder's line stands for its __init__.py.
    listed |= {
        f"{name}__init__.py"
        for name in named
        if name.endswith("/") and (ROOT / name / "__init__.py").exists()
    }
    modules = {
        str(path.relative_to(ROOT))
        for package in ("triggerer", "watchers")
        for path in (ROOT / package).rglob("*.py")
    }
    assert not modules - listed, (
        f"docs/architecture.md's Module map misses {sorted(modules - listed)}: "
        "add a line for each, saying what it is"
    )
    assert not listed - modules, (
        f"the map lists modules that do not exist: {sorted(listed - modules)}"
    )


def map_entry(folder: str) -> str:
    """The text of the module map's item for ``folder`` (``watchers/``), up to the next item."""
    found = re.search(rf"^- `{re.escape(folder)}`: (.*?)(?=^- |^#|\Z)", module_map(), re.M | re.S)
    assert found, f"docs/architecture.md's Module map has no item for {folder}"
    return found.group(1)


def declared_all(package: str) -> set[str]:
    """The names of ``package/__init__.py``'s ``__all__``, read without importing it."""
    tree = ast.parse((ROOT / package / "__init__.py").read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, ast.Assign) and any(
            isinstance(target, ast.Name) and target.id == "__all__" for target in node.targets
        ):
            return set(ast.literal_eval(node.value))
    raise AssertionError(f"{package}/__init__.py has no __all__")


@pytest.mark.parametrize("package", ["triggerer", "watchers"])
def test_the_module_map_names_what_each_package_re_exports(package: str) -> None:
    entry = map_entry(f"{package}/")
    assert "re-exports" in entry, f"the Module map's {package}/ does not say what it re-exports"
    said = set(re.findall(r"`([A-Za-z]\w*)`", entry))
    exported = declared_all(package)
    assert said == exported, (
        f"docs/architecture.md's Module map says {package}/ re-exports names its __all__ does "
        f"not have: {sorted(said - exported)}, and not those it has: {sorted(exported - said)}"
    )
