"""A run process started before its run: on Spark Connect (``local`` and ``connect`` mode) most
of a run's start is Python importing PySpark's Connect client, about a second. The launcher
keeps one runner process that has done so, waiting on its stdin; a run takes it and the next
one starts warming up. A spare that died meanwhile is replaced by a cold start, never waited on.
"""

from __future__ import annotations

import contextlib
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
            run = f"{spec_path}\n{result_path}\n{log_path}\n".encode()
            spare, self._spare = self._spare, None
            if spare is not None and await _handed(spare, run):
                process = spare
            else:
                # None ready, or it died: this run starts cold, its output in its log from
                # the start (an import that fails shows there, and its exit code says so).
                process = await self._spawn(log_path)
                await _handed(process, run)
            self._spare = await self._spawn()
            return process

    async def close(self) -> None:
        """Stop the spare (the launcher stops)."""
        process, self._spare = self._spare, None
        if process is not None:
            await terminate(process)

    async def _spawn(self, log_path: Path | None = None) -> anyio.abc.Process:
        """A runner waiting for its run; its output goes to ``log_path`` until the run makes
        its own log the output (nowhere without one)."""
        command = [sys.executable, "-m", "triggerer.runner", "--spare"]
        with contextlib.ExitStack() as stack:
            output = stack.enter_context(log_path.open("ab")) if log_path else subprocess.DEVNULL
            # A process group of its own, tied to the daemon like any run (triggerer.lifeline).
            return await anyio.open_process(
                lifeline.tied(command),
                stdin=subprocess.PIPE,
                stdout=output,
                stderr=subprocess.STDOUT if log_path else subprocess.DEVNULL,
                env=self._env(),
                start_new_session=True,
            )


async def _handed(process: anyio.abc.Process, run: bytes) -> bool:
    """Whether ``process`` took ``run`` (it may have died meanwhile)."""
    if process.returncode is not None or process.stdin is None:
        return False
    try:
        await process.stdin.send(run)
        await process.stdin.aclose()
    except (anyio.BrokenResourceError, anyio.ClosedResourceError, OSError):
        return False
    return True
