"""Ingest: trigger events become committed asset events, and only then are they acked."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Awaitable, Callable
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar

import anyio
import structlog
from anyio.streams.memory import MemoryObjectReceiveStream
from sqlalchemy.exc import DBAPIError
from sqlalchemy.ext.asyncio import AsyncSession, async_sessionmaker

from triggerer.cloudevents import same_event
from triggerer.service import metrics
from triggerer.service.daemon.part_leases import lost_fences
from triggerer.service.dead_letters import (
    Unstorable,
    record_dead_letters,
    rejection_reason,
    unstorable,
)
from triggerer.service.events import NewEvent, Recorded, record_events, stored_extras
from triggerer.service.scheduling.registry import WatchedTrigger
from triggerer.service.store.outages import until_stored
from triggerer.service.store.source_checkpoints import furthest, record_checkpoints
from triggerer.service.store.states import EventSource
from triggerer.service.store.types import utcnow
from triggerer.service.trace_context import TraceContext, carried, of_cloudevent
from triggerer.service.tracing import now_ns
from triggerer.triggers import TriggerEvent

if TYPE_CHECKING:
    from triggerer.part_leases import Fence
    from triggerer.service.tracing import Tracing

log = structlog.get_logger(__name__)

Delivery = tuple[WatchedTrigger, TriggerEvent]

_Also = Callable[[AsyncSession], Awaitable[None]]
"""More to write in a batch's transaction (its checkpoints)."""
_Item = TypeVar("_Item")
_Written = TypeVar("_Written")


