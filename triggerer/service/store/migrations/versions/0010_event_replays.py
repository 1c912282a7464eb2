"""Stored events can be queued again for their consumers (issue 20, replay).

``events replay`` gives a pipeline added after its asset's events arrived, or one fixed after a
bug, the events of a time range again. A replay must not queue an event twice for a pipeline
when asked twice, so it is recorded: ``replay`` (what was asked, per pipeline) and
``replay_event``, the events a replay covered, unique per ``(pipeline_id, event_id)``: each
stored event is replayed for a pipeline at most once, however often or concurrently asked.
``queued_event.replay_id`` marks the queue rows a replay wrote (no foreign key, as the queue's
``asset_id``: adding one would rebuild the queue on SQLite), so the scheduler links their
events to a run outside the unique guard of ``run_event``, which holds the events' first
consumption, and names the run after the replay.

Revision ID: 0010
Revises: 0009
Create Date: 2026-11-28
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0010"
down_revision: str | None = "0009"
branch_labels: str | tuple[str, ...] | None = None
depends_on: str | tuple[str, ...] | None = None

# The type of triggerer.service.store.types.BigId, spelled out so this revision never changes.
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "replay",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("asset_id", sa.Integer(), nullable=False),
        sa.Column("pipeline_id", sa.String(length=250), nullable=False),
        sa.Column("since", sa.DateTime(timezone=True), nullable=False),
        sa.Column("until", sa.DateTime(timezone=True), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["asset_id"], ["asset.id"], name=op.f("fk_replay_asset_id_asset"), ondelete="CASCADE"
        ),
        sa.ForeignKeyConstraint(
            ["pipeline_id"],
            ["pipeline.pipeline_id"],
            name=op.f("fk_replay_pipeline_id_pipeline"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_replay")),
    )
    op.create_index("ix_replay_asset_id", "replay", ["asset_id"])
    op.create_index("ix_replay_pipeline_id", "replay", ["pipeline_id"])
    op.create_table(
        "replay_event",
        sa.Column("pipeline_id", sa.String(length=250), nullable=False),
        sa.Column("event_id", BIG_ID, nullable=False),
        sa.Column("replay_id", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["event_id"],
            ["asset_event.id"],
            name=op.f("fk_replay_event_event_id_asset_event"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["replay_id"],
            ["replay.id"],
            name=op.f("fk_replay_event_replay_id_replay"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("pipeline_id", "event_id", name=op.f("pk_replay_event")),
    )
    op.create_index("ix_replay_event_event_id", "replay_event", ["event_id"])
    op.create_index("ix_replay_event_replay_id", "replay_event", ["replay_id"])
    with op.batch_alter_table("queued_event") as queue:
        queue.add_column(sa.Column("replay_id", sa.Integer(), nullable=True))


def downgrade() -> None:
    """Revert this revision. Queue rows a replay wrote stay queued, as plain rows: their events
    may then be linked twice to runs of one pipeline, which the old unique index refuses, so
    they are deleted where a run of that pipeline consumed their event already."""
    op.execute(
        "DELETE FROM queued_event WHERE replay_id IS NOT NULL AND EXISTS ("
        "SELECT 1 FROM run_event WHERE run_event.pipeline_id = queued_event.pipeline_id "
        "AND run_event.event_id = queued_event.event_id AND NOT run_event.rerun)"
    )
    with op.batch_alter_table("queued_event") as queue:
        queue.drop_column("replay_id")
    op.drop_table("replay_event")
    op.drop_table("replay")
