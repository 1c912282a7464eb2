"""The audit log: who changed what, through the REST API or the CLI.

Every change a principal makes (an event emitted, a pipeline paused or unpaused, a run
triggered, cancelled or re-run, a replay, queued events deleted, ``db clean``) is one row,
written in the transaction of the change: a change that fails (not found, refused, a conflict
with the state of what it names) rolls back, and leaves no row. The actions
(:mod:`triggerer.service.actions`, :mod:`triggerer.service.replay`) write their row themselves,
given the actor, so the API and the CLI record a change alike; the REST API's group commit
writes the rows of a batch of posted events in one statement, in the batch's transaction.

Events that watchers ingest and the outlet events of runs are nobody's change: they have no
row. Rows are read newest first, filtered by actor, action, target and time, and deleted by
retention after ``[retention] audit_days`` (and by ``db clean --before``).
"""

from __future__ import annotations

import dataclasses
import datetime as dt
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

from sqlalchemy import Table, delete, func, insert, or_, select, text
from sqlalchemy.ext.asyncio import AsyncSession

from triggerer.service.reads.views import View
from triggerer.service.store import models
from triggerer.service.store.engine import json_text
from triggerer.service.store.states import AuditAction
from triggerer.service.store.types import utcnow

if TYPE_CHECKING:
    from triggerer.service.principals import Principal

DATABASE = "database"
"""The target of ``db clean``: the store itself."""


def pipeline_target(pipeline_id: str) -> str:
    return f"pipeline:{pipeline_id}"


def run_target(run_id: str) -> str:
    return f"run:{run_id}"


def asset_target(uri: str) -> str:
    return f"asset:{uri}"


@dataclasses.dataclass(frozen=True, slots=True)
class Entry:
    """A change to record: who made it (the principal's name), what it was, on what, and the
    request's values with what the change did."""

    actor: str
    action: AuditAction
    target: str
    details: Mapping[str, Any]


class AuditRow(View):
    """A change as the audit log holds it."""

    id: int
    time: dt.datetime
    actor: str
    """The principal that made it: ``api-token-N``, a ``[[api.principals]]`` name,
    ``anonymous`` (an API without tokens) or ``cli:<unix user>``."""
    action: AuditAction
    target: str
    """What it changed: ``pipeline:<id>``, ``run:<run_id>``, ``asset:<uri>`` or ``database``."""
    details: dict[str, Any]
    """The request's values (params, extra, since and until...) and what it did (the run
    created, how many events were queued or deleted...)."""


# Written to the table, not the mapped class, as the events are (see events.py).
_AUDIT: Table = models.AuditEntry.__table__  # type: ignore[assignment]  # a Table, declarative

# On PostgreSQL the rows of a batch go as one array per column, as the events they record do.
_PG_INSERT = text(
    """
    INSERT INTO audit (time, actor, action, target, details)
    SELECT CAST(:now AS timestamptz), actor, action, target, CAST(details AS jsonb)
    FROM unnest(CAST(:actors AS text[]), CAST(:actions AS text[]), CAST(:targets AS text[]),
                CAST(:details AS text[])) WITH ORDINALITY
         AS new (actor, action, target, details, position)
    ORDER BY position
    """
)


async def record(
    session: AsyncSession,
    actor: Principal,
    action: AuditAction,
    target: str,
    details: Mapping[str, Any],
) -> None:
    """Record one change of ``actor``'s in the caller's transaction."""
    await record_all(session, [Entry(actor.name, action, target, details)])


async def record_all(session: AsyncSession, entries: Sequence[Entry]) -> None:
    """Record ``entries`` in the caller's transaction, in their order, in one statement."""
    if not entries:
        return
    now = utcnow()
    if session.get_bind().dialect.name == "postgresql":
        await session.execute(
            _PG_INSERT,
            {
                "now": now,
                "actors": [entry.actor for entry in entries],
                "actions": [entry.action.value for entry in entries],
                "targets": [entry.target for entry in entries],
                "details": [json_text(entry.details) for entry in entries],
            },
        )
    else:
        await session.execute(
            insert(_AUDIT),
            [
                {
                    "time": now,
                    "actor": entry.actor,
                    "action": entry.action.value,
                    "target": entry.target,
                    "details": entry.details,
                }
                for entry in entries
            ],
        )


async def entries(
    session: AsyncSession,
    *,
    actor: str | None = None,
    action: AuditAction | None = None,
    target: str | None = None,
    pipeline_id: str | None = None,
    since: dt.datetime | None = None,
    limit: int = 100,
    offset: int = 0,
) -> list[AuditRow]:
    """The changes recorded, newest first; by actor, action, target, pipeline (its own
    changes and those of its runs: a cancel, a re-run, a replay for it), and from ``since``
    on."""
    row = models.AuditEntry
    query = select(row).order_by(row.id.desc())
    if actor is not None:
        query = query.where(row.actor == actor)
    if action is not None:
        query = query.where(row.action == action.value)
    if target is not None:
        query = query.where(row.target == target)
    if pipeline_id is not None:
        query = query.where(
            or_(
                row.target == pipeline_target(pipeline_id),
                row.details["pipeline_id"].as_string() == pipeline_id,
            )
        )
    if since is not None:
        query = query.where(row.time >= since)
    found = await session.scalars(query.limit(limit).offset(offset))
    return [
        AuditRow(
            id=entry.id,
            time=entry.time,
            actor=entry.actor,
            action=AuditAction(entry.action),
            target=entry.target,
            details=entry.details,
        )
        for entry in found.all()
    ]


async def prune(session: AsyncSession, before: dt.datetime, limit: int) -> int:
    """Delete the oldest rows recorded before ``before``, ``limit`` at most; how many went."""
    row = models.AuditEntry
    oldest = select(row.id).where(row.time < before).order_by(row.time).limit(limit)
    result = await session.execute(delete(row).where(row.id.in_(oldest)))
    return int(result.rowcount)  # type: ignore[attr-defined]  # a CursorResult


async def count_before(session: AsyncSession, before: dt.datetime) -> int:
    """How many rows were recorded before ``before`` (what :func:`prune` would delete)."""
    row = models.AuditEntry
    counted = select(func.count()).select_from(row).where(row.time < before)
    return int(await session.scalar(counted) or 0)
