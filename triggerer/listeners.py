"""Listener plugins: pluggy hooks called when assets and asset events change.

Plugins come from the entry-point group ``triggerer.listeners`` and from ``[listeners] plugins``
(dotted paths of modules or objects carrying ``@hookimpl`` functions). Hooks are called after the
commit of what they report, never inside its transaction; the daemon calls them in a process of
their own (see :mod:`triggerer.daemon.notifier`), so a slow listener does not slow ingest. A
listener that raises is logged and counted; the event is still stored and its consumers still
queued.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

import pluggy
import structlog

if TYPE_CHECKING:
    from collections.abc import Iterable

    from triggerer.assets import Asset, AssetAlias
    from triggerer.context import AssetEvent

PROJECT = "triggerer"
ENTRY_POINT_GROUP = "triggerer.listeners"

hookspec = pluggy.HookspecMarker(PROJECT)
hookimpl = pluggy.HookimplMarker(PROJECT)
log = structlog.get_logger(__name__)


class ListenerSpec:
    """The hooks a listener may implement."""

    @hookspec
    def on_asset_created(self, asset: Asset) -> None:
        """An asset was stored for the first time."""

    @hookspec
    def on_asset_alias_created(self, asset_alias: AssetAlias) -> None:
        """An alias was stored for the first time."""

    @hookspec
    def on_asset_changed(self, asset: Asset) -> None:
        """A stored asset's definition (extra, group, watchers) changed."""

    @hookspec
    def on_asset_event_emitted(self, asset_event: AssetEvent) -> None:
        """An asset event was committed."""


def listener_manager(plugins: Iterable[str] = ()) -> pluggy.PluginManager:
    """A plugin manager with the entry-point listeners and the dotted-path ``plugins``.

    Raises :class:`ListenerPluginError` naming a plugin that cannot be imported.
    """
    manager = pluggy.PluginManager(PROJECT)
    manager.add_hookspecs(ListenerSpec)
    manager.load_setuptools_entrypoints(ENTRY_POINT_GROUP)
    for dotted_path in plugins:
        manager.register(_import_plugin(dotted_path), name=dotted_path)
    return manager


class ListenerPluginError(ValueError):
    """A ``[listeners] plugins`` entry cannot be imported (a configuration error)."""


def notify(manager: pluggy.PluginManager, hook_name: str, **kwargs: Any) -> int:
    """Call every listener of ``hook_name``; one that raises is logged and the rest still run.

    Returns how many raised.
    """
    hook = getattr(manager.hook, hook_name)
    failed = 0
    for implementation in hook.get_hookimpls():
        try:
            implementation.function(*(kwargs[name] for name in implementation.argnames))
        # A listener is user code: whatever it raises must not stop ingest or the scheduler.
        except Exception:
            failed += 1
            log.exception("listener_failed", hook=hook_name, listener=implementation.plugin_name)
    return failed


def _import_plugin(dotted_path: str) -> object:
    try:
        return importlib.import_module(dotted_path)
    except ImportError:
        module_name, _, attribute = dotted_path.rpartition(".")
        try:
            return getattr(importlib.import_module(module_name), attribute)
        except (ImportError, AttributeError, ValueError) as error:
            raise ListenerPluginError(
                f"listener plugin {dotted_path!r} cannot be imported: give a module or "
                f"'module.object' path ({error})"
            ) from error
