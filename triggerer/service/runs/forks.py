"""Runs on Spark Connect start as forks of a warm run forker (``triggerer.service.runs.forker``).

The forker starts with the first such run and stays for the next ones. One that died is
replaced at the next run; its runs died with it and end with SIGKILL's returncode. When the
runs' environment changes (the local Spark Connect server restarted with a new token), or a run
needs a module imported ahead that the forker did not import (a pipeline with a new kind of
trigger), a new forker takes the next runs and the old one exits once its runs have ended.
"""

from __future__ import annotations

import math
import os
import signal
import subprocess
import sys
from collections.abc import Callable, Iterable
from pathlib import Path

import anyio
import anyio.abc
from anyio.streams.buffered import BufferedByteReceiveStream

from triggerer.service.runs import lifeline

_LINE_MAX_BYTES = 64


def modules_ahead(triggers: Iterable[object], pipelines_dir: Path) -> frozenset[str]:
    """The modules the run forker imports ahead for runs of pipelines that declare ``triggers``:
    those defining the triggers' classes, but for modules of ``pipelines_dir`` (a run imports
    those afresh: they may have changed since)."""
    folder = os.path.join(os.path.abspath(pipelines_dir), "")
    modules = set()
    for trigger in triggers:
        name = type(trigger).__module__
        file = getattr(sys.modules.get(name), "__file__", None)
        if file is not None and not os.path.abspath(file).startswith(folder):
            modules.add(name)
    return frozenset(modules)


class ForkedRun:
    """A run's process, forked by the run forker: what the launcher needs of a process."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode: int | None = None
        self._ended = anyio.Event()

    async def wait(self) -> int:
        await self._ended.wait()
        assert self.returncode is not None  # noqa: S101  # set before _ended
        return self.returncode

    def ended(self, returncode: int) -> None:
        self.returncode = returncode
        self._ended.set()


class ForkerUnavailable(RuntimeError):
    """No run forker could start the run: the run fails with this, the daemon goes on."""


class _ForkerGone(Exception):
    """The forker ended before it forked the run."""


class _Forker:
    """One run forker process, and its runs."""

    def __init__(
        self, process: anyio.abc.Process, env: dict[str, str], modules: frozenset[str]
    ) -> None:
        self.process = process
        self.env = env
        self.modules = modules
        self._forked_in, self._forked = anyio.create_memory_object_stream[ForkedRun](math.inf)
        self._runs: dict[int, ForkedRun] = {}

    async def fork(self, request: bytes) -> ForkedRun:
        if self.process.stdin is None:
            raise _ForkerGone
        try:
            await self.process.stdin.send(request)
            # Asked, the answer is this run's, whoever is cancelled: never the next run's.
            with anyio.CancelScope(shield=True):
                forked = await self._forked.receive()
        except (anyio.BrokenResourceError, anyio.ClosedResourceError, anyio.EndOfStream):
            raise _ForkerGone from None
        return forked

    async def take_no_more(self) -> None:
        """Close its stdin: it exits once its runs have ended."""
        if self.process.stdin is not None:
            await self.process.stdin.aclose()

    async def read(self) -> None:
        """Pass on what the forker says, until it exits (or the daemon stops: it dies with
        the daemon, and its runs with it)."""
        assert self.process.stdout is not None  # noqa: S101  # opened with a pipe
        answers = BufferedByteReceiveStream(self.process.stdout)
        try:
            while True:
                line = await answers.receive_until(b"\n", _LINE_MAX_BYTES)
                pid, *returncode = map(int, line.split())
                if not returncode:
                    self._runs[pid] = run = ForkedRun(pid)
                    await self._forked_in.send(run)
                elif (ended := self._runs.pop(pid, None)) is not None:
                    ended.ended(returncode[0])
        except (anyio.EndOfStream, anyio.IncompleteRead, anyio.BrokenResourceError):
            await self.process.wait()  # it exited
        finally:
            self._forked_in.close()
            self._forked.close()
            for run in self._runs.values():
                run.ended(-signal.SIGKILL)  # they died with it
            with anyio.CancelScope(shield=True):
                await self.process.stdout.aclose()
                await self.take_no_more()


class RunForks:
    """Starts runs as forks of the current run forker, in the environment ``env()`` gives, with
    the modules ``ahead()`` names imported ahead. Its readers run in the task group given to
    :meth:`serve_in`, so runs may outlive the launcher's loop."""

    def __init__(
        self,
        env: Callable[[], dict[str, str]],
        ahead: Callable[[], frozenset[str]] = frozenset,
    ) -> None:
        self._env = env
        self._ahead = ahead
        self._forker: _Forker | None = None
        self._lock = anyio.Lock()
        self._task_group: anyio.abc.TaskGroup | None = None

    def serve_in(self, task_group: anyio.abc.TaskGroup) -> None:
        self._task_group = task_group

    async def start_run(self, spec_path: Path, result_path: Path, log_path: Path) -> ForkedRun:
        """The process of the run of ``spec_path``, forked."""
        request = f"{spec_path}\t{result_path}\t{log_path}\n".encode()
        async with self._lock:  # one fork at a time: answers come in the order asked
            # A forker that died since the last run (its runs went with it) gets one successor.
            for _ in range(2):
                try:
                    return await (await self._current()).fork(request)
                except _ForkerGone:
                    self._forker = None
            raise ForkerUnavailable(
                "the run forker (python -m triggerer.service.runs.forker) exited before it started "
                "the run: its error is in the daemon's output"
            )

    async def close(self) -> None:
        """Take no more runs; the forker exits once its runs have ended."""
        forker, self._forker = self._forker, None
        if forker is not None:
            await forker.take_no_more()

    async def _current(self) -> _Forker:
        env, modules = self._env(), self._ahead()
        forker = self._forker
        if (
            forker is not None
            and forker.process.returncode is None
            and forker.env == env
            and modules <= forker.modules
        ):
            return forker
        if forker is not None:
            await forker.take_no_more()
        if self._task_group is None:
            raise RuntimeError("RunForks.start_run() before serve_in()")
        try:
            process = await anyio.open_process(
                lifeline.tied(
                    [sys.executable, "-m", "triggerer.service.runs.forker", *sorted(modules)]
                ),
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=None,  # its own errors (an import that fails) in the daemon's output
                env=env,
                start_new_session=True,
            )
        except OSError as error:  # no process at all (no memory, no file descriptors)
            raise ForkerUnavailable(f"cannot start the run forker: {error}") from None
        self._forker = _Forker(process, env, modules)
        self._task_group.start_soon(self._forker.read)
        return self._forker
