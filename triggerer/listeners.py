"""Listener plugins: pluggy hooks called when assets and asset events change.

Plugins come from the entry-point group ``triggerer.listeners`` and from ``[listeners] plugins``
(dotted paths of modules or objects carrying ``@hookimpl`` functions). Hooks are called after the
commit of what they report, never inside its transaction; the daemon calls them in a process of
their own (see :mod:`triggerer.service.daemon.notifier`), so a slow listener does not slow ingest. A
listener that raises is logged and counted; the event is still stored and its consumers still
queued.
"""

from __future__ import annotations

import importlib
import importlib.metadata
from functools import partial
from typing import TYPE_CHECKING, Any

import pluggy
import structlog

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

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

    Raises :class:`ListenerPluginError` naming a plugin that cannot be imported or registered.
    """
    manager = pluggy.PluginManager(PROJECT)
    manager.add_hookspecs(ListenerSpec)
    for entry_point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if not manager.has_plugin(entry_point.name):  # the same one installed twice
            source = f"{ENTRY_POINT_GROUP} entry point {entry_point.value}"
            _register(manager, entry_point.name, entry_point.load, source)
    for dotted_path in plugins:
        _register(manager, dotted_path, partial(_import_plugin, dotted_path), "[listeners] plugins")
    return manager


class ListenerPluginError(ValueError):
    """A listener plugin (an entry point or a ``[listeners] plugins`` entry) cannot be imported
    or registered: a configuration error."""


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


def _register(
    manager: pluggy.PluginManager, name: str, load: Callable[[], object], source: str
) -> None:
    """Register the plugin ``load()`` returns as ``name``; ``source`` says where it is set."""
    try:
        manager.register(load(), name=name)
    # Importing a plugin runs its code, and registering checks its hooks: whatever either
    # raises is a configuration error, told in one line naming the plugin, not a traceback.
    except Exception as error:
        cause = "; ".join(f"{type(error).__name__}: {error}".splitlines())
        raise ListenerPluginError(
            f"listener plugin {name!r} cannot be loaded ({source}): {cause}"
        ) from error


def _import_plugin(dotted_path: str) -> object:
    """The module ``dotted_path`` or, when there is no such module, the object it names."""
    try:
        return importlib.import_module(dotted_path)
    except ImportError:
        module_name, _, attribute = dotted_path.rpartition(".")
        if not module_name:
            raise
        return getattr(importlib.import_module(module_name), attribute)
