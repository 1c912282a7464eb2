"""The W3C trace context an event carries (``asset_event.traceparent`` and ``tracestate``).

A message's ``traceparent`` header (or attribute, or X-Ray's header converted), a REST
request's, or the context of the run that emitted the event: kept with the event, so it
survives restarts and reaches the runs that consume it (docs/tracing.md). Both columns are
nullable: events stored before this revision, and events that came with no context, have none.

Revision ID: 0021
Revises: 0019
Create Date: 2026-12-05
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0021"
down_revision: str | None = "0020"
branch_labels: str | tuple[str, ...] | None = None
depends_on: str | tuple[str, ...] | None = None


def upgrade() -> None:
    """Apply this revision."""
    with op.batch_alter_table("asset_event") as batch:
        batch.add_column(sa.Column("traceparent", sa.String(length=55), nullable=True))
        batch.add_column(sa.Column("tracestate", sa.String(length=512), nullable=True))


def downgrade() -> None:
    """Revert this revision."""
    with op.batch_alter_table("asset_event") as batch:
        batch.drop_column("tracestate")
        batch.drop_column("traceparent")