class Ingest:
    """Batches deliveries: one transaction per batch, then the acks, then the scheduler wakes.

    Up to ``commits_in_flight`` batches are committed at once, so the next batch is prepared
    while the database writes the last one. A batch is formed only once a commit slot is free:
    what arrives meanwhile waits in the stream and joins it, so batches stay full under load.
    Batches may commit out of order; acks need no order (Kafka commits contiguous offsets).

    A database error keeps the batch and retries it with backoff: nothing is acked until its
    events are committed, so a crash at any point loses nothing, and the dedup key turns a
    redelivery into an ack without a second event (one that is not the stored message, by its
    trigger's ``same_message``, is logged: its source reused a key). An event the store cannot
    hold (a key too long, a NUL character, a value the database refuses) is not retried: it is
    found before writing or, when the database refuses a batch, by splitting the batch, and is
    kept in the dead-letter table with the reason; its message is acked with the others. So is
    an event its trigger gave up on (``TriggerEvent.dead_letter``).

    The checkpoints the batch's events carry (``TriggerEvent.checkpoint``: a Kinesis shard's
    sequence number) are stored in its last transaction, with its events (or with its dead
    letters, when it has some), so a watcher that starts again reads on after exactly what is
    stored. Batches that carry one key commit in the order they were formed: a later batch
    committed first could store a position past events that a crash then loses. For the same
    reason, once a batch fails (an error that is not the store's: a bug), the batches after it
    store no position of its keys, though they store their events. A checkpoint that carries
    nothing else (``TriggerEvent.checkpoint_only``) only moves its position.

    An event read from a part of a source that several daemons share (a Kinesis shard, under
    a part lease: ``TriggerEvent.fence``) is stored only while this daemon (``owner``) still
    holds that lease as it did when it took the part, checked in each transaction that stores
    it (:func:`triggerer.service.daemon.part_leases.lost_fences`): when the part was taken over
    or given up meanwhile, the batch is written again without the events of that part, nor
    their positions, and the part's new holder reads them again from its stored position.

    Each event keeps the trace context its message carried
    (:func:`triggerer.service.trace_context.carried`), else the one of the CloudEvent it is
    (:func:`~triggerer.service.trace_context.of_cloudevent`); with ``tracing``, each batch
    acked is a span linked to those contexts.
    """

    def __init__(
        self,
        sessions: async_sessionmaker[AsyncSession],
        on_recorded: Callable[[Recorded], None],
        *,
        batch_size: int,
        commits_in_flight: int = 1,
        on_stored: Callable[[list[int]], None] = lambda trigger_ids: None,
        owner: str = "",
        tracing: Tracing | None = None,
    ) -> None:
        self._sessions = sessions
        self._owner = owner
        self._tracing = tracing
        self._on_recorded = on_recorded
        #: Told the trigger id of each delivery once its batch is stored (backpressure).
        self._on_stored = on_stored
        self._batch_size = batch_size
        self._commit_slots = anyio.Semaphore(commits_in_flight)
        # By checkpoint key, the commit of the last batch formed that carries it.
        self._committed: dict[str, _Commit] = {}
        # Totals since start, read by the benchmarks and tests (metrics count them too).
        self.events_recorded = 0
        self.duplicates = 0
        self.dead_letters = 0

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
                keys = {event.checkpoint[0] for _, event in batch if event.checkpoint}
                earlier = {key: self._committed[key] for key in keys if key in self._committed}
                commit = _Commit(frozenset(keys))
                self._committed.update(dict.fromkeys(keys, commit))
                commits.start_soon(self._commit_and_ack, batch, earlier, commit)

    async def _commit_and_ack(
        self, batch: list[Delivery], earlier: dict[str, _Commit], commit: _Commit
    ) -> None:
        # Once events are taken off the stream, finish them even during shutdown.
        started_ns = now_ns() if self._tracing is not None else 0
        with anyio.CancelScope(shield=True):
            try:
                for before in set(earlier.values()):  # the batches before it of its keys
                    await before.done.wait()
                commit.unstored = {
                    key for key, before in earlier.items() if before.unstored_of(key)
                }
                if commit.unstored:
                    log.error("checkpoints_withheld", keys=sorted(commit.unstored))
                stored, traced = await self._commit_fenced(batch, withheld=commit.unstored)
                commit.succeeded = True
                self._on_stored(
                    [w.trigger_id for w, event in batch if not event.is_checkpoint_only]
                )
            finally:
                commit.done.set()
                for key, last in list(self._committed.items()):
                    # A key left unstored stays, so that every later batch withholds it too.
                    if last is commit and not commit.unstored_of(key):
                        del self._committed[key]
            try:
                await _ack(stored)
                if self._tracing is not None and traced is not None:
                    self._trace(stored, traced, started_ns)
            finally:
                self._commit_slots.release()

    def _trace(self, batch: list[Delivery], contexts: list[TraceContext], started_ns: int) -> None:
        """The span of ``batch``, committed and acked, linked to the ``contexts`` its messages
        carried."""
        assert self._tracing is not None  # noqa: S101 - called only when tracing
        messages = [(watched, event) for watched, event in batch if not event.is_checkpoint_only]
        if messages:  # checkpoints alone are no batch of messages
            triggers = {watched.trigger_id: watched.trigger for watched, _ in messages}
            self._tracing.batch_ingested(triggers, len(messages), contexts, started_ns)

    async def _commit_fenced(
        self, batch: list[Delivery], *, withheld: set[str]
    ) -> tuple[list[Delivery], list[TraceContext] | None]:
        """Store ``batch`` but the events of the parts whose lease was lost; what was stored,
        and the trace contexts its messages carried (when tracing)."""
        while True:
            try:
                traced = await self._commit(batch, withheld=withheld)
            except _Fenced as fenced:
                batch = [delivery for delivery in batch if delivery[1].fence not in fenced.lost]
                log.warning(
                    "events_fenced",
                    leases=sorted(name for name, _ in fenced.lost),
                    remaining=len(batch),
                )
            else:
                return batch, traced

    async def _commit(
        self, batch: list[Delivery], *, withheld: set[str]
    ) -> list[TraceContext] | None:
        """Store ``batch``: its events, dead letters and positions, but none of the positions
        of the keys ``withheld``; raise :class:`_Fenced` (having stored nothing, or only parts
        that a next try absorbs) when the lease of a part some of its events were read from is
        lost. Returns the trace contexts its messages carried, when tracing."""
        fences = frozenset(event.fence for _, event in batch if event.fence)
        started = anyio.current_time()
        storable: list[NewEvent] = []
        letters: list[Unstorable] = []
        traced: list[TraceContext] | None = [] if self._tracing is not None else None
        for watched, event in batch:
            if event.is_checkpoint_only:
                continue
            extra = _extra(event)
            trace = carried(event.payload)
            if trace is None and event.cloudevent is not None:
                trace = of_cloudevent(extra)
            if trace is not None and traced is not None:
                traced.append(trace)
            for asset_id in watched.asset_ids:
                new_event = NewEvent(
                    asset_id=asset_id,
                    extra=extra,
                    source=EventSource.TRIGGER,
                    dedup_key=event.dedup_key,
                    partition_key=event.partition_key,
                    source_trigger_id=watched.trigger_id,
                    traceparent=trace.traceparent if trace is not None else None,
                    tracestate=trace.tracestate if trace is not None else None,
                )
                reason = event.dead_letter or unstorable(new_event)
                if reason is None:
                    storable.append(new_event)
                else:
                    letters.append(Unstorable(new_event, reason))
        positions = furthest(
            event.checkpoint
            for _, event in batch
            if event.checkpoint and event.checkpoint[0] not in withheld
        )
        # The positions go in the batch's last transaction: with its events, unless it has
        # dead letters; when it had to be split, on their own after every part.
        pending: _Also | None = (
            functools.partial(record_checkpoints, positions=positions) if positions else None
        )
        written, rejected, whole = await self._write_bisecting(
            _record, storable, also=None if letters else pending, fences=fences
        )
        if whole:
            pending = None
        letters += [Unstorable(event, reason) for event, reason in rejected]
        if letters and await self._dead_letter(letters, also=pending, fences=fences):
            pending = None
        if pending is not None:
            await self._record_positions(pending, positions, fences)
        metrics.committed(
            [event.sent_at for _, event in batch if not event.is_checkpoint_only],
            anyio.current_time() - started,
        )
        for part, stored in written:
            self.events_recorded += len(part.events)
            self.duplicates += part.duplicates
            if stored:
                _log_reused_keys(
                    part, stored, {watched.trigger_id: watched for watched, _ in batch}
                )
            self._on_recorded(part)
        return traced

    async def _record_positions(
        self, write: _Also, positions: dict[str, str], fences: frozenset[Fence]
    ) -> None:
        async def record(session: AsyncSession, _: list[None]) -> None:
            await write(session)

        try:
            await self._write(record, [], fences=fences)
        except DBAPIError as error:  # checked when made, so not expected: the source rereads
            log.error("checkpoints_rejected", positions=positions, error=rejection_reason(error))

    async def _dead_letter(
        self, letters: list[Unstorable], *, also: _Also | None, fences: frozenset[Fence]
    ) -> bool:
        """Store ``letters`` (with ``also`` in their transaction when they fit in one: then
        True)."""
        for letter in letters:
            log.warning(
                "event_dead_lettered",
                trigger_id=letter.event.source_trigger_id,
                asset_id=letter.event.asset_id,
                dedup_key=letter.event.dedup_key,
                reason=letter.reason,
            )
        inserted, lost, whole = await self._write_bisecting(
            record_dead_letters, letters, also=also, fences=fences
        )
        self.dead_letters += sum(inserted)
        metrics.DEAD_LETTERS.inc(sum(inserted))
        for letter, error in lost:
            # Every value of a dead letter is made storable, so only a row deleted meanwhile
            # (its asset or trigger) gets here. Holding the message would stop its watcher for
            # good: it is logged in full instead, and acked.
            log.error(
                "dead_letter_rejected",
                trigger_id=letter.event.source_trigger_id,
                asset_id=letter.event.asset_id,
                dedup_key=letter.event.dedup_key,
                reason=letter.reason,
                error=error,
                extra=letter.event.extra,
            )
        return whole

    async def _write_bisecting(
        self,
        write: Callable[[AsyncSession, list[_Item]], Awaitable[_Written]],
        items: list[_Item],
        *,
        also: _Also | None = None,
        fences: frozenset[Fence] = frozenset(),
    ) -> tuple[list[_Written], list[tuple[_Item, str]], bool]:
        """Write ``items`` in one transaction; when the store rejects their data, write each
        half on its own, down to the single items it rejects.

        Returns what each committed transaction's ``write`` returned, the items rejected with
        the database's reason, and whether ``also`` was written: it joins the transaction of
        all ``items`` at once, not those of its parts. A batch with one bad item among n costs
        about 2 log2(n) transactions more than a good one.
        """
        written: list[_Written] = []
        rejected: list[tuple[_Item, str]] = []
        parts = [items] if items else []
        whole = False
        while parts:
            part = parts.pop()
            try:
                written.append(
                    await self._write(
                        write, part, also=also if part is items else None, fences=fences
                    )
                )
                whole = whole or (also is not None and part is items)
            except DBAPIError as error:  # a rejection: _write retries the other errors
                if len(part) == 1:
                    rejected.append((part[0], rejection_reason(error)))
                else:
                    middle = len(part) // 2
                    parts += [part[middle:], part[:middle]]
        return written, rejected, whole

    async def _write(
        self,
        write: Callable[[AsyncSession, list[_Item]], Awaitable[_Written]],
        items: list[_Item],
        *,
        also: _Also | None = None,
        fences: frozenset[Fence] = frozenset(),
    ) -> _Written:
        """Commit ``write(session, items)`` (then ``also(session)``, in the same transaction),
        retrying with backoff until the store answers; its rejection of the data is raised (the
        caller splits the batch), as is :class:`_Fenced` when a lease of ``fences`` is lost."""

        async def once() -> _Written:
            async with self._sessions.begin() as session:
                if fences and (lost := await lost_fences(session, fences, self._owner)):
                    raise _Fenced(lost)
                result = await write(session, items)
                if also is not None:
                    await also(session)
                return result

        return await until_stored(once, during="ingest")


