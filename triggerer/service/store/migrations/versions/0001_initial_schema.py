"""Initial schema: assets, events, triggers, pipelines, queue, runs, instances, leases.

Revision ID: 0001
Revises:
Create Date: 2026-11-21
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0001"
down_revision: str | None = None
branch_labels: str | tuple[str, ...] | None = None
depends_on: str | tuple[str, ...] | None = None

# The same types as triggerer.service.store.types, spelled out so this revision never changes
# with them.
JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")
BIG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    """Apply this revision."""
    op.create_table(
        "asset",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=1500), nullable=False),
        sa.Column("uri", sa.String(length=1500), nullable=False),
        sa.Column("identity_key", sa.String(length=64), nullable=False),
        sa.Column("group", sa.String(length=1500), nullable=False),
        sa.Column("extra", JSON, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_asset")),
        sa.UniqueConstraint("identity_key", name=op.f("uq_asset_identity_key")),
    )
    op.create_index("ix_asset_uri", "asset", ["uri"])

    op.create_table(
        "asset_alias",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=1500), nullable=False),
        sa.Column("group", sa.String(length=1500), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_asset_alias")),
        sa.UniqueConstraint("name", name=op.f("uq_asset_alias_name")),
    )
    op.create_table(
        "instance",
        sa.Column("id", sa.String(length=250), nullable=False),
        sa.Column("hostname", sa.String(length=255), nullable=False),
        sa.Column("pid", sa.Integer(), nullable=False),
        sa.Column("started_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_instance")),
    )
    op.create_table(
        "lease",
        sa.Column("name", sa.String(length=250), nullable=False),
        sa.Column("owner", sa.String(length=250), nullable=False),
        sa.Column("acquired_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("expires_at", sa.DateTime(timezone=True), nullable=False),
        sa.PrimaryKeyConstraint("name", name=op.f("pk_lease")),
    )
    op.create_table(
        "pipeline",
        sa.Column("pipeline_id", sa.String(length=250), nullable=False),
        sa.Column("fileloc", sa.Text(), nullable=False),
        sa.Column("schedule", JSON, nullable=False),
        sa.Column("schedule_text", sa.Text(), nullable=False),
        sa.Column("paused", sa.Boolean(), nullable=False),
        sa.Column("is_active", sa.Boolean(), nullable=False),
        sa.Column("partitioned", sa.Boolean(), nullable=False),
        sa.Column("max_active_runs", sa.Integer(), nullable=False),
        sa.Column("run_policy", sa.String(length=16), nullable=False),
        sa.Column("max_events_per_run", sa.Integer(), nullable=True),
        sa.Column("retries", sa.Integer(), nullable=False),
        sa.Column("next_cron_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "run_policy IN ('coalesce', 'per_event')", name=op.f("ck_pipeline_run_policy")
        ),
        sa.PrimaryKeyConstraint("pipeline_id", name=op.f("pk_pipeline")),
    )
    op.create_table(
        "trigger",
        sa.Column("id", sa.Integer(), nullable=False),
        sa.Column("classpath", sa.String(length=1500), nullable=False),
        sa.Column("kwargs", JSON, nullable=False),
        sa.Column("key", sa.String(length=64), nullable=False),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("last_poll_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_error", sa.Text(), nullable=True),
        sa.Column("restart_count", sa.Integer(), nullable=False),
        sa.Column("lag", sa.BigInteger(), nullable=True),
        sa.Column("instance_id", sa.String(length=250), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "state IN ('starting', 'running', 'backoff', 'failed', 'stopped')",
            name=op.f("ck_trigger_state"),
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_trigger")),
        sa.UniqueConstraint("key", name=op.f("uq_trigger_key")),
    )
    op.create_table(
        "asset_alias_asset",
        sa.Column("alias_id", sa.Integer(), nullable=False),
        sa.Column("asset_id", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["alias_id"],
            ["asset_alias.id"],
            name=op.f("fk_asset_alias_asset_alias_id_asset_alias"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["asset_id"],
            ["asset.id"],
            name=op.f("fk_asset_alias_asset_asset_id_asset"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("alias_id", "asset_id", name=op.f("pk_asset_alias_asset")),
    )
    op.create_index("ix_asset_alias_asset_asset_id", "asset_alias_asset", ["asset_id"])

    op.create_table(
        "asset_watcher",
        sa.Column("asset_id", sa.Integer(), nullable=False),
        sa.Column("name", sa.String(length=1500), nullable=False),
        sa.Column("trigger_id", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["asset_id"],
            ["asset.id"],
            name=op.f("fk_asset_watcher_asset_id_asset"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["trigger_id"],
            ["trigger.id"],
            name=op.f("fk_asset_watcher_trigger_id_trigger"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("asset_id", "name", name=op.f("pk_asset_watcher")),
    )
    op.create_index("ix_asset_watcher_trigger_id", "asset_watcher", ["trigger_id"])

    op.create_table(
        "pipeline_alias_ref",
        sa.Column("pipeline_id", sa.String(length=250), nullable=False),
        sa.Column("alias_id", sa.Integer(), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.CheckConstraint(
            "role IN ('schedule', 'outlet', 'inlet')", name=op.f("ck_pipeline_alias_ref_role")
        ),
        sa.ForeignKeyConstraint(
            ["alias_id"],
            ["asset_alias.id"],
            name=op.f("fk_pipeline_alias_ref_alias_id_asset_alias"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["pipeline_id"],
            ["pipeline.pipeline_id"],
            name=op.f("fk_pipeline_alias_ref_pipeline_id_pipeline"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "pipeline_id", "alias_id", "role", name=op.f("pk_pipeline_alias_ref")
        ),
    )
    op.create_index(
        "ix_pipeline_alias_ref_alias_id_role", "pipeline_alias_ref", ["alias_id", "role"]
    )

    op.create_table(
        "pipeline_asset_ref",
        sa.Column("pipeline_id", sa.String(length=250), nullable=False),
        sa.Column("asset_id", sa.Integer(), nullable=False),
        sa.Column("role", sa.String(length=16), nullable=False),
        sa.CheckConstraint(
            "role IN ('schedule', 'outlet', 'inlet')", name=op.f("ck_pipeline_asset_ref_role")
        ),
        sa.ForeignKeyConstraint(
            ["asset_id"],
            ["asset.id"],
            name=op.f("fk_pipeline_asset_ref_asset_id_asset"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["pipeline_id"],
            ["pipeline.pipeline_id"],
            name=op.f("fk_pipeline_asset_ref_pipeline_id_pipeline"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint(
            "pipeline_id", "asset_id", "role", name=op.f("pk_pipeline_asset_ref")
        ),
    )
    op.create_index(
        "ix_pipeline_asset_ref_asset_id_role", "pipeline_asset_ref", ["asset_id", "role"]
    )

    op.create_table(
        "run",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("run_id", sa.String(length=250), nullable=False),
        sa.Column("pipeline_id", sa.String(length=250), nullable=False),
        sa.Column("run_type", sa.String(length=16), nullable=False),
        sa.Column("logical_date", sa.DateTime(timezone=True), nullable=True),
        sa.Column("partition_key", sa.String(length=250), nullable=True),
        sa.Column("state", sa.String(length=16), nullable=False),
        sa.Column("try_number", sa.Integer(), nullable=False),
        sa.Column("max_tries", sa.Integer(), nullable=False),
        sa.Column("params", JSON, nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.Column("start_date", sa.DateTime(timezone=True), nullable=True),
        sa.Column("end_date", sa.DateTime(timezone=True), nullable=True),
        sa.Column("next_try_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("heartbeat_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("owner", sa.String(length=250), nullable=True),
        sa.Column("log_path", sa.Text(), nullable=True),
        sa.Column("error", sa.Text(), nullable=True),
        sa.CheckConstraint(
            "run_type IN ('asset', 'manual', 'cron', 'rest')", name=op.f("ck_run_run_type")
        ),
        sa.CheckConstraint(
            "state IN ('queued', 'running', 'success', 'failed', 'up_for_retry')",
            name=op.f("ck_run_state"),
        ),
        sa.ForeignKeyConstraint(
            ["pipeline_id"],
            ["pipeline.pipeline_id"],
            name=op.f("fk_run_pipeline_id_pipeline"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_run")),
        sa.UniqueConstraint("id", "pipeline_id", name=op.f("uq_run_id_pipeline_id")),
        sa.UniqueConstraint("run_id", name=op.f("uq_run_run_id")),
    )
    op.create_index("ix_run_pipeline_id_state", "run", ["pipeline_id", "state"])
    op.create_index("ix_run_state", "run", ["state"])

    op.create_table(
        "asset_event",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("asset_id", sa.Integer(), nullable=False),
        sa.Column("extra", JSON, nullable=False),
        sa.Column("source", sa.String(length=16), nullable=False),
        sa.Column("source_trigger_id", sa.Integer(), nullable=True),
        sa.Column("source_run_pk", BIG_ID, nullable=True),
        sa.Column("dedup_key", sa.String(length=1500), nullable=True),
        sa.Column("partition_key", sa.String(length=250), nullable=True),
        sa.Column("timestamp", sa.DateTime(timezone=True), nullable=False),
        sa.CheckConstraint(
            "source IN ('trigger', 'rest_api', 'run', 'cli', 'manual')",
            name=op.f("ck_asset_event_source"),
        ),
        sa.ForeignKeyConstraint(
            ["asset_id"],
            ["asset.id"],
            name=op.f("fk_asset_event_asset_id_asset"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["source_run_pk"],
            ["run.id"],
            name=op.f("fk_asset_event_source_run_pk_run"),
            ondelete="SET NULL",
        ),
        sa.ForeignKeyConstraint(
            ["source_trigger_id"],
            ["trigger.id"],
            name=op.f("fk_asset_event_source_trigger_id_trigger"),
            ondelete="SET NULL",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_asset_event")),
        sa.UniqueConstraint(
            "asset_id", "dedup_key", name=op.f("uq_asset_event_asset_id_dedup_key")
        ),
    )
    op.create_index("ix_asset_event_asset_id_id", "asset_event", ["asset_id", "id"])
    op.create_index("ix_asset_event_source_run_pk", "asset_event", ["source_run_pk"])
    op.create_index("ix_asset_event_source_trigger_id", "asset_event", ["source_trigger_id"])

    op.create_table(
        "asset_event_alias",
        sa.Column("event_id", BIG_ID, nullable=False),
        sa.Column("alias_id", sa.Integer(), nullable=False),
        sa.ForeignKeyConstraint(
            ["alias_id"],
            ["asset_alias.id"],
            name=op.f("fk_asset_event_alias_alias_id_asset_alias"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["event_id"],
            ["asset_event.id"],
            name=op.f("fk_asset_event_alias_event_id_asset_event"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("event_id", "alias_id", name=op.f("pk_asset_event_alias")),
    )
    op.create_index("ix_asset_event_alias_alias_id", "asset_event_alias", ["alias_id"])

    op.create_table(
        "queued_event",
        sa.Column("id", BIG_ID, autoincrement=True, nullable=False),
        sa.Column("pipeline_id", sa.String(length=250), nullable=False),
        sa.Column("asset_id", sa.Integer(), nullable=False),
        sa.Column("event_id", BIG_ID, nullable=False),
        sa.Column("partition_key", sa.String(length=250), nullable=True),
        sa.Column("created_at", sa.DateTime(timezone=True), nullable=False),
        sa.ForeignKeyConstraint(
            ["asset_id"],
            ["asset.id"],
            name=op.f("fk_queued_event_asset_id_asset"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["event_id"],
            ["asset_event.id"],
            name=op.f("fk_queued_event_event_id_asset_event"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["pipeline_id"],
            ["pipeline.pipeline_id"],
            name=op.f("fk_queued_event_pipeline_id_pipeline"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("id", name=op.f("pk_queued_event")),
        sa.UniqueConstraint(
            "pipeline_id", "event_id", name=op.f("uq_queued_event_pipeline_id_event_id")
        ),
    )
    op.create_index("ix_queued_event_asset_id", "queued_event", ["asset_id"])
    op.create_index("ix_queued_event_event_id", "queued_event", ["event_id"])
    op.create_index("ix_queued_event_pipeline_id_id", "queued_event", ["pipeline_id", "id"])
    op.create_index(
        "ix_queued_event_pipeline_id_asset_id_id",
        "queued_event",
        ["pipeline_id", "asset_id", "id"],
    )

    op.create_table(
        "run_event",
        sa.Column("run_pk", BIG_ID, nullable=False),
        sa.Column("event_id", BIG_ID, nullable=False),
        sa.Column("pipeline_id", sa.String(length=250), nullable=False),
        sa.ForeignKeyConstraint(
            ["event_id"],
            ["asset_event.id"],
            name=op.f("fk_run_event_event_id_asset_event"),
            ondelete="CASCADE",
        ),
        sa.ForeignKeyConstraint(
            ["run_pk", "pipeline_id"],
            ["run.id", "run.pipeline_id"],
            name=op.f("fk_run_event_run_pk_pipeline_id_run"),
            ondelete="CASCADE",
        ),
        sa.PrimaryKeyConstraint("run_pk", "event_id", name=op.f("pk_run_event")),
        sa.UniqueConstraint(
            "pipeline_id", "event_id", name=op.f("uq_run_event_pipeline_id_event_id")
        ),
    )
    op.create_index("ix_run_event_event_id", "run_event", ["event_id"])


def downgrade() -> None:
    """Revert this revision."""
    op.drop_table("run_event")
    op.drop_table("queued_event")
    op.drop_table("asset_event_alias")
    op.drop_table("asset_event")
    op.drop_table("run")
    op.drop_table("pipeline_asset_ref")
    op.drop_table("pipeline_alias_ref")
    op.drop_table("asset_watcher")
    op.drop_table("asset_alias_asset")
    op.drop_table("trigger")
    op.drop_table("pipeline")
    op.drop_table("lease")
    op.drop_table("instance")
    op.drop_table("asset_alias")
    op.drop_table("asset")
