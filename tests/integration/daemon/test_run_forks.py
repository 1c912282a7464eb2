"""Runs forked by the run forker: their log and returncode, a forker that dies, a new forker for
a new environment or a module to import ahead, and closing. Real processes; the runs fail
before they need Spark."""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import msgspec
import pytest

from tests.e2e.daemon import (
    daemon_env,
    daemon_settings,
    running_daemon,
    runs,
    sqlite_url,
    stat_fields,
    triggerer_cli,
    wait_for,
    write_pipelines,
)
from triggerer.service.runs import lifeline
from triggerer.service.runs.forks import ForkedRun, ForkerUnavailable, RunForks
from triggerer.service.runs.processes import spark_env, terminate
from triggerer.service.runs.spec import RunSpec, SparkSpec

if TYPE_CHECKING:
    from triggerer.service.store import models

# Its import prints the marker of its environment, then waits when asked to: the pipeline the
# spec names is not there, so a run that goes on fails with the runner's error.
PIPELINE_FILE = """
import os, sys, time
print("forked with", os.environ.get("MARKER"), flush=True)
print("imported ahead:", "wave" in sys.modules, flush=True)
if os.environ.get("WAIT"):
    time.sleep(60)
"""

MANUAL = """
from triggerer import pipeline

@pipeline()
def manual(spark, context): ...
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
        spec = RunSpec(
            run_id=f"absent__{self.count}",
            pipeline_id="absent",
            fileloc=str(self.folder / "pipelines.py"),
            application=None,
            try_number=1,
            partition_key=None,
            params={},
            triggering_events=[],
            spark=SparkSpec(mode="connect", master="local[*]", remote="sc://127.0.0.1:1", conf={}),
        )
        (run / "spec.json").write_bytes(msgspec.json.encode(spec))
        log = run / "run.log"
        process = await self.forks.start_run(run / "spec.json", run / "result.json", log)
        return process, log

    async def start_waiting(self) -> tuple[ForkedRun, Path]:
        """A run that waits (alive while it is looked at), once its pipeline file printed."""
        self.env["WAIT"] = "1"
        process, log = await self.start()
        with anyio.fail_after(30):
            while not logged(log, f"forked with {self.env['MARKER']}"):  # noqa: ASYNC110
                await anyio.sleep(0.05)
        return process, log


@asynccontextmanager
async def forking(
    folder: Path, ahead: Callable[[], frozenset[str]] = frozenset
) -> AsyncIterator[Forks]:
    (folder / "pipelines.py").write_text(PIPELINE_FILE)
    env = spark_env() | {"MARKER": "first"}
    run_forks = RunForks(lambda: dict(env), ahead)
    async with anyio.create_task_group() as group:
        run_forks.serve_in(group)
        yield Forks(folder, run_forks, env)
        await run_forks.close()  # the forker exits, its runs ended: the group ends


def parent_of(pid: int) -> int:
    return int(stat_fields(Path(f"/proc/{pid}/stat"))[1])


def logged(log: Path, text: str) -> bool:
    return log.exists() and text in log.read_text()


def failed(all_runs: list[models.Run]) -> int:
    return sum(run.state == "failed" for run in all_runs)


def exists(pid: int) -> bool:
    return Path(f"/proc/{pid}").exists()


async def ended(process: ForkedRun) -> int:
    with anyio.fail_after(60):
        return await process.wait()


async def terminated(process: ForkedRun) -> int:
    """SIGTERM to the run's process group; its returncode."""
    os.killpg(process.pid, signal.SIGTERM)
    return await ended(process)


async def test_a_run_is_a_fork_in_a_group_of_its_own_with_its_log_and_returncode(
    tmp_path: Path,
) -> None:
    async with forking(tmp_path) as forks:
        first, _ = await forks.start_waiting()
        second, _ = await forks.start_waiting()
        assert parent_of(first.pid) == parent_of(second.pid) != os.getpid()  # the one forker
        assert os.getpgid(first.pid) == first.pid
        assert (await terminated(first), await terminated(second)) == (-signal.SIGTERM,) * 2
        del forks.env["WAIT"]
        failing, log = await forks.start()
        assert await ended(failing) == 1
        assert "pipeline 'absent' is no longer defined" in log.read_text()


async def test_a_run_stopped_as_it_is_forked_ends_before_it_reads_its_spec(
    tmp_path: Path,
) -> None:
    # Cancelled the moment it was forked: the daemon then deletes its spec, so a run that went
    # on would fail reading it, into the log of a run that printed nothing.
    async with forking(tmp_path) as forks:
        forks.env["WAIT"] = "1"
        process, log = await forks.start()
        await terminate(process)
        assert process.returncode == -signal.SIGTERM
        assert not log.exists() or "Traceback" not in log.read_text()


