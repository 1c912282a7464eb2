"""Processes that die with the daemon, even when it is killed with SIGKILL (Linux).

The daemon starts every run (and local mode's Spark Connect server) as ``python -I lifeline.py
DAEMON_PID PROGRAM [ARG...]`` (:func:`tied`): the process asks the kernel for SIGKILL when its
parent ends (``PR_SET_PDEATHSIG``), then execs PROGRAM. The request holds across exec (not
across a setuid program), so the runner, or the spark-submit script and the JVM it execs in
turn, go when the daemon goes. The JVM's own children (the runner of a ``submit`` run) ask the
same of the JVM with :func:`die_with_parent`.

Only the standard library is used here: the file runs isolated from the daemon's packages.
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys
from collections.abc import Sequence

PR_SET_PDEATHSIG = 1
EXIT_PARENT_GONE = 1
EXIT_CANNOT_EXEC = 127  # what a shell returns for a command it cannot run


def die_with_parent(parent_pid: int | None = None) -> None:
    """Get SIGKILL when the parent process ends; a no-op outside Linux.

    With ``parent_pid``, exit at once when the parent is not that process any more: it ended
    between this process's fork and the request, so no signal would ever come.
    """
    if not sys.platform.startswith("linux"):
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if parent_pid is not None and os.getppid() != parent_pid:
        sys.exit(EXIT_PARENT_GONE)


def tied(command: Sequence[str]) -> list[str]:
    """The argv that runs ``command`` through this file, tied to the calling process."""
    return [sys.executable, "-I", __file__, str(os.getpid()), *command]


def main(argv: Sequence[str]) -> int:
    """Tie this process to ``argv[0]`` (the parent's PID), then become ``argv[1:]``."""
    parent_pid, program, *arguments = argv
    die_with_parent(int(parent_pid))
    try:
        os.execv(program, [program, *arguments])  # noqa: S606 - the launcher's own argv
    except OSError as error:
        sys.stderr.write(f"cannot start {program}: {error.strerror}\n")
    return EXIT_CANNOT_EXEC


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
