"""Who makes a change: the principal a request or a command acts as, named in the audit log."""

from __future__ import annotations

import dataclasses
import getpass


@dataclasses.dataclass(frozen=True)
class Principal:
    """A caller of the API or the CLI: ``name`` is what the audit log records, ``role`` what
    it may do (``viewer``, ``emitter``, ``operator``, ``admin``)."""

    name: str
    role: str


ANONYMOUS = Principal("anonymous", "admin")
"""Whoever calls an API with no tokens configured (it listens on loopback only)."""


def token_principal(index: int) -> Principal:
    """The bearer of the ``index``-th token of ``[api] tokens``: an admin."""
    return Principal(f"api-token-{index + 1}", "admin")


def cli_principal() -> Principal:
    """The CLI's user, acting on the store directly: an admin named by the Unix user."""
    return Principal(f"cli:{getpass.getuser()}", "admin")
