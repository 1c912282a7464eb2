"""The consumer of one RabbitMQ queue: its connection, and the readers it hands each message to.

Every :class:`~watchers.rabbitmq.RabbitMqTrigger` reading a queue is a reader of the queue's
consumer (in the daemon, one consumer per queue, :class:`Consumers`; on its own, a trigger has
one of its own). A queue splits its messages between consumers, so watchers of one queue share
the consumer to each see every message: a message is acked once every reader is done with it
(its events acked, or filtered, or dead-lettered), and nacked back to the queue when a reader
could not process it. One that a watcher of the daemon has not read (not running at the moment,
or restarted before acking it) is held, unacked, until that watcher reads it, or until the
daemon no longer runs it. The broker holds at most ``prefetch`` unacked messages for the
consumer, which bounds what the readers hold: while a watcher is away, the others stop once
``prefetch`` messages wait for it.

A stream queue keeps its messages: each event of one carries its offset as a checkpoint
(:attr:`~triggerer.triggers.TriggerEvent.checkpoint`), stored with the event, and a consumer
(re)connecting starts from the readers' stored offsets (:func:`~watchers.rabbitmq_address.
stream_start`).

A lost connection (a broker restart, a closed connection, a cancelled consumer) is reconnected
with backoff; the broker puts the messages it had not been acked back in the queue, and their
dedup keys absorb the events stored already. A queue that does not exist, credentials the broker
refuses and options it rejects are the readers' error.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import hashlib
import os
import socket
import ssl
from collections import OrderedDict
from collections.abc import Callable, Coroutine, Iterable, Iterator, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any, Protocol

import structlog

from triggerer import checkpoints
from triggerer.backoff import Backoff
from triggerer.connections import get_connection
from triggerer.triggers import TriggerEvent
from watchers.clients import require
from watchers.rabbitmq_address import (
    StreamStart,
    checkpoint_prefix,
    dedup_key,
    stream_offset_of,
    stream_start,
)

if TYPE_CHECKING:
    from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage

    from watchers.rabbitmq_address import RabbitQueue

log = structlog.get_logger(__name__)

#: Settings a named connection may hold.
CONNECTION_KEYS = frozenset(
    {"login", "password", "ssl", "ssl_cafile", "ssl_certfile", "ssl_keyfile"}
)
CONNECT_TIMEOUT_S = 10.0
BACKOFF_MAX_S = 30.0
#: How often the queue's backlog (the watcher's lag) is read by a passive declare.
LAG_INTERVAL_S = 10.0
CLOSE_TIMEOUT_S = 5.0
#: How long a new consumer waits for the other watchers of its queue before consuming.
JOIN_WAIT_S = 5.0
#: How long a stream queue's consumer resumed at a stored offset waits for the message there:
#: none means the stream is shorter than that offset (it was deleted and declared again).
RESUME_CHECK_S = 5.0
#: Failure counts kept for queues whose broker does not count deliveries (classic queues).
MAX_COUNTED = 10_000
#: The consumer options: those of the first reader of a queue, whatever later readers say.
CONSUMER_OPTIONS = ("prefetch", "max_deliveries", "broker_dead_letters", "stream_offset")

_CONSUMERS: contextvars.ContextVar[Consumers | None] = contextvars.ContextVar(
    "rabbitmq_consumers", default=None
)


class QueueMissing(LookupError):
    """The queue does not exist (the watcher does not create it)."""


class _StreamShorter(Exception):
    """The stream queue has no message at the stored offset it was resumed from."""


@contextlib.contextmanager
def sharing(consumers: Consumers) -> Iterator[None]:
    """Within this context (and the tasks started in it), RabbitMqTriggers of one queue share
    one consumer of ``consumers``."""
    token = _CONSUMERS.set(consumers)
    try:
        yield
    finally:
        _CONSUMERS.reset(token)


def current() -> Consumers | None:
    """The shared consumers in effect, ``None`` outside :func:`sharing`."""
    return _CONSUMERS.get()


async def connect(queue: RabbitQueue, connection: str | None) -> AbstractConnection:
    """A connection to the vhost of ``queue``, with the credentials of the named ``connection``
    (else guest/guest). Credentials or a vhost the broker refuses are a ``PermissionError``;
    a broker that cannot be reached a ``ConnectionError``."""
    aio_pika = require("aio_pika", "rabbitmq")
    aiormq = require("aiormq", "rabbitmq")
    settings = get_connection(connection) if connection is not None else {}
    unknown = set(settings) - CONNECTION_KEYS
    if unknown:
        raise ValueError(
            f"connection {connection!r} has settings RabbitMqTrigger does not know: "
            f"{', '.join(sorted(unknown))}; valid: {', '.join(sorted(CONNECTION_KEYS))}"
        )
    tls = queue.tls or bool(settings.get("ssl"))
    context = None
    if tls:
        context = ssl.create_default_context(cafile=settings.get("ssl_cafile"))
        if settings.get("ssl_certfile"):
            context.load_cert_chain(settings["ssl_certfile"], settings.get("ssl_keyfile"))
    where = f"RabbitMQ at {queue.host}:{queue.port} (vhost {queue.vhost!r})"
    try:
        opened: AbstractConnection = await aio_pika.connect(
            host=queue.host,
            port=queue.port,
            login=str(settings.get("login", "guest")),
            password=str(settings.get("password", "guest")),
            virtualhost=queue.vhost,
            ssl=tls,
            ssl_context=context,
            timeout=CONNECT_TIMEOUT_S,
            client_properties={
                "connection_name": f"triggerer {socket.gethostname()}:{os.getpid()}"
            },
        )
    except (
        aiormq.exceptions.ProbableAuthenticationError,
        aiormq.exceptions.ConnectionNotAllowed,
    ) as error:
        raise PermissionError(f"{where} refuses the connection: {error}") from None
    except aiormq.exceptions.InvalidFrameError:  # the broker closed the handshake at Open
        raise PermissionError(
            f"{where} refuses the connection: does vhost {queue.vhost!r} exist, and may the "
            "login use it?"
        ) from None
    except (OSError, TimeoutError, aiormq.exceptions.AMQPConnectionError) as error:
        raise ConnectionError(f"cannot connect to {where}: {error!r}") from error
    return opened


async def declared(channel: AbstractChannel, queue: RabbitQueue) -> int:
    """The number of ready messages of ``queue`` (a passive declare); :class:`QueueMissing`
    naming it when it does not exist."""
    aiormq = require("aiormq", "rabbitmq")
    try:
        found = await channel.get_queue(queue.name, ensure=True)
    except aiormq.exceptions.ChannelNotFoundEntity:
        raise QueueMissing(
            f"RabbitMQ queue {queue.name!r} does not exist in vhost {queue.vhost!r} at "
            f"{queue.host}:{queue.port}: declare it first (triggerer does not create queues)"
        ) from None
    count = found.declaration_result.message_count
    return int(count or 0)


#: A reader's payload and partition key of a message; ``None`` when the reader filters it out.
Prepared = tuple[Any, str | None] | None


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
    #: The reader's step from that payload to the event's payload and partition key (``None``:
    #: filtered out). It may raise: the message is then redelivered, dead-lettered at last.
    prepare: Callable[[Any], Prepared]
    #: Where its place in a stream queue is stored (:func:`~watchers.rabbitmq_address.
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


@dataclasses.dataclass
class ReaderStats:
    """What a consumer did for one reader: counters for the daemon's ``/watchers``."""

    received: int = 0
    events: int = 0
    filtered: int = 0
    failed: int = 0
    dead_lettered: int = 0
    acked: int = 0
    reconnects: int = 0
    lag: int | None = None
    last_poll_at: datetime | None = None
    #: Whether the queue is a stream queue (known once one of its messages came).
    stream: bool = False


