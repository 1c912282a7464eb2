"""Backpressure from the runs to the broker: a watcher stops fetching while every pipeline it
feeds has its backlog full, so a burst stays in the broker instead of the store.

A pipeline's backlog is its queued events plus the events held by its runs that have not
started; its limit is ``max_backlog`` (the pipeline's, else ``[runs] max_backlog``, else none).
A watcher's *room* is the most room among the pipelines scheduled on its assets (a pipeline
without a limit, or no pipeline at all, leaves it unbounded). The supervisor takes one unit of
room per event before passing it on, and waits, holding the trigger's stream, when none is left.
The room is recounted from the store after each ingest commit and each change of the runs (and
every second), less the events passed on and not yet committed, so the stored backlog stays
within the limit.

Pipelines scheduled on an alias do not hold a watcher back: which of the alias's assets a
watcher feeds is known only once a run adds one.
"""

from __future__ import annotations

import math
from collections import Counter, defaultdict
from typing import TYPE_CHECKING, Protocol

import anyio
import structlog
from sqlalchemy import func, select

from triggerer.service.store import models
from triggerer.service.store.outages import keep_running
from triggerer.service.store.states import RunState

if TYPE_CHECKING:
    from collections.abc import Iterable

    from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

    from triggerer.service.scheduling.registry import Registry

log = structlog.get_logger(__name__)

RECOUNT_INTERVAL_S = 1.0
"""How often the backlogs are counted again without a wake (runs started by other daemons)."""


class WatcherStatus(Protocol):
    """What backpressure writes of a watcher's state (the supervisor's status of it)."""

    held_by: str | None


class Backpressure:
    """Which watchers may pass events on, and how many, by the backlogs of what they feed."""

    def __init__(
        self, sessions: async_sessionmaker[AsyncSession], default_limit: int | None
    ) -> None:
        self._sessions = sessions
        self._default_limit = default_limit
        #: The supervisor's state of each watcher that took room: a watcher held back says by
        #: which pipeline (``/watchers``, ``watchers list``, the UI, a metric).
        self._statuses: dict[int, WatcherStatus] = {}
        #: Per trigger id: the limited pipelines it feeds; absent: unbounded.
        self._feeds: dict[int, dict[str, int]] = {}
        self._room: dict[int, float] = {}
        self._pending: Counter[int] = Counter()
        self._opened: dict[int, anyio.Event] = {}
        self._woken = anyio.Event()

    def follow(self, registry: Registry) -> None:
        """Take the definitions of ``registry``: which limited pipelines each watcher feeds."""
        limits = {
            pipeline_id: limit
            for pipeline_id, pipeline in registry.pipelines.items()
            if (limit := pipeline.max_backlog or self._default_limit) is not None
        }
        consumers: dict[int, set[str]] = defaultdict(set)
        unbounded: set[int] = set()
        for pipeline_id, pipeline in registry.pipelines.items():
            if pipeline.condition is None:
                continue
            for asset in pipeline.condition.iter_assets():
                asset_id = registry.asset_ids.get(asset)
                if asset_id is None:
                    continue
                if pipeline_id in limits:
                    consumers[asset_id].add(pipeline_id)
                else:
                    unbounded.add(asset_id)
        feeds: dict[int, dict[str, int]] = {}
        for trigger_id, watched in registry.triggers.items():
            if any(asset_id in unbounded for asset_id in watched.asset_ids):
                continue
            fed = {p for asset_id in watched.asset_ids for p in consumers.get(asset_id, ())}
            if fed:
                feeds[trigger_id] = {pipeline_id: limits[pipeline_id] for pipeline_id in fed}
        self._feeds = feeds
        for trigger_id in list(self._room):
            if trigger_id not in feeds:
                self._open(trigger_id, math.inf)
        self.wake()

    def wake(self) -> None:
        """Count the backlogs again soon: events were stored, a run was created or started."""
        self._woken.set()

    async def take(self, trigger_id: int, status: WatcherStatus) -> None:
        """One unit of the watcher's room, waiting (its stream held) while it has none."""
        self._statuses[trigger_id] = status
        while self._room.get(trigger_id, math.inf) < 1:
            opened = self._opened.setdefault(trigger_id, anyio.Event())
            await opened.wait()
        self._room[trigger_id] = self._room.get(trigger_id, math.inf) - 1
        self._pending[trigger_id] += 1

    def committed(self, trigger_ids: Iterable[int]) -> None:
        """The events of these triggers (one id per event) are stored: counted from the store."""
        done = Counter(trigger_ids)
        for trigger_id, count in done.items():
            if trigger_id in self._pending:
                self._pending[trigger_id] = max(0, self._pending[trigger_id] - count)
        if done.keys() & self._feeds.keys():
            self.wake()

    async def run(self) -> None:
        """Count the backlogs whenever woken (and every second), until cancelled."""
        while True:
            self._woken = anyio.Event()
            if self._feeds:
                await keep_running(self._recount, during="backpressure_count")
            with anyio.move_on_after(RECOUNT_INTERVAL_S):
                await self._woken.wait()

    async def _recount(self) -> None:
        feeds = self._feeds
        limited = {pipeline_id for fed in feeds.values() for pipeline_id in fed}
        # Events passed on before the count: a batch committed while the count reads is in
        # the count or still pending here, never in neither.
        pending = self._pending.copy()
        async with self._sessions() as session:
            backlog = await _backlogs(session, limited)
        for trigger_id, fed in feeds.items():
            rooms = {p: limit - backlog.get(p, 0) for p, limit in fed.items()}
            roomiest = max(rooms, key=lambda p: rooms[p])
            room = rooms[roomiest] - max(pending[trigger_id], self._pending[trigger_id])
            status = self._statuses.get(trigger_id)
            if room < 1 and status is not None and status.held_by is None:
                status.held_by = roomiest
                log.info(
                    "watcher_held_back",
                    trigger_id=trigger_id,
                    pipeline_id=roomiest,
                    backlog=backlog.get(roomiest, 0),
                    max_backlog=fed[roomiest],
                )
            self._open(trigger_id, room)

    def _open(self, trigger_id: int, room: float) -> None:
        self._room[trigger_id] = room
        if room < 1:
            return
        status = self._statuses.get(trigger_id)
        if status is not None and status.held_by is not None:
            status.held_by = None
            log.info("watcher_resumed", trigger_id=trigger_id)
        opened = self._opened.pop(trigger_id, None)
        if opened is not None:
            opened.set()


async def _backlogs(session: AsyncSession, pipeline_ids: set[str]) -> dict[str, int]:
    """Each pipeline's queued events plus the events held by its runs not yet started."""
    queue, run, held = models.QueuedEvent, models.Run, models.RunEvent
    counts: Counter[str] = Counter()
    for pipeline_id, count in await session.execute(
        select(queue.pipeline_id, func.count())
        .where(queue.pipeline_id.in_(pipeline_ids))
        .group_by(queue.pipeline_id)
    ):
        counts[pipeline_id] += count
    for pipeline_id, count in await session.execute(
        select(run.pipeline_id, func.count())
        .join(held, held.run_pk == run.id)
        .where(run.pipeline_id.in_(pipeline_ids), run.state == RunState.QUEUED)
        .group_by(run.pipeline_id)
    ):
        counts[pipeline_id] += count
    return dict(counts)
