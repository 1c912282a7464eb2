"""Runs' logs through ``triggerer run --config``, its REST API and ``triggerer runs logs``: a
run's log is shipped into the store while it runs, so another daemon on the same PostgreSQL
shows it, while it runs and after the daemon that ran it and its logs folder are gone; a daemon
killed during a run leaves what the run had printed, and the run, started again, goes on after
it; the store keeps the latest try's log; a log past ``[runs] log_max_bytes`` keeps its start
and its end and says what was cut; an empty log says why (queued, cancelled before it started,
nothing printed yet or at all); an unknown run is an error."""

from __future__ import annotations

import os
import re
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import httpx
import pytest
from sqlalchemy import func, select

from tests.e2e.daemon import DaemonProcess, Deployment, sqlite_url, triggerer_cli
from tests.e2e.test_api import api_url
from triggerer.service.store import models

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable

    from sqlalchemy.ext.asyncio import AsyncSession

RUN_TIMEOUT_S = 120.0
"""A Spark run on a machine shared with other tests."""
CHATTY = """
    import time
    from pathlib import Path

    from triggerer import pipeline

    @pipeline()
    def chatty(spark, context):
        print("chatty starts", context.run_id, flush=True)
        while Path(HOLD).exists():
            time.sleep(0.05)
        print("chatty counted", spark.range(5).count(), flush=True)
"""


def no_kafka(tmp_path: Path, database_url: str, spark_remote: str) -> Deployment:
    """A deployment whose pipelines watch no broker."""
    return Deployment(tmp_path, database_url, spark_remote, "127.0.0.1:9", "none")


@dataclass
class Daemon:
    """A ``triggerer run --config`` process of its own config file, logs folder and API."""

    name: str
    config: Path
    logs_dir: Path
    process: DaemonProcess
    url: str = ""

    @property
    def pid(self) -> int:
        assert self.process.process is not None
        return self.process.process.pid

    async def start(self) -> None:
        self.process.start()
        await self.process.wait_logged("pipelines_loaded")
        await self.process.wait_logged("api_listening")
        self.url = api_url(self.process)


def daemon(deployment: Deployment, name: str, **sections: dict[str, object]) -> Daemon:
    """A daemon of ``deployment`` (not started) with the API on a free port and its runs'
    logs under ``logs-<name>``; ``sections`` merged into its config."""
    logs_dir = deployment.tmp_path / f"logs-{name}"
    written = deployment.config_file(
        api={"enabled": True, "port": 0}, spark={"logs_dir": str(logs_dir)}, **sections
    )
    config = written.rename(deployment.tmp_path / f"{name}.toml")
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIGGERER_")}
    process = DaemonProcess(env, deployment.tmp_path / f"{name}.log", config)
    return Daemon(name, config, logs_dir, process)


async def until(check: Callable[[], Awaitable[Any]], timeout_s: float = RUN_TIMEOUT_S) -> Any:
    """``await check()`` again until it answers something true; that answer."""
    with anyio.fail_after(timeout_s):
        while not (found := await check()):  # noqa: ASYNC110 - what other processes do
            await anyio.sleep(0.2)
        return found


async def run_state(client: httpx.AsyncClient, run_id: str) -> str:
    state: str = (await client.get(f"/runs/{run_id}")).json()["state"]
    return state


async def owner_pid(deployment: Deployment, run_id: str) -> int:
    """The process id of the daemon that ran ``run_id`` (an instance id is host:pid:nonce)."""

    async def owner(session: AsyncSession) -> str | None:
        return await session.scalar(select(models.Run.owner).where(models.Run.run_id == run_id))

    found = await deployment.query(owner)
    assert found is not None
    return int(found.split(":")[1])


