"""Part leases in the store: a shareable trigger's parts (Kinesis shards) spread over the
daemons running it, one lease row per part (see :mod:`triggerer.part_leases`).

Each daemon running a group's trigger keeps a member row (``<group>@member/<instance>``) and
the part rows it holds (``<group><part>``), in the ``lease`` table beside the leases of
triggers that are not shared; the heartbeat renews them with the others, and a dead daemon's
rows expire after ``dead_after_s``. Each round (:meth:`StoredPartLeases.balance`) a daemon
takes free or expired parts up to its fair share (the parts over the live members, rounded
up), and gives up what is past it or what another member needs to reach its share, so a
daemon that joins gets parts within a round or two, and parts of a daemon that stopped or died
are taken as soon as its rows are gone or expired.

A part's holding has a tenure: the time it was taken (``acquired_at``, which renewals keep).
Events read from a part carry it (their fence); ingest stores them only while the row still
names this daemon and that tenure (:func:`lost_fences`, in the events' transaction, the rows
locked against a takeover meanwhile on PostgreSQL). A tenure never comes back once lost, so of
one tenure's events a first part is stored and none after it, and the part's next holder reads
on from the stored checkpoint.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
from collections import Counter
from collections.abc import Collection, Mapping
from datetime import datetime, timedelta
from typing import TYPE_CHECKING

from sqlalchemy import delete, select, update
from sqlalchemy.dialects import postgresql, sqlite

from triggerer.service.store import models
from triggerer.service.store.models import ID_LENGTH
from triggerer.service.store.outages import until_stored
from triggerer.service.store.types import utcnow

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

    from triggerer.part_leases import Fence
    from triggerer.service.daemon.leases import Leases

MEMBER = "@member/"
"""What a member row's name holds after its group's prefix, before the instance."""
_LONGEST_PREFIX = 150
"""Longest group prefix kept as it is in lease names; a longer one is digested."""


@dataclasses.dataclass(frozen=True)
class Plan:
    """What one daemon does in a round: the parts it takes and those it gives up."""

    take: frozenset[str]
    give_up: frozenset[str]


def plan(
    me: str, parts: Collection[str], holders: Mapping[str, str], members: Collection[str]
) -> Plan:
    """The round of daemon ``me`` for ``parts``, held as ``holders`` says (part to the live
    daemon holding it; a part not there is free), the group's live daemons being ``members``.

    Nobody holds more than its share, ``ceil(parts / members)``: a daemon over it gives up the
    rest. While another member holds fewer than ``floor(parts / members)``, a daemon takes no
    part past that floor, and when no part is free it gives up what it holds past it, for the
    needy member to take. A daemon takes free parts up to its limit, in the order of names.
    """
    owners = {*members, me, *(holders[part] for part in parts if part in holders)}
    share = math.ceil(len(parts) / len(owners))
    floor = len(parts) // len(owners)
    held = Counter(holders[part] for part in parts if part in holders)
    mine = sorted(part for part in parts if holders.get(part) == me)
    free = sorted(part for part in parts if part not in holders)
    needy = any(held[owner] < floor for owner in owners if owner != me)
    limit = floor if needy else share
    give_up = mine[limit if needy and not free else share :]
    take = free[: max(0, limit - len(mine))]
    return Plan(frozenset(take), frozenset(give_up))


def lease_prefix(group: str) -> str:
    """What the lease names of ``group``'s parts start with: the group itself, or a digest of
    it when it is long."""
    if len(group) <= _LONGEST_PREFIX:
        return group
    return f"parts/{hashlib.sha256(group.encode()).hexdigest()[:32]}/"


def _fitted(prefix: str, tail: str) -> str:
    name = prefix + tail
    if len(name) <= ID_LENGTH:
        return name
    return prefix + hashlib.sha256(tail.encode()).hexdigest()[:32]


def tenure(acquired_at: datetime) -> str:
    """The tenure of a holding taken at ``acquired_at``: its microseconds since the epoch."""
    return str(round(acquired_at.timestamp() * 1_000_000))


class StoredPartLeases:
    """The daemon's :class:`triggerer.part_leases.PartLeases`: rows of the ``lease`` table,
    held by ``leases``' owner and renewed by its heartbeat (:meth:`Leases.renew`)."""

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        leases: Leases,
        *,
        interval_s: float,
        ttl_s: float,
    ) -> None:
        self._sessions = sessions
        self._leases = leases
        self._interval_s = interval_s
        self._ttl = timedelta(seconds=ttl_s)
        # By group, the names of the rows this daemon holds (its member row and its parts').
        self._held: dict[str, set[str]] = {}

    @property
    def interval_s(self) -> float:
        return self._interval_s

    @property
    def owner(self) -> str:
        return self._leases.owner

    async def balance(self, group: str, parts: Collection[str]) -> dict[str, Fence | None]:
        """See :meth:`triggerer.part_leases.PartLeases.balance`."""
        return await until_stored(lambda: self._balance(group, parts), during="part_leases")

    async def release(self, group: str) -> None:
        """See :meth:`triggerer.part_leases.PartLeases.release`."""
        names = self._held.pop(group, set())
        self._leases.held -= names
        if names:
            await until_stored(lambda: self._delete(names), during="part_leases")

    async def _balance(self, group: str, parts: Collection[str]) -> dict[str, Fence | None]:
        prefix = lease_prefix(group)
        names = {part: _fitted(prefix, part) for part in parts}
        member = _fitted(prefix + MEMBER, self.owner)
        now = utcnow()
        expires_at = now + self._ttl
        async with self._sessions.begin() as session:
            rows = (
                await session.scalars(
                    select(models.Lease).where(
                        models.Lease.name.startswith(prefix, autoescape=True)
                    )
                )
            ).all()
            live = {row.name: row for row in rows if row.expires_at >= now}
            members = {row.owner for name, row in live.items() if name.startswith(prefix + MEMBER)}
            holders = {part: live[name].owner for part, name in names.items() if name in live}
            todo = plan(self.owner, list(parts), holders, members)
            kept = {part for part, owner in holders.items() if owner == self.owner}
            kept -= todo.give_up
            # The rows this daemon held that are not its parts now: a part finished, or gone.
            dropped = self._held.get(group, set()) - {names[part] for part in kept} - {member}
            dropped |= {names[part] for part in todo.give_up}
            # Members that died are gone for good (a restarted daemon is a new instance).
            await session.execute(
                delete(models.Lease).where(
                    models.Lease.name.startswith(prefix + MEMBER, autoescape=True),
                    models.Lease.expires_at < now,
                )
            )
            if dropped:
                await session.execute(
                    delete(models.Lease).where(
                        models.Lease.name.in_(dropped), models.Lease.owner == self.owner
                    )
                )
            await self._hold(session, member, now, expires_at)
            held: dict[str, Fence | None] = {}
            # One row at a time, in the order of their names: two daemons' rounds lock rows in
            # one order, so neither waits for the other in a circle.
            for part in sorted(kept | todo.take, key=names.__getitem__):
                taken_at = await self._hold(session, names[part], now, expires_at)
                if taken_at is not None:
                    held[part] = (names[part], tenure(taken_at))
        names_held = {member} | {fence[0] for fence in held.values() if fence}
        self._leases.held -= self._held.get(group, set()) - names_held
        self._leases.held |= names_held
        self._held[group] = names_held
        return held

    async def _hold(
        self, session: AsyncSession, name: str, now: datetime, expires_at: datetime
    ) -> datetime | None:
        """Renew ``name`` (when this daemon holds it) or take it (when it is free or expired);
        when it is taken, its tenure starts now. When it was held, its ``acquired_at``; else
        ``None``."""
        renewed: datetime | None = await session.scalar(
            update(models.Lease)
            .where(models.Lease.name == name, models.Lease.owner == self.owner)
            .values(expires_at=expires_at)
            .returning(models.Lease.acquired_at)
        )
        if renewed is not None:
            return renewed
        taken: datetime | None = await session.scalar(
            update(models.Lease)
            .where(models.Lease.name == name, models.Lease.expires_at < now)
            .values(owner=self.owner, acquired_at=now, expires_at=expires_at)
            .returning(models.Lease.acquired_at)
        )
        if taken is not None:
            return taken
        dialect = postgresql if session.get_bind().dialect.name == "postgresql" else sqlite
        # Nothing when another daemon inserted it since this round read the rows.
        inserted: datetime | None = await session.scalar(
            dialect.insert(models.Lease)
            .values(name=name, owner=self.owner, acquired_at=now, expires_at=expires_at)
            .on_conflict_do_nothing(index_elements=[models.Lease.name])
            .returning(models.Lease.acquired_at)
        )
        return inserted

    async def _delete(self, names: set[str]) -> None:
        async with self._sessions.begin() as session:
            await session.execute(
                delete(models.Lease).where(
                    models.Lease.name.in_(names), models.Lease.owner == self.owner
                )
            )


async def lost_fences(session: AsyncSession, fences: Collection[Fence], owner: str) -> set[Fence]:
    """Of ``fences``, those whose lease ``owner`` no longer holds as it did (another daemon
    took the part over, or it was given up): their events must not be stored. On PostgreSQL
    the rows are locked until the transaction ends, so no takeover slips in before its commit.
    An expired lease nobody took is still held: its holder is still the part's last reader.
    """
    names = sorted({name for name, _ in fences})
    query = (
        select(models.Lease.name, models.Lease.owner, models.Lease.acquired_at)
        .where(models.Lease.name.in_(names))
        .order_by(models.Lease.name)
    )
    if session.get_bind().dialect.name == "postgresql":
        query = query.with_for_update(read=True)
    held = {
        (row.name, tenure(row.acquired_at))
        for row in await session.execute(query)
        if row.owner == owner
    }
    return {fence for fence in fences if fence not in held}
