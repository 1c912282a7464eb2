"""Cancelling and re-running runs through ``triggerer run --config``, with the CLI (another
process) and the REST API: a cancelled run's process group is stopped within a second or so,
the run ends ``cancelled`` with no outlet event and no retry, and its events are not queued
again; a queued run is cancelled before it starts; a finished run cannot be cancelled, nor a
running one re-run; a re-run consumes the same events and says what it re-ran."""

from __future__ import annotations

import json
import os
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

import anyio
import httpx
import pytest

from tests.e2e.daemon import (
    ORDERS,
    alive,
    consumed,
    event_count,
    events_of,
    queued_events,
    runs,
    stat_fields,
    triggerer_cli,
)
from tests.e2e.test_api import api_url

if TYPE_CHECKING:
    from tests.e2e.conftest import MakeDeployment

TOKEN = "e2e-token"  # noqa: S105 - the token this test configures
HELD = """
    import os, subprocess, time
    from pathlib import Path

    report = Asset("report")
    folder = Path(FOLDER)

    @pipeline(schedule=orders, outlets=[report], run_policy="per_event", retries=2)
    def held(spark, context):
        sleeper = subprocess.Popen(["sleep", "300"])  # in the run's process group
        written = folder / ("." + context.run_id)  # renamed once whole
        written.write_text(str(os.getpid()) + " " + str(sleeper.pid))
        written.rename(folder / context.run_id)
        while (folder / "hold").exists():
            time.sleep(0.05)
        sleeper.kill()
        sleeper.wait()

    @pipeline()
    def by_hand(spark, context):
        pass
"""
CANCELLED_WITHIN_S = 3.0
"""From the cancel's commit to the run recorded ``cancelled``: far below the launcher's sweep
on PostgreSQL (a notice tells it), a poll of a second on SQLite, plus stopping the process."""


def gone(pid: int) -> bool:
    """Whether process ``pid`` has ended (a zombie no one reaped yet has)."""
    try:
        return not alive(pid) or stat_fields(Path(f"/proc/{pid}/stat"))[0] == "Z"
    except OSError:
        return True


async def started(folder: Path, seen: set[str]) -> tuple[str, list[int]]:
    """Once a run of ``held`` not in ``seen`` has begun: its run id (added to ``seen``), and
    the pids of its process and of the ``sleep`` it started."""
    with anyio.fail_after(120):
        while not (new := await _run_ids(folder) - seen):  # noqa: ASYNC110 - a file appears
            await anyio.sleep(0.05)
    [run_id] = new
    seen.add(run_id)
    pids = await (anyio.Path(folder) / run_id).read_text()
    return run_id, [int(pid) for pid in pids.split()]


async def _run_ids(folder: Path) -> set[str]:
    names = {path.name async for path in anyio.Path(folder).iterdir()}
    return {name for name in names if name != "hold" and not name.startswith(".")}