class Consumers:
    """The daemon's queue consumers, one per queue (and connection), and the readers it expects
    on each."""

    def __init__(self) -> None:
        self._consumers: dict[tuple[Any, ...], _Consumer] = {}
        self._expected: dict[tuple[Any, ...], dict[str, ReaderSpec]] = {}

    def keep(self, readers: Iterable[HasReaderSpec]) -> None:
        """The readers (RabbitMqTriggers) the daemon runs now: messages are held for those not
        running at the moment, no longer for those gone."""
        expected: dict[tuple[Any, ...], dict[str, ReaderSpec]] = {}
        for reader in readers:
            spec = reader.reader_spec()
            expected.setdefault(spec.consumer_key, {})[spec.key] = spec
        self._expected = expected
        for consumer in self._consumers.values():
            if not consumer.closed:
                consumer.expected_changed()

    async def join(self, spec: ReaderSpec, stats: ReaderStats) -> Reader:
        """Read the queue of ``spec`` through its consumer (started by its first reader)."""
        key = spec.consumer_key
        consumer = self._consumers.get(key)
        if consumer is None or consumer.closed:
            consumer = self._consumers[key] = _Consumer(
                spec, expected=lambda: self._expected.get(key, {})
            )
            reader = consumer.join(spec, stats)
            consumer.start()
            return reader
        return consumer.join(spec, stats)


