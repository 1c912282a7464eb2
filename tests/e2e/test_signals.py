"""SIGTERM is heeded from the first moment of ``triggerer run``: during the start (here, a
store that does not answer yet) it ends the start and the daemon exits 0, instead of dying of
the signal or waiting for the store."""

from __future__ import annotations

import signal
import socket
from typing import TYPE_CHECKING

from tests.e2e.daemon import Deployment, write_pipelines

if TYPE_CHECKING:
    from pathlib import Path


async def test_sigterm_during_the_start_ends_it_cleanly(tmp_path: Path) -> None:
    with socket.socket() as closed:  # a port no database listens on
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    write_pipelines(tmp_path / "pipelines", "")
    url = f"postgresql://postgres@127.0.0.1:{port}/none"
    deployment = Deployment(tmp_path, url, "sc://127.0.0.1:1", "", "")

    with deployment.process_with_config(deployment.config_file()) as daemon:
        daemon.start()
        await daemon.wait_logged("store_unavailable")  # waiting for the store, still starting
        daemon.signal(signal.SIGTERM)
        assert await daemon.wait(timeout_s=60) == 0, daemon.tail()
