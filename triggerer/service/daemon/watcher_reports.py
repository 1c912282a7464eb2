"""What a heartbeat writes of the watchers: each trigger's state, as the supervisor holds it,
into its ``trigger`` row, and only where it changed since the last write.

Idle watchers change nothing but their last poll, and the watchers reading through one shared
consumer (Kafka's) are answered by the same fetch: their rows take the same values. Rows of equal
values are written by one ``UPDATE ... WHERE id IN (...)``, so 300 idle Kafka watchers cost one
statement a beat instead of 300 rows through the ORM's bulk update, which was most of what such
a daemon spent of its own at idle. Rows whose values are their own go in one bulk update.

Each statement is a transaction of its own: two instances writing the rows of the same
(shareable) triggers then never hold locks one another waits for. The rows are independent:
nothing needs them written together.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from sqlalchemy import update

from triggerer.service.store import models

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

    from triggerer.service.daemon.supervisor import WatcherStatus

IDS_PER_STATEMENT = 1000
"""Rows of one ``IN`` list: well within SQLite's and PostgreSQL's bound parameter limits."""

_Row = tuple[tuple[str, Any], ...]
"""A trigger row's reported columns and values, in a fixed order: comparable and hashable."""


class WatcherReports:
    """Writes the states of one instance's watchers; called at each heartbeat."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession], instance_id: str) -> None:
        self._sessions = sessions
        self._instance_id = instance_id
        #: Each trigger's row as last written.
        self._written: dict[int, _Row] = {}

    async def write(self, statuses: Mapping[int, WatcherStatus]) -> int:
        """Write the state of each trigger in ``statuses`` that changed since it was last
        written; how many rows were written."""
        # Values taken before the write: a state that changes while it is written (starting ->
        # running) is then written by the next beat, not taken for written.
        rows = {trigger_id: self._row(status) for trigger_id, status in statuses.items()}
        changed = {
            trigger_id: row
            for trigger_id, row in rows.items()
            if self._written.get(trigger_id) != row
        }
        alike: dict[_Row, list[int]] = {}
        for trigger_id, row in changed.items():
            alike.setdefault(row, []).append(trigger_id)
        own = []
        for row, trigger_ids in alike.items():
            if len(trigger_ids) == 1:
                own.append({"id": trigger_ids[0], **dict(row)})
                continue
            for first in range(0, len(trigger_ids), IDS_PER_STATEMENT):
                chunk = trigger_ids[first : first + IDS_PER_STATEMENT]
                async with self._sessions.begin() as session:
                    await session.execute(
                        update(models.Trigger)
                        .where(models.Trigger.id.in_(chunk))
                        .values(dict(row))
                        .execution_options(synchronize_session=False)
                    )
                self._written.update(dict.fromkeys(chunk, row))
        if own:
            async with self._sessions.begin() as session:
                await session.execute(update(models.Trigger), own)
            self._written.update((values["id"], rows[values["id"]]) for values in own)
        return len(changed)

    def _row(self, status: WatcherStatus) -> _Row:
        return (
            ("state", status.state),
            ("last_poll_at", status.last_poll_at),
            ("last_event_at", status.last_event_at),
            ("last_error", status.last_error),
            ("last_error_at", status.last_error_at),
            ("restart_count", status.restart_count),
            ("lag", status.lag),
            ("reads_as", status.reads_as),
            ("held_by", status.held_by),
            ("instance_id", self._instance_id),
        )
