"""Notices between processes sharing a database: over NOTIFY on PostgreSQL, as rows on SQLite.

A process that queues events for pipelines, queues a run or cancels one says so in the same
transaction, so the notice exists once the change is committed, never if it rolls back, and
another instance or the CLI wakes a daemon's scheduler or launcher instead of its sweep doing
so. PostgreSQL delivers the notice to every listening daemon
(``triggerer.service.daemon.wakeups``) when the transaction commits. SQLite has no such
channel: the notice is a ``notice`` row, which daemons read by polling for the rows after the
last one they read (one indexed probe, nothing to read at idle) and delete after
:data:`KEPT_S`.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import timedelta

from sqlalchemy import bindparam, delete, func, insert, select
from sqlalchemy.ext.asyncio import AsyncSession

from triggerer.service.store import models
from triggerer.service.store.types import utcnow

CHANNEL = "triggerer"
RUNS = "runs"
"""The notice of a new queued run."""
CANCEL = "cancel"
"""The notice of a running run cancelled: the daemon running it stops it."""
QUEUED = "queued"
"""The notice of queued events: ``queued`` then the pipeline ids, or alone for "any"."""
_PAYLOAD_MAX_BYTES = 7900  # PostgreSQL refuses payloads of 8000 bytes or more
KEPT_S = 60.0
"""How long a notice row stays on SQLite: daemons read them every fraction of a second, and one
that was not running then looks at every pipeline when it starts."""
# Built once: building it cost three times what running it did, on every transaction.
_NOTIFY = select(func.pg_notify(CHANNEL, bindparam("payload")))
_NOTICE_ROW = insert(models.Notice)
_AFTER = (
    select(models.Notice.id, models.Notice.payload)
    .where(models.Notice.id > bindparam("after"))
    .order_by(models.Notice.id)
)


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
    else:
        await session.execute(_NOTICE_ROW, {"payload": payload, "created_at": utcnow()})


async def last_notice(session: AsyncSession) -> int:
    """The id of the last notice row (0 when none): where a daemon starts reading (SQLite)."""
    return await session.scalar(select(func.coalesce(func.max(models.Notice.id), 0))) or 0


async def notices_after(session: AsyncSession, after: int) -> Sequence[tuple[int, str]]:
    """The notice rows after ``after``, in order, as ``(id, payload)`` (SQLite)."""
    rows = await session.execute(_AFTER, {"after": after})
    return [(notice_id, payload) for notice_id, payload in rows]


async def prune_notices(session: AsyncSession) -> None:
    """Delete the notice rows older than :data:`KEPT_S` (SQLite)."""
    cutoff = utcnow() - timedelta(seconds=KEPT_S)
    await session.execute(delete(models.Notice).where(models.Notice.created_at < cutoff))


def parse_queued(payload: str) -> set[str] | None:
    """The pipeline ids of a ``queued`` notice; ``None`` for "any pipeline"."""
    ids = payload.split(" ")[1:]
    return set(ids) if ids else None