@pytest.mark.parametrize("db_backend", ["postgresql"], indirect=True)
@pytest.mark.timeout(300)
async def test_a_runs_log_is_read_through_another_daemon_after_its_own_and_its_folder_are_gone(
    database_url: str, spark_remote: str, tmp_path: Path
) -> None:
    deployment = no_kafka(tmp_path, database_url, spark_remote)
    hold = tmp_path / "hold"
    hold.touch()
    deployment.write_pipelines(CHATTY.replace("HOLD", repr(str(hold))))
    first, second = daemon(deployment, "first"), daemon(deployment, "second")
    with first.process, second.process:
        await first.start()  # (it migrates the database; the second finds it done)
        await second.start()
        async with (
            httpx.AsyncClient(base_url=first.url, timeout=30) as via_first,
            httpx.AsyncClient(base_url=second.url, timeout=30) as via_second,
        ):
            created = await via_first.post("/pipelines/chatty/runs")
            assert created.status_code == 201, created.text
            run_id = created.json()["run_id"]

            # While it runs, on whichever daemon, both show what it has printed so far.
            for client in (via_first, via_second):
                log = await until(lambda c=client: _log_with(c, run_id, "chatty starts"))
                assert f"chatty starts {run_id}\n" in log
            assert await run_state(via_second, run_id) == "running"

            hold.unlink()
            await until(lambda: _state_is(via_first, run_id, "success"))
            ran = first if await owner_pid(deployment, run_id) == first.pid else second
            other, via_other = (second, via_second) if ran is first else (first, via_first)

            # The daemon that ran it stops, and its logs folder goes (a pod and its emptyDir).
            ran.process.signal(signal.SIGTERM)
            assert await ran.process.wait(60) == 0, ran.process.tail()
            assert (ran.logs_dir / "chatty" / run_id).is_dir()
            shutil.rmtree(ran.logs_dir)

            answer = await via_other.get(f"/runs/{run_id}/logs")
        cli = await triggerer_cli(
            dict(os.environ), "runs", "logs", run_id, "--config", str(other.config)
        )

    assert answer.status_code == 200, answer.text
    assert "Triggerer-Log-Empty" not in answer.headers
    assert f"chatty starts {run_id}\n" in answer.text
    assert "chatty counted 5\n" in answer.text
    assert answer.text.index("chatty starts") < answer.text.index("chatty counted")
    assert not (other.logs_dir / "chatty").exists()  # not from a file of the other daemon
    assert (cli.returncode, cli.stderr) == (0, b""), cli.stderr
    assert cli.stdout.decode() == answer.text


async def _log_with(client: httpx.AsyncClient, run_id: str, text: str) -> str | None:
    answer = await client.get(f"/runs/{run_id}/logs")
    assert answer.status_code == 200, answer.text
    return answer.text if text in answer.text else None


async def _state_is(client: httpx.AsyncClient, run_id: str, state: str) -> bool:
    return await run_state(client, run_id) == state


@pytest.mark.timeout(240)
async def test_a_daemon_killed_during_a_run_leaves_its_log_and_the_run_again_goes_on_after_it(
    tmp_path: Path, spark_remote: str
) -> None:
    deployment = no_kafka(tmp_path, sqlite_url(tmp_path), spark_remote)
    hold = tmp_path / "hold"
    hold.touch()
    deployment.write_pipelines(CHATTY.replace("HOLD", repr(str(hold))))
    killed = daemon(deployment, "killed")
    with killed.process:
        await killed.start()
        async with httpx.AsyncClient(base_url=killed.url, timeout=30) as client:
            run_id = (await client.post("/pipelines/chatty/runs")).json()["run_id"]
            await until(lambda: _log_with(client, run_id, "chatty starts"))
        killed.process.signal(signal.SIGKILL)
        assert await killed.process.wait(10) == -signal.SIGKILL
    shutil.rmtree(killed.logs_dir)

    # Started again (a new pod): the run goes on the same try, its log after what was shipped.
    again = Daemon(
        "again",
        killed.config,
        killed.logs_dir,
        DaemonProcess(killed.process.env, tmp_path / "again.log", killed.config),
    )
    with again.process:
        await again.start()
        async with httpx.AsyncClient(base_url=again.url, timeout=30) as client:
            before_the_rerun = (await client.get(f"/runs/{run_id}/logs")).text
            hold.unlink()
            await until(lambda: _state_is(client, run_id, "success"))
            after = (await client.get(f"/runs/{run_id}/logs")).text
            detail = (await client.get(f"/runs/{run_id}")).json()

    assert f"chatty starts {run_id}\n" in before_the_rerun
    assert detail["try_number"] == 1
    assert after.count(f"chatty starts {run_id}\n") == 2, after
    assert after.startswith(before_the_rerun), after
    assert after.endswith("chatty counted 5\n"), after


