"""``triggerer.service.runs.lifeline``: the process it becomes dies with its parent, even on
kill -9."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import anyio
import pytest

from triggerer.service.runs import lifeline

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG")

PARENT = """
import os, subprocess, sys
child = subprocess.Popen([sys.executable, "-I", {lifeline!r}, str(os.getpid()), "/bin/sleep", "60"])
print(child.pid, flush=True)
child.wait()
"""


def _running(pid: int) -> bool:
    """Whether ``pid`` runs; a zombie (an orphan PID 1 has not reaped) has ended."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat.rpartition(") ")[2].split()[0] != "Z"


async def test_the_program_dies_when_its_parent_is_killed() -> None:
    script = PARENT.format(lifeline=lifeline.__file__)
    async with await anyio.open_process([sys.executable, "-c", script]) as parent:
        assert parent.stdout is not None
        child = int(await parent.stdout.receive())
        with anyio.fail_after(10):
            while True:
                if await anyio.Path(f"/proc/{child}/comm").read_text() == "sleep\n":
                    break  # tied to its parent and past exec
                await anyio.sleep(0.05)
        parent.kill()
        await parent.wait()
        with anyio.fail_after(10):
            while True:
                if not _running(child):
                    break
                await anyio.sleep(0.05)


def test_a_parent_gone_before_the_tie_means_no_program(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    ended = subprocess.run(  # noqa: S603 - our own interpreter and script
        [sys.executable, "-I", lifeline.__file__, "1", "/usr/bin/touch", str(marker)],
        check=False,
    )
    assert ended.returncode == lifeline.EXIT_PARENT_GONE
    assert not marker.exists()


def test_a_program_that_cannot_start_is_named() -> None:
    ended = subprocess.run(  # noqa: S603 - our own interpreter and script
        [sys.executable, "-I", lifeline.__file__, str(os.getpid()), "/nonexistent/spark-submit"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert ended.returncode == lifeline.EXIT_CANNOT_EXEC
    assert ended.stderr == "cannot start /nonexistent/spark-submit: No such file or directory\n"
