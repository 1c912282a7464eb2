"""Named connections: credentials live in settings, triggers only name them."""

from __future__ import annotations

from typing import Any

from triggerer.config import current_settings


class UnknownConnection(KeyError):
    """No ``[connections.<name>]`` section exists."""

    def __str__(self) -> str:
        return str(self.args[0])


def get_connection(name: str) -> dict[str, Any]:
    """The settings of ``[connections.<name>]`` (or ``TRIGGERER_CONNECTIONS__<NAME>__<KEY>``)."""
    connections = current_settings().connections
    try:
        return dict(connections[name])
    except KeyError:
        known = ", ".join(sorted(connections)) or "none are configured"
        raise UnknownConnection(
            f"connection {name!r} is not configured: add [connections.{name}] to the config "
            f"file (known: {known})"
        ) from None
