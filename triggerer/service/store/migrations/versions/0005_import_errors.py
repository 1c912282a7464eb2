"""Files of the pipelines folder that fail to load, as the last load found them.

``import_error`` has one row per file (or unreadable folder) with the line where it failed and
the last frames of its traceback, so that ``pipelines list``, the REST API and the UI show it,
not only the daemon's log. A load replaces the rows: a file that loads again loses its row.

Revision ID: 0005
Revises: 0004
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0005"
down_revision: str | None = "0004"
branch_labels: str | tuple[str, ...] | None = None
depends_on: str | tuple[str, ...] | None = None


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "import_error",
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("fileloc", sa.Text(), nullable=False),
        sa.Column("line", sa.Integer(), nullable=True),
        sa.Column("error", sa.Text(), nullable=False),
        sa.Column("traceback", sa.Text(), nullable=True),
        sa.Column("error_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("key", name=op.f("pk_import_error")),
    )


def downgrade() -> None:
    """Revert this revision."""
    op.drop_table("import_error")
