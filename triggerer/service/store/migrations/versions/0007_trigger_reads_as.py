"""The name a watcher reads its source under (a Kafka consumer group), as its trigger says.

``watchers list`` showed a Kafka watcher's consumer group by working it out from the trigger's
options, in the service: provider knowledge outside the provider. The daemon now stores what the
running trigger reports (``BaseEventTrigger.reads_as``) at each heartbeat, for any provider.

Revision ID: 0007
Revises: 0006
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0007"
down_revision: str | None = "0006"
branch_labels: str | tuple[str, ...] | None = None
depends_on: str | tuple[str, ...] | None = None


def upgrade() -> None:
    """Apply this revision."""
    with op.batch_alter_table("trigger") as batch:
        batch.add_column(sa.Column("reads_as", sa.String(length=1500), nullable=True))


def downgrade() -> None:
    """Revert this revision."""
    with op.batch_alter_table("trigger") as batch:
        batch.drop_column("reads_as")
