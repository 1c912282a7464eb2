"""How the daemon supervises its local Spark Connect server, with a stand-in server: a Python
process that listens on the port it is given (the real server is in tests/e2e/test_local_spark.py,
at a JVM's pace). Ready once it listens, kept past the start timeout, started again when it
dies, stopped when cancelled."""

from __future__ import annotations

import os
import signal
import sys
from pathlib import Path

import anyio
import pytest
from structlog.testing import capture_logs

from tests.e2e.daemon import alive
from triggerer.service.config import SparkSettings
from triggerer.service.runs import spark_server
from triggerer.service.runs.spark_server import LocalSparkServer

LISTENER = """
import socket, sys, time
server = socket.socket()
server.bind(("127.0.0.1", int(sys.argv[1])))
server.listen()
time.sleep(3600)
"""


@pytest.fixture
def server(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> LocalSparkServer:
    monkeypatch.setattr(spark_server, "START_TIMEOUT_S", 1.0)
    supervised = LocalSparkServer(
        SparkSettings(logs_dir=tmp_path / "logs"), restart_backoff_max_s=0.5
    )
    monkeypatch.setattr(
        supervised, "_command", lambda port: [sys.executable, "-c", LISTENER, str(port)]
    )
    return supervised


async def test_ready_when_it_listens_kept_past_the_start_timeout_restarted_and_stopped(
    server: LocalSparkServer,
) -> None:
    async with anyio.create_task_group() as daemon:
        daemon.start_soon(server.run)
        with anyio.fail_after(10):
            remote = await server.wait_ready()
        assert remote.startswith("sc://localhost:")
        first = server.pid
        assert first is not None

        await anyio.sleep(2.0)  # twice the start timeout: a running server is left alone
        assert (server.pid, await server.wait_ready()) == (first, remote)

        os.kill(first, signal.SIGKILL)
        with anyio.fail_after(10):
            while server.pid in (first, None):  # noqa: ASYNC110  # the pid is what changes
                await anyio.sleep(0.05)
        second = server.pid
        assert second is not None
        assert await server.wait_ready() != remote  # a port of its own

        daemon.cancel_scope.cancel()
    assert not alive(second)


async def test_a_server_that_exits_while_starting_is_started_again(
    server: LocalSparkServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    attempts: list[int] = []

    def failing_then_listening(port: int) -> list[str]:
        attempts.append(port)
        if len(attempts) == 1:
            return [sys.executable, "-c", "raise SystemExit(3)"]
        return [sys.executable, "-c", LISTENER, str(port)]

    monkeypatch.setattr(server, "_command", failing_then_listening)
    async with anyio.create_task_group() as daemon:
        daemon.start_soon(server.run)
        with anyio.fail_after(10):
            await server.wait_ready()
        daemon.cancel_scope.cancel()
    assert len(attempts) == 2


async def test_a_log_folder_that_cannot_be_made_is_reported_and_the_start_tried_again(
    server: LocalSparkServer,
) -> None:
    """Was: the OSError of opening its log stopped the daemon."""
    blocking = server.log_path.parent  # a file where the logs folder goes
    blocking.write_text("")
    with capture_logs() as logs:
        async with anyio.create_task_group() as daemon:
            daemon.start_soon(server.run)
            with anyio.fail_after(10):
                while not logs:  # noqa: ASYNC110  # the log is what tells
                    await anyio.sleep(0.05)
            blocking.unlink()
            with anyio.fail_after(10):
                await server.wait_ready()
            daemon.cancel_scope.cancel()
    exited = next(entry for entry in logs if entry["event"] == "spark_server_exited")
    assert exited["reason"] == f"it could not start: [Errno 17] File exists: '{blocking}'"
