"""Notices on SQLite (``notice``) and the index of the next cron ticks.

SQLite has no NOTIFY: a process that queues events, a run or a cancel writes a ``notice`` row
in the same transaction, and daemons read the rows after the last one they read, so a change
made by the CLI wakes the scheduler within a poll instead of at a sweep over every pipeline
(issue 32). ``ix_pipeline_next_cron_at``: the scheduler asks for the ticks that are due and
the earliest of the rest, not for every cron pipeline, on each pass.

Revision ID: 0019
Revises: 0018
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0019"
down_revision: str | None = "0018"
branch_labels: str | tuple[str, ...] | None = None
depends_on: str | tuple[str, ...] | None = None

BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "notice",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_notice")),
        sqlite_autoincrement=True,
    )
    op.create_index(op.f("ix_pipeline_next_cron_at"), "pipeline", ["next_cron_at"])


def downgrade() -> None:
    """Revert this revision."""
    op.drop_index(op.f("ix_pipeline_next_cron_at"), table_name="pipeline")
    op.drop_table("notice")
