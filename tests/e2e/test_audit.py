"""The audit log through ``triggerer run --config`` on SQLite and PostgreSQL: each change made
through the REST API (with a token: ``api-token-1``, also when the CLI posts with ``--api``) and
through the CLI on the store (``cli:<unix user>``) is exactly one row, read back through
``GET /api/v1/audit`` and ``triggerer audit list``, with their filters; a change that fails
(404, 409, 422, a CLI error) leaves none, and what the daemon does on its own (the runs its
scheduler creates) none either."""

from __future__ import annotations

import getpass
import json
import socket
from collections.abc import Iterator
from functools import partial
from typing import TYPE_CHECKING, Any

import anyio
import httpx
import pytest

from tests.e2e.daemon import Deployment, triggerer_cli
from tests.e2e.test_api import api_url
from tests.e2e.test_import_errors import without_triggerer_variables

if TYPE_CHECKING:
    from pathlib import Path

TOKEN = "e2e-audit-token"  # noqa: S105 - the token this test configures
API = "api-token-1"
CLI = f"cli:{getpass.getuser()}"
PIPELINES = """
    from triggerer import Asset, pipeline

    orders = Asset("orders")

    @pipeline(schedule=orders)
    def count_orders(spark, context):
        pass

    @pipeline()
    def by_hand(spark, context):
        pass
"""
CONCURRENT_POSTS = 10
WAIT_S = 60.0


@pytest.fixture
def silent_spark() -> Iterator[str]:
    """A Spark Connect address that takes connections and never answers: a run started there
    stays ``running`` (its session waits) until it is cancelled."""
    with socket.socket() as listening:
        listening.bind(("127.0.0.1", 0))
        listening.listen(16)
        yield f"sc://127.0.0.1:{listening.getsockname()[1]}"


async def run_state_when(client: httpx.AsyncClient, run_id: str, state: str) -> None:
    with anyio.fail_after(WAIT_S):
        while (await client.get(f"/runs/{run_id}")).json()["state"] != state:  # noqa: ASYNC110 - polling the API
            await anyio.sleep(0.2)


def summary(rows: list[dict[str, Any]]) -> list[tuple[str, str, str]]:
    """(actor, action, target) of each row, oldest first."""
    return [(row["actor"], row["action"], row["target"]) for row in reversed(rows)]


