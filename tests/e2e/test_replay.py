"""Replaying stored events through ``triggerer run --config``, with the CLI (another process)
and the REST API, on real PySpark: a pipeline added after its asset's events arrived gets them
(the dry run predicts its runs and changes nothing; the replay starts exactly those), a replay
asked again queues nothing and starts no run, and a pipeline fixed after a bug runs its events
again once. What cannot be replayed is refused in one line naming it."""

from __future__ import annotations

import json
import os
from datetime import UTC, datetime, timedelta
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio
import httpx
import pytest
from sqlalchemy import func, select

from tests.e2e.daemon import (
    ORDERS,
    event_count,
    events_of,
    pipeline_row,
    runs,
    settled,
    triggerer_cli,
)
from tests.e2e.test_api import api_url
from triggerer.service.store import models

if TYPE_CHECKING:
    from pathlib import Path

    from sqlalchemy.ext.asyncio import AsyncSession

    from tests.e2e.conftest import MakeDeployment

pytestmark = pytest.mark.slow  # runs on Spark, both stores: make test-slow

TOKEN = "e2e-token"  # noqa: S105 - the token this test configures
TOTALS = """
    import json
    from pathlib import Path

    folder = Path(FOLDER)

    @pipeline(schedule=orders, retries=RETRIES)
    def totals(spark, context):
        events = context.triggering_asset_events[orders]
        ns = [event.extra["payload"]["value"]["n"] for event in events]
        frame = spark.createDataFrame([(n,) for n in ns], "n long")
        total = frame.groupBy().sum("n").first()[0] + BUG
        (folder / context.run_id).write_text(json.dumps(dict(ns=sorted(ns), total=total)))
"""
LATE = """
    @pipeline(schedule=orders, run_policy="per_event")
    def late(spark, context):
        [event] = context.triggering_asset_events[orders]
        n = spark.createDataFrame([(event.extra["payload"]["value"]["n"],)], "n long").first()[0]
        (folder / context.run_id).write_text(json.dumps(dict(ns=[n], total=n)))
"""


def source(folder: Path, *, bug: int, late: bool) -> str:
    """The pipelines: totals (``bug`` added to its total; the fixed one, without, gets a
    retry, so the test sees the fix loaded) and, with ``late``, late."""
    totals = TOTALS.replace("FOLDER", repr(str(folder))).replace("BUG", str(bug))
    totals = totals.replace("RETRIES", "0" if bug else "1")
    return ORDERS + totals + (LATE if late else "")


async def footprint(session: AsyncSession) -> tuple[list[str], int, int]:
    """What a dry run must not change: the runs, the queue rows, the replays."""
    all_runs = [f"{run.run_id}:{run.state}" for run in await runs(session)]
    counts = [
        await session.scalar(select(func.count()).select_from(table))
        for table in (models.QueuedEvent, models.Replay)
    ]
    return all_runs, counts[0] or 0, counts[1] or 0


async def caught_up(session: AsyncSession) -> tuple[int, tuple[int, int]]:
    """The orders stored, and totals' (active runs, queued events): 0 and 0 once caught up."""
    return await event_count(session, "orders"), await settled(session, "totals")


def finished(pipeline_id: str, count: int) -> Any:
    """A ``wait_for`` test: ``count`` runs of ``pipeline_id``, all succeeded."""

    def done(rows: list[models.Run]) -> bool:
        mine = [run.state for run in rows if run.pipeline_id == pipeline_id]
        assert "failed" not in mine, rows
        return mine == ["success"] * count

    return done


