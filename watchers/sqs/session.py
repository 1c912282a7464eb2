"""The poller of one SQS queue: its long polls, and the readers it hands each message to.

The session composes the rest, each with its own state and task: the client and its retries
(:mod:`watchers.sqs.client`), the held messages and their visibility
(:mod:`watchers.sqs.in_flight`), the batched deletes (:mod:`watchers.sqs.deletes`) and the dead
letters (:mod:`watchers.sqs.dead_letters`).

Every trigger reading the queue is a reader of its session and is handed each message; a message
is deleted once every reader is done with it (its events acked, or filtered, or dead-lettered).
One that a reader could not process, or that a watcher of the daemon missed (not running at the
moment), is not deleted: SQS delivers it again once its visibility timeout passes, and the
readers that stored its events already recognise it by its dedup key.

A reader is described by a :class:`ReaderSpec` (its queue, the poller options, and the step that
turns a message into its payload) and the session counts what it does for the reader in a
:class:`ReaderStats`: it never sees the trigger itself.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import structlog

from triggerer.cloudevents import MalformedCloudEvent
from triggerer.triggers import TriggerEvent
from watchers import cloudevents, shared_readers
from watchers.shared_readers import (
    BufferedReader,
    ExpectedReaders,
    ReadingTasks,
    Sharing,
    cancel_and_wait,
    warn_options_ignored,
)
from watchers.sqs.client import MAX_MESSAGES, QueueClient
from watchers.sqs.dead_letters import DeadLetters
from watchers.sqs.deletes import BatchedDeletes
from watchers.sqs.in_flight import InFlightMessages

if TYPE_CHECKING:
    from triggerer.cloudevents import CloudEvent
    from watchers.processing import Prepared
    from watchers.sqs.address import SqsQueue
    from watchers.sqs.in_flight import InFlight

log = structlog.get_logger(__name__)

#: How often the queue's backlog (the watcher's lag) is read: a call of its own, so not per poll.
LAG_INTERVAL_S = 30.0
CLEANUP_TIMEOUT_S = 10.0
#: The SqsTrigger options of the poller: those of the first reader of a queue (in the daemon,
#: the first watcher of the queue), whatever later readers say.
POLLER_OPTIONS = (
    "wait_time_s",
    "max_messages",
    "receivers",
    "visibility_timeout_s",
    "dead_letter_queue",
    "max_receives",
)
_SHARING: Sharing[Pollers] = Sharing("sqs_pollers")
#: Within ``sharing(pollers)``, SqsTriggers of one queue share one session of ``pollers``.
sharing = _SHARING.sharing
current = _SHARING.current


def _cloudevent(message: dict[str, Any]) -> CloudEvent | None:
    """The CloudEvent a received message's body is, if any: SQS has no binding, so structured
    mode alone."""
    return cloudevents.BODY.recognise(body=message.get("Body"))


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class ReaderSpec:
    """What a session needs of one reader (an SqsTrigger): the queue and how to poll it, and how
    the reader turns a message into an event."""

    queue: SqsQueue
    #: The named connection with the credentials (and maybe region and endpoint), if any.
    connection: str | None
    #: Tells the reader from the other readers of the queue; an instance with the same key
    #: takes the place of one the daemon gave up on.
    key: str
    #: The reader's step from a received message to its payload and partition key (``None``:
    #: filtered out). It may raise: the message is then retried, and dead-lettered at last.
    prepare: Callable[[dict[str, Any]], Prepared]
    #: The payload of a received message as it is, for its dead letter.
    payload: Callable[[dict[str, Any]], Any]
    #: One event per receive (its messages' payloads under ``message_batch``) per partition key.
    batch: bool
    # The poller options (POLLER_OPTIONS): the first reader's are the session's.
    wait_time_s: int
    max_messages: int
    receivers: int
    visibility_timeout_s: int | None
    dead_letter_queue: str | None
    max_receives: int

    @property
    def source_key(self) -> str:
        """The queue however it is spelled (URL, name, ``sqs://``), with the connection read by:
        readers with one queue key share a session."""
        queue = self.queue
        return json.dumps([queue.name, queue.region_name, queue.endpoint_url, self.connection])


@dataclasses.dataclass(eq=False)
class ReaderStats(shared_readers.ReaderStats):
    """What a session did for one reader, written by the session and read by its trigger;
    messages it shares with other readers count for each. ``lag`` is the queue's
    ApproximateNumberOfMessages: read when the session opens and every ``LAG_INTERVAL_S``, and 0
    when a long poll comes back empty."""

    deleted: int = 0


class Pollers(ExpectedReaders):
    """The daemon's SQS sessions, one per queue (and connection), and the watchers it expects
    to read each (:meth:`keep`): a message is deleted only once each of them is done with it."""

    def __init__(self) -> None:
        super().__init__()
        self._sessions: dict[str, _SqsSession] = {}

    async def join(self, spec: ReaderSpec, stats: ReaderStats) -> Reader:
        """Read the queue of ``spec`` through its session (opened by its first reader), counting
        in ``stats``."""
        key = spec.source_key
        session = self._sessions.get(key)
        if session is not None and not session.closed:
            return session.join(spec, stats)
        session = self._sessions[key] = _SqsSession(spec, stats, expected=self.of(key))
        reader = session.join(spec, stats)
        await session.open()
        return reader


@dataclasses.dataclass(eq=False, kw_only=True)
class Reader(BufferedReader[ReaderSpec, ReaderStats, "list[InFlight]"]):
    """One reader's end of a session: its events, oldest first, and the messages of the
    events it has not acked yet."""

    session: _SqsSession
    reading: bool = True

    @property
    def key(self) -> str:
        return self.spec.key

    def stop_reading(self) -> None:
        """The reader takes no more events: once no reader does, receiving stops."""
        self.session.stop_reading(self)

    async def leave(self) -> None:
        """The reader stopped. Messages of its events not yet acked reappear for it; the last
        reader to leave closes the session."""
        await self.session.leave(self)


class _SqsSession(ReadingTasks):
    """The receive loops of one queue, handing each message to its readers, and the client,
    held messages, deletes and dead letters they share."""

    def __init__(
        self,
        spec: ReaderSpec,
        stats: ReaderStats,
        *,
        expected: Callable[[], set[str]] = lambda: set(),
    ) -> None:
        #: The first reader's: its options are the poller's, and its counts are logged at close.
        self._spec = spec
        self._stats = stats
        self._expected = expected
        self._readers: dict[str, Reader] = {}
        self._joined = asyncio.Event()
        self._name = spec.queue.name
        self._log = log.bind(queue=self._name)
        self._sqs = QueueClient(self._log)
        self._in_flight = InFlightMessages(self._sqs, self._log)
        self._deletes = BatchedDeletes(
            self._sqs,
            self._in_flight,
            self._log,
            concurrency=max(2, spec.receivers),
            counted=self._count_deleted,
            batch_done=self._on_task_done,
        )
        self._dead_letters = DeadLetters(
            self._sqs, self._log, queue_name=self._name, max_receives=spec.max_receives
        )
        self._receivers: list[asyncio.Task[None]] = []
        self._background: list[asyncio.Task[None]] = []
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def join(self, spec: ReaderSpec, stats: ReaderStats) -> Reader:
        """Hand the reader of ``spec`` every message received from now on."""
        warn_options_ignored(
            self._log,
            "sqs_poller_options_ignored",
            POLLER_OPTIONS,
            spec,
            self._spec,
            why="watchers of one queue share its poller, set up by the first of them",
        )
        old = self._readers.get(spec.key)
        if old is not None:  # an instance the daemon gave up on: the new one takes its place
            self._drop(old)
        buffer = self._spec.receivers * (1 if spec.batch else MAX_MESSAGES)
        reader = self._readers[spec.key] = Reader(
            session=self, spec=spec, stats=stats, buffer=buffer
        )
        self._joined.set()
        return reader

    async def leave(self, reader: Reader) -> None:
        """See :meth:`Reader.leave`."""
        if self._readers.get(reader.key) is not reader:
            return
        reader.reading = False
        if len(self._readers) == 1:
            await self.close()  # flushes the deletes and releases every message not acked
            del self._readers[reader.key]
            return
        self._drop(reader)

    def _drop(self, reader: Reader) -> None:
        """Stop handing ``reader`` messages; those of its events not yet acked reappear."""
        del self._readers[reader.key]
        reader.reading = False
        unacked, reader.unacked = reader.unacked, {}
        reader.free_slots()
        for entries in unacked.values():
            for entry in entries:
                entry.event_done()
                entry.redeliver = True
                self._settle(entry)

    def stop_reading(self, reader: Reader) -> None:
        """See :meth:`Reader.stop_reading`."""
        reader.reading = False
        if not any(r.reading for r in self._readers.values()):
            self.stop_receiving()

    async def open(self) -> None:
        try:
            await self._connect()
        except BaseException as error:
            self._closed = True
            await self._sqs.aclose()
            for reader in self._readers.values():
                reader.fail(error)
            raise
        self._sqs.retrying = True
        self._background = [
            self._spawn(self._in_flight.keep_invisible(), "sqs-extend"),
            self._spawn(self._deletes.send_batches(), "sqs-delete"),
            self._spawn(self._lag_loop(), "sqs-lag"),
        ]
        self._receivers = [
            self._spawn(self._receive_loop(), f"sqs-receive-{number}")
            for number in range(self._spec.receivers)
        ]
        self._log.info(
            "sqs_watcher_started",
            queue_url=self._sqs.queue_url,
            receivers=len(self._receivers),
            visibility_timeout_s=self._in_flight.visibility_timeout_s,
            dead_letter_queue=self._dead_letters.url,
            max_receives=self._dead_letters.max_receives,
        )

    async def _connect(self) -> None:
        await self._sqs.connect(
            self._spec.queue,
            self._spec.connection,
            pool_size=self._spec.receivers + self._deletes.concurrency + 2,
            read_timeout_s=self._spec.wait_time_s + 30,
        )
        with self._sqs.missing_queue(self._sqs.queue_url):
            response = await self._sqs.call(
                "get_queue_attributes",
                QueueUrl=self._sqs.queue_url,
                AttributeNames=[
                    "VisibilityTimeout",
                    "RedrivePolicy",
                    "ApproximateNumberOfMessages",
                ],
            )
        attributes = response.get("Attributes", {})
        self._set_lag(int(attributes.get("ApproximateNumberOfMessages", 0)))
        # A queue may say 0 (visible at once); holding a message needs some time.
        self._in_flight.visibility_timeout_s = (
            self._spec.visibility_timeout_s or int(attributes.get("VisibilityTimeout", 0)) or 30
        )
        await self._dead_letters.resolve(
            self._spec.dead_letter_queue, attributes.get("RedrivePolicy")
        )

    def _set_lag(self, lag: int) -> None:
        for reader in self._readers.values():
            reader.stats.lag = lag

    def _polled(self) -> None:
        """The queue answered a receive (a long poll that found nothing included)."""
        now = datetime.now(UTC)
        for reader in self._readers.values():
            reader.stats.last_poll_at = now

    def _count_deleted(self, deleted: int) -> None:
        for reader in self._readers.values():
            reader.stats.deleted += deleted

    def stop_receiving(self) -> None:
        for task in self._receivers:
            task.cancel()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.stop_receiving()
        extend_loop, delete_loop, lag_loop = self._background
        await cancel_and_wait([lag_loop])
        try:
            async with asyncio.timeout(CLEANUP_TIMEOUT_S):
                await cancel_and_wait([*self._receivers, delete_loop])
                await self._deletes.flush()
                await cancel_and_wait([extend_loop])
                await self._in_flight.release_unacked()
        except TimeoutError:
            self._log.warning(
                "sqs_cleanup_timed_out",
                pending_deletes=len(self._deletes),
                in_flight=len(self._in_flight),
            )
        finally:
            await cancel_and_wait([extend_loop, *self._deletes.tasks])
            await self._sqs.aclose()
        stats = self._stats
        self._log.info(
            "sqs_watcher_stopped",
            received=stats.received,
            events=stats.events,
            filtered=stats.filtered,
            failed=stats.failed,
            dead_lettered=stats.dead_lettered,
            deleted=stats.deleted,
        )

    async def _lag_loop(self) -> None:
        while True:
            await asyncio.sleep(LAG_INTERVAL_S)
            response = await self._sqs.call(
                "get_queue_attributes",
                QueueUrl=self._sqs.queue_url,
                AttributeNames=["ApproximateNumberOfMessages"],
            )
            self._set_lag(int(response["Attributes"]["ApproximateNumberOfMessages"]))

    async def _receive_loop(self) -> None:
        arguments: dict[str, Any] = {
            "QueueUrl": self._sqs.queue_url,
            "MaxNumberOfMessages": self._spec.max_messages,
            "WaitTimeSeconds": self._spec.wait_time_s,
            "MessageSystemAttributeNames": ["All"],
            "MessageAttributeNames": ["All"],
            "VisibilityTimeout": self._in_flight.visibility_timeout_s,
        }
        await shared_readers.all_joined(self._joined, lambda: self._expected() - set(self._readers))
        while True:
            asked_at = time.monotonic()
            response = await self._sqs.call("receive_message", **arguments)
            self._polled()
            messages: list[dict[str, Any]] = response.get("Messages", [])
            if not messages:
                self._set_lag(0)  # a long poll waits for any message: none is waiting
                continue
            held = [self._in_flight.hold(message, asked_at) for message in messages]
            if self._expected() - set(self._readers):
                for entry in held:
                    entry.redeliver = True  # a watcher of the queue is not running now
            for reader in list(self._readers.values()):
                await self._hand(reader, messages, held)
            for entry in held:
                entry.dispatching = False
                self._settle(entry)

    async def _hand(
        self, reader: Reader, messages: list[dict[str, Any]], held: list[InFlight]
    ) -> None:
        reader.stats.received += len(messages)
        for event, token, entries in await self._events_of(reader, messages, held):
            reader.stats.events += 1
            await reader.slots.acquire()
            if self._readers.get(reader.key) is not reader:
                for entry in entries:
                    entry.redeliver = True  # it left meanwhile
                continue
            for entry in entries:
                entry.event_handed_out()
            reader.unacked[token] = entries
            reader.events.put_nowait(event)

    def _settle(self, entry: InFlight) -> None:
        """Once every reader is done with the message: delete it, or leave it to reappear."""
        if not entry.settleable:
            return
        entry.settled = True
        if entry.redeliver:
            self._in_flight.forget(entry)
        else:
            self._deletes.add(entry)

    async def _events_of(
        self, reader: Reader, messages: list[dict[str, Any]], held: list[InFlight]
    ) -> list[tuple[TriggerEvent, object, list[InFlight]]]:
        """The reader's events of the messages that pass, with their ack tokens and messages;
        filtered and failing messages are done for this reader. A malformed CloudEvent is a
        dead letter at once (a batch's messages are not read as CloudEvents)."""
        kept: list[tuple[Any, str | None, InFlight, CloudEvent | None]] = []
        letters = []
        for message, entry in zip(messages, held, strict=True):
            try:
                cloudevent = None if reader.spec.batch else _cloudevent(message)
            except MalformedCloudEvent as error:
                payload = reader.spec.payload(message)
                letters.append(self._event(reader, payload, None, [entry], dead_letter=str(error)))
                continue
            try:
                prepared = reader.spec.prepare(message)
            # A user's transform may raise anything: a bad message must not stop the watcher;
            # it is retried, then dead-lettered with the reason.
            except Exception as error:  # noqa: BLE001
                await self._failed(reader.stats, message, entry, error)
                continue
            if prepared is None:
                reader.stats.filtered += 1
                continue
            payload, partition_key = prepared
            kept.append((payload, partition_key, entry, cloudevent))
        if not reader.spec.batch:
            return letters + [
                self._event(reader, payload, key, [entry], cloudevent=cloudevent)
                for payload, key, entry, cloudevent in kept
            ]
        groups: dict[str | None, list[tuple[Any, InFlight]]] = {}
        for payload, key, entry, _ in kept:
            groups.setdefault(key, []).append((payload, entry))
        return letters + [
            self._event(
                reader,
                {"message_batch": [payload for payload, _ in items]},
                key,
                [entry for _, entry in items],
            )
            for key, items in groups.items()
        ]

    def _event(
        self,
        reader: Reader,
        payload: Any,
        partition_key: str | None,
        entries: list[InFlight],
        *,
        cloudevent: CloudEvent | None = None,
        dead_letter: str | None = None,
    ) -> tuple[TriggerEvent, object, list[InFlight]]:
        ids = ",".join(entry.message_id for entry in entries)
        token = object()

        async def ack() -> None:
            self._ack(reader, token, entries)

        sent = [entry.sent_at for entry in entries if entry.sent_at is not None]
        event = TriggerEvent(
            payload,
            dedup_key=f"{self._name}/{ids}" if cloudevent is None else cloudevent.dedup_key,
            ack=ack,
            partition_key=partition_key,
            sent_at=min(sent, default=None),  # a batch: since its oldest message
            dead_letter=dead_letter,
            cloudevent=cloudevent,
        )
        return event, token, entries

    def _ack(self, reader: Reader, token: object, entries: list[InFlight]) -> None:
        if self._closed:
            # The messages were made visible again at cleanup: redelivered, then deduplicated.
            self._log.warning("sqs_ack_after_cleanup", message_ids=[e.message_id for e in entries])
            return
        if reader.unacked.pop(token, None) is None:
            return  # acked already, or its reader left and the messages reappear for it
        for entry in entries:
            entry.event_done()
            self._settle(entry)

    async def _failed(
        self, stats: ReaderStats, message: dict[str, Any], entry: InFlight, error: Exception
    ) -> None:
        """Leave a failing message for redelivery, or dead-letter it after ``max_receives``."""
        stats.failed += 1
        if await self._dead_letters.dead_letter(message, error):
            stats.dead_lettered += 1
        else:
            entry.redeliver = True
