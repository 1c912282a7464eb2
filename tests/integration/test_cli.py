"""The ``triggerer`` command line against a real database (SQLite and PostgreSQL)."""

from __future__ import annotations

import argparse
import datetime as dt
import json
import logging
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import anyio
import pytest
import structlog
from sqlalchemy import make_url, text

from triggerer.service.api.schemas import CreatedEvent
from triggerer.service.cli import main
from triggerer.service.cli.main import build_parser
from triggerer.service.config import current_settings
from triggerer.service.dead_letters import Unstorable, record_dead_letters
from triggerer.service.events import NewEvent
from triggerer.service.loader import load_pipelines
from triggerer.service.scheduling.registry import sync_definitions
from triggerer.service.store import create_engine, session_factory, upgrade
from triggerer.service.store.engine import sqlite_file

PIPELINES = """
from triggerer import Asset, pipeline

orders = Asset("orders")

@pipeline(schedule=orders)
def count_orders(spark, context): ...

@pipeline(schedule=Asset("s3://lake"))
def load_lake(spark, context): ...
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


TRIGGERER_BIN = Path(sys.executable).with_name("triggerer")


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
    row, _ = json.loads(out)
    assert (row["pipeline_id"], row["schedule"], row["paused"], row["error"]) == (
        "count_orders",
        "orders",
        False,
        None,
    )
    code, out, _ = run_cli(capsys, "assets", "list", "--json")
    assert [a["uri"] for a in json.loads(out)] == ["orders", "s3://lake/"]
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


def test_emit_finds_the_asset_by_its_normalised_uri(
    synced: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(capsys, "events", "emit", "S3://lake")
    assert (code, err) == (0, "")
    assert "on s3://lake/; queued for load_lake" in out


def test_a_paused_pipeline_is_still_queued_and_explain_says_its_events_wait(
    synced: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_cli(capsys, "pipelines", "pause", "count_orders")[0] == 0
    assert "queued for count_orders" in run_cli(capsys, "events", "emit", "orders")[1]
    explained = run_cli(capsys, "explain", "count_orders")[1]
    assert "paused: no runs start; events are still queued (1 now)" in explained
    assert "triggerer pipelines unpause count_orders" in explained
    assert run_cli(capsys, "pipelines", "unpause", "count_orders")[0] == 0
    assert "queued for count_orders" in run_cli(capsys, "events", "emit", "orders")[1]


def test_manual_trigger_creates_a_queued_run_without_logical_date(
    synced: str, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, _ = run_cli(capsys, "pipelines", "trigger", "count_orders")
    assert code == 0
    assert out.startswith("count_orders__manual__")
    [run] = json.loads(run_cli(capsys, "runs", "list", "--json")[1])
    assert (run["run_id"], run["state"], run["run_type"]) == (out.strip(), "queued", "manual")


def test_dead_letters_lists_the_newest_first_with_reason_and_payload(
    synced: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run_cli(capsys, "events", "dead-letters", "--json")[:2] == (0, "[]\n")
    long_text = "x" * 200

    async def dead_letter() -> None:
        engine = create_engine(synced)
        try:
            async with session_factory(engine).begin() as session:
                letters = [
                    Unstorable(
                        NewEvent(1, {"payload": {"n": n, "text": long_text}}, "trigger", f"q/{n}"),
                        f"reason {n}",
                    )
                    for n in range(3)
                ]
                assert await record_dead_letters(session, letters) == 3
        finally:
            await engine.dispose()

    anyio.run(dead_letter)
    code, out, _ = run_cli(capsys, "events", "dead-letters", "--json", "--limit", "2")
    assert code == 0
    rows = json.loads(out)
    assert [(r["dedup_key"], r["reason"], r["asset"]) for r in rows] == [
        ("q/2", "reason 2", "orders"),
        ("q/1", "reason 1", "orders"),
    ]
    assert json.loads(rows[0]["payload"]) == {"payload": {"n": 2, "text": long_text}}
    assert rows[0]["asset_id"] == 1
    columns = ["id", "created_at", "asset", "trigger_id", "dedup_key", "reason", "payload"]
    code, out, _ = run_cli(capsys, "events", "dead-letters")
    header, *lines = out.splitlines()
    assert header.split() == [column.upper() for column in columns]
    assert len(lines) == 3
    assert lines[0].split()[3:6] == ["q/2", "reason", "2"]  # no trigger: an empty cell
    assert lines[0].endswith("xxx…")  # the table cuts the payload, --json does not
    assert long_text not in out


def test_events_table_cuts_payloads_and_leaves_empty_cells_empty(
    synced: str, capsys: pytest.CaptureFixture[str]
) -> None:
    """Was: every row padded to the longest extra (~340 characters), and ``None`` shown."""
    extra = {"payload": {"topic": "orders", "value": {"id": 7, "note": "n" * 300}}}
    assert run_cli(capsys, "events", "emit", "orders", "--extra", json.dumps(extra))[0] == 0
    assert run_cli(capsys, "events", "emit", "orders")[0] == 0

    code, out, _ = run_cli(capsys, "events", "list")

    assert code == 0
    header, short_row, long_row = out.splitlines()  # newest first
    assert header.split() == ["ID", "URI", "SOURCE", "TIMESTAMP", "PARTITION_KEY", "EXTRA"]
    assert "None" not in out  # no partition key: an empty cell
    assert long_row.endswith("  " + json.dumps(extra)[:59] + "…")  # 60 characters
    assert short_row.endswith("{}")  # nothing padded after the last column
    assert json.loads(run_cli(capsys, "events", "list", "--json")[1])[1]["extra"] == extra


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


def test_a_database_never_migrated_is_one_line_naming_the_fix(
    cli_database: str, capsys: pytest.CaptureFixture[str]
) -> None:
    file = sqlite_file(cli_database)
    if file is not None:
        file.touch()  # an empty SQLite database
    code, out, err = run_cli(capsys, "events", "list")
    assert (code, out) == (1, "")
    assert err.startswith("triggerer: the database at ")
    assert "run 'triggerer db upgrade'" in err
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize("db_backend", ["sqlite"], indirect=True)
@pytest.mark.parametrize("argv", [("check",), ("pipelines", "list"), ("events", "emit", "orders")])
def test_a_sqlite_file_that_does_not_exist_is_named_and_not_created(
    cli_database: str, capsys: pytest.CaptureFixture[str], argv: tuple[str, ...]
) -> None:
    file = sqlite_file(cli_database)
    assert file is not None

    code, out, err = run_cli(capsys, *argv)

    assert (code, out) == (1, "")
    assert err == (
        f"triggerer: no database at {file}: 'triggerer run' creates it "
        "(or 'triggerer db upgrade')\n"
    )
    assert not file.exists()


@pytest.mark.parametrize("db_backend", ["sqlite"], indirect=True)
def test_a_store_that_does_not_answer_is_one_line(
    cli_database: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRIGGERER_DATABASE__URL", "postgresql://triggerer:secret@127.0.0.1:1/x")
    code, out, err = run_cli(capsys, "runs", "list")
    assert (code, out) == (1, "")
    assert err.startswith("triggerer: the store at postgresql://triggerer:***@127.0.0.1:1/x")
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize("db_backend", ["sqlite"], indirect=True)
def test_check_says_degraded_when_the_store_does_not_answer(
    cli_database: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRIGGERER_DATABASE__URL", "postgresql://triggerer:secret@127.0.0.1:1/x")
    code, out, err = run_cli(capsys, "check")
    assert (code, err) == (1, "")
    assert out.startswith("degraded: the store at postgresql://triggerer:***@127.0.0.1:1/x")
    assert "secret" not in out


@pytest.mark.parametrize("db_backend", ["sqlite"], indirect=True)
def test_bad_config_value_names_key_value_and_allowed(
    cli_database: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TRIGGERER_SPARK__MODE", "yarn")
    code, _, err = run_cli(capsys, "runs", "list")
    assert code == 1
    assert "spark.mode = 'yarn'" in err
    assert "'local', 'classic', 'connect' or 'submit'" in err


@pytest.mark.parametrize("limit", ["99999999999999999999", "0", "-1", "ten"])
def test_a_limit_out_of_range_is_a_usage_error_naming_it(
    capsys: pytest.CaptureFixture[str], limit: str
) -> None:
    with pytest.raises(SystemExit) as exited:
        main(["pipelines", "list", "--limit", limit])
    assert exited.value.code == 2
    assert f"argument --limit: must be a whole number from 1 to {2**63 - 1}, got {limit!r}" in (
        capsys.readouterr().err
    )


@pytest.mark.parametrize("db_backend", ["sqlite"], indirect=True)
@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("events", "emit", "orders", "--api", ""), "--api must be an http:// or https:// URL"),
        (
            ("events", "emit", "orders", "--api", "http://127.0.0.1:99999"),
            "'http://127.0.0.1:99999'",
        ),
        (("events", "emit", "orders", "--api", "http://127.0.0.1:port"), "'http://127.0.0.1:port'"),
        (("events", "emit", "orders", "--api", "127.0.0.1:8080"), "'127.0.0.1:8080'"),
        (
            ("post", "kafka", "t", "m", "--bootstrap-servers", "127.0.0.1:99999"),
            "--bootstrap-servers must be HOST:PORT[,HOST:PORT...] with ports from 1 to 65535, "
            "got '127.0.0.1:99999'",
        ),
        (("post", "kafak", "t", "m"), "no provider named 'kafak' sends messages"),
        (("post", "nats", "nats://h/S/s", "m", "--key", "k"), "--key is an option of `post kafka`"),
        (("post", "nats", "kafka://h/t", "m"), "'kafka://h/t' is not a nats URI"),
    ],
)
def test_a_bad_address_is_one_line_naming_it(
    cli_database: str, capsys: pytest.CaptureFixture[str], argv: tuple[str, ...], message: str
) -> None:
    code, out, err = run_cli(capsys, *argv)
    assert (code, out) == (1, "")
    assert err.startswith("triggerer: ")
    assert message in err
    assert len(err.splitlines()) == 1


class _FakeApi(BaseHTTPRequestHandler):
    """Answers every POST with 201 and the server's ``body``; none resets the connection."""

    server: _FakeApiServer

    def do_POST(self) -> None:
        self.rfile.read(int(self.headers["Content-Length"]))
        if self.server.body is None:
            # Linger 0: closing sends a reset, as a crashed proxy or server does.
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
            self.close_connection = True
            return
        self.send_response(201)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(self.server.body)))
        self.end_headers()
        self.wfile.write(self.server.body)

    def log_message(self, format: str, *args: object) -> None:
        """Quiet: pytest's output is for the test's own."""


