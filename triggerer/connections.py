"""Named connections: credentials live in settings, triggers only name them.

The service's settings (``[connections.<name>]``) are where connections come from; the service
hands this module the way to read them (:func:`read_from`) when its settings module is
imported, so the SDK itself reads no configuration.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

Connections = Mapping[str, Mapping[str, Any]]

_source: Callable[[], Connections] = dict


class UnknownConnection(KeyError):
    """No ``[connections.<name>]`` section exists."""

    def __str__(self) -> str:
        return str(self.args[0])


def read_from(source: Callable[[], Connections]) -> None:
    """Read the connections from ``source`` (called at each lookup) from now on."""
    global _source  # the one setting of this module, made by the service
    _source = source


def get_connection(name: str) -> dict[str, Any]:
    """The settings of ``[connections.<name>]`` (or ``TRIGGERER_CONNECTIONS__<NAME>__<KEY>``)."""
    connections = _source()
    try:
        return dict(connections[name])
    except KeyError:
        known = ", ".join(sorted(connections)) or "none are configured"
        raise UnknownConnection(
            f"connection {name!r} is not configured: add [connections.{name}] to the config "
            f"file (known: {known})"
        ) from None
