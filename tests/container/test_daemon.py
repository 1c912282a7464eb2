"""The image's daemon in a read-only container with no capabilities, its settings from
``TRIGGERER_*`` variables: it is healthy (``/healthz``, ``/readyz``, the image's healthcheck),
an event posted over REST becomes a PySpark run on the local Spark inside the container, and
SIGTERM stops it with exit code 0 within the grace period.

One container serves the module's tests, in order (its JVM takes a minute to start on a busy
two-core machine); the last one stops it."""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import anyio
import httpx
import pytest

from tests.container.conftest import BUILD_TIMEOUT_S
from tests.container.podman import (
    PIPELINES_DIR,
    STATE_DIR,
    Container,
    Podman,
    RecordProperty,
    shared_folder,
)

pytestmark = [pytest.mark.container, pytest.mark.timeout(BUILD_TIMEOUT_S + 600)]

TOKEN = "container-token"  # noqa: S105 - the token this test configures
DATABASE = f"{STATE_DIR}/from-env.db"
PIPELINES = f"""\
from triggerer import Asset, pipeline

orders = Asset("orders")


@pipeline(schedule=orders)
def count_orders(spark, context):
    [event] = context.triggering_asset_events[orders]
    rows = event.extra["rows"]
    out = "{STATE_DIR}/out/count_orders"
    spark.range(rows).write.mode("overwrite").parquet(out)
    assert spark.read.parquet(out).count() == rows
"""
RUN_TIMEOUT_S = 420.0
"""The JVM's start and a first run, in a container on a busy two-core machine."""
STOP_TIMEOUT_S = 10.0
"""What ``podman stop`` and ``docker stop`` wait after SIGTERM before SIGKILL (the image's
``shutdown_grace_s`` is 8)."""


@pytest.fixture(scope="module")
async def daemon(
    podman: Podman, triggerer_image: str, tmp_path_factory: pytest.TempPathFactory
) -> AsyncIterator[Container]:
    pipelines = tmp_path_factory.mktemp("pipelines")
    (pipelines / "orders.py").write_text(PIPELINES)
    container = Container(podman, triggerer_image)
    try:
        container.start(
            f"--volume={shared_folder(pipelines)}:{PIPELINES_DIR}:ro",
            f"--env=TRIGGERER_API__TOKENS={TOKEN}",
            f"--env=TRIGGERER_DATABASE__URL=sqlite:///{DATABASE}",
        )
        await container.wait_healthz()
        yield container
    finally:
        container.remove()


def client(daemon: Container) -> httpx.AsyncClient:
    return httpx.AsyncClient(
        base_url=daemon.url, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=30
    )


async def test_it_is_healthy_read_only_with_its_settings_from_the_environment(
    daemon: Container, record_property: RecordProperty
) -> None:
    record_property("seconds_to_healthz", round(await daemon.wait_healthz(), 1))
    record_property("seconds_to_ready", round(await daemon.wait_ready(TOKEN), 1))
    async with httpx.AsyncClient() as anonymous:
        assert (await anonymous.get(f"{daemon.url}/readyz")).status_code == 401
    # The image's HEALTHCHECK, `triggerer check`, reads the heartbeat from the database.
    health = daemon.podman("healthcheck", "run", daemon.name)
    assert health.returncode == 0, health.stdout + health.stderr + daemon.logs()
    assert daemon.exec("test", "-f", DATABASE).returncode == 0, "TRIGGERER_DATABASE__URL ignored"
    wrote = daemon.exec("touch", "/opt/triggerer/written")
    assert wrote.returncode != 0
    assert "Read-only file system" in wrote.stderr


async def test_an_event_posted_over_rest_becomes_a_pyspark_run(
    daemon: Container, record_property: RecordProperty
) -> None:
    async with client(daemon) as api:
        posted = await api.post("/assets/events", json={"uri": "orders", "extra": {"rows": 7}})
        assert posted.status_code == 201, posted.text
        assert posted.json()["queued_for"] == ["count_orders"]
        started = time.monotonic()
        run = await finished_run(api, "count_orders")
    record_property("seconds_event_to_run_end", round(time.monotonic() - started, 1))
    assert run["state"] == "success", f"{run}{daemon.logs()}"
    assert run["events"] == 1


async def finished_run(api: httpx.AsyncClient, pipeline_id: str) -> dict[str, Any]:
    """The first run of ``pipeline_id`` once it has ended."""
    with anyio.fail_after(RUN_TIMEOUT_S):
        while True:
            runs = (await api.get(f"/pipelines/{pipeline_id}/runs")).json()
            if runs and runs[0]["state"] in ("success", "failed"):
                run: dict[str, Any] = runs[0]
                return run
            await anyio.sleep(1)


async def test_sigterm_stops_it_with_exit_code_0_within_the_grace_period(
    daemon: Container, record_property: RecordProperty
) -> None:
    await daemon.wait_healthz()
    signalled = time.monotonic()
    daemon.podman.ok("kill", "--signal=TERM", daemon.name)
    exit_code = daemon.podman.ok("wait", daemon.name, timeout_s=STOP_TIMEOUT_S + 30).strip()
    stopped_s = time.monotonic() - signalled
    record_property("seconds_sigterm_to_exit", round(stopped_s, 1))
    assert exit_code == "0", daemon.logs()
    assert stopped_s < STOP_TIMEOUT_S, f"took {stopped_s:.1f} s{daemon.logs()}"
    assert '"shutdown_complete"' in daemon.logs()