@dataclasses.dataclass(eq=False)
class _Failure:
    error: BaseException


class Reader:
    """One trigger's place in a queue's consumer: the events handed to it."""

    def __init__(self, consumer: _Consumer, spec: ReaderSpec, stats: ReaderStats) -> None:
        self.consumer = consumer
        self.spec = spec
        self.stats = stats
        self.key = spec.key
        self.events: asyncio.Queue[TriggerEvent | _Failure] = asyncio.Queue()
        #: The entries of its events not yet acked, by ack token.
        self.unacked: dict[object, _Entry] = {}

    async def next_event(self) -> TriggerEvent:
        item = await self.events.get()
        if isinstance(item, _Failure):
            raise item.error
        return item

    async def leave(self) -> None:
        """Stop reading: messages of its events not yet acked go back to the queue; the last
        reader to leave closes the consumer."""
        await self.consumer.leave(self)


@dataclasses.dataclass(eq=False)
class _Entry:
    """One delivered message and what its readers still hold of it."""

    message: AbstractIncomingMessage
    generation: int
    #: Its deliveries, this one included (:meth:`_Consumer._deliveries`).
    deliveries: int
    #: The readers it was handed to (and not taken back from).
    handed: set[str] = dataclasses.field(default_factory=set)
    owners: int = 0
    dispatching: bool = True
    #: Back to the queue (a reader failed on it or left it): nack with requeue.
    requeue: bool = False
    #: To the broker's dead-letter exchange: nack without requeue.
    reject: bool = False
    settled: bool = False