VERBOSE = """
    import time

    from triggerer import pipeline

    @pipeline()
    def verbose(spark, context):
        for burst in range(10):  # over several seconds: the store's tail moves on meanwhile
            for n in range(burst * 300, burst * 300 + 300):
                print("verbose line %05d of a run that says too much" % n)
            print(end="", flush=True)
            time.sleep(0.3)
        print("verbose done", flush=True)
"""
LINE = re.compile(r"^verbose line (\d{5}) ", re.MULTILINE)
CAP_BYTES = 16384


@pytest.mark.timeout(240)
async def test_a_log_past_the_cap_keeps_its_start_and_its_end_and_says_what_was_cut(
    tmp_path: Path, spark_remote: str
) -> None:
    deployment = no_kafka(tmp_path, sqlite_url(tmp_path), spark_remote)
    deployment.write_pipelines(VERBOSE)
    single = daemon(deployment, "single", runs={"log_max_bytes": CAP_BYTES})
    with single.process:
        await single.start()
        async with httpx.AsyncClient(base_url=single.url, timeout=30) as client:
            run_id = (await client.post("/pipelines/verbose/runs")).json()["run_id"]
            await until(lambda: _state_is(client, run_id, "success"))
            text = (await client.get(f"/runs/{run_id}/logs")).text
        stored = await deployment.query(_stored_bytes)
    whole = next((single.logs_dir / "verbose" / run_id).glob("try-*.log")).read_text()

    head, cut, tail = re.split(r"^(\[triggerer: .* cut here: .*\]\n)", text, flags=re.MULTILINE)
    assert "of this log cut here: the store keeps the start and the end of a run's log" in cut
    head_lines = [int(n) for n in LINE.findall(head)]
    tail_lines = [int(n) for n in LINE.findall(tail)]
    assert head_lines == list(range(len(head_lines)))  # from the first line on, none missing
    assert tail_lines == list(range(3000 - len(tail_lines), 3000))  # to the last one
    assert tail.endswith("verbose done\n")
    assert len(head.encode()) <= CAP_BYTES // 4 + 1  # (+ the newline ending a line cut in two)
    # At least fifteen sixteenths of the tail's share (it is trimmed a chunk at a time), less
    # the line the cut began.
    assert CAP_BYTES * 3 // 4 * 15 // 16 - 60 <= len(tail.encode()) <= CAP_BYTES * 3 // 4
    assert stored <= CAP_BYTES
    assert len(LINE.findall(whole)) == 3000  # the file holds the whole log


async def _stored_bytes(session: AsyncSession) -> int:
    chunks = models.RunLogChunk
    return int(await session.scalar(select(func.sum(func.length(chunks.data)))) or 0)


FLAKY = """
    from triggerer import pipeline

    @pipeline(retries=1, retry_delay_s=0.1)
    def flaky(spark, context):
        print("flaky try", context.try_number, flush=True)
        if context.try_number == 1:
            raise RuntimeError("the first try fails")
"""


@pytest.mark.timeout(240)
async def test_the_store_keeps_the_log_of_the_latest_try(tmp_path: Path, spark_remote: str) -> None:
    deployment = no_kafka(tmp_path, sqlite_url(tmp_path), spark_remote)
    deployment.write_pipelines(FLAKY)
    single = daemon(deployment, "single")
    with single.process:
        await single.start()
        async with httpx.AsyncClient(base_url=single.url, timeout=30) as client:
            run_id = (await client.post("/pipelines/flaky/runs")).json()["run_id"]
            await until(lambda: _state_is(client, run_id, "success"))
            text = (await client.get(f"/runs/{run_id}/logs")).text
        tries = await deployment.query(_tries_stored)

    assert "flaky try 2\n" in text
    assert "flaky try 1" not in text
    assert tries == [2]


