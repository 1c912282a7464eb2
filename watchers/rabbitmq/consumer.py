"""The consumer of one RabbitMQ queue: its connection, reconnected after a loss, and its readers.

Every :class:`~watchers.rabbitmq.RabbitMqTrigger` reading a queue is a reader of the queue's
consumer (in the daemon, one consumer per queue, :class:`Consumers`; on its own, a trigger has
one of its own). A queue splits its messages between consumers, so watchers of one queue share
the consumer to each see every message; which reader has read which message, and when a message
is acked, nacked or held for a watcher away, is :mod:`watchers.rabbitmq.readers`. Connecting
and declaring the queue is :mod:`watchers.rabbitmq.client`.

A stream queue keeps its messages: each event of one carries its offset as a checkpoint
(:attr:`~triggerer.triggers.TriggerEvent.checkpoint`), stored with the event, and a consumer
(re)connecting starts from the readers' stored offsets (:func:`~watchers.rabbitmq.address.
stream_start`), or, while none is stored and they read new messages, from when the earliest of
them first started (:mod:`watchers.first_start`): a stream declared after its watchers were
deployed, or written to while no daemon ran, loses no message.

A lost connection (a broker restart, a closed connection, a cancelled consumer) is reconnected
with backoff; the broker puts the messages it had not been acked back in the queue, and their
dedup keys absorb the events stored already. A queue that does not exist, credentials the broker
refuses and options it rejects are the readers' error.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Callable, Iterable, Iterator, Mapping
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import structlog

from triggerer import checkpoints
from triggerer.backoff import Backoff
from watchers.clients import require
from watchers.rabbitmq.address import StreamStart, checkpoint_prefix, stream_start
from watchers.rabbitmq.client import connect, declared
from watchers.rabbitmq.readers import HasReaderSpec, Reader, Readers, ReaderSpec, ReaderStats
from watchers.shared_readers import Sharing, all_joined, warn_options_ignored

if TYPE_CHECKING:
    from aio_pika.abc import AbstractChannel, AbstractConnection, AbstractIncomingMessage

log = structlog.get_logger(__name__)

BACKOFF_MAX_S = 30.0
#: How often the queue's backlog (the watcher's lag) is read by a passive declare.
LAG_INTERVAL_S = 10.0
CLOSE_TIMEOUT_S = 5.0
#: How long a new consumer waits for the other watchers of its queue before consuming.
JOIN_WAIT_S = 5.0
#: How long a stream queue's consumer resumed at a stored offset waits for the message there:
#: none means the stream is shorter than that offset (it was deleted and declared again).
RESUME_CHECK_S = 5.0
#: The ``stream_offset`` values that read only what is published from now on.
NEW_MESSAGES = (None, "next")
#: The consumer options: those of the first reader of a queue, whatever later readers say.
CONSUMER_OPTIONS = ("prefetch", "max_deliveries", "broker_dead_letters", "stream_offset")

_SHARING: Sharing[Consumers] = Sharing("rabbitmq_consumers")
#: Within ``sharing(consumers)``, RabbitMqTriggers of one queue share one consumer of
#: ``consumers``.
sharing = _SHARING.sharing
current = _SHARING.current


class _StreamShorter(Exception):
    """The stream queue has no message at the stored offset it was resumed from."""


class _NotAStream(Exception):
    """The queue refused a stream offset: it is not a stream queue."""


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

    async def join(
        self, spec: ReaderSpec, stats: ReaderStats, *, first_started_ms: int | None = None
    ) -> Reader:
        """Read the queue of ``spec`` through its consumer (started by its first reader);
        ``first_started_ms``, when the reader first started, is where a stream queue is read
        from while no reader of it has an offset stored."""
        key = spec.consumer_key
        consumer = self._consumers.get(key)
        if consumer is None or consumer.closed:
            consumer = self._consumers[key] = _Consumer(
                spec, expected=lambda: self._expected.get(key, {})
            )
            reader = consumer.join(spec, stats, first_started_ms)
            consumer.start()
            return reader
        return consumer.join(spec, stats, first_started_ms)


class _Consumer:
    """The connection and consumer of one queue, handing each message to its readers."""

    def __init__(
        self, spec: ReaderSpec, *, expected: Callable[[], Mapping[str, ReaderSpec]]
    ) -> None:
        self._spec = spec
        self._queue = spec.queue
        self._expected = expected
        self._log = log.bind(queue=spec.queue.name, vhost=spec.queue.vhost)
        self._readers = Readers(spec, expected=expected, log=self._log)
        self._joined = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        #: The next stream consumer starts from ``first`` (the stream was declared again).
        self._from_first = False
        #: When each reader first started, by reader key.
        self._first_started_ms: dict[str, int] = {}
        #: The queue refused a stream offset: it is consumed without one from now on.
        self._not_a_stream = False
        self._delivered = asyncio.Event()
        self.closed = False

    def join(self, spec: ReaderSpec, stats: ReaderStats, first_started_ms: int | None) -> Reader:
        if first_started_ms is not None:
            self._first_started_ms[spec.key] = first_started_ms
        warn_options_ignored(
            self._log,
            "rabbitmq_consumer_options_ignored",
            CONSUMER_OPTIONS,
            spec,
            self._spec,
            why="watchers of one queue share its consumer, set up by the first of them",
        )
        reader = Reader(spec, stats, leave=self.leave)
        self._readers.add(reader)
        self._joined.set()
        return reader

    def expected_changed(self) -> None:
        """The daemon runs other watchers now: a held message may be done with."""
        self._readers.expected_changed()

    def start(self) -> None:
        self._task = asyncio.create_task(self._run(), name=f"rabbitmq-{self._queue.name}")
        self._task.add_done_callback(self._on_done)

    async def leave(self, reader: Reader) -> None:
        if self._readers.get(reader.key) is not reader:
            return
        if len(self._readers) == 1:
            self._readers.forget(reader)
            await self.close()  # the broker puts back every message not acked
            return
        self._readers.drop(reader)

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
                reader.fail(error)

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
        await all_joined(
            self._joined,
            lambda: self._expected().keys() - self._readers.keys(),
            wait_s=JOIN_WAIT_S,
        )
        backoff = Backoff(max_s=BACKOFF_MAX_S)
        while True:
            try:
                await self._consume(backoff)
            except _NotAStream:
                self._not_a_stream = True  # consumed again at once, without an offset
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
            self._readers.channel_opened(start.floors)
            self._delivered.clear()
            offset = start.offset
            try:
                await queue.consume(
                    self._on_message,
                    arguments=None if offset is None else {"x-stream-offset": offset},
                )
            except aiormq.exceptions.ChannelPreconditionFailed as error:
                if start.since_first_start:
                    raise _NotAStream from None
                raise ValueError(
                    f"RabbitMQ refuses to consume queue {self._queue.name!r} "
                    f"(stream_offset={offset!r} is only for stream queues): {error}"
                ) from None
            self._log.info(
                "rabbitmq_consuming",
                host=self._queue.host,
                port=self._queue.port,
                prefetch=self._spec.prefetch,
                stream_offset=offset.isoformat() if isinstance(offset, datetime) else offset,
                after_failures=backoff.attempt,
            )
            backoff.attempt = 0
            await self._watch(connection, channel, cancelled, resumed=start.resumed)
            raise _StreamShorter(offset)  # _watch returns only then
        finally:
            self._readers.channel_closed()
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
        (a stream queue), else the first reader's ``stream_offset``; for new messages only
        (``next``, the default), from when the earliest reader present first started."""
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
        start = stream_start(self._spec.stream_offset, positions)
        started = [
            self._first_started_ms[key] for key in self._readers if key in self._first_started_ms
        ]
        if start.floors or start.offset not in NEW_MESSAGES or not started or self._not_a_stream:
            return start
        # A stream queue declared after its watchers started, or written to while no daemon
        # consumed it, is read from their first start (RabbitMQ takes it in whole seconds).
        since = datetime.fromtimestamp(min(started) / 1000, UTC)
        return StreamStart(since, {}, resumed=False, since_first_start=True)

    def _set_lag(self, lag: int) -> None:
        now = datetime.now(UTC)
        for stats in self._each_stats():
            stats.lag = lag
            stats.last_poll_at = now

    async def _on_message(self, message: AbstractIncomingMessage) -> None:
        self._delivered.set()
        await self._readers.deliver(message)
