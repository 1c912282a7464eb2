"""Redis triggers are stored under their package's classpath: ``watchers.redis.*``.

The Redis triggers moved into ``watchers/redis/`` (issue 30), and the two modules kept only so
that stored classpaths (``watchers.redis_streams.RedisStreamTrigger``,
``watchers.redis_pubsub.RedisPubSubTrigger``) still imported are gone. Each stored Redis trigger
takes the new classpath and the key that goes with it (SHA-256 of the canonical JSON of
``[classpath, kwargs]``, as ``store.keys.trigger_key`` makes it), keeping its id: its events,
watchers, state and history stay with it. Checkpoints and dedup keys name the source, not the
trigger, and do not change. A row whose new key is already taken (a newer daemon made it) is
left as it is; the daemon no longer points any watcher at it.

Revision ID: 0017
Revises: 0016
Create Date: 2026-11-28
"""

from __future__ import annotations

import hashlib
import json
from typing import Any

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = "0017"
down_revision: str | None = "0016"
branch_labels: str | tuple[str, ...] | None = None
depends_on: str | tuple[str, ...] | None = None

MOVED = {
    "watchers.redis_streams.RedisStreamTrigger": "watchers.redis.RedisStreamTrigger",
    "watchers.redis_pubsub.RedisPubSubTrigger": "watchers.redis.RedisPubSubTrigger",
}
"""Each classpath stored before this revision, to the one stored after."""

_TRIGGER = sa.table(
    "trigger",
    sa.column("id"),
    sa.column("classpath"),
    sa.column("kwargs", sa.JSON().with_variant(postgresql.JSONB(), "postgresql")),
    sa.column("key"),
)


def _key(classpath: str, kwargs: dict[str, Any]) -> str:
    canonical = json.dumps(
        [classpath, kwargs], sort_keys=True, separators=(",", ":"), ensure_ascii=False
    )
    return hashlib.sha256(canonical.encode()).hexdigest()


def _rename(classpaths: dict[str, str]) -> None:
    bind = op.get_bind()
    taken = set(bind.scalars(sa.select(_TRIGGER.c.key)))
    rows = bind.execute(
        sa.select(_TRIGGER.c.id, _TRIGGER.c.classpath, _TRIGGER.c.kwargs).where(
            _TRIGGER.c.classpath.in_(classpaths)
        )
    ).all()
    for row in rows:
        classpath = classpaths[row.classpath]
        key = _key(classpath, row.kwargs)
        if key in taken:
            continue
        bind.execute(
            sa.update(_TRIGGER).where(_TRIGGER.c.id == row.id).values(classpath=classpath, key=key)
        )
        taken.add(key)


def upgrade() -> None:
    """Apply this revision."""
    _rename(MOVED)


def downgrade() -> None:
    """Revert this revision: the older build imports the classpaths it wrote."""
    _rename({new: old for old, new in MOVED.items()})
