"""SIGTERM is heeded from the first moment of ``triggerer run``: during the start (here, a
store that does not answer yet) it ends the start and the daemon exits 0, instead of dying of
the signal or waiting for the store; and what a library leaves running never holds the exit."""

from __future__ import annotations

import signal
import socket
from typing import TYPE_CHECKING

from tests.e2e.daemon import Deployment, sqlite_url, write_pipelines

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


LEAVES_A_TASK = """
    import asyncio

    from triggerer import Asset, AssetWatcher, BaseEventTrigger

    async def close_connection():
        # As aiosqlite's close when SQLAlchemy stopped its thread meanwhile: the first cancel
        # ends the wait for the close, and the wait for the thread's stop never ends.
        try:
            await asyncio.Event().wait()
        finally:
            await asyncio.Event().wait()

    class ClientTrigger(BaseEventTrigger):
        def serialize(self):
            return ClientTrigger.classpath(), {}

        async def run(self):
            self.closing = asyncio.get_running_loop().create_task(close_connection())
            await asyncio.Event().wait()
            yield

    orders = Asset("orders", watchers=[AssetWatcher("client", ClientTrigger())])
"""


async def test_a_task_left_running_by_a_library_does_not_hold_the_exit(tmp_path: Path) -> None:
    """Was: a signal during the start that cancelled a SQLite statement left such a task, and
    ``asyncio.run``, which cancels once, waited for it without end."""
    write_pipelines(tmp_path / "pipelines", LEAVES_A_TASK)
    deployment = Deployment(tmp_path, sqlite_url(tmp_path), "sc://127.0.0.1:1", "", "")

    with deployment.process_with_config(deployment.config_file()) as daemon:
        await deployment.start_watching(daemon)
        daemon.signal(signal.SIGTERM)
        assert await daemon.wait(timeout_s=60) == 0, daemon.tail()