class _Fenced(Exception):
    """The leases ``lost`` of parts some events of a batch were read from are no longer held."""

    def __init__(self, lost: set[Fence]) -> None:
        super().__init__(sorted(lost))
        self.lost = lost


@dataclasses.dataclass(eq=False)
class _Commit:
    """A batch's commit, as the later batches that carry its checkpoint keys wait for it."""

    keys: frozenset[str]
    done: anyio.Event = dataclasses.field(default_factory=anyio.Event)
    succeeded: bool = False
    #: Its keys whose positions it withheld, a batch before it having failed.
    unstored: set[str] = dataclasses.field(default_factory=set)

    def unstored_of(self, key: str) -> bool:
        """Whether events of ``key`` up to this batch may be missing from the store (this batch
        failed, or one before it did): no later batch may store a position of it."""
        return key in self.keys and (not self.succeeded or key in self.unstored)


Stored = dict[tuple[int, str], tuple[dict[str, Any], datetime]]


async def _record(session: AsyncSession, events: list[NewEvent]) -> tuple[Recorded, Stored]:
    """Record ``events``; with the stored events that the duplicates among them met."""
    recorded = await record_events(session, events)
    return recorded, await stored_extras(session, recorded.absorbed)


def _log_reused_keys(
    recorded: Recorded, stored: Stored, watched: dict[int, WatchedTrigger]
) -> None:
    """Warn of each absorbed event that is not the stored message delivered again, but another
    message under the same key: a source recreated with its sequence numbers restarted, or a
    trigger whose key does not tell its messages apart. Dedup has dropped it all the same."""
    received_at = utcnow()
    for event in recorded.absorbed:
        met = stored.get((event.asset_id, event.dedup_key or ""))
        trigger = watched.get(event.source_trigger_id or 0)
        if met is None or trigger is None:
            continue  # not a trigger's event, or the stored one was deleted meanwhile
        stored_extra, stored_at = met
        if "cloudevent" in event.extra:  # keyed by its source and id, whichever way it came
            same = same_event(stored_extra.get("cloudevent"), event.extra["cloudevent"])
        else:
            try:
                same = trigger.trigger.same_message(
                    stored_extra.get("payload"), event.extra["payload"]
                )
            # A custom trigger's comparison may raise anything; it only decides this warning.
            except Exception as error:  # noqa: BLE001
                log.warning("same_message_failed", trigger_id=trigger.trigger_id, error=repr(error))
                continue
        if same:
            continue
        log.warning(
            "duplicate_key_other_message",
            watchers=list(trigger.watchers),
            trigger_id=trigger.trigger_id,
            dedup_key=event.dedup_key,
            stored_at=stored_at.isoformat(),
            received_at=received_at.isoformat(),
        )


def _extra(event: TriggerEvent) -> dict[str, Any]:
    """The extra of a trigger's event: its payload, and the CloudEvent its message is."""
    extra: dict[str, Any] = {"from_trigger": True, "payload": event.payload}
    if event.cloudevent is not None:
        extra["cloudevent"] = event.cloudevent.extra
    return extra


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
