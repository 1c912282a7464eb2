"""Stored positions of sources without acks: written with their events, read by their triggers.

A trigger of such a source (a Kinesis shard) says in each event how far it has read
(:attr:`triggerer.triggers.TriggerEvent.checkpoint`); ingest writes the furthest position of a
batch in the transaction of its events (:func:`record_checkpoints`), and the trigger reads them
back when it starts, through :mod:`triggerer.checkpoints` (:func:`reader`, which the daemon
installs). A position only moves forward, as a number: batches may commit out of order, and a
watcher restarted before its last batch committed reads some messages again.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import TYPE_CHECKING

from sqlalchemy import ColumnElement, Table, and_, func, or_, select
from sqlalchemy.dialects import postgresql, sqlite

from triggerer.service.store.models import SourceCheckpoint
from triggerer.service.store.outages import until_stored
from triggerer.service.store.types import utcnow

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

    from triggerer.checkpoints import Reader

_CHECKPOINTS: Table = SourceCheckpoint.__table__  # type: ignore[assignment]  # a Table for models


def furthest(checkpoints: Iterable[tuple[str, str]]) -> dict[str, str]:
    """The furthest position of each key among ``checkpoints`` (``(key, position)`` pairs)."""
    positions: dict[str, str] = {}
    for key, position in checkpoints:
        position = _canonical(position)
        known = positions.get(key)
        if known is None or (len(position), position) > (len(known), known):
            positions[key] = position
    return positions


async def record_checkpoints(session: AsyncSession, positions: Mapping[str, str]) -> None:
    """Store each key's position, unless the stored one is further. The caller commits.

    Positions are decimal integers as text, of any length (a Kinesis sequence number has up to
    129 digits): the longer is further, and of equal lengths the greater text.
    """
    if not positions:
        return
    now = utcnow()
    rows = [
        {"key": key, "position": position, "updated_at": now}
        for key, position in sorted(furthest(positions.items()).items())
    ]
    postgres = session.get_bind().dialect.name == "postgresql"
    statement = (postgresql if postgres else sqlite).insert(_CHECKPOINTS)
    new: ColumnElement[str] = statement.excluded.position
    stored: ColumnElement[str] = _CHECKPOINTS.c.position
    if postgres:  # digits by their code points, whatever the database's collation
        new, stored = new.collate("C"), stored.collate("C")
    await session.execute(
        statement.on_conflict_do_update(
            index_elements=[_CHECKPOINTS.c.key],
            set_={"position": statement.excluded.position, "updated_at": now},
            where=_further(new, stored),
        ),
        rows,
    )


async def stored_positions(session: AsyncSession, prefix: str) -> dict[str, str]:
    """Every stored key that starts with ``prefix``, to its position."""
    rows = await session.execute(
        select(_CHECKPOINTS.c.key, _CHECKPOINTS.c.position).where(
            _CHECKPOINTS.c.key.startswith(prefix, autoescape=True)
        )
    )
    return {row.key: row.position for row in rows}


def reader(sessions: async_sessionmaker[AsyncSession]) -> Reader:
    """What :func:`triggerer.checkpoints.read_from` is given: reads from ``sessions``' store,
    waiting for it while it is down (a Kinesis trigger reads at every balance of its shards: a
    store outage holds it, as it holds ingest, rather than failing the watcher)."""

    async def once(prefix: str) -> dict[str, str]:
        async with sessions() as session:
            return await stored_positions(session, prefix)

    async def read(prefix: str) -> dict[str, str]:
        return await until_stored(lambda: once(prefix), during="checkpoints")

    return read


def _further(new: ColumnElement[str], stored: ColumnElement[str]) -> ColumnElement[bool]:
    return or_(
        func.length(new) > func.length(stored),
        and_(func.length(new) == func.length(stored), new > stored),
    )


def _canonical(position: str) -> str:
    """``position`` without leading zeros, so that length orders positions."""
    return position.lstrip("0") or "0"
