"""The warm Spark of ``[spark] mode = "local"``: one Spark Connect server the daemon starts on
loopback, restarts when it dies and stops with itself. Each run connects to it with a session
of its own (temporary views and SQL conf stay per run) while the JVM stays warm: a run starts in
under half a second (forked by the run forker) instead of the ten a JVM of its own takes.

The server is spark-submit running ``SparkConnectServer`` in the foreground, a child of the
daemon tied to it like a run (:mod:`triggerer.service.runs.lifeline`), on a free loopback port,
with a token made at start: only processes the daemon gives the token to (its runs, through
``SPARK_CONNECT_AUTHENTICATE_TOKEN``) can use it. PySpark's own reusable local server
(``spark.local.connect.reuse``) was not used: it detaches the server through ``sbin/`` scripts
and shares it between every process of the user through a discovery file, where the daemon needs
a child it supervises and stops.
"""

from __future__ import annotations

import os
import secrets
import socket
import subprocess
from typing import TYPE_CHECKING

import anyio
import anyio.abc
import structlog

from triggerer.backoff import backoff_s
from triggerer.service.runs import lifeline
from triggerer.service.runs.processes import LOOPBACK, spark_conf, spark_env, spark_home, terminate

if TYPE_CHECKING:
    from triggerer.service.config import SparkSettings

log = structlog.get_logger(__name__)

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
TOKEN_VARIABLE = "SPARK_CONNECT_AUTHENTICATE_TOKEN"  # noqa: S105  # a name, not a token
"""Where the server and its clients read the token from (never on a command line)."""
START_TIMEOUT_S = 180.0
"""How long a start may take before the server is killed and started again."""
STABLE_AFTER_S = 60.0
"""A server that ran this long before exiting is restarted at once, not backed off."""


class LocalSparkServer:
    """Runs the Spark Connect server of ``settings`` (its ``master`` and ``conf``) until
    cancelled; :meth:`wait_ready` gives the address runs connect to."""

    def __init__(self, settings: SparkSettings, *, restart_backoff_max_s: float) -> None:
        self._settings = settings
        self._restart_backoff_max_s = restart_backoff_max_s
        self._token = secrets.token_urlsafe(32)
        self._remote: str | None = None
        self._ready = anyio.Event()
        self.log_path = settings.logs_dir / "spark-connect-server.log"
        self.pid: int | None = None
        """The server's process, while it runs."""
        self.start_s: float | None = None
        """How long its last start took, until it accepted connections."""

    @property
    def client_env(self) -> dict[str, str]:
        """What a run's process needs in its environment to be let in."""
        return {TOKEN_VARIABLE: self._token}

    async def wait_ready(self) -> str:
        """``sc://localhost:PORT`` once the server accepts sessions (waiting while it starts
        or restarts)."""
        while self._remote is None:
            await self._ready.wait()
        return self._remote

    async def run(self) -> None:
        """Start the server and start it again whenever it exits, until cancelled (which
        stops it)."""
        failures = 0
        while True:
            started = anyio.current_time()
            reason = await self._serve_once()
            # Not ready until the next start: waiters wake and wait for that one.
            was_ready, self._remote, self._ready = self._ready, None, anyio.Event()
            was_ready.set()
            failures = 1 if anyio.current_time() - started > STABLE_AFTER_S else failures + 1
            delay_s = backoff_s(failures, self._restart_backoff_max_s)
            log.error(
                "spark_server_exited",
                reason=reason,
                restart_in_s=round(delay_s, 1),
                log=str(self.log_path),
                hint="runs wait for it; its log says why it stopped",
            )
            await anyio.sleep(delay_s)

    async def _serve_once(self) -> str:
        """Run one server process until it exits; why it did."""
        port = _free_port()
        started = anyio.current_time()
        try:
            self.log_path.parent.mkdir(parents=True, exist_ok=True)
            with self.log_path.open("ab") as log_file:
                process = await anyio.open_process(
                    self._command(port),
                    stdin=subprocess.DEVNULL,
                    stdout=log_file,
                    stderr=subprocess.STDOUT,
                    env={**spark_env(self._settings.master), **self.client_env},
                    start_new_session=True,
                )
        except OSError as error:  # its log cannot be written, or no process can be made
            return f"it could not start: {error}"
        try:
            with anyio.move_on_after(START_TIMEOUT_S) as starting:
                while not await _accepts(port):
                    if process.returncode is not None:
                        return f"it exited with code {process.returncode} while starting"
                    await anyio.sleep(0.2)
            if starting.cancelled_caught:
                return f"it did not listen within {START_TIMEOUT_S:.0f} s"
            self._remote = f"sc://localhost:{port}"
            self.pid, self.start_s = process.pid, anyio.current_time() - started
            self._ready.set()
            log.info(
                "spark_server_ready",
                remote=self._remote,
                master=self._settings.master,
                start_s=round(self.start_s, 1),
                pid=process.pid,
            )
            return f"it exited with code {await process.wait()}"
        finally:
            self.pid = None
            with anyio.CancelScope(shield=True):
                await terminate(process)

    def _command(self, port: int) -> list[str]:
        confs = {
            "spark.ui.enabled": "false",  # unless [spark] conf turns it on
            **spark_conf(self._settings.master, self._settings.conf),
            "spark.connect.grpc.binding.address": LOOPBACK,
            "spark.connect.grpc.binding.port": str(port),
        }
        submit = os.path.join(spark_home(), "bin", "spark-submit")
        command = [submit, "--class", SERVER_CLASS, "--master", self._settings.master]
        command += [f"--conf={key}={value}" for key, value in confs.items()]
        return lifeline.tied(command)


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((LOOPBACK, 0))
        port: int = probe.getsockname()[1]
        return port


async def _accepts(port: int) -> bool:
    try:
        stream = await anyio.connect_tcp(LOOPBACK, port)
    except OSError:
        return False
    await stream.aclose()
    return True
