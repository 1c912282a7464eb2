"""The readers of one RabbitMQ queue's consumer, and which of them has read which message.

Every message the consumer receives is handed to each of its readers (one per
:class:`~watchers.rabbitmq.RabbitMqTrigger`), and acked once every reader is done with it (its
events acked, or filtered, or dead-lettered). A message a reader could not process is nacked
back to the queue, up to ``max_deliveries`` deliveries (the broker counts those of a quorum
queue; those of a classic queue are counted here, in memory); then its event goes to the
dead-letter table, or with ``broker_dead_letters`` the message is rejected to the queue's
dead-letter exchange. A stream queue keeps its messages in place: one a reader fails on goes to
the dead-letter table at once.

A message that a watcher of the daemon has not read (not running at the moment, restarted
before acking it, or failed because its schema registry does not answer) is held, unacked,
until that watcher reads it, or until the daemon no longer runs it. The broker holds at most
``prefetch`` unacked messages for the consumer, which bounds what the readers hold: while a
watcher is away, the others stop once ``prefetch`` messages wait for it.

A message delivered on a channel that is gone is not settled: the broker put it back in the
queue, and delivers it again on the next channel.
"""

from __future__ import annotations

import asyncio
import dataclasses
import hashlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable, Coroutine, Iterator, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

from triggerer.triggers import TriggerEvent
from watchers import cloudevents, shared_readers
from watchers.rabbitmq.address import dedup_key, stream_offset_of
from watchers.shared_readers import ReaderFailure, decoded_for

if TYPE_CHECKING:
    from aio_pika.abc import AbstractIncomingMessage
    from structlog.typing import FilteringBoundLogger

    from watchers.processing import Prepared
    from watchers.rabbitmq.address import RabbitQueue
    from watchers.shared_readers import Decode

#: Failure counts kept for queues whose broker does not count deliveries (classic queues).
MAX_COUNTED = 10_000


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class ReaderSpec:
    """What a consumer needs of one reader (a RabbitMqTrigger)."""

    queue: RabbitQueue
    connection: str | None
    #: Tells the reader from the other readers of the queue; an instance with the same key
    #: takes the place of one the daemon gave up on.
    key: str
    #: The payload of a message as the reader's filter sees it (before ``apply_function``).
    payload: Callable[[AbstractIncomingMessage], Any]
    #: The reader's step decoding a message's body into that payload's ``body``
    #: (``value_format``) and finding the CloudEvent it is.
    decode: Decode
    #: The reader's step from that payload to the event's payload and partition key (``None``:
    #: filtered out). It may raise: the message is then redelivered, dead-lettered at last.
    prepare: Callable[[Any], Prepared]
    #: Where its place in a stream queue is stored (:func:`~watchers.rabbitmq.address.
    #: checkpoint_key`).
    checkpoint_key: str
    prefetch: int
    max_deliveries: int
    broker_dead_letters: bool
    stream_offset: str | int | None

    @property
    def consumer_key(self) -> tuple[Any, ...]:
        return (self.queue, self.connection)


class HasReaderSpec(Protocol):
    def reader_spec(self) -> ReaderSpec: ...


@dataclasses.dataclass(eq=False)
class ReaderStats(shared_readers.ReaderStats):
    """What a consumer did for one reader: counters for the daemon's ``/watchers``. ``lag`` is
    the queue's ready messages: read at connect and every ``LAG_INTERVAL_S``, less the messages
    delivered since; ``last_poll_at`` when the broker last answered (a delivery or a read of the
    backlog)."""

    acked: int = 0
    reconnects: int = 0
    #: Whether the queue is a stream queue (known once one of its messages came).
    stream: bool = False


