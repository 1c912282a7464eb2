"""Listener plugins through the daemon: every hook, for events of a watcher, a run, the CLI and
the REST API, after their commit; a listener that raises is counted (and served at
``/api/v1/metrics``) and holds nothing up."""

from __future__ import annotations

import json
import os
import socket
import textwrap
import uuid
from pathlib import Path
from typing import TYPE_CHECKING, Any

import anyio
import httpx
import pytest
from prometheus_client import REGISTRY
from prometheus_client.parser import text_string_to_metric_families

from tests.e2e.daemon import (
    ORDERS,
    daemon_settings,
    events_of,
    running_daemon,
    runs,
    triggerer_cli,
)
from triggerer.service.config import ApiSettings, ListenersSettings

if TYPE_CHECKING:
    from tests.e2e.conftest import MakeDeployment
    from tests.e2e.daemon import Deployment

PIPELINES = """
    from triggerer import AssetAlias

    report = Asset("report")
    manual = Asset("manual", extra={{"version": VERSION}})
    posted = Asset("posted")
    made = AssetAlias("made")

    @pipeline(schedule=orders, outlets=[report, made])
    def on_order(spark, context):
        assert spark.range(1).count() == 1
        yield Metadata(report, {{"rows": 1}})
        context.outlet_events[made].add(Asset("dynamic"), extra={{"via": "alias"}})
"""

RECORDING = """
    import json
    import os

    from triggerer import hookimpl

    def _write(record):
        record["pid"] = os.getpid()
        with open({path!r}, "a") as heard:
            heard.write(json.dumps(record) + "\\n")

    @hookimpl
    def on_asset_created(asset):
        _write({{"hook": "created", "name": asset.name}})

    @hookimpl
    def on_asset_alias_created(asset_alias):
        _write({{"hook": "alias_created", "name": asset_alias.name}})

    @hookimpl
    def on_asset_changed(asset):
        _write({{"hook": "changed", "name": asset.name, "extra": asset.extra}})

    @hookimpl
    def on_asset_event_emitted(asset_event):
        _write({{
            "hook": "emitted",
            "id": asset_event.id,
            "name": asset_event.asset.name,
            "extra": asset_event.extra,
            "source": asset_event.source,
            "source_run_id": asset_event.source_run_id,
        }})
"""

RAISING = """
    from triggerer import hookimpl

    @hookimpl
    def on_asset_created(asset):
        raise RuntimeError("listener broke")

    @hookimpl
    def on_asset_alias_created(asset_alias):
        raise RuntimeError("listener broke")

    @hookimpl
    def on_asset_changed(asset):
        raise RuntimeError("listener broke")

    @hookimpl
    def on_asset_event_emitted(asset_event):
        raise RuntimeError("listener broke")
"""

HOOKS = ("on_asset_created", "on_asset_alias_created", "on_asset_changed", "on_asset_event_emitted")


def failures() -> dict[str, float]:
    return {
        hook: REGISTRY.get_sample_value("triggerer_listener_failures_total", {"hook": hook}) or 0.0
        for hook in HOOKS
    }


