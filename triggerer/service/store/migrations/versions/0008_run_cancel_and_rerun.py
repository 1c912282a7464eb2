"""Runs can be cancelled and run again (issue 20, run control).

A run's state may now be ``cancelling`` (its daemon stops its process group) and ``cancelled``.
A re-run is a new run of the same pipeline consuming the same events: ``run.rerun_of`` names the
run it runs again, and its ``run_event`` rows repeat that run's, marked ``rerun``. The unique
``(pipeline_id, event_id)`` of ``run_event``, which kept two schedulers from consuming one event
twice, now holds for the scheduler's rows alone (a partial unique index, ``WHERE NOT rerun``):
that guarantee stays, and a re-run may link the events again.

The downgrade deletes the re-runs' links (the old unique constraint could not hold them) and
turns cancelled runs into failed ones, with the reason in their error.

Revision ID: 0008
Revises: 0007
Create Date: 2026-11-27
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0008"
down_revision: str | None = "0007"
branch_labels: str | tuple[str, ...] | None = None
depends_on: str | tuple[str, ...] | None = None

OLD_STATES = "'queued', 'running', 'success', 'failed', 'up_for_retry'"
NEW_STATES = f"{OLD_STATES}, 'cancelling', 'cancelled'"
SCHEDULED = sa.text("NOT rerun")


def upgrade() -> None:
    """Apply this revision."""
    with op.batch_alter_table("run") as run:
        run.add_column(sa.Column("rerun_of", sa.String(length=250), nullable=True))
        run.drop_constraint(op.f("ck_run_state"), type_="check")
        run.create_check_constraint(op.f("ck_run_state"), f"state IN ({NEW_STATES})")
    with op.batch_alter_table("run_event") as links:
        links.add_column(
            sa.Column("rerun", sa.Boolean(), nullable=False, server_default=sa.false())
        )
        links.drop_constraint(op.f("uq_run_event_pipeline_id_event_id"), type_="unique")
    op.create_index(
        "uq_run_event_pipeline_id_event_id",
        "run_event",
        ["pipeline_id", "event_id"],
        unique=True,
        sqlite_where=SCHEDULED,
        postgresql_where=SCHEDULED,
    )


def downgrade() -> None:
    """Revert this revision."""
    op.execute("DELETE FROM run_event WHERE rerun")
    op.execute(
        "UPDATE run SET state = 'failed', error = 'cancelled' "
        "WHERE state IN ('cancelling', 'cancelled')"
    )
    op.drop_index("uq_run_event_pipeline_id_event_id", table_name="run_event")
    with op.batch_alter_table("run_event") as links:
        links.create_unique_constraint(
            op.f("uq_run_event_pipeline_id_event_id"), ["pipeline_id", "event_id"]
        )
        links.drop_column("rerun")
    with op.batch_alter_table("run") as run:
        run.drop_constraint(op.f("ck_run_state"), type_="check")
        run.create_check_constraint(op.f("ck_run_state"), f"state IN ({OLD_STATES})")
        run.drop_column("rerun_of")
