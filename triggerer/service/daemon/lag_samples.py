"""Watcher lag over time: at a heartbeat, the lag of each trigger this instance runs is stored
(at most one sample a minute per trigger), and samples older than a day are deleted.

``GET /activity/watcherLag`` (:mod:`triggerer.service.reads.activity`) draws them; the heartbeat's
own write of the current lag (``trigger.lag``) is what ``/watchers`` shows.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Mapping
from typing import TYPE_CHECKING

from sqlalchemy import delete, insert, select

from triggerer.service.store import models
from triggerer.service.store.types import utcnow

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

    from triggerer.service.daemon.supervisor import WatcherStatus

SAMPLE_INTERVAL_S = 60.0
"""At most one sample per trigger this often: a day of 200 lagging watchers is 288,000 rows."""
KEPT_S = 86_400.0
"""How long a sample is kept: the longest window the charts draw."""


class LagSampler:
    """Writes the lag samples of one instance's triggers; called at each heartbeat."""

    def __init__(self, sessions: async_sessionmaker[AsyncSession]) -> None:
        self._sessions = sessions
        self._last_at: dt.datetime | None = None

    async def sample(self, statuses: Mapping[int, WatcherStatus]) -> int:
        """Store the lag of each trigger in ``statuses`` that reports one, unless the last
        sample was under :data:`SAMPLE_INTERVAL_S` ago; how many samples were stored."""
        now = utcnow()
        if self._last_at is not None and (now - self._last_at).total_seconds() < SAMPLE_INTERVAL_S:
            return 0
        self._last_at = now
        lags = {trigger_id: s.lag for trigger_id, s in statuses.items() if s.lag is not None}
        async with self._sessions.begin() as session:
            # A trigger deleted since (its watcher removed) has no row to refer to.
            stored = await session.scalars(
                select(models.Trigger.id).where(models.Trigger.id.in_(lags))
            )
            rows = [
                {"trigger_id": trigger_id, "sampled_at": now, "lag": lags[trigger_id]}
                for trigger_id in stored.all()
            ]
            if rows:
                await session.execute(insert(models.WatcherLagSample), rows)
            cutoff = now - dt.timedelta(seconds=KEPT_S)
            await session.execute(
                delete(models.WatcherLagSample).where(models.WatcherLagSample.sampled_at < cutoff)
            )
        return len(rows)
