"""The UI's libraries are part of every install: the files app.js and index.html load from
``vendor/`` exist in the package, are committed (not ignored by git), are package data of the
wheel and sdist, and are the lockfile's (compared with ``ui/node_modules`` when it exists)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import tomllib
from pathlib import Path

import pytest

from triggerer.service.api.app import STATIC

ROOT = Path(__file__).resolve().parents[2]
VENDOR = STATIC / "vendor"
NODE_MODULES = ROOT / "ui" / "node_modules"
COPIED = re.compile(r"^\tcp ui/node_modules/(\S+) \$\(UI_VENDOR\)/(\S+)$", re.MULTILINE)


def loaded_files() -> set[str]:
    """The vendor files the page loads."""
    app = (STATIC / "app.js").read_text()
    index = (STATIC / "index.html").read_text()
    return set(re.findall(r'vendor\("([^"]+)"\)', app)) | set(
        re.findall(r'href="/ui/vendor/([^"]+)"', index)
    )


def copies() -> dict[str, str]:
    """What `make ui` copies: vendor file -> its path under ui/node_modules."""
    return {target: source for source, target in COPIED.findall((ROOT / "Makefile").read_text())}


def test_the_page_loads_only_files_make_ui_copies_and_they_are_in_the_package() -> None:
    loaded = loaded_files()
    assert loaded >= {"cytoscape.js", "dagre.js", "uplot.js", "uplot.css"}
    assert loaded == set(copies())
    missing = [name for name in loaded if not (VENDOR / name).is_file()]
    assert not missing, f"missing from {VENDOR}: {missing} (run `make ui`)"
    pyproject = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert (
        "service/api/static/vendor/*"
        in pyproject["tool"]["setuptools"]["package-data"]["triggerer"]
    )


@pytest.mark.skipif(shutil.which("git") is None, reason="needs git")
def test_the_vendor_files_are_not_ignored_by_git() -> None:
    paths = [str((VENDOR / name).relative_to(ROOT)) for name in loaded_files()]
    ignored = subprocess.run(  # noqa: S603 - git with our own paths
        ["git", "check-ignore", *paths],  # noqa: S607 - git from PATH
        cwd=ROOT,
        capture_output=True,
        text=True,
        check=False,
    )
    assert ignored.stdout == "", f"ignored by git, so a clone would lack them: {ignored.stdout}"


@pytest.mark.skipif(not NODE_MODULES.is_dir(), reason="ui/node_modules absent (npm ci in ui/)")
def test_the_vendor_files_are_the_lockfiles_packages() -> None:
    lock = json.loads((ROOT / "ui" / "package-lock.json").read_text())["packages"]
    for target, source in copies().items():
        package = re.match(r"((?:@[^/]+/)?[^/]+)/", source)
        assert package is not None, source
        installed = json.loads((NODE_MODULES / package[1] / "package.json").read_text())
        assert installed["version"] == lock[f"node_modules/{package[1]}"]["version"], package[1]
        assert (VENDOR / target).read_bytes() == (NODE_MODULES / source).read_bytes(), (
            f"{target} is not {source} of the lockfile: run `make ui`"
        )