class Reader:
    """One trigger's place in a queue's consumer: the events handed to it."""

    def __init__(
        self,
        spec: ReaderSpec,
        stats: ReaderStats,
        *,
        leave: Callable[[Reader], Awaitable[None]],
    ) -> None:
        self.spec = spec
        self.stats = stats
        self.key = spec.key
        self.events: asyncio.Queue[TriggerEvent | ReaderFailure] = asyncio.Queue()
        #: The entries of its events not yet acked, by ack token.
        self.unacked: dict[object, _Entry] = {}
        #: Stopped (:meth:`fail`): its next events raise, and it is handed no more messages.
        self.failed = False
        self._leave = leave

    async def next_event(self) -> TriggerEvent:
        item = await self.events.get()
        if isinstance(item, ReaderFailure):
            raise item.error
        return item

    def fail(self, error: BaseException) -> None:
        """The consumer, or this reader alone, stopped on ``error``: :meth:`next_event` raises
        it."""
        self.failed = True
        self.events.put_nowait(ReaderFailure(error))

    async def leave(self) -> None:
        """Stop reading: messages of its events not yet acked go back to the queue; the last
        reader to leave closes the consumer."""
        await self._leave(self)


@dataclasses.dataclass(eq=False)
class _Entry(shared_readers.Held):
    """One delivered message and what its readers still hold of it. One to redeliver (a reader
    failed on it) is nacked back to the queue."""

    message: AbstractIncomingMessage
    generation: int
    #: Its deliveries, this one included (:meth:`Readers._deliveries`).
    deliveries: int
    #: The readers it was handed to (and not taken back from).
    handed: set[str] = dataclasses.field(default_factory=set)
    #: To the broker's dead-letter exchange: nack without requeue.
    reject: bool = False


