"""How the daemon's log lines look: JSON, or console text coloured only on a terminal."""

from __future__ import annotations

import io
import json
import logging
import sys
from collections.abc import Iterator

import pytest
import structlog

from triggerer.service.config import LoggingSettings
from triggerer.service.logs import configure_logging

ESCAPE = "\x1b["
"""How every ANSI colour code starts."""


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _logging_as_it_was() -> Iterator[None]:
    root = logging.getLogger()
    handlers, level, config = root.handlers[:], root.level, structlog.get_config()
    yield
    root.handlers[:] = handlers
    root.setLevel(level)
    structlog.configure(**config)


def logged(monkeypatch: pytest.MonkeyPatch, stream: io.StringIO, log_format: str) -> str:
    """What the daemon's logging writes to ``stream`` as stderr: an event, then an error with
    its traceback."""
    monkeypatch.setattr(sys, "stderr", stream)
    configure_logging(LoggingSettings.model_validate({"format": log_format}))
    log = structlog.get_logger("triggerer.test")
    log.warning("trigger_failed", trigger_id=7, error="ConnectionError: no broker")
    try:
        raise ConnectionError("no broker")
    except ConnectionError:
        log.exception("daemon_crashed")
    return stream.getvalue()


def test_console_output_to_a_file_is_plain_text(monkeypatch: pytest.MonkeyPatch) -> None:
    """Was: ``format = "console"`` with stderr in a file (the demo's daemon.log) wrote colour
    codes into it."""
    text = logged(monkeypatch, io.StringIO(), "console")

    assert ESCAPE not in text
    assert "trigger_failed" in text
    assert "trigger_id=7" in text
    assert "ConnectionError: no broker" in text


def test_console_output_on_a_terminal_is_coloured(monkeypatch: pytest.MonkeyPatch) -> None:
    assert ESCAPE in logged(monkeypatch, Terminal(), "console")


@pytest.mark.parametrize("log_format", ["auto", "json"])
def test_a_file_gets_json_lines(monkeypatch: pytest.MonkeyPatch, log_format: str) -> None:
    lines = logged(monkeypatch, io.StringIO(), log_format).splitlines()

    records = [json.loads(line) for line in lines]
    assert [r["event"] for r in records] == ["trigger_failed", "daemon_crashed"]
    assert records[0]["trigger_id"] == 7
    assert "ConnectionError: no broker" in records[1]["exception"]
