"""Notices between processes sharing a PostgreSQL database, over NOTIFY.

A process that queues events for pipelines, queues a run or cancels one says so in the same
transaction; PostgreSQL delivers the notice to every listening daemon
(``triggerer.service.daemon.wakeups``) when that transaction commits, never if it rolls back, so
another instance or the CLI wakes a daemon's scheduler or launcher at once instead of at its
next sweep. SQLite has no such channel: there the sweep is the wake-up.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import bindparam, func, select
from sqlalchemy.ext.asyncio import AsyncSession

CHANNEL = "triggerer"
RUNS = "runs"
"""The notice of a new queued run."""
CANCEL = "cancel"
"""The notice of a running run cancelled: the daemon running it stops it."""
QUEUED = "queued"
"""The notice of queued events: ``queued`` then the pipeline ids, or alone for "any"."""
_PAYLOAD_MAX_BYTES = 7900  # PostgreSQL refuses payloads of 8000 bytes or more
# Built once: building it cost three times what running it did, on every transaction.
_NOTIFY = select(func.pg_notify(CHANNEL, bindparam("payload")))


async def notify_queued(session: AsyncSession, pipeline_ids: Iterable[str]) -> None:
    """Tell listening daemons, once the transaction commits, that these pipelines have events."""
    payload = " ".join([QUEUED, *sorted(pipeline_ids)])
    if len(payload.encode()) > _PAYLOAD_MAX_BYTES:
        payload = QUEUED  # too many to name: every pipeline is looked at
    await _notify(session, payload)


async def notify_runs(session: AsyncSession) -> None:
    """Tell listening daemons, once the transaction commits, that a run is queued."""
    await _notify(session, RUNS)


async def notify_cancel(session: AsyncSession) -> None:
    """Tell listening daemons, once the transaction commits, that a running run is cancelled."""
    await _notify(session, CANCEL)


async def _notify(session: AsyncSession, payload: str) -> None:
    if session.get_bind().dialect.name == "postgresql":
        await session.execute(_NOTIFY, {"payload": payload})


def parse_queued(payload: str) -> set[str] | None:
    """The pipeline ids of a ``queued`` notice; ``None`` for "any pipeline"."""
    ids = payload.split(" ")[1:]
    return set(ids) if ids else None
