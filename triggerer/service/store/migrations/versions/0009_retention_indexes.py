"""Indexes retention finds old rows by: an event's time, a run's end, a dead letter's time.

Without them each retention pass would read every event, run and dead letter to find the few
old enough to go.

Revision ID: 0009
Revises: 0008
Create Date: 2026-11-27
"""

from __future__ import annotations

from alembic import op

revision: str = "0009"
down_revision: str | None = "0008"
branch_labels: str | tuple[str, ...] | None = None
depends_on: str | tuple[str, ...] | None = None

INDEXES = (
    ("ix_asset_event_timestamp", "asset_event", "timestamp"),
    ("ix_run_end_date", "run", "end_date"),
    ("ix_dead_letter_created_at", "dead_letter", "created_at"),
)


def upgrade() -> None:
    """Apply this revision."""
    for name, table, column in INDEXES:
        op.create_index(name, table, [column])


def downgrade() -> None:
    """Revert this revision."""
    for name, table, _ in INDEXES:
        op.drop_index(name, table_name=table)