class _FakeApiServer(ThreadingHTTPServer):
    body: bytes | None = None


@pytest.fixture
def fake_api() -> Iterator[_FakeApiServer]:
    """An HTTP server on a free loopback port answering whatever ``body`` is set to."""
    with _FakeApiServer(("127.0.0.1", 0), _FakeApi) as server:
        thread = threading.Thread(target=server.serve_forever)
        thread.start()
        yield server
        server.shutdown()
        thread.join()


def _url(server: _FakeApiServer) -> str:
    host, port = server.server_address[:2]
    return f"http://{host!s}:{port}"


CREATED = CreatedEvent(
    id=7,
    asset_id=1,
    uri="orders",
    source="api",
    timestamp=dt.datetime(2024, 1, 1, tzinfo=dt.UTC),
    partition_key=None,
    extra={},
    source_run_id=None,
    source_trigger_id=None,
    queued_for=["count_orders"],
)


@pytest.mark.parametrize("db_backend", ["sqlite"], indirect=True)
def test_emit_over_the_api_prints_the_created_event(
    cli_database: str, fake_api: _FakeApiServer, capsys: pytest.CaptureFixture[str]
) -> None:
    fake_api.body = CREATED.model_dump_json().encode()
    code, out, err = run_cli(capsys, "events", "emit", "orders", "--api", _url(fake_api))
    assert (code, out, err) == (0, "event 7 on orders; queued for count_orders\n", "")


