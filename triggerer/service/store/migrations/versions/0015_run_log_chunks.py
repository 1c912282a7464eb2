"""Runs' logs in the store (issue 29): ``run_log_chunk``.

A run's log was a file under ``[spark] logs_dir`` of the daemon that ran it: with several
daemons, a run executed by another one showed no log, and its log went with that daemon's
folder. The daemon running a try now ships its log into ``run_log_chunk`` while it runs (one
row a second or so, and one when it ends), within ``[runs] log_max_bytes``; readers read the
store. The chunks go with their run.

Runs from before this revision have no chunks: their log is read from the file, on the daemon
that ran them.

Revision ID: 0015
Revises: 0014
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0015"
down_revision: str | None = "0014"
branch_labels: str | tuple[str, ...] | None = None
depends_on: str | tuple[str, ...] | None = None

BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "run_log_chunk",
        sa.Column("run_pk", BIG_ID, autoincrement=False, nullable=False),
        sa.Column("try_number", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("seq", sa.Integer(), autoincrement=False, nullable=False),
        sa.Column("position", sa.BigInteger(), nullable=False),
        sa.Column("data", sa.LargeBinary(), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["run_pk"],
            ["run.id"],
            name=op.f("fk_run_log_chunk_run_pk_run"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("run_pk", "try_number", "seq", name=op.f("pk_run_log_chunk")),
    )


def downgrade() -> None:
    """Revert this revision: the logs in the store go (an older build reads the files that
    are left under ``[spark] logs_dir``)."""
    op.drop_table("run_log_chunk")
