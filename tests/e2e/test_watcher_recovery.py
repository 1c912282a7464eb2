"""A watcher that failed and runs again shows its error as history, through ``triggerer run
--config FILE``: a ``FileTrigger`` on a folder that does not exist yet fails (``failing``, its
error and when), the folder is made, the watcher polls it; then ``GET /watchers``, ``GET
/lineage`` and ``triggerer watchers list`` (table and ``--json``) say it is no longer failing,
has recovered, and when the error happened. Issue 29: such watchers stayed red."""

from __future__ import annotations

import json
from datetime import datetime
from typing import TYPE_CHECKING, Any

import anyio
import httpx

from tests.e2e.daemon import Deployment, triggerer_cli
from tests.e2e.test_api import api_url

if TYPE_CHECKING:
    from pathlib import Path

    from tests.e2e.daemon import DaemonProcess

NO_SPARK = "sc://127.0.0.1:1"  # no pipeline runs here
LANDING = """
    from triggerer import Asset, AssetWatcher
    from watchers import FileTrigger

    invoices = Asset("invoices", watchers=[
        AssetWatcher("invoices_files", FileTrigger({folder!r}, poll_interval_s=0.2))])
"""
RECOVERY_TIMEOUT_S = 60
"""The missing folder is looked for again every few seconds; a busy machine's heartbeats."""


def recovery_deployment(tmp_path: Path, database_url: str) -> tuple[Deployment, Path, Path]:
    """A deployment whose one watcher reads a folder not made yet: (it, its config with the
    API on a free port, the folder)."""
    folder = tmp_path / "invoices"
    deployment = Deployment(tmp_path, database_url, NO_SPARK, "", "")
    deployment.write_pipelines(LANDING.replace("{folder!r}", repr(str(folder))))
    config = deployment.config_file(
        api={"enabled": True, "port": 0}, daemon={"restart_backoff_max_s": 1}
    )
    return deployment, config, folder


async def watcher_when(
    client: httpx.AsyncClient, holds: Any, timeout_s: float = RECOVERY_TIMEOUT_S
) -> dict[str, Any]:
    """``GET /watchers``' one row, once ``holds(row)``."""
    with anyio.fail_after(timeout_s):
        while True:
            [row] = (await client.get("/watchers")).json()
            if holds(row):
                return row
            await anyio.sleep(0.2)


async def cli_watchers(daemon: DaemonProcess, config: Path, *options: str) -> str:
    """``triggerer watchers list [OPTIONS]``'s output."""
    done = await triggerer_cli(daemon.env, "--config", str(config), "watchers", "list", *options)
    assert done.returncode == 0, done.stderr
    return done.stdout.decode()


async def test_a_recovered_watcher_is_not_failing_and_says_when_its_error_was(
    tmp_path: Path, database_url: str
) -> None:
    deployment, config, folder = recovery_deployment(tmp_path, database_url)
    with deployment.process_with_config(config) as daemon:
        daemon.start()
        await daemon.wait_logged("api_listening")
        async with httpx.AsyncClient(base_url=api_url(daemon), timeout=30) as client:
            failing = await watcher_when(client, lambda row: row["last_error"] is not None)
            failing_table = await cli_watchers(daemon, config)
            folder.mkdir()
            recovered = await watcher_when(client, lambda row: row["recovered"])
            [node] = [
                node
                for node in (await client.get("/lineage")).json()["nodes"]
                if node["kind"] == "watcher"
            ]
        listed = json.loads(await cli_watchers(daemon, config, "--json"))
        table = await cli_watchers(daemon, config)

    # Failing: the error is the current state, with its time.
    assert failing["state"] in ("backoff", "running"), failing
    assert "invoices" in failing["last_error"]
    assert failing["last_error_at"] is not None
    if failing["state"] == "backoff":  # a heartbeat may catch it trying again
        assert failing["failing"]
        assert "recovered from" not in failing_table
    assert not failing["recovered"]

    # Recovered: running, polled after the error; the error and its time are kept as history.
    error_at = datetime.fromisoformat(recovered["last_error_at"])
    assert recovered["state"] == "running"
    assert recovered["failing"] is False
    assert datetime.fromisoformat(recovered["last_poll_at"]) > error_at
    assert recovered["last_error"] == failing["last_error"]
    assert error_at >= datetime.fromisoformat(failing["last_error_at"])
    assert (node["state"], node["failing"], node["recovered"]) == ("running", False, True)
    [row] = listed
    assert (row["failing"], row["recovered"], row["last_error_at"]) == (
        False,
        True,
        recovered["last_error_at"],
    )
    header, line = table.splitlines()
    assert "LAST_ERROR_AT" in header
    assert recovered["last_error_at"] in line
    assert f"recovered from: {recovered['last_error']}" in line
