"""Runs forked by the run forker: their log and returncode, a forker that dies, a new forker for
a new environment, and closing. Real processes; the runs fail before they need Spark."""

from __future__ import annotations

import json
import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from pathlib import Path

import anyio

from triggerer.daemon.run_forks import ForkedRun, RunForks
from triggerer.processes import spark_env

# Its import prints the marker of its environment, then waits when asked to: the pipeline the
# spec names is not there, so a run that goes on fails with the runner's error.
PIPELINE_FILE = """
import os, time
print("forked with", os.environ.get("MARKER"), flush=True)
if os.environ.get("WAIT"):
    time.sleep(60)
"""


class Forks:
    def __init__(self, folder: Path, forks: RunForks, env: dict[str, str]) -> None:
        self.folder = folder
        self.forks = forks
        self.env = env
        self.count = 0

    async def start(self) -> tuple[ForkedRun, Path]:
        self.count += 1
        run = self.folder / f"run-{self.count}"
        run.mkdir()
        spec = {"fileloc": str(self.folder / "pipelines.py"), "pipeline_id": "absent"}
        (run / "spec.json").write_text(json.dumps(spec))
        log = run / "run.log"
        process = await self.forks.start_run(run / "spec.json", run / "result.json", log)
        return process, log


@asynccontextmanager
async def forking(folder: Path) -> AsyncIterator[Forks]:
    (folder / "pipelines.py").write_text(PIPELINE_FILE)
    env = spark_env() | {"MARKER": "first"}
    run_forks = RunForks(lambda: dict(env))
    async with anyio.create_task_group() as group:
        run_forks.serve_in(group)
        yield Forks(folder, run_forks, env)
        await run_forks.close()  # the forker exits, its runs ended: the group ends


def parent_of(pid: int) -> int:
    return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[1])


async def ended(process: ForkedRun) -> int:
    with anyio.fail_after(60):
        return await process.wait()


def logged(log: Path, text: str) -> bool:
    return log.exists() and text in log.read_text()


def exists(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


async def until_logged(log: Path, text: str) -> None:
    with anyio.fail_after(30):
        while not logged(log, text):  # noqa: ASYNC110
            await anyio.sleep(0.05)


async def test_a_run_is_a_fork_in_a_group_of_its_own_with_its_log_and_returncode(
    tmp_path: Path,
) -> None:
    async with forking(tmp_path) as forks:
        await _a_run_is_a_fork(forks)


async def _a_run_is_a_fork(forks: Forks) -> None:
    forks.env["WAIT"] = "1"  # alive while they are looked at
    first, first_log = await forks.start()
    second, second_log = await forks.start()
    await until_logged(first_log, "forked with first")
    await until_logged(second_log, "forked with first")
    assert parent_of(first.pid) == parent_of(second.pid) != os.getpid()  # the one forker
    assert os.getpgid(first.pid) == first.pid
    for run in (first, second):
        os.killpg(run.pid, signal.SIGTERM)
        assert await ended(run) == -signal.SIGTERM
    del forks.env["WAIT"]
    failing, log = await forks.start()
    assert await ended(failing) == 1
    assert "pipeline 'absent' is no longer defined" in log.read_text()


async def test_runs_of_a_forker_that_died_end_killed_and_the_next_run_gets_a_new_one(
    tmp_path: Path,
) -> None:
    async with forking(tmp_path) as forks:
        await _a_dead_forker_is_replaced(forks)


async def _a_dead_forker_is_replaced(forks: Forks) -> None:
    forks.env["WAIT"] = "1"
    waiting, log = await forks.start()
    await until_logged(log, "forked with")
    forker = parent_of(waiting.pid)
    os.kill(forker, signal.SIGKILL)
    assert await ended(waiting) == -signal.SIGKILL
    after, after_log = await forks.start()  # the same environment
    await until_logged(after_log, "forked with")
    assert parent_of(after.pid) != forker
    os.killpg(after.pid, signal.SIGTERM)
    assert await ended(after) == -signal.SIGTERM


async def test_a_new_environment_gets_a_new_forker_and_the_old_one_ends_with_its_runs(
    tmp_path: Path,
) -> None:
    async with forking(tmp_path) as forks:
        await _a_new_environment_gets_a_new_forker(forks)


async def _a_new_environment_gets_a_new_forker(forks: Forks) -> None:
    forks.env["WAIT"] = "1"
    old_run, old_log = await forks.start()
    await until_logged(old_log, "forked with first")
    old_forker = parent_of(old_run.pid)
    forks.env["MARKER"] = "second"
    new_run, new_log = await forks.start()
    await until_logged(new_log, "forked with second")
    assert parent_of(new_run.pid) != old_forker
    os.killpg(new_run.pid, signal.SIGTERM)
    assert await ended(new_run) == -signal.SIGTERM
    # The old forker takes no more runs but waits for its run, which is not cut short.
    assert exists(old_forker)
    os.killpg(old_run.pid, signal.SIGTERM)
    assert await ended(old_run) == -signal.SIGTERM
    with anyio.fail_after(30):
        while exists(old_forker):  # noqa: ASYNC110
            await anyio.sleep(0.05)
