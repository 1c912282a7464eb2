"""A run process started before its run: on Spark Connect (``local`` and ``connect`` mode) most
of a run's start is Python importing PySpark's Connect client, about a second. The launcher
keeps one runner process that has done so, waiting on its stdin; a run takes it and the next
one starts warming up. A spare that died meanwhile is replaced by a cold start, never waited on.
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import anyio
import anyio.abc

from triggerer import lifeline
from triggerer.processes import terminate


class SpareRunner:
    """Hands runs to a warm ``python -m triggerer.runner --spare``."""

    def __init__(self, env: Callable[[], dict[str, str]]) -> None:
        self._env = env
        self._spare: anyio.abc.Process | None = None
        self._lock = anyio.Lock()

    async def start_run(
        self, spec_path: Path, result_path: Path, log_path: Path
    ) -> anyio.abc.Process:
        """The process of the run of ``spec_path``, started: the spare if it is alive."""
        async with self._lock:  # one spare: runs starting at once take it in turn
            process, self._spare = self._spare, None
            if process is None or process.returncode is not None:
                process = await self._spawn()
            run = f"{spec_path}\n{result_path}\n{log_path}\n".encode()
            try:
                await _hand(process, run)
            except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
                process = await self._spawn()  # it died after the check: this run starts cold
                await _hand(process, run)
            self._spare = await self._spawn()
            return process

    async def close(self) -> None:
        """Stop the spare (the launcher stops)."""
        process, self._spare = self._spare, None
        if process is not None:
            await terminate(process)

    async def _spawn(self) -> anyio.abc.Process:
        command = [sys.executable, "-m", "triggerer.runner", "--spare"]
        # A process group of its own, tied to the daemon like any run (see triggerer.lifeline).
        return await anyio.open_process(
            [sys.executable, "-I", lifeline.__file__, str(os.getpid()), *command],
            stdin=subprocess.PIPE,
            stdout=subprocess.DEVNULL,  # the run's log, once it has one: the runner redirects
            stderr=subprocess.DEVNULL,
            env=self._env(),
            start_new_session=True,
        )


async def _hand(process: anyio.abc.Process, run: bytes) -> None:
    assert process.stdin is not None  # noqa: S101 - spawned with a pipe
    await process.stdin.send(run)
    await process.stdin.aclose()