@pytest.mark.timeout(420)
async def test_events_are_replayed_for_a_new_pipeline_and_after_a_fix(
    database_url: str, make_deployment: MakeDeployment, tmp_path: Path
) -> None:
    deployment = await make_deployment(database_url)
    folder = tmp_path / "written"
    folder.mkdir()
    since = (datetime.now(UTC) - timedelta(minutes=1)).isoformat()
    deployment.write_pipelines(source(folder, bug=1000, late=False))
    config = deployment.config_file(api={"enabled": True, "port": 0, "tokens": [TOKEN]})
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIGGERER_")}
    cli = partial(triggerer_cli, env, "--config", str(config))

    async def replay_cli(*options: str) -> dict[str, Any]:
        done = await cli("events", "replay", "--asset", "orders", "--since", since, *options)
        assert done.returncode == 0, done.stderr
        answer: dict[str, Any] = json.loads(done.stdout)
        return answer

    with deployment.process_with_config(config) as daemon:
        daemon.start()
        await daemon.wait_logged("pipelines_loaded")
        async with httpx.AsyncClient(
            base_url=api_url(daemon), headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30
        ) as client:
            # Three orders, consumed by totals (in one run or more, as they come).
            await deployment.produce([{"n": 1}, {"n": 2}, {"n": 3}])
            await deployment.wait_for(caught_up, lambda state: state == (3, (0, 0)))
            orders = [e.id for e in await deployment.query(partial(events_of, name="orders"))]
            assert len(orders) == 3
            first_runs = await deployment.query(runs)

            # A pipeline added afterwards: the dry run predicts a run per event, changes nothing.
            deployment.write_pipelines(source(folder, bug=1000, late=True))
            await deployment.wait_for(
                partial(pipeline_row, pipeline_id="late"), lambda row: row is not None
            )
            before = await deployment.query(footprint)
            dry = await replay_cli("--pipeline", "late", "--dry-run", "--json")
            [late] = dry["pipelines"]
            predicted = [run["run_id"] for run in late["runs"]]
            assert (late["queued"], late["event_ids"]) == (3, orders), dry
            assert predicted == [f"late__replay__{event_id}" for event_id in orders]
            text = await cli("events", "replay", "--asset", "orders", "--since", since, "--dry-run")
            assert f"would start late__replay__{orders[0]} (1 event(s))" in text.stdout.decode()
            await anyio.sleep(1)  # a daemon woken by mistake would have moved by now
            assert await deployment.query(footprint) == before

            # The replay starts exactly those runs.
            done = await replay_cli("--pipeline", "late", "--json")
            assert [run["run_id"] for run in done["pipelines"][0]["runs"]] == predicted
            replayed = await deployment.wait_for(runs, finished("late", 3))
            assert [r.run_id for r in replayed if r.pipeline_id == "late"] == predicted

            # Again, through the API: nothing new is queued and no run starts (a new order
            # afterwards starts one run of late, for that order alone).
            [asset] = (await client.get("/assets", params={"name_prefix": "orders"})).json()
            replay_path = f"/assets/{asset['id']}/replay"
            again = await client.post(replay_path, json={"since": since, "pipeline_id": "late"})
            assert again.status_code == 200, again.text
            [late] = again.json()["pipelines"]
            assert (late["queued"], late["already_replayed"], late["runs"]) == (0, 3, [])
            await deployment.produce([{"n": 4}])
            after = await deployment.wait_for(runs, finished("late", 4))
            fourth = max(e.id for e in await deployment.query(partial(events_of, name="orders")))
            assert [r.run_id for r in after if r.pipeline_id == "late"] == [
                *predicted,
                f"late__asset__{fourth}",
            ]
            await deployment.wait_for(caught_up, lambda state: state == (4, (0, 0)))
            totals_runs = len(
                [r for r in await deployment.query(runs) if r.pipeline_id == "totals"]
            )

            # A bug fixed in totals: its four events run again, once, in one coalesced run.
            deployment.write_pipelines(source(folder, bug=0, late=True))
            await deployment.wait_for(
                partial(pipeline_row, pipeline_id="totals"),
                lambda row: row is not None and row.retries == 1,
            )
            backfill = await client.post(
                replay_path,
                json={"since": since, "pipeline_id": "totals", "dry_run": True},
            )
            [totals] = backfill.json()["pipelines"]
            assert [run["run_id"] for run in totals["runs"]] == [f"totals__replay__{orders[0]}"]
            done = await replay_cli("--pipeline", "totals", "--json")
            assert done["pipelines"][0]["queued"] == 4
            await deployment.wait_for(runs, finished("totals", totals_runs + 1))
            everything = await replay_cli("--json")
            assert [(p["pipeline_id"], p["queued"]) for p in everything["pipelines"]] == [
                ("late", 1),  # the fourth order: late consumed it, but never by a replay
                ("totals", 0),
            ]
            await deployment.wait_for(runs, finished("late", 5))

            # What cannot be replayed, named in one line.
            refusals = [
                (("--asset", "nope", "--since", since), "no asset named 'nope'"),
                (("--asset", "orders", "--since", "soon"), "--since 'soon' is not an ISO date"),
                (
                    ("--asset", "orders", "--since", since, "--pipeline", "ghost"),
                    "pipeline 'ghost' does not exist",
                ),
            ]
            for arguments, message in refusals:
                refused = await cli("events", "replay", *arguments)
                assert refused.returncode == 1, refused
                assert message in refused.stderr.decode(), refused.stderr
                assert len(refused.stderr.decode().strip().splitlines()) == 1
            backwards = await client.post(
                replay_path,
                json={"since": since, "until": "2000-01-01"},
            )
            assert backwards.status_code == 422
            assert "is not before until 2000-01-01T00:00:00+00:00" in backwards.json()["detail"]
            unknown = await client.post("/assets/999/replay", json={"since": since})
            assert unknown.status_code == 404, unknown.text

    written = {path.name: json.loads(path.read_text()) for path in folder.iterdir()}
    assert written[f"totals__replay__{orders[0]}"] == {"ns": [1, 2, 3, 4], "total": 10}
    assert all(
        written[run.run_id]["total"] > 1000 for run in first_runs if run.pipeline_id == "totals"
    )
    assert [written[run_id]["ns"] for run_id in predicted] == [[1], [2], [3]]