@pytest.mark.parametrize("db_backend", ["sqlite"], indirect=True)
@pytest.mark.parametrize(
    ("body", "problem"),
    [
        (b"[1]", "(body: Input should be an object)"),
        (b'"x"', "(body: Input should be an object)"),
        (b'{"queued_for":5}', "(id: Field required)"),
        (b'{"queued_for":[1]}', "(id: Field required)"),
        (b'{"id":1}', "(asset_id: Field required)"),
        (
            CREATED.model_dump_json().replace('["count_orders"]', "[1]").encode(),
            "(queued_for.0: Input should be a valid string)",
        ),
        (b"<html>", "(body: Invalid JSON"),
    ],
)
def test_emit_over_the_api_names_an_answer_that_is_not_an_event(
    cli_database: str,
    fake_api: _FakeApiServer,
    capsys: pytest.CaptureFixture[str],
    body: bytes,
    problem: str,
) -> None:
    fake_api.body = body
    code, out, err = run_cli(capsys, "events", "emit", "orders", "--api", _url(fake_api))
    assert (code, out) == (1, "")
    text = body.decode()
    quoted = repr(text if len(text) <= 80 else text[:79] + "…")
    assert err.startswith(
        f"triggerer: the API at {_url(fake_api)} answered 201 with {quoted}, "
        f"which is not a triggerer event {problem}"
    )
    assert len(err.splitlines()) == 1


@pytest.mark.parametrize("db_backend", ["sqlite"], indirect=True)
def test_emit_over_the_api_names_a_dropped_connection(
    cli_database: str, fake_api: _FakeApiServer, capsys: pytest.CaptureFixture[str]
) -> None:
    code, out, err = run_cli(capsys, "events", "emit", "orders", "--api", _url(fake_api))
    assert (code, out) == (1, "")
    assert err == (
        f"triggerer: the API at {_url(fake_api)} closed the connection without an answer "
        "(ReadError); an API serving HTTPS does that to plain HTTP: is it https://?\n"
    )


