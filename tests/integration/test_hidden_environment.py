"""The daemon hides its environment from the runs it starts as the same user: a process that
calls ``hide_environment`` is no longer dumpable, so its ``/proc`` files are root's alone."""

from __future__ import annotations

import subprocess
import sys

PR_GET_DUMPABLE = 3
CHILD = """
import ctypes
from triggerer.service.runs.processes import hide_environment

prctl = ctypes.CDLL(None).prctl
before = prctl({get}, 0, 0, 0, 0)
hide_environment()
print(before, prctl({get}, 0, 0, 0, 0))
"""


def test_a_process_that_hides_its_environment_is_no_longer_dumpable() -> None:
    code = CHILD.format(get=PR_GET_DUMPABLE)
    shown = subprocess.run(  # noqa: S603 - this interpreter, a fixed program
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert shown.stdout.split() == ["1", "0"]