@pytest.mark.timeout(300)
async def test_runs_are_cancelled_and_rerun_through_the_cli_and_the_api(
    database_url: str, make_deployment: MakeDeployment, tmp_path: Path
) -> None:
    deployment = await make_deployment(database_url)
    folder = tmp_path / "held"
    folder.mkdir()
    (folder / "hold").touch()
    deployment.write_pipelines(ORDERS + HELD.replace("FOLDER", repr(str(folder))))
    # One run at a time: a manual run waits, queued, behind a held one. Heartbeats far apart:
    # on a loaded machine, a heartbeat's transactions taking longer than three short intervals
    # make the daemon take its own runs for a dead instance's, and queue them again.
    config = deployment.config_file(
        api={"enabled": True, "port": 0, "tokens": [TOKEN]},
        runs={"parallelism": 1},
        daemon={"heartbeat_interval_s": 5},
    )
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIGGERER_")}
    cli = partial(triggerer_cli, env, "--config", str(config))

    async def cancelled_after(run_id: str) -> float:
        """Seconds until ``run_id`` is recorded ``cancelled``."""
        began = anyio.current_time()
        await deployment.wait_for(
            runs, lambda rows: {r.run_id: r.state for r in rows}[run_id] == "cancelled"
        )
        return anyio.current_time() - began

    with deployment.process_with_config(config) as daemon:
        daemon.start()
        await daemon.wait_logged("pipelines_loaded")
        await daemon.wait_logged("api_listening")
        async with httpx.AsyncClient(
            base_url=api_url(daemon), headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30
        ) as client:
            # A running run, cancelled through the CLI.
            await deployment.produce([{"n": 1}])
            seen: set[str] = set()
            first, first_pids = await started(folder, seen)
            answer = await cli("runs", "cancel", first)
            assert answer.returncode == 0, answer.stderr
            assert answer.stdout.decode().startswith(f"run {first} cancelling"), daemon.tail(80)
            first_took_s = await cancelled_after(first)
            assert all(gone(pid) for pid in first_pids), first_pids

            # Another, cancelled through the API, and a manual run queued behind it cancelled
            # before it starts.
            await deployment.produce([{"n": 2}])
            second, second_pids = await started(folder, seen)
            triggered = await cli("pipelines", "trigger", "by_hand")
            assert triggered.returncode == 0, triggered.stderr
            by_hand = triggered.stdout.decode().strip()
            answer = await cli("runs", "cancel", by_hand)
            assert answer.stdout.decode().strip() == f"run {by_hand} cancelled", answer.stderr
            cancelling = await client.post(f"/runs/{second}/cancel")
            assert cancelling.status_code == 200, cancelling.text
            assert cancelling.json()["state"] == "cancelling"
            second_took_s = await cancelled_after(second)
            assert all(gone(pid) for pid in second_pids), second_pids

            # What is finished or unknown cannot be cancelled.
            refused = await cli("runs", "cancel", first)
            assert refused.returncode == 1
            assert f"run {first!r} is cancelled" in refused.stderr.decode(), refused.stderr
            conflict = await client.post(f"/runs/{by_hand}/cancel")
            assert conflict.status_code == 409, conflict.text
            assert f"run {by_hand!r} is cancelled" in conflict.json()["detail"]
            assert (await client.post("/runs/no_such_run/cancel")).status_code == 404
            unknown = await cli("runs", "cancel", "no_such_run")
            assert unknown.returncode == 1
            assert "'no_such_run' does not exist" in unknown.stderr.decode()

            # A re-run of the first consumes its events again; a running run is no re-run's.
            answer = await cli("runs", "rerun", first)
            assert answer.returncode == 0, answer.stderr
            again = answer.stdout.decode().strip()
            assert (await started(folder, seen))[0] == again
            not_yet = await client.post(f"/runs/{again}/rerun")
            assert not_yet.status_code == 409, not_yet.text
            assert f"run {again!r} is running" in not_yet.json()["detail"]
            refused = await cli("runs", "rerun", again)
            assert refused.returncode == 1
            assert f"run {again!r} is running" in refused.stderr.decode()
            (folder / "hold").unlink()
            await deployment.wait_for(
                runs, lambda rows: {r.run_id: r.state for r in rows}[again] == "success"
            )
            rerun = await client.post(f"/runs/{again}/rerun")
            assert rerun.status_code == 201, rerun.text
            third = rerun.json()["run_id"]
            final = await deployment.wait_for(
                runs, lambda rows: {r.run_id: r.state for r in rows}[third] == "success"
            )
            shown = (await client.get(f"/runs/{again}")).json()
            listed = await cli("runs", "list", "--json")
        logged = await daemon.wait_logged("run_cancelled", times=2)

    assert first_took_s < CANCELLED_WITHIN_S, first_took_s
    assert second_took_s < CANCELLED_WITHIN_S, second_took_s
    states = {run.run_id: (run.state, run.try_number, run.rerun_of) for run in final}
    assert states == {
        first: ("cancelled", 1, None),  # retries do not apply to a cancelled run
        second: ("cancelled", 1, None),
        by_hand: ("cancelled", 0, None),  # it never started
        again: ("success", 1, first),
        third: ("success", 1, again),
    }
    orders = [event.id for event in await deployment.query(partial(events_of, name="orders"))]
    links = await deployment.query(consumed)
    assert links == {
        first: orders[:1],
        second: orders[1:],
        again: orders[:1],
        third: orders[:1],
    }
    assert await deployment.query(partial(queued_events, pipeline_id="held")) == []
    # The cancelled runs recorded no outlet event; each re-run that succeeded did.
    reports = await deployment.query(partial(events_of, name="report"))
    by_run = {run.id: run.run_id for run in final}
    producers = [by_run.get(event.source_run_pk or 0) for event in reports]
    assert sorted(map(str, producers)) == sorted([again, third])
    assert await deployment.query(partial(event_count, name="report")) == 2
    assert shown["rerun_of"] == first
    assert [event["id"] for event in shown["consumed"]] == orders[:1]
    assert {row["run_id"]: row["rerun_of"] for row in json.loads(listed.stdout)}[again] == first
    assert [record["run_id"] for record in logged] == [first, second]
