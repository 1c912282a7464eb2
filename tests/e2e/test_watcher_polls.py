"""A quiet watcher shows that it polls, through ``triggerer run --config FILE``: its
``last_poll_at`` in ``watchers list --json`` and ``GET /watchers`` moves on while no message
arrives (Kafka through the shared consumer and with a consumer of its own on the tansu broker,
SQS on moto, ``FileTrigger``, a custom trigger calling ``polled()``), and so does the poll-age
metric; ``last_event_at`` stays empty until an event. A custom trigger that never says when it
polls shows its last event as its last poll, as before."""

from __future__ import annotations

import json
import math
import signal
from datetime import datetime
from typing import TYPE_CHECKING, Any

import anyio
import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.daemon import Deployment, sqlite_url, triggerer_cli, write_pipelines
from tests.e2e.test_api import api_url

if TYPE_CHECKING:
    from pathlib import Path

    from tests.e2e.daemon import DaemonProcess

NO_SPARK = "sc://127.0.0.1:1"  # no pipeline runs here

QUIET = """
    import anyio

    from triggerer import Asset, AssetWatcher, BaseEventTrigger
    from watchers import FileTrigger, KafkaTrigger, SqsTrigger

    class Asking(BaseEventTrigger):
        def serialize(self):
            return Asking.classpath(), {{}}

        async def run(self):
            while True:
                await anyio.sleep(0.2)  # asked a source that has nothing
                self.polled()
            yield

    class Silent(BaseEventTrigger):
        def serialize(self):
            return Silent.classpath(), {{}}

        async def run(self):
            await anyio.sleep_forever()
            yield

    def kafka(**options):
        return KafkaTrigger(
            bootstrap_servers="{bootstrap}", topics=["{topic}"], session_timeout_ms=6000,
            heartbeat_interval_ms=1000, fetch_max_wait_ms=100, **options)

    orders = Asset("orders", watchers=[
        AssetWatcher("kafka_shared", kafka()),
        AssetWatcher("kafka_own", kafka(group_id="own-{topic}")),
    ])
    customers = Asset("customers", watchers=[AssetWatcher("sqs", SqsTrigger(
        "{queue_url}", endpoint_url="{endpoint}", region_name="us-east-1", wait_time_s=1))])
    landing = Asset("landing", watchers=[
        AssetWatcher("files", FileTrigger("{folder}", poll_interval_s=0.2))])
    custom = Asset("custom", watchers=[
        AssetWatcher("asking", Asking()), AssetWatcher("silent", Silent())])
"""
POLLING = ("kafka_shared", "kafka_own", "sqs", "files", "asking")
"""The watchers that say when they poll."""


async def listed(daemon: DaemonProcess, config: Path) -> dict[str, dict[str, Any]]:
    """``triggerer watchers list --json``, by watcher."""
    done = await triggerer_cli(daemon.env, "--config", str(config), "watchers", "list", "--json")
    assert done.returncode == 0, done.stderr
    return {watcher["watcher"]: watcher for watcher in json.loads(done.stdout)}


async def until_listed(
    daemon: DaemonProcess, config: Path, holds: Any, timeout_s: float = 60
) -> dict[str, dict[str, Any]]:
    """The watchers as listed once ``holds(watchers)``."""
    with anyio.fail_after(timeout_s):
        while not holds(watchers := await listed(daemon, config)):  # noqa: ASYNC110 - another process
            await anyio.sleep(0.2)
    return watchers


def polled_at(watchers: dict[str, dict[str, Any]], name: str) -> datetime | None:
    text = watchers[name]["last_poll_at"]
    return None if text is None else datetime.fromisoformat(text)


def moved_on(before: dict[str, dict[str, Any]], after: dict[str, dict[str, Any]]) -> bool:
    """Whether every watcher that says when it polls has polled since ``before``."""
    for name in POLLING:
        then, now = polled_at(before, name), polled_at(after, name)
        if then is None or now is None or now <= then:
            return False
    return True


def poll_ages(metrics_text: str) -> list[tuple[str, float]]:
    """``triggerer_watcher_last_poll_age_seconds`` of each trigger instance, with its class."""
    return sorted(
        (sample.labels["trigger"], sample.value)
        for family in text_string_to_metric_families(metrics_text)
        for sample in family.samples
        if sample.name == "triggerer_watcher_last_poll_age_seconds"
    )


async def test_quiet_watchers_show_their_polls_moving_on(
    tmp_path: Path, kafka_broker: str, kafka_topic: str, moto_server: str, sqs_queue: str
) -> None:
    """Was: ``last_poll_at`` moved only with an event, so a healthy watcher of a quiet source
    showed "last poll 3m ago" and looked stuck; the poll-age metric too."""
    folder = tmp_path / "landing"
    folder.mkdir()
    source = QUIET.format(
        bootstrap=kafka_broker,
        topic=kafka_topic,
        queue_url=sqs_queue,
        endpoint=moto_server,
        folder=str(folder),
    )
    write_pipelines(tmp_path / "pipelines", source)
    deployment = Deployment(tmp_path, sqlite_url(tmp_path), NO_SPARK, kafka_broker, kafka_topic)
    config = deployment.config_file(api={"enabled": True, "port": 0})

    with deployment.process_with_config(config) as daemon:
        daemon.start()
        await daemon.wait_logged("pipelines_loaded")
        # Every watcher running (on a busy machine the silent one may still be starting).
        first = await until_listed(
            daemon,
            config,
            lambda ws: (
                all(polled_at(ws, name) for name in POLLING)
                and all(w["state"] == "running" for w in ws.values())
            ),
        )
        later = await until_listed(daemon, config, lambda ws: moved_on(first, ws), timeout_s=30)
        async with httpx.AsyncClient(base_url=api_url(daemon), timeout=30) as client:
            served = {w["watcher"]: w for w in (await client.get("/watchers")).json()}
            ages = poll_ages((await client.get("/metrics")).text)

        # An event: its time is shown beside the polls, which are never older.
        await deployment.produce([{"order": 1}])
        kafka = ("kafka_shared", "kafka_own")
        evented = await until_listed(
            daemon, config, lambda ws: all(ws[name]["last_event_at"] for name in kafka)
        )
        daemon.signal(signal.SIGTERM)
        assert await daemon.wait(timeout_s=30) == 0, daemon.tail()

    for watchers in (first, later):
        assert {name: w["state"] for name, w in watchers.items()} == dict.fromkeys(
            (*POLLING, "silent"), "running"
        )
        assert {name: w["last_event_at"] for name, w in watchers.items()} == dict.fromkeys(
            (*POLLING, "silent")
        )
        assert polled_at(watchers, "silent") is None  # it never said, and had no event
    assert {name: w["last_poll_at"] for name, w in served.items()}.keys() == later.keys()
    assert all(served[name]["last_poll_at"] for name in POLLING)
    assert "last_event_at" in served["silent"]
    # A watcher that polls shows a fresh poll (the heartbeat is every 0.5 s here).
    assert [kind for kind, _ in ages] == [
        "Asking",
        "FileTrigger",
        "KafkaTrigger",
        "KafkaTrigger",
        "Silent",
        "SqsTrigger",
    ]
    assert all(age < 10 for kind, age in ages if kind != "Silent"), ages
    assert math.isnan(dict(ages)["Silent"])
    for name in kafka:
        event_at = datetime.fromisoformat(evented[name]["last_event_at"])
        assert (polled_at(evented, name) or event_at) >= event_at
        assert polled_at(evented, name) is not None
