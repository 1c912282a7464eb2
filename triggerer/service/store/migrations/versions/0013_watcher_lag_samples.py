"""Watcher lag over time (issue 21, the UI's charts).

``watcher_lag_sample`` holds a watcher's lag as its instance saw it at a heartbeat (at most one
row a minute per trigger, kept for a day), which ``GET /activity/watcherLag`` aggregates per
minute for the UI's chart. The samples go with their trigger.

Revision ID: 0013
Revises: 0012
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0013"
down_revision: str | None = "0012"
branch_labels: str | tuple[str, ...] | None = None
depends_on: str | tuple[str, ...] | None = None

BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "watcher_lag_sample",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("trigger_id", sa.Integer(), nullable=False),
        sa.Column("sampled_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("lag", sa.BigInteger(), nullable=False),
        sa.ForeignKeyConstraint(
            ["trigger_id"],
            ["trigger.id"],
            name=op.f("fk_watcher_lag_sample_trigger_id_trigger"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_watcher_lag_sample")),
    )
    op.create_index("ix_watcher_lag_sample_sampled_at", "watcher_lag_sample", ["sampled_at"])
    op.create_index(
        "ix_watcher_lag_sample_trigger_id_sampled_at",
        "watcher_lag_sample",
        ["trigger_id", "sampled_at"],
    )


def downgrade() -> None:
    """Revert this revision: the samples go (the charts of an older build draw none)."""
    op.drop_table("watcher_lag_sample")
