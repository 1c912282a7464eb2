"""Dead letters, and the error that stops a pipeline from being evaluated.

``dead_letter`` keeps what could not be stored as an event (a payload or key the database
rejects), with the reason, so ingest can ack it and go on instead of retrying it forever.
``pipeline.error`` is set while evaluating a pipeline fails (a partition mapper that raises,
an alias that cannot be resolved); the other pipelines go on.

Revision ID: 0003
Revises: 0002
Create Date: 2026-11-22
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0003"
down_revision: str | None = "0002"
branch_labels: str | tuple[str, ...] | None = None
depends_on: str | tuple[str, ...] | None = None

BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "dead_letter",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("asset_id", sa.Integer(), nullable=True),
        sa.Column("trigger_id", sa.Integer(), nullable=True),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("dedup_key", sa.String(length=1500), nullable=True),
        sa.Column("partition_key", sa.Text(), nullable=True),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.Column("reason", sa.Text(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "source IN ('trigger', 'rest_api', 'run', 'cli', 'manual')",
            name=op.f("ck_dead_letter_source"),
        ),
        sa.ForeignKeyConstraint(
            ["asset_id"],
            ["asset.id"],
            name=op.f("fk_dead_letter_asset_id_asset"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["trigger_id"],
            ["trigger.id"],
            name=op.f("fk_dead_letter_trigger_id_trigger"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_dead_letter")),
        sa.UniqueConstraint(
            "asset_id", "dedup_key", name=op.f("uq_dead_letter_asset_id_dedup_key")
        ),
    )
    with op.batch_alter_table("pipeline") as pipeline:
        pipeline.add_column(sa.Column("error", sa.Text(), nullable=True))
        pipeline.add_column(sa.Column("error_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    """Revert this revision."""
    with op.batch_alter_table("pipeline") as pipeline:
        pipeline.drop_column("error_at")
        pipeline.drop_column("error")
    op.drop_table("dead_letter")