class _Consumer:
    """The connection and consumer of one queue, handing each message to its readers."""

    def __init__(
        self, spec: ReaderSpec, *, expected: Callable[[], Mapping[str, ReaderSpec]]
    ) -> None:
        self._spec = spec
        self._queue = spec.queue
        self._expected = expected
        self._readers: dict[str, Reader] = {}
        self._joined = asyncio.Event()
        self._log = log.bind(queue=spec.queue.name, vhost=spec.queue.vhost)
        self._generation = 0
        self._channel: AbstractChannel | None = None
        self._task: asyncio.Task[None] | None = None
        self._failures: OrderedDict[str, int] = OrderedDict()
        #: Messages every present reader is done with, held for expected readers not running.
        self._held: dict[int, _Entry] = {}
        #: By reader key: the last offset of a stream queue it stored (it skips up to it).
        self._floors: Mapping[str, int] = {}
        #: The next stream consumer starts from ``first`` (the stream was declared again).
        self._from_first = False
        self._delivered = asyncio.Event()
        self._tasks: set[asyncio.Task[None]] = set()
        self.closed = False

    def join(self, spec: ReaderSpec, stats: ReaderStats) -> Reader:
        differing = [n for n in CONSUMER_OPTIONS if getattr(spec, n) != getattr(self._spec, n)]
        if differing:
            self._log.warning(
                "rabbitmq_consumer_options_ignored",
                options=differing,
                why="watchers of one queue share its consumer, set up by the first of them",
            )
        old = self._readers.get(spec.key)
        if old is not None:  # an instance the daemon gave up on: the new one takes its place
            self._drop(old)
        reader = self._readers[spec.key] = Reader(self, spec, stats)
        self._joined.set()
        for entry in list(self._held.values()):  # what it missed while away
            self._settle_soon(entry)
        return reader

    def expected_changed(self) -> None:
        """The daemon runs other watchers now: a held message may be done with."""
        for entry in list(self._held.values()):
            self._settle_soon(entry)

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"rabbitmq-{self._queue.name}")
        self._task.add_done_callback(self._on_done)

    async def leave(self, reader: Reader) -> None:
        if self._readers.get(reader.key) is not reader:
            return
        if len(self._readers) == 1:
            del self._readers[reader.key]
            await self.close()  # the broker puts back every message not acked
            return
        self._drop(reader)

    def _drop(self, reader: Reader) -> None:
        """Stop handing ``reader`` messages: those of its events not yet acked are held for it
        (the daemon still runs its watcher) or done with (it does not)."""
        del self._readers[reader.key]
        unacked, reader.unacked = reader.unacked, {}
        for entry in unacked.values():
            entry.owners -= 1
            entry.handed.discard(reader.key)
            self._settle_soon(entry)

    async def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        task, self._task = self._task, None
        if task is not None:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task

    def _on_done(self, task: asyncio.Task[None]) -> None:
        self.closed = True
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            for reader in self._readers.values():
                reader.events.put_nowait(_Failure(error))

    def _each_stats(self) -> Iterator[ReaderStats]:
        return (reader.stats for reader in self._readers.values())

    # -- the connection, reconnected after a loss

    async def _run(self) -> None:
        aiormq = require("aiormq", "rabbitmq")
        lost = (
            ConnectionError,
            TimeoutError,
            aiormq.exceptions.AMQPConnectionError,
            aiormq.exceptions.ChannelInvalidStateError,
        )
        await self._all_joined()
        backoff = Backoff(max_s=BACKOFF_MAX_S)
        while True:
            try:
                await self._consume(backoff)
            except _StreamShorter as shorter:
                self._log.warning(
                    "rabbitmq_stream_declared_again",
                    stored_offset=str(shorter),
                    why="no message at the stored offset: the stream is read from its start",
                )
                self._from_first = True
            except lost as error:
                for stats in self._each_stats():
                    stats.reconnects += 1
                wait_s = backoff.next_s()
                self._log.warning(
                    "rabbitmq_connection_lost", error=repr(error), retry_in_s=round(wait_s, 2)
                )
                await asyncio.sleep(wait_s)

    async def _consume(self, backoff: Backoff) -> None:
        """Connect, consume until the connection or the consumer is lost (raising), then close."""
        aiormq = require("aiormq", "rabbitmq")
        start = await self._stream_start()
        connection = await connect(self._queue, self._spec.connection)
        try:
            channel = await connection.channel(publisher_confirms=False)
            await channel.set_qos(prefetch_count=self._spec.prefetch)
            self._set_lag(await declared(channel, self._queue))
            queue = await channel.get_queue(self._queue.name, ensure=False)
            cancelled = asyncio.Event()
            underlay = await channel.get_underlay_channel()
            underlay.on_consumer_cancel_callbacks.add(lambda _: cancelled.set())
            self._generation += 1
            self._channel = channel
            self._held.clear()  # their channel is gone: the broker delivers them again
            self._floors = start.floors
            self._delivered.clear()
            offset = start.offset
            try:
                await queue.consume(
                    self._on_message,
                    arguments=None if offset is None else {"x-stream-offset": offset},
                )
            except aiormq.exceptions.ChannelPreconditionFailed as error:
                raise ValueError(
                    f"RabbitMQ refuses to consume queue {self._queue.name!r} "
                    f"(stream_offset={offset!r} is only for stream queues): {error}"
                ) from None
            self._log.info(
                "rabbitmq_consuming",
                host=self._queue.host,
                port=self._queue.port,
                prefetch=self._spec.prefetch,
                stream_offset=offset,
                after_failures=backoff.attempt,
            )
            backoff.attempt = 0
            await self._watch(connection, channel, cancelled, resumed=start.resumed)
            raise _StreamShorter(offset)  # _watch returns only then
        finally:
            self._channel = None
            # Closing a connection that is lost already may raise anything of the client's.
            with contextlib.suppress(Exception):
                async with asyncio.timeout(CLOSE_TIMEOUT_S):
                    await connection.close()

    async def _watch(
        self,
        connection: AbstractConnection,
        channel: AbstractChannel,
        cancelled: asyncio.Event,
        *,
        resumed: bool,
    ) -> None:
        """Read the queue's backlog every ``LAG_INTERVAL_S`` until the connection closes or the
        broker cancels the consumer (its queue deleted): then raise ``ConnectionError``.
        Consuming a stream from a stored offset (``resumed``), return when nothing comes within
        ``RESUME_CHECK_S``: the stream is shorter than that offset."""
        closed = asyncio.ensure_future(connection.closed())
        stopped = asyncio.ensure_future(cancelled.wait())
        delivered = asyncio.ensure_future(self._delivered.wait())
        checking = resumed
        try:
            while True:
                waiting = {closed, stopped, delivered} if checking else {closed, stopped}
                timeout_s = RESUME_CHECK_S if checking else LAG_INTERVAL_S
                done, _ = await asyncio.wait(waiting, timeout=timeout_s)
                if stopped in done:
                    raise ConnectionError("the broker cancelled the consumer")
                if closed in done:
                    raise ConnectionError("the connection closed")
                if checking and delivered not in done:
                    return
                checking = False
                self._set_lag(await declared(channel, self._queue))
        finally:
            closed.cancel()
            stopped.cancel()
            delivered.cancel()

    async def _stream_start(self) -> StreamStart:
        """Where to consume from: after the stored offsets of the readers present and expected
        (a stream queue), else the first reader's ``stream_offset``."""
        if self._from_first:
            self._from_first = False
            return StreamStart("first", {}, resumed=False)
        specs = {**self._expected(), **{key: r.spec for key, r in self._readers.items()}}
        stored = await checkpoints.stored_positions(checkpoint_prefix(self._queue))
        positions = {
            key: None if position is None else int(position)
            for key, spec in specs.items()
            for position in [stored.get(spec.checkpoint_key)]
        }
        return stream_start(self._spec.stream_offset, positions)

    async def _all_joined(self) -> None:
        """Wait (a little) for the watchers expected on the queue, so none misses the first
        messages."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(JOIN_WAIT_S):
                while self._expected().keys() - self._readers.keys():
                    self._joined.clear()
                    await self._joined.wait()

    def _set_lag(self, lag: int) -> None:
        now = datetime.now(UTC)
        for stats in self._each_stats():
            stats.lag = lag
            stats.last_poll_at = now

    # -- messages

    async def _on_message(self, message: AbstractIncomingMessage) -> None:
        self._delivered.set()
        entry = _Entry(message, self._generation, self._deliveries(message))
        for reader in list(self._readers.values()):
            self._hand(reader, entry)
        entry.dispatching = False
        await self._settle(entry)

    def _hand(self, reader: Reader, entry: _Entry) -> None:
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
        dead_letter = None
        try:
            prepared = reader.spec.prepare(payload)
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
            entry.owners -= 1
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
        if dead_letter is None:
            stats.events += 1
        else:
            stats.dead_lettered += 1
        entry.owners += 1
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
            entry.requeue = True
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
        if entry.owners == 0 and not entry.dispatching and not entry.settled:
            self._spawn(self._settle(entry))

    def _spawn(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` as a task of its own, referenced until it is done (the event loop keeps
        only a weak reference to a task)."""
        task = asyncio.get_running_loop().create_task(work)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _settle(self, entry: _Entry) -> None:
        """Once every reader is done with the message: ack it, or nack it back to the queue (or
        to the dead-letter exchange); while a watcher the daemon runs has not read it, hold it
        (a reader that came back is handed it now)."""
        if entry.dispatching or entry.owners or entry.settled:
            return
        current = entry.generation == self._generation and self._channel is not None
        if current and not (entry.requeue or entry.reject):
            for reader in list(self._readers.values()):
                if reader.key not in entry.handed:
                    self._hand(reader, entry)
            if entry.owners:
                return  # handed on: settled once the new readers are done too
        # Checked again: a reader handed it just now may have failed on it (requeue).
        if current and not (entry.requeue or entry.reject):
            missing = self._expected().keys() - entry.handed
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
            elif entry.requeue and stream_offset_of(message) is None:
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