@pytest.mark.timeout(300)
async def test_each_change_through_the_api_and_the_cli_is_one_audit_row(
    tmp_path: Path, database_url: str, silent_spark: str
) -> None:
    deployment = Deployment(tmp_path, database_url, silent_spark, bootstrap="", topic="")
    deployment.write_pipelines(PIPELINES)
    # One run at a time: the first manual run holds the slot (its Spark session waits), so the
    # runs after it stay queued. Heartbeats far apart, so a loaded machine never has the daemon
    # take its own runs for a dead instance's.
    config = deployment.config_file(
        api={"enabled": True, "port": 0, "tokens": [TOKEN]},
        runs={"parallelism": 1},
        daemon={"heartbeat_interval_s": 5},
    )
    cli = partial(triggerer_cli, without_triggerer_variables(), "--config", str(config))

    async def changed(*arguments: str) -> str:
        done = await cli(*arguments)
        assert done.returncode == 0, done.stderr.decode()
        return done.stdout.decode().strip()

    async def refused(*arguments: str) -> str:
        done = await cli(*arguments)
        assert done.returncode == 1, done.stdout.decode()
        return done.stderr.decode()

    with deployment.process_with_config(config) as daemon:
        daemon.start()
        await daemon.wait_logged("pipelines_loaded")
        await daemon.wait_logged("api_listening")
        base = api_url(daemon)
        headers = {"Authorization": f"Bearer {TOKEN}"}
        async with httpx.AsyncClient(base_url=base, headers=headers, timeout=30) as client:
            held = (await client.post("/pipelines/by_hand/runs", json={})).json()["run_id"]
            await run_state_when(client, held, "running")

            # Events: one, several committed together, from the CLI, and through the API by it.
            created = await client.post("/assets/events", json={"uri": "orders", "extra": {"n": 0}})
            assert created.status_code == 201, created.text
            orders = created.json()["asset_id"]
            statuses = []

            async def post(n: int) -> None:
                body = {"uri": "orders", "extra": {"n": n}}
                statuses.append((await client.post("/assets/events", json=body)).status_code)

            async with anyio.create_task_group() as posts:
                for n in range(1, CONCURRENT_POSTS + 1):
                    posts.start_soon(post, n)
            assert statuses == [201] * CONCURRENT_POSTS
            await changed("events", "emit", "orders", "--extra", '{"from": "cli"}')
            await changed("events", "emit", "orders", "--api", base, "--token", TOKEN)

            # Pausing, and a replay a paused pipeline refuses (409) before one it takes.
            assert (
                await client.patch("/pipelines/count_orders", json={"paused": True})
            ).status_code == 200
            await changed("pipelines", "unpause", "count_orders")
            await changed("pipelines", "pause", "count_orders")
            replay = {"since": "2000-01-01", "pipeline_id": "count_orders"}
            assert (await client.post(f"/assets/{orders}/replay", json=replay)).status_code == 409
            replay_cli = ("events", "replay", "--asset", "orders", "--since", "2000-01-01")
            assert "is paused" in await refused(*replay_cli, "--pipeline", "count_orders")
            await client.patch("/pipelines/count_orders", json={"paused": False})
            assert (await client.post(f"/assets/{orders}/replay", json=replay)).status_code == 200
            dry = await client.post(f"/assets/{orders}/replay", json={**replay, "dry_run": True})
            assert dry.status_code == 200
            await changed(*replay_cli, "--pipeline", "count_orders", "--json")

            # Runs: one queued behind the held one cancelled from the CLI, the held one from the
            # API; cancelling either again is refused, as is re-running a run not finished.
            queued = await changed("pipelines", "trigger", "by_hand", "--params", '{"day": 1}')
            assert await changed("runs", "cancel", queued) == f"run {queued} cancelled"
            cancelling = await client.post(f"/runs/{held}/cancel")
            assert cancelling.json()["state"] == "cancelling"
            await run_state_when(client, held, "cancelled")
            assert (await client.post(f"/runs/{held}/cancel")).status_code == 409
            assert "is cancelled" in await refused("runs", "cancel", queued)
            again = (await client.post(f"/runs/{queued}/rerun")).json()["run_id"]
            again_cli = await changed("runs", "rerun", held)
            assert (await client.post(f"/runs/{again}/rerun")).status_code == 409
            assert "only a finished run" in await refused("runs", "rerun", again_cli)

            # Queued events deleted, by pipeline and by asset.
            assert (
                await client.delete("/pipelines/count_orders/assets/queuedEvents")
            ).status_code == 200
            assert (await client.delete(f"/assets/{orders}/queuedEvents")).status_code == 200

            # Changes that fail: unknown names (404), bad bodies (422), CLI errors.
            failures = [
                await client.patch("/pipelines/nope", json={"paused": True}),
                await client.post("/assets/events", json={"uri": "nope"}),
                await client.post("/pipelines/nope/runs", json={}),
                await client.post("/runs/nope/cancel"),
                await client.delete("/assets/999999/queuedEvents"),
                await client.post("/assets/events", json={"uri": "orders", "extra": [1]}),
                await client.post("/pipelines/by_hand/runs", json={"params": 3}),
                await client.patch("/pipelines/count_orders", json={"paused": "maybe"}),
            ]
            assert [f.status_code for f in failures] == [404] * 5 + [422] * 3
            await refused("pipelines", "pause", "nope")
            await refused("events", "emit", "nope")
            await refused("events", "emit", "nope", "--api", base, "--token", TOKEN)
            await refused("runs", "cancel", "nope")
            await refused("pipelines", "trigger", "nope")

            await changed("db", "clean", "--before", "2000-01-01")

            # Read back through the API...
            response = await client.get("/audit?limit=1000")
            assert response.status_code == 200, response.text
            rows = response.json()
            assert summary(rows) == [
                (API, "trigger", "pipeline:by_hand"),
                *[(API, "emit", "asset:orders")] * (1 + CONCURRENT_POSTS),
                (CLI, "emit", "asset:orders"),
                (API, "emit", "asset:orders"),
                (API, "pause", "pipeline:count_orders"),
                (CLI, "unpause", "pipeline:count_orders"),
                (CLI, "pause", "pipeline:count_orders"),
                (API, "unpause", "pipeline:count_orders"),
                (API, "replay", "asset:orders"),
                (CLI, "replay", "asset:orders"),
                (CLI, "trigger", "pipeline:by_hand"),
                (CLI, "cancel", f"run:{queued}"),
                (API, "cancel", f"run:{held}"),
                (API, "rerun", f"run:{queued}"),
                (CLI, "rerun", f"run:{held}"),
                (API, "delete_queued", "pipeline:count_orders"),
                (API, "delete_queued", "asset:orders"),
                (CLI, "db_clean", "database"),
            ]
            emitted = [row["details"] for row in reversed(rows) if row["action"] == "emit"]
            assert sorted(d["extra"].get("n", -1) for d in emitted) == [
                -1,
                -1,
                *range(CONCURRENT_POSTS + 1),
            ]
            reruns = {row["target"]: row["details"] for row in rows if row["action"] == "rerun"}
            assert reruns == {
                f"run:{queued}": {"pipeline_id": "by_hand", "new_run_id": again},
                f"run:{held}": {"pipeline_id": "by_hand", "new_run_id": again_cli},
            }
            [trigger_cli] = [
                row for row in rows if (row["actor"], row["action"]) == (CLI, "trigger")
            ]
            assert trigger_cli["details"] == {"run_id": queued, "params": {"day": 1}}
            cancels = {
                row["target"]: row["details"]["state"] for row in rows if row["action"] == "cancel"
            }
            assert cancels == {f"run:{queued}": "cancelled", f"run:{held}": "cancelling"}

            # ... with its filters...
            async def audit(query: str) -> list[tuple[str, str, str]]:
                answer = await client.get(f"/audit?limit=1000&{query}")
                assert answer.status_code == 200, answer.text
                return summary(answer.json())

            assert await audit(f"actor={CLI}") == [r for r in summary(rows) if r[0] == CLI]
            assert await audit("action=pause") == [
                (API, "pause", "pipeline:count_orders"),
                (CLI, "pause", "pipeline:count_orders"),
            ]
            assert await audit("target=pipeline:count_orders") == [
                r for r in summary(rows) if r[2] == "pipeline:count_orders"
            ]
            by_hand = [
                r
                for r in rows
                if r["target"] == "pipeline:by_hand" or r["details"].get("pipeline_id") == "by_hand"
            ]
            assert await audit("pipeline_id=by_hand") == summary(by_hand)
            assert {r["action"] for r in by_hand} >= {"trigger", "cancel", "rerun"}
            since = rows[2]["time"]
            assert await audit(f"since={since.replace('+', '%2B')}") == [
                summary([row])[0] for row in reversed(rows) if row["time"] >= since
            ]

        # ... and through the CLI, as the API gives it.
        assert json.loads(await changed("audit", "list", "--json", "--limit", "1000")) == rows
        mine = json.loads(
            await changed("audit", "list", "--json", "--actor", CLI, "--action", "pause")
        )
        assert summary(mine) == [(CLI, "pause", "pipeline:count_orders")]
        since_cli = json.loads(await changed("audit", "list", "--json", "--since", since))
        assert since_cli == [row for row in rows if row["time"] >= since]
        assert json.loads(await changed("audit", "list", "--json", "--limit", "2")) == rows[:2]
        of_pipeline = json.loads(await changed("audit", "list", "--json", "--pipeline", "by_hand"))
        assert of_pipeline == by_hand
        table = (await changed("audit", "list", "--target", "database")).splitlines()
        assert table[0].split() == ["ID", "TIME", "ACTOR", "ACTION", "TARGET", "DETAILS"]
        assert table[1].split()[2:5] == [CLI, "db_clean", "database"]
        assert "is not one of emit, pause" in await refused("audit", "list", "--action", "x")
