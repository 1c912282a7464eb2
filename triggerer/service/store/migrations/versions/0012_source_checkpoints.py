"""Stored positions of sources without acks (issue 24, Kinesis).

A Kinesis shard has no acknowledgement: a reader keeps its place itself. ``source_checkpoint``
holds that place (the sequence number read up to, as decimal text, under a key naming the
stream, the reader and the shard), written by the daemon in the transaction of the events read
up to it, so a restarted watcher reads on from exactly there.

Revision ID: 0012
Revises: 0011
Create Date: 2026-12-01
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0012"
down_revision: str | None = "0011"
branch_labels: str | tuple[str, ...] | None = None
depends_on: str | tuple[str, ...] | None = None


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "source_checkpoint",
        sa.Column("key", sa.String(length=1500), nullable=False),
        sa.Column("position", sa.Text(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_source_checkpoint")),
    )


def downgrade() -> None:
    """Revert this revision: the stored positions go, so Kinesis watchers of an older build
    (which keep none) start from their ``start`` option."""
    op.drop_table("source_checkpoint")
