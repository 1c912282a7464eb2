"""The REST API of ``triggerer run --config FILE``: events posted over REST (also with
``triggerer events emit --api``) start PySpark runs; queued events are listed and deleted; a
paused pipeline holds its queued events and starts no run; SIGTERM stops the daemon with its API."""

from __future__ import annotations

import json
import signal
from typing import TYPE_CHECKING, Any

import anyio
import httpx

from tests.e2e.daemon import ORDERS, DaemonProcess, triggerer_cli

if TYPE_CHECKING:
    from tests.e2e.daemon import Deployment

TOKEN = "e2e-token"  # noqa: S105 - the token this test configures
PIPELINES = """
    customers = Asset("customers")

    @pipeline(schedule=orders)
    def count_orders(spark, context):
        assert spark.range(3).count() == 3

    @pipeline(schedule=orders & customers)
    def matched(spark, context):
        pass
"""
RUN_TIMEOUT_S = 90.0


def api_url(daemon: DaemonProcess) -> str:
    """The API address the daemon logged (it listens on a free port)."""
    for line in daemon.log_path.read_text().splitlines():
        if '"api_listening"' in line:
            logged = json.loads(line)
            return f"http://{logged['host']}:{logged['port']}/api/v1"
    raise AssertionError(f"no api_listening logged{daemon.tail()}")


async def runs_when(
    client: httpx.AsyncClient, pipeline_id: str, states: list[str]
) -> list[dict[str, Any]]:
    """The runs of ``pipeline_id`` (oldest first) once their states are ``states``."""
    with anyio.fail_after(RUN_TIMEOUT_S):
        while True:
            found: list[dict[str, Any]] = (
                await client.get(f"/pipelines/{pipeline_id}/runs")
            ).json()[::-1]
            if [run["state"] for run in found] == states:
                return found
            await anyio.sleep(0.2)


async def test_events_over_rest_start_runs_queues_can_be_cleared_and_pause_holds_runs(
    deployment: Deployment,
) -> None:
    deployment.write_pipelines(ORDERS + PIPELINES)
    config = deployment.config_file(api={"enabled": True, "port": 0, "tokens": [TOKEN]})
    with deployment.process_with_config(config) as daemon:
        daemon.start()
        await daemon.wait_logged("pipelines_loaded")
        await daemon.wait_logged("api_listening")
        url = api_url(daemon)
        async with httpx.AsyncClient(
            base_url=url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30
        ) as client:
            async with httpx.AsyncClient() as anonymous:
                assert (await anonymous.get(f"{url}/readyz")).status_code == 401
                assert (await anonymous.get(f"{url}/healthz")).status_code == 200
            assert (await client.get("/readyz")).json()["status"] == "ready"

            # An event posted over REST starts a PySpark run.
            first = await client.post("/assets/events", json={"uri": "orders", "extra": {"n": 1}})
            assert first.status_code == 201, first.text
            assert first.json()["queued_for"] == ["count_orders", "matched"]
            [run] = await runs_when(client, "count_orders", ["success"])
            assert run["events"] == 1

            # Paused: its events wait in its queue, and it starts no run.
            patched = await client.patch("/pipelines/count_orders", json={"paused": True})
            assert patched.json()["paused"] is True

            # The AND pipeline's queued orders event is deleted; customers alone do not run it.
            queued = (await client.get("/pipelines/matched/assets/queuedEvents")).json()
            assert [q["event_id"] for q in queued] == [first.json()["id"]]
            deleted = await client.delete("/pipelines/matched/assets/queuedEvents")
            assert deleted.json() == {"deleted": 1}
            emitted = await triggerer_cli(
                deployment.env(), "events", "emit", "customers", "--api", url, "--token", TOKEN
            )
            assert emitted.returncode == 0, emitted.stderr
            assert b"queued for matched" in emitted.stdout
            explained = (await client.get("/pipelines/matched/explain")).json()
            assert explained["condition_met"] is False
            assert (await client.get("/pipelines/matched/runs")).json() == []

            second = await client.post("/assets/events", json={"uri": "orders"})
            assert second.json()["queued_for"] == ["count_orders", "matched"]
            [matched] = await runs_when(client, "matched", ["success"])
            consumed = (await client.get(f"/runs/{matched['run_id']}")).json()["consumed"]
            assert [(e["uri"], e["source"]) for e in consumed] == [
                ("customers", "rest_api"),
                ("orders", "rest_api"),
            ]
            assert consumed[1]["id"] == second.json()["id"]
            held = (await client.get("/pipelines/count_orders/assets/queuedEvents")).json()
            assert [q["event_id"] for q in held] == [second.json()["id"]]
            assert len((await client.get("/pipelines/count_orders/runs")).json()) == 1
            log = await client.get(f"/runs/{run['run_id']}/logs")
            assert log.status_code == 200

        daemon.signal(signal.SIGTERM)
        assert await daemon.wait(60) == 0, daemon.tail()
    assert '"event": "shutdown_complete"' in daemon.log_path.read_text()