class Readers(Mapping[str, Reader]):
    """The readers of one queue's consumer by key, the messages handed to them, and those held
    for the readers the daemon runs but that are not reading."""

    def __init__(
        self,
        spec: ReaderSpec,
        *,
        expected: Callable[[], Mapping[str, ReaderSpec]],
        log: FilteringBoundLogger,
    ) -> None:
        self._spec = spec
        self._queue = spec.queue
        self._expected = expected
        self._log = log
        self._readers: dict[str, Reader] = {}
        #: Counts the channels the consumer opened: a message is settled on its own channel only.
        self._generation = 0
        self._channel_open = False
        self._failures: OrderedDict[str, int] = OrderedDict()
        #: Messages every present reader is done with, held for expected readers not running.
        self._held: dict[int, _Entry] = {}
        #: By reader key: the last offset of a stream queue it stored (it skips up to it).
        self._floors: Mapping[str, int] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        #: Messages are handed out one at a time (each delivery is a task of its own): one
        #: waiting for its schema keeps its place before the messages that came after it.
        self._handing = asyncio.Lock()

    def __getitem__(self, key: str) -> Reader:
        return self._readers[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._readers)

    def __len__(self) -> int:
        return len(self._readers)

    def add(self, reader: Reader) -> None:
        """Hand ``reader`` the messages from now on, and those held for it while it was away.
        It takes the place of an instance with its key (one the daemon gave up on)."""
        old = self._readers.get(reader.key)
        if old is not None:
            self.drop(old)
        self._readers[reader.key] = reader
        for entry in list(self._held.values()):  # what it missed while away
            self._settle_soon(entry)

    def drop(self, reader: Reader) -> None:
        """Stop handing ``reader`` messages: those of its events not yet acked are held for it
        (the daemon still runs its watcher) or done with (it does not)."""
        del self._readers[reader.key]
        unacked, reader.unacked = reader.unacked, {}
        for entry in unacked.values():
            entry.event_done()
            entry.handed.discard(reader.key)
            self._settle_soon(entry)
        if reader.failed:  # what was held for it alone is done with, unless the daemon runs it
            self.expected_changed()

    def forget(self, reader: Reader) -> None:
        """Stop handing ``reader`` messages, leaving those it holds unsettled: the consumer
        closes, and the broker takes back every message not acked."""
        del self._readers[reader.key]

    def expected_changed(self) -> None:
        """The daemon runs other watchers now: a held message may be done with."""
        for entry in list(self._held.values()):
            self._settle_soon(entry)

    def channel_opened(self, floors: Mapping[str, int]) -> None:
        """The consumer consumes on a new channel: the messages of the former one are the
        broker's again (it delivers them anew), and a stream's readers skip up to ``floors``."""
        self._generation += 1
        self._channel_open = True
        self._held.clear()  # their channel is gone: the broker delivers them again
        self._floors = floors

    def channel_closed(self) -> None:
        """The consumer's channel is gone: the messages delivered on it are settled no more."""
        self._channel_open = False

    async def deliver(self, message: AbstractIncomingMessage) -> None:
        """Hand ``message`` to every reader, and settle it if they are all done with it."""
        entry = _Entry(message, self._generation, self._deliveries(message))
        async with self._handing:
            for reader in list(self._readers.values()):
                await self._hand(reader, entry)
        entry.dispatching = False
        await self._settle(entry)

    async def _hand(self, reader: Reader, entry: _Entry) -> None:
        if reader.failed:
            return  # it stopped: the message is held for its next instance, or goes back
        entry.handed.add(reader.key)
        stats = reader.stats
        stats.received += 1
        stats.last_poll_at = datetime.now(UTC)
        if stats.lag:
            stats.lag -= 1
        message = entry.message
        offset = stream_offset_of(message)
        if offset is not None:
            stats.stream = True
            if offset <= self._floors.get(reader.key, -1):
                return  # its event is stored already: read again only to resume there
        payload = reader.spec.payload(message)
        headers = message.headers
        decoding = reader.spec.decode(
            payload,
            message.body,
            cloudevents.AMQP,
            headers.items() if headers else (),
            message.content_type,
        )
        decoded = await decoded_for(reader, decoding, payload, self._log)
        if decoded is None:
            entry.handed.discard(reader.key)  # held for its next instance, or goes back
            return
        # Unreadable: a dead letter at once, since it stays unreadable.
        payload, cloudevent, dead_letter = decoded
        try:
            prepared = (payload, None) if dead_letter else reader.spec.prepare(payload)
        # A user's apply_function may raise anything: a bad message must not stop the watcher;
        # it is redelivered, then dead-lettered with the reason.
        except Exception as error:  # noqa: BLE001
            stats.failed += 1
            dead_letter = self._failed(entry, entry.deliveries, error)
            if dead_letter is None:
                return
            prepared = payload, None
        if prepared is None:
            stats.filtered += 1
            return
        token = object()

        async def ack() -> None:
            if reader.unacked.pop(token, None) is None:
                return  # acked already, or its reader left and the message went back
            stats.acked += 1
            entry.event_done()
            await self._settle(entry)

        event_payload, partition_key = prepared
        timestamp = message.timestamp
        event = TriggerEvent.of_decoded_json(
            event_payload,
            dedup_key=dedup_key(self._queue, message),
            ack=ack,
            partition_key=partition_key,
            sent_at=None if timestamp is None else timestamp.timestamp(),
            dead_letter=dead_letter,
            checkpoint=None if offset is None else (reader.spec.checkpoint_key, str(offset)),
        )
        event = cloudevents.with_cloudevent(event, cloudevent)
        if dead_letter is None:
            stats.events += 1
        else:
            stats.dead_lettered += 1
        entry.event_handed_out()
        reader.unacked[token] = entry
        reader.events.put_nowait(event)

    def _deliveries(self, message: AbstractIncomingMessage) -> int:
        """How many times the message has been delivered, this time included: the broker's
        count (quorum queues), else the failures this consumer counted (classic queues)."""
        count = (message.headers or {}).get("x-delivery-count")
        if isinstance(count, int):
            return count + 1
        if not message.redelivered:
            return 1
        return self._failures.get(_identity(message), 0) + 1

    def _failed(self, entry: _Entry, deliveries: int, error: Exception) -> str | None:
        """Send the message back to the queue, or give up on it: the dead-letter reason when it
        goes to the dead-letter table."""
        message = entry.message
        if stream_offset_of(message) is not None:  # a stream keeps its messages in place
            return f"{type(error).__name__}: {error} (a stream queue's message is not redelivered)"
        reason = (
            f"{type(error).__name__}: {error} (delivered {deliveries} time(s), "
            f"max_deliveries={self._spec.max_deliveries})"
        )
        if deliveries < self._spec.max_deliveries:
            self._count_failure(message, deliveries)
            entry.redeliver = True
            self._log.info("rabbitmq_message_failed", deliveries=deliveries, error=reason)
            return None
        self._failures.pop(_identity(message), None)
        if self._spec.broker_dead_letters:
            entry.reject = True
            self._log.warning("rabbitmq_message_rejected", error=reason)
            return None
        return reason

    def _count_failure(self, message: AbstractIncomingMessage, deliveries: int) -> None:
        if "x-delivery-count" in (message.headers or {}):
            return  # the broker counts
        self._failures[_identity(message)] = deliveries
        while len(self._failures) > MAX_COUNTED:
            self._failures.popitem(last=False)

    def _settle_soon(self, entry: _Entry) -> None:
        if entry.settleable:
            self._spawn(self._settle(entry))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` as a task of its own, referenced until it is done (the event loop keeps
        only a weak reference to a task)."""
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _hand_on(self, entry: _Entry) -> None:
        """Hand ``entry`` to the readers that came after it, then settle it: once they are
        done with it too, or at once if they filtered it out or failed on it."""
        try:
            async with self._handing:
                for reader in list(self._readers.values()):
                    if reader.key not in entry.handed:
                        await self._hand(reader, entry)
        finally:
            entry.dispatching = False
        await self._settle(entry)

    async def _settle(self, entry: _Entry) -> None:
        """Once every reader is done with the message: ack it, or nack it back to the queue (or
        to the dead-letter exchange); while a watcher the daemon runs has not read it, hold it
        (a reader that came back is handed it now)."""
        if not entry.settleable:
            return
        current = entry.generation == self._generation and self._channel_open
        if current and not (entry.redeliver or entry.reject):
            if any(
                key not in entry.handed and not reader.failed
                for key, reader in self._readers.items()
            ):
                # Handed on in a task of its own: decoding it may wait for its schema, and an
                # ack (the daemon's, after a commit) must not wait with it.
                entry.dispatching = True  # settled by no other task meanwhile
                self._spawn(self._hand_on(entry))
                return
            stopped = {key for key, reader in self._readers.items() if reader.failed}
            missing = (self._expected().keys() | stopped) - entry.handed
            if missing:
                if not self._held:
                    self._log.info(
                        "rabbitmq_holding_for_watchers",
                        missing=len(missing),
                        why="watchers of the queue are not running: messages wait for them",
                    )
                self._held[id(entry)] = entry
                return
        self._held.pop(id(entry), None)
        entry.settled = True
        if not current:
            return  # its channel is gone: the broker put it back in the queue
        message = entry.message
        try:
            if entry.reject:
                await message.nack(requeue=False)
            elif entry.redeliver and stream_offset_of(message) is None:
                await message.nack(requeue=True)
            else:
                await message.ack()
        # The channel closed meanwhile: the broker puts the message back; its dedup key absorbs
        # the events stored already.
        except Exception as error:  # noqa: BLE001
            self._log.warning("rabbitmq_ack_lost", error=repr(error))


def _identity(message: AbstractIncomingMessage) -> str:
    """What tells a message from others across its deliveries: its id, else its body."""
    if message.message_id:
        return f"id:{message.message_id}"
    return "sha256:" + hashlib.sha256(message.body).hexdigest()