async def test_terminate_ends_a_process_that_leads_no_group_of_its_own() -> None:
    # A run forked moments ago, before its setsid(): its pid names no process group yet.
    process = await anyio.open_process([sys.executable, "-c", "import time; time.sleep(60)"])
    assert os.getpgid(process.pid) != process.pid
    with anyio.fail_after(30):
        await terminate(process)
    assert process.returncode == -signal.SIGTERM


async def test_runs_of_a_forker_that_died_end_killed_and_the_next_run_gets_a_new_one(
    tmp_path: Path,
) -> None:
    async with forking(tmp_path) as forks:
        waiting, _ = await forks.start_waiting()
        forker = parent_of(waiting.pid)
        os.kill(forker, signal.SIGKILL)
        assert await ended(waiting) == -signal.SIGKILL
        after, _ = await forks.start_waiting()  # the same environment
        assert parent_of(after.pid) != forker
        assert await terminated(after) == -signal.SIGTERM


async def test_a_new_environment_gets_a_new_forker_and_the_old_one_ends_with_its_runs(
    tmp_path: Path,
) -> None:
    async with forking(tmp_path) as forks:
        old_run, _ = await forks.start_waiting()
        old_forker = parent_of(old_run.pid)
        forks.env["MARKER"] = "second"
        new_run, _ = await forks.start_waiting()
        assert parent_of(new_run.pid) != old_forker
        assert await terminated(new_run) == -signal.SIGTERM
        # The old forker takes no more runs but waits for its run, which is not cut short.
        assert exists(old_forker)
        assert await terminated(old_run) == -signal.SIGTERM
        with anyio.fail_after(30):
            while exists(old_forker):  # noqa: ASYNC110
                await anyio.sleep(0.05)


async def test_a_module_to_import_ahead_gets_a_new_forker_that_imports_it(tmp_path: Path) -> None:
    # A module that cannot be imported is the runs' to fail on: the forker goes on without it.
    ahead = {"no_such_module_anywhere"}
    async with forking(tmp_path, lambda: frozenset(ahead)) as forks:
        first, log = await forks.start_waiting()
        assert logged(log, "imported ahead: False")
        ahead.add("wave")  # (a module PySpark does not import)
        second, log = await forks.start_waiting()
        assert logged(log, "imported ahead: True")
        assert parent_of(second.pid) != parent_of(first.pid)
        ahead.remove("wave")  # one module fewer: the forker that has it imported goes on
        third, _ = await forks.start_waiting()
        assert parent_of(third.pid) == parent_of(second.pid)
        for run in (first, second, third):
            assert await terminated(run) == -signal.SIGTERM


async def test_a_forker_that_cannot_start_fails_the_run_with_an_error_naming_it(
    tmp_path: Path,
) -> None:
    async with forking(tmp_path) as forks:
        forks.env["PYTHONHOME"] = str(tmp_path / "no-python-here")  # its interpreter cannot start
        with pytest.raises(
            ForkerUnavailable, match=r"run forker \(python -m triggerer.service.runs.forker"
        ):
            await forks.start()


async def test_a_forker_that_cannot_even_be_spawned_fails_the_run_with_the_reason(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(lifeline, "tied", lambda _: [str(tmp_path / "no-such-program")])
    async with forking(tmp_path) as forks:
        reason = r"cannot start the run forker: .*no-such-program"
        with pytest.raises(ForkerUnavailable, match=reason):
            await forks.start()


async def test_through_the_daemon_a_forker_that_cannot_start_fails_its_runs_not_the_daemon(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    write_pipelines(tmp_path / "pipelines", MANUAL)
    url = sqlite_url(tmp_path)
    env = daemon_env(tmp_path, url, "sc://127.0.0.1:1")
    # Every forker the daemon starts exits at once, before it forks anything.
    monkeypatch.setattr(lifeline, "tied", lambda _: [sys.executable, "-c", "raise SystemExit(3)"])
    async with running_daemon(daemon_settings(tmp_path, url, "sc://127.0.0.1:1")):
        for count in (1, 2):  # the daemon goes on to the next run
            triggered = await triggerer_cli(env, "pipelines", "trigger", "manual")
            assert triggered.returncode == 0, triggered.stderr
            done = await wait_for(url, runs, lambda rs, n=count: failed(rs) == n)
    assert all(
        "run forker (python -m triggerer.service.runs.forker) exited" in r.error for r in done
    )
