"""The verbs that import pipeline files (``pipelines check``, ``test``, ``simulate``) import
them as the daemon does: in a worker thread (a file may run an event loop of its own as it is
imported), with the configured pipelines folder importable, and what the files print as they
are imported kept off the verb's output."""

from __future__ import annotations

import json
import os
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from triggerer.service.cli.main import main
from triggerer.service.config import CONFIG_ENV, current_settings

# Runs an event loop of its own as it is imported (to read a setting, say), and prints.
LOOPING = """\
import asyncio

from triggerer import Asset, pipeline


async def setting():
    return "orders"


orders = Asset(asyncio.run(setting()))
print("imported looping.py")


@pipeline(schedule=orders)
def on_orders(spark, context):
    pass
"""


@pytest.fixture(autouse=True)
def _isolated(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Iterator[None]:
    """The settings and ``sys.path`` as they were after the test, and no module of the test's
    folder left imported (the library modules a verb imports stay: SQLAlchemy warns when
    imported twice)."""
    for name in list(os.environ):
        if name.startswith("TRIGGERER_") and name != "TRIGGERER_HOME":
            monkeypatch.delenv(name)
    monkeypatch.setenv(CONFIG_ENV, "")  # undoes what load_settings(path) sets
    monkeypatch.setattr(sys, "path", list(sys.path))
    current_settings.cache_clear()
    yield
    current_settings.cache_clear()
    for name, module in list(sys.modules.items()):
        if str(getattr(module, "__file__", None)).startswith(str(tmp_path)):
            del sys.modules[name]


def _configured(tmp_path: Path, files: dict[str, str]) -> tuple[Path, Path]:
    """The config file and its pipelines folder, holding ``files``."""
    folder = tmp_path / "pipelines"
    for relative, source in files.items():
        (folder / relative).parent.mkdir(parents=True, exist_ok=True)
        (folder / relative).write_text(textwrap.dedent(source))
    config = tmp_path / "triggerer.toml"
    config.write_text(
        f'[database]\nurl = "sqlite:///{tmp_path}/triggerer.db"\n[pipelines]\ndir = "{folder}"\n'
    )
    return config, folder


def test_check_loads_a_file_running_an_event_loop_and_keeps_its_json_whole(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: RuntimeError (asyncio.run() cannot be called from a running event loop), which the
    daemon's load never has; and a file's print went into the JSON."""
    config, folder = _configured(tmp_path, {"looping.py": LOOPING})
    code = main(["--config", str(config), "pipelines", "check", "--json"])
    out, err = capsys.readouterr()
    assert (code, json.loads(out)) == (
        0,
        {
            "pipelines": [
                {"pipeline_id": "on_orders", "file": f"{folder}/looping.py", "schedule": "orders"}
            ],
            "errors": [],
        },
    )
    assert err == "imported looping.py\n"


def test_check_of_a_subfolders_file_imports_the_configured_folders_helpers(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: ModuleNotFoundError for ``_common``, which the daemon imports from its folder."""
    config, folder = _configured(
        tmp_path,
        {
            "_common.py": "SCHEDULE = '@daily'\n",
            "team/job.py": """\
                from triggerer import pipeline
                import _common

                @pipeline(schedule=_common.SCHEDULE)
                def job(spark, context):
                    pass
                """,
        },
    )
    code = main(["--config", str(config), "pipelines", "check", str(folder / "team" / "job.py")])
    out, _ = capsys.readouterr()
    assert (code, out.splitlines()[-1]) == (0, "1 pipeline(s), 0 error(s)")


def test_test_finds_a_pipeline_of_a_file_running_an_event_loop(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: no pipeline 'on_orders', its file having failed with RuntimeError. (The event names
    an asset the pipeline does not know: the verb ends before a run, with no Spark.)"""
    config, _ = _configured(tmp_path, {"looping.py": LOOPING})
    code = main(["--config", str(config), "pipelines", "test", "on_orders", "--event", "x={}"])
    out, err = capsys.readouterr()
    assert (code, out) == (1, "")
    assert err == (
        "imported looping.py\n"
        "triggerer: --event x=...: pipeline 'on_orders' knows no asset 'x'; give one of its "
        "schedule's assets or inlets, by name or URI: orders\n"
    )


def test_simulate_keeps_its_json_whole(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """Was: the file's print in the JSON, and RuntimeError for its event loop."""
    config, _ = _configured(tmp_path, {"looping.py": LOOPING})
    events = tmp_path / "events.jsonl"
    events.write_text('{"asset": "orders", "at": "2026-01-01T00:00:00+00:00", "extra": {}}\n')
    code = main(
        ["--config", str(config), "pipelines", "simulate", "on_orders", str(events), "--json"]
    )
    out, err = capsys.readouterr()
    assert (code, json.loads(out)) == (0, [{"at": "2026-01-01T00:00:00+00:00", "events": [0]}])
    assert err == "imported looping.py\n"
