"""The listeners' queue and process: listeners run in a process of their own, a full queue drops
and counts, a raising listener is counted, definition changes come before the events queued
after them, and a process that dies is started again."""

from __future__ import annotations

import json
import os
import textwrap
import uuid
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import anyio
import pytest
from prometheus_client import REGISTRY
from structlog.testing import capture_logs

from triggerer import Asset, AssetAlias
from triggerer.service.config import LoggingSettings
from triggerer.service.daemon.notifier import Notifier
from triggerer.service.events import Recorded, RecordedEvent
from triggerer.service.scheduling.registry import DefinitionChanges

ORDERS = Asset("orders")
NOW = datetime(2026, 3, 16, tzinfo=UTC)

RECORDING = """
    import json
    import os
    import time
    from pathlib import Path

    from triggerer import hookimpl

    HEARD = Path({heard!r})
    RELEASE = Path({release!r})

    def _write(record):
        record["pid"] = os.getpid()
        with HEARD.open("a") as heard:
            heard.write(json.dumps(record) + "\\n")

    @hookimpl
    def on_asset_created(asset):
        _write({{"hook": "created", "name": asset.name}})

    @hookimpl
    def on_asset_alias_created(asset_alias):
        _write({{"hook": "alias_created", "name": asset_alias.name}})

    @hookimpl
    def on_asset_changed(asset):
        _write({{"hook": "changed", "name": asset.name}})

    @hookimpl
    def on_asset_event_emitted(asset_event):
        deadline = time.monotonic() + 30
        while not RELEASE.exists() and time.monotonic() < deadline:
            time.sleep(0.01)  # held until the test releases it, like a listener that hangs
        if asset_event.extra.get("exit"):
            os._exit(3)
        _write({{"hook": "emitted", "id": asset_event.id, "name": asset_event.asset.name}})
"""

RAISING = """
    from triggerer import hookimpl

    @hookimpl
    def on_asset_created(asset):
        raise RuntimeError("listener broke")

    @hookimpl
    def on_asset_event_emitted(asset_event):
        raise RuntimeError("listener broke")
"""


class Listener:
    """The recording listener's module, and what it wrote."""

    def __init__(self, folder: Path) -> None:
        self.name = f"recording_{uuid.uuid4().hex[:8]}"
        self.heard_path, self.release_path = folder / "heard.jsonl", folder / "release"
        source = RECORDING.format(heard=str(self.heard_path), release=str(self.release_path))
        (folder / f"{self.name}.py").write_text(textwrap.dedent(source))

    def release(self) -> None:
        self.release_path.touch()

    def heard(self) -> list[dict[str, Any]]:
        if not self.heard_path.exists():
            return []
        return [json.loads(line) for line in self.heard_path.read_text().splitlines()]