class Heard:
    """What the recording listener wrote, from the daemon and the CLI alike."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def records(self) -> list[dict[str, Any]]:
        if not self.path.exists():
            return []
        return [json.loads(line) for line in self.path.read_text().splitlines()]

    def of(self, hook: str) -> dict[str, dict[str, Any]]:
        return {r["name"]: r for r in self.records() if r["hook"] == hook}

    async def wait(self, hook: str, names: set[str], timeout_s: float = 60) -> None:
        with anyio.fail_after(timeout_s):
            while not names <= self.of(hook).keys():  # noqa: ASYNC110 - a file another process writes
                await anyio.sleep(0.1)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


def served(text: str, name: str, labels: dict[str, str]) -> float | None:
    """The value of one sample in a ``/metrics`` response."""
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    return None


def write_plugins(tmp_path: Path, heard: Path) -> tuple[Path, str, str]:
    """The two plugin modules in a folder of their own: (folder, recording, raising)."""
    folder = tmp_path / "plugins"
    folder.mkdir()
    suffix = uuid.uuid4().hex[:8]
    recording, raising = f"recording_{suffix}", f"raising_{suffix}"
    (folder / f"{recording}.py").write_text(textwrap.dedent(RECORDING.format(path=str(heard))))
    (folder / f"{raising}.py").write_text(textwrap.dedent(RAISING))
    return folder, recording, raising


async def test_listener_hears_every_hook_for_watcher_run_cli_and_rest_events(
    database_url: str,
    make_deployment: MakeDeployment,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    deployment: Deployment = await make_deployment(database_url)
    heard = Heard(tmp_path / "heard.jsonl")
    folder, recording, raising = write_plugins(tmp_path, heard.path)
    monkeypatch.syspath_prepend(str(folder))
    plugins = (recording, raising)  # the raising one last: it is called first (pluggy: LIFO)
    settings = daemon_settings(tmp_path, deployment.database_url, deployment.spark_remote)
    port = free_port()
    settings = settings.model_copy(
        update={
            "listeners": ListenersSettings(plugins=plugins),
            "api": ApiSettings(enabled=True, port=port),
        }
    )
    deployment.write_pipelines(ORDERS + PIPELINES.replace("VERSION", "1"))
    failed_before = failures()

    async with running_daemon(settings):
        await heard.wait("created", {"orders", "report", "manual", "posted"})
        await heard.wait("alias_created", {"made"})
        await deployment.produce([{"order": 1}])
        await heard.wait("emitted", {"orders", "report", "dynamic"}, timeout_s=120)
        await heard.wait("created", {"dynamic"})

        env = deployment.env(
            TRIGGERER_LISTENERS__PLUGINS=json.dumps(plugins),
            PYTHONPATH=os.pathsep.join([str(folder), os.environ.get("PYTHONPATH", "")]),
        )
        emitted = await triggerer_cli(env, "events", "emit", "manual", "--extra", '{"by": "cli"}')
        assert emitted.returncode == 0, emitted.stderr.decode()
        await heard.wait("emitted", {"manual"})

        async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}/api/v1") as client:
            response = await client.post(
                "/assets/events", json={"uri": "posted", "extra": {"by": "rest"}}
            )
            assert response.status_code == 201, response.text
            await heard.wait("emitted", {"posted"})

            deployment.write_pipelines(ORDERS + PIPELINES.replace("VERSION", "2"))
            await heard.wait("changed", {"manual"})
            # The listeners' process reports failures with its acknowledgement of the item,
            # which comes after the recording listener has written it.
            with anyio.fail_after(10):
                while failures()["on_asset_changed"] == failed_before["on_asset_changed"]:  # noqa: ASYNC110 - a metric
                    await anyio.sleep(0.05)
            failed_after = failures()
            metrics_text = (await client.get("/metrics")).text

    (run,) = await deployment.query(runs)
    assert run.state == "success"
    stored = {
        name: (await deployment.query(lambda s, name=name: events_of(s, name)))[0]
        for name in ("orders", "report", "dynamic", "manual", "posted")
    }
    emitted_events = heard.of("emitted")
    assert {name: r["id"] for name, r in emitted_events.items()} == {
        name: event.id for name, event in stored.items()
    }
    assert {name: (r["source"], r["source_run_id"]) for name, r in emitted_events.items()} == {
        "orders": ("trigger", None),
        "report": ("run", run.run_id),
        "dynamic": ("run", run.run_id),
        "manual": ("cli", None),
        "posted": ("rest_api", None),
    }
    assert emitted_events["orders"]["extra"]["payload"]["value"] == {"order": 1}
    assert emitted_events["report"]["extra"] == {"rows": 1}
    assert emitted_events["dynamic"]["extra"] == {"via": "alias"}
    assert emitted_events["manual"]["extra"] == {"by": "cli"}
    assert emitted_events["posted"]["extra"] == {"by": "rest", "from_rest_api": True}
    # The daemon's events are heard in the listeners' process (one, not the daemon's own); the
    # CLI's event in the CLI's process, after its commit.
    (listeners_pid,) = {r["pid"] for name, r in emitted_events.items() if name != "manual"}
    assert emitted_events["manual"]["pid"] not in (listeners_pid, os.getpid())
    assert listeners_pid != os.getpid()
    assert heard.of("changed")["manual"]["extra"] == {"version": 2}
    # Each created once, though the folder was synced again.
    created = [r["name"] for r in heard.records() if r["hook"] == "created"]
    assert sorted(created) == ["dynamic", "manual", "orders", "posted", "report"]

    # The raising listener was called for every hook in the daemon, counted, and held nothing up.
    raised = {hook: failed_after[hook] - failed_before[hook] for hook in HOOKS}
    assert raised == {
        "on_asset_created": 5,
        "on_asset_alias_created": 1,
        "on_asset_changed": 1,
        "on_asset_event_emitted": 4,  # all but the CLI's event, which counts in the CLI
    }
    for hook in HOOKS:  # and that is what /api/v1/metrics serves
        value = served(metrics_text, "triggerer_listener_failures_total", {"hook": hook})
        assert value == failed_after[hook]


async def test_a_plugin_that_cannot_be_imported_is_a_one_line_error(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("TRIGGERER_")}
    env |= {
        "TRIGGERER_DATABASE__URL": f"sqlite:///{tmp_path / 'triggerer.db'}",
        "TRIGGERER_PIPELINES__DIR": str(tmp_path / "pipelines"),
        "TRIGGERER_API__ENABLED": "false",
        "TRIGGERER_LISTENERS__PLUGINS": '["no_such_listener_module"]',
    }
    for arguments in (("run",), ("events", "emit", "orders")):
        done = await triggerer_cli(env, *arguments)
        assert done.returncode == 1, arguments
        (line,) = done.stderr.decode().splitlines()
        assert line.startswith("triggerer: listener plugin 'no_such_listener_module' cannot be")
