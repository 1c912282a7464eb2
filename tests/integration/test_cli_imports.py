"""What the command line imports, in a fresh interpreter: ``--help`` nothing but the parser,
and the verbs that read the store the store alone, on SQLite: not the daemon, Spark, the
brokers' clients, the API server, Alembic or structlog. (Each of those costs a tenth of a
second or more to import; ``make bench`` times the CLI.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import anyio
import pytest
from alembic.script import ScriptDirectory

from triggerer.service import actions
from triggerer.service.loader import load_pipelines
from triggerer.service.principals import cli_principal
from triggerer.service.scheduling.registry import sync_definitions
from triggerer.service.store import create_engine, head_revision, session_factory
from triggerer.service.store.migrate import alembic_config

NOT_FOR_READING = (
    "pyspark",
    "aiokafka",
    "aiobotocore",
    "botocore",
    "aiohttp",
    "fastapi",
    "uvicorn",
    "httpx",
    "alembic",
    "structlog",
    "prometheus_client",
    "pluggy",
    "watchers",
    "triggerer.service.daemon",
    "triggerer.service.scheduling",
    "triggerer.service.runs.launcher",
    "triggerer.service.api",
    "triggerer.listeners",
)
"""Modules a verb that reads the store and prints has no use for."""
NOT_FOR_HELP = (*NOT_FOR_READING, "sqlalchemy", "pydantic", "anyio", "triggerer.service.config")
READING_VERBS = (
    ("runs", "list"),
    ("runs", "list", "--json"),
    ("pipelines", "list"),
    ("assets", "list"),
    ("watchers", "list"),
    ("events", "list"),
    ("events", "dead-letters"),
    ("audit", "list"),
    ("audit", "list", "--json", "--action", "emit"),
    ("explain", "count_orders"),
    ("runs", "logs", "count_orders__manual__x"),  # no such run: an error, its imports too
    ("check",),
)
PROBE = """
import contextlib, json, os, sys
from triggerer.service.cli import main

imported = {}
for argv in json.loads(sys.argv[1]):
    with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
        try:
            code = main(argv)
        except SystemExit as exited:
            code = exited.code
    imported[" ".join(argv)] = {"code": code, "modules": sorted(sys.modules)}
print(json.dumps(imported))
"""
"""Runs ``main`` for each argv in turn in one interpreter; after each, the exit code and every
module imported so far."""

PIPELINES = """
from triggerer import Asset, pipeline

@pipeline(schedule=Asset("orders"))
def count_orders(spark, context): ...
"""


Imported = dict[str, dict[str, Any]]


def imported_by(verbs: tuple[tuple[str, ...], ...], env: dict[str, str]) -> Imported:
    done = subprocess.run(  # noqa: S603 - our own interpreter and script
        [sys.executable, "-c", PROBE, json.dumps(verbs)],
        env=env,
        cwd=Path(env["HOME"]),  # not the checkout: the installed package, as a user runs it
        capture_output=True,
        text=True,
        check=True,
    )
    found: Imported = json.loads(done.stdout)
    return found


def among(modules: list[str], names: tuple[str, ...]) -> list[str]:
    """The ``names`` that ``modules`` holds, as modules or as packages of some."""
    return [n for n in names if any(m == n or m.startswith(f"{n}.") for m in modules)]


@pytest.fixture
def cli_env(tmp_path: Path) -> dict[str, str]:
    """The environment of a CLI process with no configuration but the defaults."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIGGERER_")}
    return env | {"HOME": str(tmp_path), "TRIGGERER_LOGGING__FORMAT": "json"}


def test_help_imports_only_the_parser(cli_env: dict[str, str]) -> None:
    [(_, help_run)] = imported_by((("--help",),), cli_env).items()

    assert help_run["code"] == 0
    assert among(help_run["modules"], NOT_FOR_HELP) == []


@pytest.mark.parametrize("db_backend", ["sqlite"], indirect=True)
def test_verbs_that_read_the_store_import_the_store_alone(
    migrated_database_url: str, tmp_path: Path, cli_env: dict[str, str]
) -> None:
    folder = tmp_path / "pipelines"
    folder.mkdir()
    (folder / "pipelines.py").write_text(PIPELINES)

    async def fill() -> None:
        engine = create_engine(migrated_database_url)
        try:
            async with session_factory(engine).begin() as session:
                await sync_definitions(session, load_pipelines(folder))
                orders = await actions.find_asset(session, asset_id=None, uri="orders")
                cli = cli_principal()
                await actions.emit_event(session, orders, {"n": 1}, source="cli", actor=cli)
                await actions.trigger_run(session, "count_orders", actor=cli)
        finally:
            await engine.dispose()

    anyio.run(fill)
    env = cli_env | {"TRIGGERER_DATABASE__URL": migrated_database_url}

    runs = imported_by(READING_VERBS, env)

    codes = {verb: run["code"] for verb, run in runs.items()}
    assert codes == {
        **dict.fromkeys(codes, 0),
        "runs logs count_orders__manual__x": 1,
        "check": 1,  # no daemon: no heartbeat
    }
    # The first verb that imports one of them is the culprit: the modules stay imported.
    assert {verb: among(run["modules"], NOT_FOR_READING) for verb, run in runs.items()} == {
        verb: [] for verb in runs
    }
    assert "aiosqlite" in runs["runs list"]["modules"]


def test_the_head_revision_read_without_alembic_is_alembics() -> None:
    assert head_revision() == ScriptDirectory.from_config(alembic_config()).get_current_head()