@pytest.fixture
def plugins(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder on the import path for the test's listener modules."""
    monkeypatch.syspath_prepend(str(tmp_path))
    return tmp_path


def recorded(*ids: int, extra: dict[str, Any] | None = None) -> Recorded:
    events = [RecordedEvent(i, 1, None, None, extra or {"n": i}, "trigger", NOW, None) for i in ids]
    return Recorded(events, [], {})


def sample(name: str, **labels: str) -> float:
    return REGISTRY.get_sample_value(name, labels) or 0.0


@asynccontextmanager
async def running(*plugin_names: str, max_pending_events: int = 100) -> AsyncIterator[Notifier]:
    # Every event is on a known asset and from no run: the store is never read.
    notifier = Notifier(
        plugin_names,
        LoggingSettings(format="json"),
        None,  # type: ignore[arg-type]
        lambda: {1: ORDERS},
        max_pending_events=max_pending_events,
    )
    async with anyio.create_task_group() as tasks:
        tasks.start_soon(notifier.run)
        yield notifier
        tasks.cancel_scope.cancel()


async def until(check: Callable[[], bool], timeout_s: float = 30) -> None:
    with anyio.fail_after(timeout_s):
        while not check():  # noqa: ASYNC110 - a file the listeners' process writes
            await anyio.sleep(0.02)


async def test_a_hung_listener_fills_the_queue_then_events_are_dropped_counted_and_logged(
    plugins: Path,
) -> None:
    listener = Listener(plugins)
    dropped = sample("triggerer_listener_events_dropped_total")
    with capture_logs() as logs:
        async with running(listener.name, max_pending_events=3) as notifier:
            notifier.events_recorded(recorded(1, 2))
            notifier.events_recorded(recorded(3))
            notifier.events_recorded(recorded(4, 5))  # 3 waiting already: no room for 2 more
            notifier.events_recorded(recorded(6))
            assert sample("triggerer_listener_pending_events") >= 3
            listener.release()
            with anyio.fail_after(30):
                await notifier.drained()

    heard = listener.heard()
    assert [r["id"] for r in heard] == [1, 2, 3]
    assert {r["pid"] for r in heard} != {os.getpid()}  # heard in the listeners' process
    assert sample("triggerer_listener_events_dropped_total") - dropped == 3
    drops = [entry for entry in logs if entry["event"] == "listener_events_dropped"]
    # Logged at once, then at most every 10 s: the drop of event 6 waits for the next log.
    assert drops[0]["events"] == 2
    assert drops[0]["log_level"] == "warning"
    assert drops[0]["max_pending_events"] == 3


async def test_raising_listener_is_counted_per_hook_and_the_others_hear_everything_in_order(
    plugins: Path,
) -> None:
    listener = Listener(plugins)
    listener.release()
    raising = f"raising_{uuid.uuid4().hex[:8]}"
    (plugins / f"{raising}.py").write_text(textwrap.dedent(RAISING))
    failures = {
        hook: sample("triggerer_listener_failures_total", hook=hook)
        for hook in ("on_asset_created", "on_asset_event_emitted")
    }
    async with running(listener.name, raising) as notifier:
        notifier.definitions_changed(
            DefinitionChanges([ORDERS], [AssetAlias("made")], [Asset("stock")])
        )
        notifier.events_recorded(recorded(1, 2))
        with anyio.fail_after(30):
            await notifier.drained()

    assert [(r["hook"], r.get("id", r["name"])) for r in listener.heard()] == [
        ("created", "orders"),
        ("alias_created", "made"),
        ("changed", "stock"),
        ("emitted", 1),
        ("emitted", 2),
    ]
    created = sample("triggerer_listener_failures_total", hook="on_asset_created")
    emitted = sample("triggerer_listener_failures_total", hook="on_asset_event_emitted")
    assert created - failures["on_asset_created"] == 1
    assert emitted - failures["on_asset_event_emitted"] == 2


async def test_a_listeners_process_that_dies_is_started_again_and_its_loss_counted(
    plugins: Path,
) -> None:
    listener = Listener(plugins)
    listener.release()
    dropped = sample("triggerer_listener_events_dropped_total")
    with capture_logs() as logs:
        async with running(listener.name) as notifier:
            notifier.events_recorded(recorded(1))
            notifier.events_recorded(recorded(2, extra={"exit": True}))  # os._exit(3)
            await until(lambda: any(e["event"] == "listener_process_exited" for e in logs))
            notifier.events_recorded(recorded(3))
            with anyio.fail_after(30):
                await notifier.drained()

    assert [r["id"] for r in listener.heard()] == [1, 3]
    assert len({r["pid"] for r in listener.heard()}) == 2
    (exited,) = [e for e in logs if e["event"] == "listener_process_exited"]
    assert (exited["returncode"], exited["lost_events"]) == (3, 1)
    assert sample("triggerer_listener_events_dropped_total") - dropped == 1


async def test_without_listeners_no_process_starts_and_nothing_is_queued() -> None:
    notifier = Notifier(
        (),
        LoggingSettings(),
        None,
        lambda: {},
        max_pending_events=10,  # type: ignore[arg-type]
    )
    notifier.events_recorded(recorded(1))
    notifier.definitions_changed(DefinitionChanges([ORDERS]))
    with anyio.fail_after(1):
        await notifier.drained()
        await notifier.run()  # returns at once: there is nobody to call
