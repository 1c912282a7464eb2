"""Leases: a trigger that cannot be shared runs on exactly one instance at a time.

A lease row names its owner and expires unless the owner renews it (every heartbeat); a dead
instance's leases are taken over once they expire.
"""

from __future__ import annotations

from datetime import timedelta

from sqlalchemy import delete, select, update
from sqlalchemy.exc import IntegrityError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from triggerer.service.store import models
from triggerer.service.store.types import utcnow


class Leases:
    """Claims and renews the named leases of one instance."""

    def __init__(
        self, sessions: async_sessionmaker[AsyncSession], owner: str, ttl_s: float
    ) -> None:
        self._sessions = sessions
        self._owner = owner
        self._ttl = timedelta(seconds=ttl_s)
        self.held: set[str] = set()

    @property
    def owner(self) -> str:
        """The instance whose leases these are."""
        return self._owner

    async def claim(self, name: str) -> bool:
        """Take or renew ``name``; False while another live instance holds it."""
        now = utcnow()
        try:
            async with self._sessions.begin() as session:
                query = select(models.Lease).where(models.Lease.name == name)
                if session.get_bind().dialect.name == "postgresql":
                    # A lease another instance is renewing right now is simply not ours.
                    query = query.with_for_update(skip_locked=True)
                lease = await session.scalar(query)
                if lease is None:
                    session.add(
                        models.Lease(name=name, owner=self._owner, expires_at=now + self._ttl)
                    )
                elif lease.owner == self._owner or lease.expires_at < now:
                    lease.owner, lease.expires_at = self._owner, now + self._ttl
                else:
                    self.held.discard(name)
                    return False
        except IntegrityError:  # another instance inserted it first (or holds its row lock)
            self.held.discard(name)
            return False
        self.held.add(name)
        return True

    async def renew(self) -> set[str]:
        """Renew every held lease in one statement; the names that were lost."""
        if not self.held:
            return set()
        async with self._sessions.begin() as session:
            renewed = await session.scalars(
                update(models.Lease)
                .where(models.Lease.name.in_(self.held), models.Lease.owner == self._owner)
                .values(expires_at=utcnow() + self._ttl)
                .returning(models.Lease.name)
            )
            lost = self.held - set(renewed.all())
        self.held -= lost
        return lost

    async def release(self, name: str) -> None:
        """Give ``name`` up (its trigger stopped here): another instance takes it at once."""
        self.held.discard(name)
        async with self._sessions.begin() as session:
            await session.execute(
                delete(models.Lease).where(
                    models.Lease.name == name, models.Lease.owner == self._owner
                )
            )
