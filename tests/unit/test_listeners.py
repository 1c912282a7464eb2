"""Listener plugins: loading by dotted path and notify."""

from __future__ import annotations

import importlib
import sys
import textwrap
from pathlib import Path

import pluggy
import pytest
from structlog.testing import capture_logs

from triggerer import Asset, hookimpl
from triggerer.listeners import ListenerPluginError, listener_manager, notify


class Recorder:
    def __init__(self) -> None:
        self.seen: list[tuple[str, object]] = []

    @hookimpl
    def on_asset_created(self, asset: Asset) -> None:
        self.seen.append(("created", asset))

    @hookimpl
    def on_asset_changed(self, asset: Asset) -> None:
        self.seen.append(("changed", asset))


class Failing:
    @hookimpl
    def on_asset_created(self, asset: Asset) -> None:
        raise RuntimeError("listener broke")


class FewerArgs:
    def __init__(self) -> None:
        self.calls = 0

    @hookimpl
    def on_asset_event_emitted(self) -> None:
        self.calls += 1


@pytest.fixture
def plugin_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    name = f"listener_plugin_{tmp_path.name.replace('-', '_')}"
    (tmp_path / f"{name}.py").write_text(
        textwrap.dedent(
            """
            from triggerer import hookimpl

            SEEN = []

            @hookimpl
            def on_asset_created(asset):
                SEEN.append(asset)

            class Listener:
                seen = []

                @hookimpl
                def on_asset_alias_created(self, asset_alias):
                    self.seen.append(asset_alias)

            listener = Listener()
            """
        )
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, name, raising=False)
    return name


def test_dotted_module_path_is_registered_and_notified(plugin_module: str) -> None:
    manager = listener_manager([plugin_module])
    asset = Asset("orders")
    notify(manager, "on_asset_created", asset=asset)
    module = importlib.import_module(plugin_module)
    assert [asset] == module.SEEN


def test_dotted_object_path_is_registered_and_notified(plugin_module: str) -> None:
    manager = listener_manager([f"{plugin_module}.listener"])
    notify(manager, "on_asset_alias_created", asset_alias="al")
    module = importlib.import_module(plugin_module)
    assert module.listener.seen == ["al"]


@pytest.mark.parametrize("path", ["no_such_listener_module", "triggerer.listeners.nothing_here"])
def test_unimportable_plugin_names_the_path(path: str) -> None:
    with pytest.raises(ListenerPluginError, match=path):
        listener_manager([path])


def test_notify_calls_every_listener() -> None:
    manager = listener_manager()
    one, two = Recorder(), Recorder()
    manager.register(one)
    manager.register(two)
    asset = Asset("orders")
    notify(manager, "on_asset_changed", asset=asset)
    assert one.seen == two.seen == [("changed", asset)]


def test_raising_listener_is_logged_and_others_still_run() -> None:
    manager = listener_manager()
    before, after = Recorder(), Recorder()
    manager.register(before)
    manager.register(Failing(), name="failing")
    manager.register(after)
    asset = Asset("orders")
    with capture_logs() as logs:
        notify(manager, "on_asset_created", asset=asset)
    assert before.seen == after.seen == [("created", asset)]
    failures = [entry for entry in logs if entry["event"] == "listener_failed"]
    assert len(failures) == 1
    assert failures[0]["log_level"] == "error"
    assert failures[0]["hook"] == "on_asset_created"
    assert failures[0]["listener"] == "failing"
    assert failures[0]["exc_info"] is True


def test_listener_implementing_fewer_args_works() -> None:
    manager = listener_manager()
    listener = FewerArgs()
    manager.register(listener)
    notify(manager, "on_asset_event_emitted", asset_event=object())
    assert listener.calls == 1


def test_hook_with_unknown_argument_name_is_rejected_at_register() -> None:
    class Wrong:
        @hookimpl
        def on_asset_created(self, assett: Asset) -> None:
            pass

    manager = listener_manager()
    with pytest.raises(pluggy.PluginValidationError, match="assett"):
        manager.register(Wrong())
