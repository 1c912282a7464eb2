"""The queue's asset column loses its foreign key and index: the event's key already cascades.

``queued_event.asset_id`` repeats the event's asset so the scheduler reads conditions from the
queue alone. Deleting an asset deletes its events, and their queue rows with them through
``event_id``; the second foreign key only cost a check on every queued row (a tenth of the
ingest transaction on PostgreSQL), and its index served nothing else.

Revision ID: 0002
Revises: 0001
Create Date: 2026-11-22
"""

from __future__ import annotations

from alembic import op

revision: str = "0002"
down_revision: str | None = "0001"
branch_labels: str | tuple[str, ...] | None = None
depends_on: str | tuple[str, ...] | None = None


def upgrade() -> None:
    """Apply this revision."""
    op.drop_index("ix_queued_event_asset_id", table_name="queued_event")
    # SQLite cannot drop a constraint in place: batch mode copies the table.
    with op.batch_alter_table("queued_event") as queue:
        queue.drop_constraint("fk_queued_event_asset_id_asset", type_="foreignkey")


def downgrade() -> None:
    """Revert this revision."""
    with op.batch_alter_table("queued_event") as queue:
        queue.create_foreign_key(
            "fk_queued_event_asset_id_asset", "asset", ["asset_id"], ["id"], ondelete="CASCADE"
        )
    op.create_index("ix_queued_event_asset_id", "queued_event", ["asset_id"])
