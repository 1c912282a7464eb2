"""A watcher's last event beside its last poll.

``trigger.last_poll_at`` moved only when the trigger yielded an event, so a healthy watcher of a
quiet source looked stuck. It is now the last time the watcher asked its source (an empty poll
included, as the trigger reports it), and ``last_event_at`` keeps the time of its last event;
until the daemon's first heartbeat that is the last poll as stored, which meant the same.

Revision ID: 0006
Revises: 0005
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0006"
down_revision: str | None = "0005"
branch_labels: str | tuple[str, ...] | None = None
depends_on: str | tuple[str, ...] | None = None


def upgrade() -> None:
    """Apply this revision."""
    with op.batch_alter_table("trigger") as batch:
        batch.add_column(sa.Column("last_event_at", sa.DateTime(timezone=True), nullable=True))
    trigger = sa.table("trigger", sa.column("last_poll_at"), sa.column("last_event_at"))
    op.execute(trigger.update().values(last_event_at=trigger.c.last_poll_at))


def downgrade() -> None:
    """Revert this revision."""
    with op.batch_alter_table("trigger") as batch:
        batch.drop_column("last_event_at")
