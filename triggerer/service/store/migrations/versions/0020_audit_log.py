"""The audit log (issue 34): ``audit``.

Every change a principal makes through the REST API or the CLI (an event emitted, a pipeline
paused, a run triggered, cancelled or re-run, a replay, queued events deleted, ``db clean``)
is one row, written in the transaction of the change: its time, the actor (the principal's
name), the action, its target and the request's details as JSON. Indexes serve the reads
(newest first, by target, actor or action, since a time) and retention (by time).

Revision ID: 0020
Revises: 0019
Create Date: 2026-12-08
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0020"
down_revision: str | None = "0019"
branch_labels: str | tuple[str, ...] | None = None
depends_on: str | tuple[str, ...] | None = None

BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")
JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "audit",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("time", sa.DateTime(timezone=True), nullable=False),
        sa.Column("actor", sa.String(length=250), nullable=False),
        sa.Column("action", sa.String(length=16), nullable=False),
        sa.Column("target", sa.Text(), nullable=False),
        sa.Column("details", JSON, nullable=False),
        sa.CheckConstraint(
            "action IN ('emit', 'pause', 'unpause', 'trigger', 'cancel', 'rerun', 'replay', "
            "'delete_queued', 'db_clean')",
            name=op.f("ck_audit_action"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_audit")),
    )
    op.create_index("ix_audit_time", "audit", ["time"])
    op.create_index("ix_audit_target_id", "audit", ["target", "id"])
    op.create_index("ix_audit_actor_id", "audit", ["actor", "id"])
    op.create_index("ix_audit_action_id", "audit", ["action", "id"])


def downgrade() -> None:
    """Revert this revision: the audit log goes (an older build writes none)."""
    op.drop_table("audit")
