"""Ingest: trigger events become committed asset events, and only then are they acked."""

from __future__ import annotations

from collections.abc import Callable

import anyio
import structlog
from anyio.streams.memory import MemoryObjectReceiveStream
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from triggerer.daemon.backoff import backoff_s
from triggerer.daemon.registry import WatchedTrigger
from triggerer.events import NewEvent, record_events
from triggerer.store.models import EventSource
from triggerer.triggers import TriggerEvent

log = structlog.get_logger(__name__)

Delivery = tuple[WatchedTrigger, TriggerEvent]
RETRY_BACKOFF_MAX_S = 10.0


class Ingest:
    """Batches deliveries: one transaction per batch, then the acks, then the scheduler wakes.

    Up to ``commits_in_flight`` batches are committed at once, so the next batch is prepared
    while the database writes the last one. A batch is formed only once a commit slot is free:
    what arrives meanwhile waits in the stream and joins it, so batches stay full under load.
    Batches may commit out of order; acks need no order (Kafka commits contiguous offsets).

    A database error keeps the batch and retries it with backoff: nothing is acked until its
    events are committed, so a crash at any point loses nothing, and the dedup key turns a
    redelivery into an ack without a second event.
    """

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        on_queued: Callable[[set[str]], None],
        *,
        batch_size: int,
        commits_in_flight: int = 1,
    ) -> None:
        self._sessions = sessions
        self._on_queued = on_queued
        self._batch_size = batch_size
        self._commit_slots = anyio.Semaphore(commits_in_flight)
        # Totals since start, read by the benchmarks (and later the metrics endpoint).
        self.events_recorded = 0
        self.duplicates = 0

    async def run(self, deliveries: MemoryObjectReceiveStream[Delivery]) -> None:
        """Consume ``deliveries`` until every sender has closed, draining what is left."""
        async with deliveries, anyio.create_task_group() as commits:
            while True:
                await self._commit_slots.acquire()
                try:
                    batch = [await deliveries.receive()]
                except anyio.EndOfStream:
                    return  # the task group waits for the commits in flight
                while len(batch) < self._batch_size:
                    try:
                        batch.append(deliveries.receive_nowait())
                    except (anyio.WouldBlock, anyio.EndOfStream):
                        break
                commits.start_soon(self._commit_and_ack, batch)

    async def _commit_and_ack(self, batch: list[Delivery]) -> None:
        # Once events are taken off the stream, finish them even during shutdown.
        with anyio.CancelScope(shield=True):
            try:
                await self._commit(batch)
                await _ack(batch)
            finally:
                self._commit_slots.release()

    async def _commit(self, batch: list[Delivery]) -> None:
        new_events = [
            NewEvent(
                asset_id=asset_id,
                extra={"from_trigger": True, "payload": event.payload},
                source=EventSource.TRIGGER,
                dedup_key=event.dedup_key,
                partition_key=event.partition_key,
                source_trigger_id=watched.trigger_id,
            )
            for watched, event in batch
            for asset_id in watched.asset_ids
        ]
        attempt = 0
        while True:
            try:
                async with self._sessions.begin() as session:
                    recorded = await record_events(session, new_events)
                break
            except DBAPIError as error:  # OperationalError (a lost connection) among them
                attempt += 1
                delay = backoff_s(attempt, RETRY_BACKOFF_MAX_S)
                log.warning("ingest_commit_failed", error=str(error), retry_in_s=round(delay, 2))
                await anyio.sleep(delay)
        self.events_recorded += len(recorded.events)
        self.duplicates += recorded.duplicates
        if recorded.queued_pipelines:
            self._on_queued(recorded.queued_pipelines)


async def _ack(batch: list[Delivery]) -> None:
    for watched, event in batch:
        if event.ack is None:
            continue
        try:
            await event.ack()
        # An ack is trigger code; one that fails leaves the message to be redelivered, which the
        # dedup key absorbs, so it is logged and ingest goes on.
        except Exception as error:  # noqa: BLE001
            log.warning("ack_failed", trigger_id=watched.trigger_id, error=repr(error))
