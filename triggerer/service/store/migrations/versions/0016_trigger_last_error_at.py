"""When a watcher's last error happened: ``trigger.last_error_at``.

A watcher kept its last error after it recovered, and nothing said when it had happened, so a
watcher that failed on a missing queue and ran again once the queue was made still looked
failing. With the time of the error, a watcher running and polling since is shown as
recovered, its error as history (issue 29). Errors stored before this revision have no time:
the daemon writes every watcher's state again at its first heartbeat after the upgrade.

Revision ID: 0016
Revises: 0015
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0016"
down_revision: str | None = "0015"
branch_labels: str | tuple[str, ...] | None = None
depends_on: str | tuple[str, ...] | None = None


def upgrade() -> None:
    """Apply this revision."""
    with op.batch_alter_table("trigger") as batch:
        batch.add_column(sa.Column("last_error_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    """Revert this revision."""
    with op.batch_alter_table("trigger") as batch:
        batch.drop_column("last_error_at")
