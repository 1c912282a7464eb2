"""Part leases: the parts of one source (a Kinesis stream's shards) spread over the daemons
that run its trigger, each part read by one daemon at a time.

A trigger whose source has parts but no broker to spread them (Kinesis has no consumer groups
of its own, as Kafka has) is ``shareable``: every daemon runs it, and it reads only the parts
it holds. Every :attr:`PartLeases.interval_s` it calls :meth:`PartLeases.balance` with the parts
to be read now, under a group naming the source and the name it reads as; the answer is the
parts it holds, each with its :data:`Fence`, which the trigger puts on the events read from that
part (:attr:`triggerer.triggers.TriggerEvent.fence`). The daemon stores such an event only while
that lease is still held as it was when the part was taken: a daemon that lost a part (it was
stalled past the lease's expiry, another took the part over) stores nothing more of it, and the
new holder reads on from the part's stored checkpoint. On a clean stop the trigger gives its
parts up (:meth:`PartLeases.release`), so another daemon takes them at once.

The service installs its store's leases (:func:`lease_with`), so the SDK itself opens no
database. Outside the daemon (a trigger run on its own, a test) there is no other reader: every
part is held, and no event is fenced.
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Protocol

Fence = tuple[str, str]
"""``(lease name, tenure)``: the lease a part was read under, and which holding of it."""


class PartLeases(Protocol):
    """How a shareable trigger learns which parts of its source it reads."""

    @property
    def interval_s(self) -> float:
        """How often the trigger calls :meth:`balance` (it also renews the parts held)."""
        ...

    async def balance(self, group: str, parts: Collection[str]) -> dict[str, Fence | None]:
        """Take or keep this daemon's fair share of ``parts`` (the parts of ``group`` to be read
        now) and give up the rest it holds; the parts it holds now, each with its fence."""
        ...

    async def release(self, group: str) -> None:
        """Give up every part of ``group`` (the trigger stopped): others take them at once."""
        ...


class _AllParts:
    """Outside the daemon: every part is this reader's, and nothing is fenced."""

    interval_s = 1.0

    async def balance(self, group: str, parts: Collection[str]) -> dict[str, Fence | None]:
        return dict.fromkeys(parts)

    async def release(self, group: str) -> None:
        return None


_leases: PartLeases = _AllParts()


def lease_with(leases: PartLeases) -> None:
    """Spread parts with ``leases`` from now on (the daemon installs its store's)."""
    global _leases  # the one setting of this module, made by the service
    _leases = leases


def part_leases() -> PartLeases:
    """The part leases installed: the daemon's, or every part held outside it."""
    return _leases