async def _tries_stored(session: AsyncSession) -> list[int]:
    chunks = models.RunLogChunk
    return list((await session.scalars(select(chunks.try_number).distinct())).all())


HELD = """
    import time
    from pathlib import Path

    from triggerer import pipeline

    @pipeline()
    def held(spark, context):
        while Path(HOLD).exists():
            time.sleep(0.05)
"""


@pytest.mark.timeout(240)
async def test_an_empty_log_says_why_and_an_unknown_run_is_an_error(
    tmp_path: Path, spark_remote: str
) -> None:
    deployment = no_kafka(tmp_path, sqlite_url(tmp_path), spark_remote)
    hold = tmp_path / "hold"
    hold.touch()
    deployment.write_pipelines(HELD.replace("HOLD", repr(str(hold))))
    single = daemon(deployment, "single", runs={"parallelism": 1})
    env = dict(os.environ)

    async def logs(run_id: str) -> tuple[int, str, str]:
        done = await triggerer_cli(env, "runs", "logs", run_id, "--config", str(single.config))
        return done.returncode, done.stdout.decode(), done.stderr.decode()

    with single.process:
        await single.start()
        async with httpx.AsyncClient(base_url=single.url, timeout=30) as client:
            running = (await client.post("/pipelines/held/runs")).json()["run_id"]
            await until(lambda: _state_is(client, running, "running"))
            waiting = (await client.post("/pipelines/held/runs")).json()["run_id"]
            silent_so_far = await client.get(f"/runs/{running}/logs")

            # Queued behind the running one ([runs] parallelism = 1): not started yet.
            queued = await client.get(f"/runs/{waiting}/logs")
            said_queued = await logs(waiting)
            cancelled = await client.post(f"/runs/{waiting}/cancel")
            assert cancelled.json()["state"] == "cancelled", cancelled.text
            before_start = await client.get(f"/runs/{waiting}/logs")
            said_before_start = await logs(waiting)

            # The run: cancelled while it ran, having printed nothing.
            assert (await client.post(f"/runs/{running}/cancel")).status_code == 200
            await until(lambda: _state_is(client, running, "cancelled"))
            silent = await client.get(f"/runs/{running}/logs")
            said_silent = await logs(running)

            unknown = await client.get("/runs/held__manual__999/logs")
            said_unknown = await logs("held__manual__999")

    assert (silent_so_far.text, silent_so_far.headers["Triggerer-Log-Empty"]) == (
        "",
        "no_output_yet",
    )
    assert (queued.status_code, queued.text) == (200, "")
    assert queued.headers["Triggerer-Log-Empty"] == "not_started"
    assert said_queued == (
        0,
        "",
        f"run {waiting} has no log: the run has not started yet: it is queued\n",
    )
    assert (before_start.status_code, before_start.text) == (200, "")
    assert before_start.headers["Triggerer-Log-Empty"] == "cancelled_before_start"
    assert before_start.headers["Triggerer-Log-Empty-Reason"] == (
        "the run was cancelled before it started"
    )
    assert said_before_start == (
        0,
        "",
        f"run {waiting} has no log: the run was cancelled before it started\n",
    )
    assert (silent.status_code, silent.text) == (200, "")
    assert silent.headers["Triggerer-Log-Empty"] == "no_output"
    assert said_silent == (0, "", f"run {running} has no log: the run printed nothing\n")
    assert unknown.status_code == 404
    assert "retention deletes a run, and its log" in unknown.json()["detail"]
    code, out, err = said_unknown
    assert (code, out) == (1, "")
    assert err.startswith("triggerer: run 'held__manual__999' does not exist"), err
