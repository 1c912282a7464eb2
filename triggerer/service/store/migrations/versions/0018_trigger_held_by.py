"""Which pipeline holds a watcher back: ``trigger.held_by``.

A watcher stops fetching while every pipeline it feeds has its backlog full
(``max_backlog``, issue 31); the heartbeat writes the pipeline holding it back, so that
``/watchers``, ``triggerer watchers list`` and the UI say why it is not reading.

Revision ID: 0018
Revises: 0017
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0018"
down_revision: str | None = "0017"
branch_labels: str | tuple[str, ...] | None = None
depends_on: str | tuple[str, ...] | None = None


def upgrade() -> None:
    """Apply this revision."""
    with op.batch_alter_table("trigger") as batch:
        batch.add_column(sa.Column("held_by", sa.String(250), nullable=True))


def downgrade() -> None:
    """Revert this revision."""
    with op.batch_alter_table("trigger") as batch:
        batch.drop_column("held_by")