@pytest.mark.parametrize("db_backend", ["sqlite"], indirect=True)
@pytest.mark.parametrize("unbuffered", [True, False])
def test_a_reader_gone_ends_the_listing_quietly_as_sigpipe_would(
    synced: str, monkeypatch: pytest.MonkeyPatch, unbuffered: bool
) -> None:
    if unbuffered:
        monkeypatch.setenv("PYTHONUNBUFFERED", "1")
    else:
        monkeypatch.delenv("PYTHONUNBUFFERED", raising=False)
    read_end, write_end = os.pipe()
    os.close(read_end)  # closed before the CLI writes: as after `| head -0`, deterministically
    try:
        ended = subprocess.run(  # noqa: S603 - a fixed argv of our own binary
            [TRIGGERER_BIN, "pipelines", "list"],
            stdout=write_end,
            stderr=subprocess.PIPE,
            timeout=60,
            check=False,
        )
    finally:
        os.close(write_end)
    assert (ended.returncode, ended.stderr) == (128 + signal.SIGPIPE, b"")


@pytest.mark.parametrize("db_backend", ["sqlite"], indirect=True)
def test_ctrl_c_during_a_command_exits_130_without_a_traceback(cli_database: str) -> None:
    with socket.create_server(("127.0.0.1", 0)) as silent_api:
        silent_api.settimeout(60)
        url = f"http://127.0.0.1:{silent_api.getsockname()[1]}"
        with subprocess.Popen(  # noqa: S603 - a fixed argv of our own binary
            [TRIGGERER_BIN, "events", "emit", "orders", "--api", url],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
        ) as cli:
            connection, _ = silent_api.accept()
            with connection:
                request = b""
                while b"\r\n\r\n" not in request:  # then the CLI waits for the answer
                    received = connection.recv(4096)
                    assert received, "the CLI closed the connection without a request"
                    request += received
                cli.send_signal(signal.SIGINT)
                out, err = cli.communicate(timeout=60)
    assert (cli.returncode, out, err) == (128 + signal.SIGINT, b"", b"")


def _help_texts(
    parser: argparse.ArgumentParser, words: tuple[str, ...] = ()
) -> Iterator[tuple[str, str]]:
    """(the verb's words, its --help) of the parser and of every verb under it."""
    yield " ".join(words), parser.format_help()
    for action in parser._actions:  # argparse lists its subcommands nowhere else
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _help_texts(sub, (*words, name))


def test_every_help_text_is_plain_text_without_docstring_markup() -> None:
    shown = subprocess.run(  # noqa: S603 - our own command, a fixed argv
        [Path(sys.executable).parent / "triggerer", "--help"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    assert "Run the triggerer daemon, inspect it and drive it." in shown
    for words, help_text in [("", shown), *_help_texts(build_parser())]:
        for markup in ("``", ":class:", ":func:", ":mod:"):
            assert markup not in help_text, (
                f"triggerer {words} --help shows {markup!r}:\n{help_text}"
            )


@pytest.mark.parametrize("db_backend", ["postgresql"], indirect=True)
def test_db_upgrade_names_the_database_without_its_password(
    cli_database: str, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    # The test server's trust authentication ignores the password.
    with_password = make_url(cli_database).set(password="s3cret-pw")  # noqa: S106 - not a secret
    monkeypatch.setenv(
        "TRIGGERER_DATABASE__URL", with_password.render_as_string(hide_password=False)
    )
    current_settings.cache_clear()
    code, out, err = run_cli(capsys, "db", "upgrade")
    assert code == 0, err
    assert "s3cret-pw" not in out + err
    assert ":***@" in out


def test_a_database_a_newer_triggerer_migrated_is_one_line_for_db_upgrade_and_run(
    cli_database: str, tmp_path: Path
) -> None:
    async def migrate_past_this_version() -> None:
        await upgrade(cli_database)
        engine = create_engine(cli_database)
        try:
            async with engine.begin() as connection:
                await connection.execute(text("UPDATE alembic_version SET version_num = '0999'"))
        finally:
            await engine.dispose()

    anyio.run(migrate_past_this_version)
    for argv in (["db", "upgrade"], ["run"]):
        done = subprocess.run(  # noqa: S603 - our own command, a fixed argv
            [TRIGGERER_BIN, *argv],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        assert done.returncode != 0
        said = done.stdout + done.stderr
        assert "schema revision 0999, newer than this triggerer's newest" in said, said
        assert "Traceback" not in said
