"""The daemon's log as ``triggerer run --config FILE`` writes it to a file: with
``[logging] format = "console"`` plain text, without the colour codes meant for a terminal."""

from __future__ import annotations

import signal
from typing import TYPE_CHECKING

import anyio

from tests.e2e.daemon import Deployment, sqlite_url, write_pipelines

if TYPE_CHECKING:
    from pathlib import Path

ESCAPE = "\x1b["
"""How every ANSI colour code starts."""


async def test_console_log_written_to_a_file_holds_no_colour_codes(tmp_path: Path) -> None:
    """Was: the demo's daemon.log (console format, stderr in a file) was full of them."""
    write_pipelines(tmp_path / "pipelines", "")
    deployment = Deployment(tmp_path, sqlite_url(tmp_path), "sc://127.0.0.1:1", "", "")
    config = deployment.config_file(logging={"format": "console"})

    with deployment.process_with_config(config) as daemon:
        daemon.start()
        with anyio.fail_after(60):
            while "pipelines_loaded" not in daemon.log_path.read_text():  # noqa: ASYNC110 - its writer is another process
                await anyio.sleep(0.1)
        daemon.signal(signal.SIGTERM)
        assert await daemon.wait(timeout_s=30) == 0, daemon.tail()

    text = daemon.log_path.read_text()
    assert "shutdown_complete" in text
    assert ESCAPE not in text
