"""Stored positions: where a trigger of a source without acks (a Kinesis shard) has read up to.

A trigger says how far it has read in each event (:attr:`triggerer.triggers.TriggerEvent.
checkpoint`); the daemon stores that position in the same transaction as the event, and the
trigger reads it back here when it starts. The service hands this module the way to read the
store (:func:`read_from`), so the SDK itself opens no database. Outside the daemon (a trigger
run on its own, a test) nothing is stored, and every lookup finds nothing.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping

Reader = Callable[[str], Awaitable[Mapping[str, str]]]
"""``await reader(prefix)``: every stored key that starts with ``prefix``, to its position."""


async def _nothing_stored(prefix: str) -> Mapping[str, str]:
    return {}


_reader: Reader = _nothing_stored


def read_from(reader: Reader) -> None:
    """Read stored positions with ``reader`` from now on (the daemon installs its store's)."""
    global _reader  # the one setting of this module, made by the service
    _reader = reader


async def stored_positions(prefix: str) -> dict[str, str]:
    """Every stored checkpoint key that starts with ``prefix``, to its position (decimal
    text); empty when none is stored, or outside the daemon."""
    return dict(await _reader(prefix))


async def stored_position(key: str) -> str | None:
    """The stored position of checkpoint ``key``; ``None`` when none is stored."""
    return (await stored_positions(key)).get(key)
