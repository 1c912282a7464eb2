"""The ``triggerer`` command line against a real database (SQLite and PostgreSQL)."""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
import structlog

from triggerer.cli import main
from triggerer.config import current_settings
from triggerer.daemon.registry import sync_definitions
from triggerer.loader import load_pipelines
from triggerer.store import create_engine, session_factory, upgrade

PIPELINES = """
from triggerer import Asset, pipeline

orders = Asset("orders")

@pipeline(schedule=orders)
def count_orders(spark, context): ...
"""


@pytest.fixture(autouse=True)
def _restore_logging() -> Iterator[None]:
    """main() configures logging onto pytest's captured stderr: undo it for later tests."""
    root = logging.getLogger()
    handlers, level = root.handlers[:], root.level
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    structlog.reset_defaults()


@pytest.fixture
def cli_database(database_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """An empty database the CLI is configured for, through the environment."""
    monkeypatch.delenv("TRIGGERER_CONFIG", raising=False)
    monkeypatch.setenv("TRIGGERER_DATABASE__URL", database_url)
    monkeypatch.setenv("TRIGGERER_PIPELINES__DIR", str(tmp_path / "pipelines"))
    monkeypatch.setenv("TRIGGERER_LOGGING__FORMAT", "json")
    current_settings.cache_clear()
    return database_url


@pytest.fixture
def synced(cli_database: str, tmp_path: Path) -> str:
    """The database with the pipelines of PIPELINES synced into it, as the daemon would."""
    folder = tmp_path / "pipelines"
    folder.mkdir()
    (folder / "pipelines.py").write_text(PIPELINES)

    async def sync() -> None:
        await upgrade(cli_database)
        engine = create_engine(cli_database)
        try:
            async with session_factory(engine).begin() as session:
                await sync_definitions(session, load_pipelines(folder))
        finally:
            await engine.dispose()

    anyio.run(sync)
    return cli_database


def run_cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_db_upgrade_migrates_an_empty_database(
    cli_database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run_cli(capsys, "db", "upgrade")
    assert code == 0
    assert "up to date" in out
    assert run_cli(capsys, "runs", "list", "--json")[:2] == (0, "[]\n")


def test_list_verbs_print_one_json_array(synced: str, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run_cli(capsys, "pipelines", "list", "--json")
    assert code == 0
    [row] = json.loads(out)
    assert (row["pipeline_id"], row["schedule"], row["paused"]) == ("count_orders", "orders", False)
    code, out, _ = run_cli(capsys, "assets", "list", "--json")
    assert [a["uri"] for a in json.loads(out)] == ["orders"]
    assert json.loads(run_cli(capsys, "watchers", "list", "--json")[1]) == []


def test_emit_queues_the_event_for_its_consumer(
    synced: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run_cli(capsys, "events", "emit", "orders", "--extra", '{"rows": 3}')
    assert code == 0
    assert "queued for count_orders" in out
    code, out, _ = run_cli(capsys, "events", "list", "--json")
    [event] = json.loads(out)
    assert (event["uri"], event["source"], event["extra"]) == ("orders", "cli", {"rows": 3})
    code, out, _ = run_cli(capsys, "explain", "count_orders")
    assert "orders: 1 queued event(s)" in out


def test_paused_pipeline_is_not_queued_and_unpause_restores_it(
    synced: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_cli(capsys, "pipelines", "pause", "count_orders")[0] == 0
    assert "queued for no pipeline" in run_cli(capsys, "events", "emit", "orders")[1]
    assert "paused" in run_cli(capsys, "explain", "count_orders")[1]
    assert run_cli(capsys, "pipelines", "unpause", "count_orders")[0] == 0
    assert "queued for count_orders" in run_cli(capsys, "events", "emit", "orders")[1]


def test_manual_trigger_creates_a_queued_run_without_logical_date(
    synced: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run_cli(capsys, "pipelines", "trigger", "count_orders")
    assert code == 0
    assert out.startswith("count_orders__manual__")
    [run] = json.loads(run_cli(capsys, "runs", "list", "--json")[1])
    assert (run["run_id"], run["state"], run["type"]) == (out.strip(), "queued", "manual")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("pipelines", "pause", "nope"), "pipeline 'nope' does not exist"),
        (("pipelines", "trigger", "nope"), "pipeline 'nope' does not exist"),
        (("events", "emit", "s3://missing/x"), "no asset with URI 's3://missing/x'"),
        (("events", "emit", "orders", "--extra", "[1]"), "--extra must be a JSON object"),
        (("runs", "logs", "nope"), "run 'nope' does not exist"),
        (("explain", "nope"), "pipeline 'nope' does not exist"),
    ],
)
def test_user_errors_go_to_stderr_with_exit_1(
    synced: str, capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], message: str
) -> None:
    code, out, err = run_cli(capsys, *argv)
    assert (code, out) == (1, "")
    assert message in err


def test_check_fails_without_a_fresh_heartbeat(
    synced: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run_cli(capsys, "check")
    assert code == 1
    assert "stale" in out


@pytest.mark.parametrize("db_backend", ["sqlite"], indirect=True)
def test_bad_config_value_names_key_value_and_allowed(
    cli_database: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRIGGERER_SPARK__MODE", "yarn")
    code, _, err = run_cli(capsys, "runs", "list")
    assert code == 1
    assert "spark.mode = 'yarn'" in err
    assert "'local', 'connect' or 'submit'" in err
