"""Kafka events' dedup keys gain the record's timestamp: ``<topic>/<partition>/<offset>@<ms>``.

A topic deleted and created again starts its offsets at 0, and the old keys made its new
messages look like redeliveries: acked and dropped. The key now carries the record's
timestamp. Stored keys are rewritten from the payload the event holds (the ``timestamp`` of a
KafkaTrigger payload), so a message stored before the upgrade but not yet committed to Kafka,
delivered again after it, is still recognised. An event whose payload an ``apply_function``
replaced keeps its old key: it cannot be rewritten, and only such a message in flight across
an upgrade after a crash may be stored twice (a graceful stop commits every stored message).

The downgrade leaves the keys as they are: they stay unique, and the older build writes its
own form again.

Revision ID: 0004
Revises: 0003
Create Date: 2026-11-26
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision: str = "0004"
down_revision: str | None = "0003"
branch_labels: str | tuple[str, ...] | None = None
depends_on: str | tuple[str, ...] | None = None

KAFKA_TRIGGER = "watchers.kafka.KafkaTrigger"

_POSTGRESQL = """
UPDATE asset_event AS e
SET dedup_key = e.dedup_key || '@' || (e.extra #>> '{payload,timestamp}')
FROM "trigger" AS t
WHERE t.id = e.source_trigger_id
  AND t.classpath = :classpath
  AND jsonb_typeof(e.extra #> '{payload,timestamp}') = 'number'
  AND e.dedup_key = (e.extra #>> '{payload,topic}') || '/'
      || (e.extra #>> '{payload,partition}') || '/' || (e.extra #>> '{payload,offset}')
"""

_SQLITE = """
UPDATE asset_event
SET dedup_key = dedup_key || '@' || json_extract(extra, '$.payload.timestamp')
WHERE source_trigger_id IN (SELECT id FROM "trigger" WHERE classpath = :classpath)
  AND json_type(extra, '$.payload.timestamp') = 'integer'
  AND dedup_key = json_extract(extra, '$.payload.topic')
      || '/' || json_extract(extra, '$.payload.partition')
      || '/' || json_extract(extra, '$.payload.offset')
"""


def upgrade() -> None:
    """Apply this revision."""
    statement = _POSTGRESQL if op.get_bind().dialect.name == "postgresql" else _SQLITE
    op.execute(sa.text(statement).bindparams(classpath=KAFKA_TRIGGER))


def downgrade() -> None:
    """Revert this revision: nothing to undo (see the module's docstring)."""
