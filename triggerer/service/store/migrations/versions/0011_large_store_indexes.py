"""Indexes that keep the API's lists fast on a store holding millions of events and runs.

Found with ``bench_large_store`` (a store of 2 million events and 200,000 runs) and each
database's plan of the statements the API issues:

- ``ix_run_pipeline_id_id`` serves a pipeline's runs newest first (``GET
  /pipelines/{id}/runs``, ``/runs?pipeline_id=``, the last run of ``/pipelines/{id}/explain``):
  through ``(pipeline_id, state)`` SQLite read and sorted every run of the pipeline;
- ``ix_asset_event_source_id`` serves the events of one source newest first
  (``/assets/events?source=``), which read every event when the source is rare;
- ``ix_run_created_at`` finds the runs created since a time (``/runs?since=``), which read
  every run when few are that recent.

Revision ID: 0011
Revises: 0010
Create Date: 2026-11-27
"""

from __future__ import annotations

from alembic import op

revision: str = "0011"
down_revision: str | None = "0010"
branch_labels: str | tuple[str, ...] | None = None
depends_on: str | tuple[str, ...] | None = None

INDEXES = (
    ("ix_run_pipeline_id_id", "run", ["pipeline_id", "id"]),
    ("ix_asset_event_source_id", "asset_event", ["source", "id"]),
    ("ix_run_created_at", "run", ["created_at"]),
)


def upgrade() -> None:
    """Apply this revision."""
    for name, table, columns in INDEXES:
        op.create_index(name, table, columns)


def downgrade() -> None:
    """Revert this revision."""
    for name, table, _ in INDEXES:
        op.drop_index(name, table_name=table)
