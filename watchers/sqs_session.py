"""The poller of one SQS queue: long polls, batched deletes, visibility extension, dead letters.

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
import contextlib
import contextvars
import dataclasses
import json
import random
import time
from collections.abc import Callable, Coroutine, Iterable, Iterator
from datetime import UTC, datetime
from typing import Any, Protocol

import structlog
from aiobotocore.config import AioConfig
from aiobotocore.session import get_session
from botocore.exceptions import ClientError, HTTPClientError
from botocore.exceptions import ConnectionError as BotoConnectionError

from triggerer.connections import get_connection
from triggerer.triggers import TriggerEvent
from watchers.sqs_address import SqsQueue, parse_queue

log = structlog.get_logger(__name__)

MAX_MESSAGES = 10
DELETE_WINDOW_S = 0.005  # acks arriving within this window share one DeleteMessageBatch
#: How often the queue's backlog (the watcher's lag) is read: a call of its own, so not per poll.
LAG_INTERVAL_S = 30.0
CLEANUP_TIMEOUT_S = 10.0
DEAD_LETTER_REASON_ATTRIBUTE = "triggerer_dead_letter_reason"
DEAD_LETTER_SOURCE_ATTRIBUTE = "triggerer_source_queue"
_MAX_MESSAGE_ATTRIBUTES = 10
_MAX_REASON_CHARS = 1_000
_THROTTLING_CODES = frozenset(
    {"Throttling", "ThrottlingException", "RequestThrottled", "ServiceUnavailable"}
)
_CREDENTIAL_KEYS = ("aws_access_key_id", "aws_secret_access_key", "aws_session_token")
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
#: How long the receives of a new session wait for the other watchers of its queue to join.
JOIN_WAIT_S = 5.0
_POLLERS: contextvars.ContextVar[Pollers | None] = contextvars.ContextVar(
    "sqs_pollers", default=None
)


@contextlib.contextmanager
def sharing(pollers: Pollers) -> Iterator[None]:
    """Within this context (and the tasks started in it), SqsTriggers of one queue share one
    session of ``pollers``."""
    token = _POLLERS.set(pollers)
    try:
        yield
    finally:
        _POLLERS.reset(token)


def current() -> Pollers | None:
    """The shared sessions in effect, ``None`` outside :func:`sharing`."""
    return _POLLERS.get()


#: A reader's payload and partition key of a message; ``None`` when the reader filters it out.
Prepared = tuple[Any, str | None] | None


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
    def queue_key(self) -> str:
        """The queue however it is spelled (URL, name, ``sqs://``), with the connection read by:
        readers with one queue key share a session."""
        queue = self.queue
        return json.dumps([queue.name, queue.region_name, queue.endpoint_url, self.connection])


@dataclasses.dataclass(eq=False)
class ReaderStats:
    """What a session did for one reader, written by the session and read by its trigger:
    messages received, events handed over, messages filtered out, failing, dead-lettered and
    deleted (those the reader shares with others count for each), and the queue's lag."""

    received: int = 0
    events: int = 0
    filtered: int = 0
    failed: int = 0
    dead_lettered: int = 0
    deleted: int = 0
    #: The queue's ApproximateNumberOfMessages: read when the session opens and every
    #: ``LAG_INTERVAL_S``, and 0 when a long poll comes back empty; ``None`` while unknown.
    lag: int | None = None
    #: When the queue last answered a receive, an empty one included.
    last_poll_at: datetime | None = None


class HasReaderSpec(Protocol):
    """A reader of a queue as :meth:`Pollers.keep` takes it (an SqsTrigger)."""

    def reader_spec(self) -> ReaderSpec: ...


class Pollers:
    """The daemon's SQS sessions, one per queue (and connection), and the watchers it expects
    to read each: a message is deleted only once each of them is done with it."""

    def __init__(self) -> None:
        self._sessions: dict[str, _SqsSession] = {}
        self._expected: dict[str, set[str]] = {}

    def keep(self, readers: Iterable[HasReaderSpec]) -> None:
        """The readers (SqsTriggers) the daemon runs now."""
        expected: dict[str, set[str]] = {}
        for reader in readers:
            spec = reader.reader_spec()
            expected.setdefault(spec.queue_key, set()).add(spec.key)
        self._expected = expected

    async def join(self, spec: ReaderSpec, stats: ReaderStats) -> Reader:
        """Read the queue of ``spec`` through its session (opened by its first reader), counting
        in ``stats``."""
        key = spec.queue_key
        session = self._sessions.get(key)
        if session is not None and not session.closed:
            return session.join(spec, stats)
        session = self._sessions[key] = _SqsSession(
            spec, stats, expected=lambda: self._expected.get(key, set())
        )
        reader = session.join(spec, stats)
        await session.open()
        return reader


@dataclasses.dataclass(eq=False)
class Reader:
    """One reader's end of a session: its events, oldest first, and the messages of the
    events it has not acked yet."""

    session: _SqsSession
    spec: ReaderSpec
    stats: ReaderStats
    buffer: int
    events: asyncio.Queue[TriggerEvent | _Failure] = dataclasses.field(
        default_factory=asyncio.Queue
    )
    slots: asyncio.Semaphore = dataclasses.field(init=False)
    unacked: dict[object, list[_InFlight]] = dataclasses.field(default_factory=dict)
    reading: bool = True

    def __post_init__(self) -> None:
        self.slots = asyncio.Semaphore(self.buffer)

    @property
    def key(self) -> str:
        return self.spec.key

    async def next_event(self) -> TriggerEvent:
        """The reader's next event; raises what stopped the session."""
        item = await self.events.get()
        if isinstance(item, _Failure):
            raise item.error
        self.slots.release()
        return item

    def stop_reading(self) -> None:
        """The reader takes no more events: once no reader does, receiving stops."""
        self.session.stop_reading(self)

    async def leave(self) -> None:
        """The reader stopped. Messages of its events not yet acked reappear for it; the last
        reader to leave closes the session."""
        await self.session.leave(self)


@dataclasses.dataclass(eq=False)
class _InFlight:
    """A received message this process holds: extended until deleted or released."""

    message_id: str
    receipt_handle: str
    visible_until: float  # time.monotonic() when SQS would make it visible again
    sent_at: float | None  # when SQS took it in (SentTimestamp), epoch seconds
    acked: bool = False  # being deleted
    #: Events of readers holding the message, not yet acked.
    owners: int = 0
    #: Still being handed to the readers.
    dispatching: bool = True
    #: Some reader must see it again: once the others are done it is left to reappear.
    redeliver: bool = False


@dataclasses.dataclass(frozen=True)
class _Failure:
    error: BaseException


class _SqsSession:
    """The client, receive loops and background tasks of one queue, for its readers."""

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
        self._exit_stack = contextlib.AsyncExitStack()
        self._client: Any = None
        self._queue_url = ""
        self._dead_letter_url: str | None = None
        self._visibility_timeout_s = 30
        self._max_receives = spec.max_receives
        self._in_flight: dict[str, _InFlight] = {}
        self._in_flight_added = asyncio.Event()
        self._pending_deletes: list[_InFlight] = []
        self._deletes_ready = asyncio.Event()
        self._deletes_full = asyncio.Event()
        self._delete_concurrency = max(2, spec.receivers)
        self._delete_slots = asyncio.Semaphore(self._delete_concurrency)
        self._delete_tasks: set[asyncio.Task[None]] = set()
        self._receivers: list[asyncio.Task[None]] = []
        self._background: list[asyncio.Task[None]] = []
        self._opened = False
        self._closed = False

    @property
    def closed(self) -> bool:
        return self._closed

    def join(self, spec: ReaderSpec, stats: ReaderStats) -> Reader:
        """Hand the reader of ``spec`` every message received from now on."""
        differing = [n for n in POLLER_OPTIONS if getattr(spec, n) != getattr(self._spec, n)]
        if differing:
            self._log.warning(
                "sqs_poller_options_ignored",
                options=differing,
                why="watchers of one queue share its poller, set up by the first of them",
            )
        old = self._readers.get(spec.key)
        if old is not None:  # an instance the daemon gave up on: the new one takes its place
            self._drop(old)
        buffer = self._spec.receivers * (1 if spec.batch else MAX_MESSAGES)
        reader = self._readers[spec.key] = Reader(self, spec, stats, buffer)
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
        for _ in range(reader.buffer):
            reader.slots.release()  # a receive loop waiting for room goes on without it
        for entries in unacked.values():
            for entry in entries:
                entry.owners -= 1
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
            await self._exit_stack.aclose()
            for reader in self._readers.values():
                reader.events.put_nowait(_Failure(error))
            raise
        self._opened = True
        self._background = [
            self._spawn(self._extend_loop(), "sqs-extend"),
            self._spawn(self._delete_loop(), "sqs-delete"),
            self._spawn(self._lag_loop(), "sqs-lag"),
        ]
        self._receivers = [
            self._spawn(self._receive_loop(), f"sqs-receive-{number}")
            for number in range(self._spec.receivers)
        ]
        self._log.info(
            "sqs_watcher_started",
            queue_url=self._queue_url,
            receivers=len(self._receivers),
            visibility_timeout_s=self._visibility_timeout_s,
            dead_letter_queue=self._dead_letter_url,
            max_receives=self._max_receives,
        )

    async def _connect(self) -> None:
        location = self._spec.queue
        connection = self._spec.connection
        settings = {} if connection is None else get_connection(connection)
        credentials = {key: settings[key] for key in _CREDENTIAL_KEYS if key in settings}
        region = location.region_name or settings.get("region_name")
        endpoint = location.endpoint_url or settings.get("endpoint_url")
        config = AioConfig(
            max_pool_connections=self._spec.receivers + self._delete_concurrency + 2,
            read_timeout=self._spec.wait_time_s + 30,
            retries={"mode": "standard"},
        )
        self._client = await self._exit_stack.enter_async_context(
            get_session().create_client(
                "sqs", region_name=region, endpoint_url=endpoint, config=config, **credentials
            )
        )
        self._queue_url = location.url or await self._queue_url_of(location.name)
        with self._missing_queue(self._queue_url):
            response = await self._call(
                "get_queue_attributes",
                QueueUrl=self._queue_url,
                AttributeNames=[
                    "VisibilityTimeout",
                    "RedrivePolicy",
                    "ApproximateNumberOfMessages",
                ],
            )
        attributes = response.get("Attributes", {})
        self._set_lag(int(attributes.get("ApproximateNumberOfMessages", 0)))
        # A queue may say 0 (visible at once); holding a message needs some time.
        self._visibility_timeout_s = (
            self._spec.visibility_timeout_s or int(attributes.get("VisibilityTimeout", 0)) or 30
        )
        await self._resolve_dead_letter_queue(attributes.get("RedrivePolicy"))

    async def _queue_url_of(self, name: str, account: str | None = None) -> str:
        arguments = {"QueueName": name}
        if account is not None:
            arguments["QueueOwnerAWSAccountId"] = account
        with self._missing_queue(name):
            response = await self._call("get_queue_url", **arguments)
        url: str = response["QueueUrl"]
        return url

    @contextlib.contextmanager
    def _missing_queue(self, queue: str) -> Iterator[None]:
        """Turn the service's "no such queue" into a ``LookupError`` naming the queue."""
        try:
            yield
        except ClientError as error:
            if not is_missing_queue(error):
                raise
            raise LookupError(
                f"SQS queue {queue!r} does not exist at {self._client.meta.endpoint_url} "
                f"(region {self._client.meta.region_name}); create it or fix the queue name"
            ) from error

    async def _resolve_dead_letter_queue(self, redrive_policy: str | None) -> None:
        """Use ``dead_letter_queue``, else the queue's redrive target (capping ``max_receives``)."""
        if self._spec.dead_letter_queue is not None:
            target = parse_queue(self._spec.dead_letter_queue)
            self._dead_letter_url = target.url or await self._queue_url_of(target.name)
            return
        if redrive_policy is None:
            return
        policy = json.loads(redrive_policy)
        *_, account, name = policy["deadLetterTargetArn"].split(":")
        self._dead_letter_url = await self._queue_url_of(name, account)
        redrive_receives = int(policy["maxReceiveCount"])
        if redrive_receives < self._max_receives:
            # SQS would move the message first, without our reason attribute.
            self._log.warning(
                "sqs_max_receives_lowered",
                max_receives=self._max_receives,
                redrive_max_receive_count=redrive_receives,
            )
            self._max_receives = redrive_receives

    def _set_lag(self, lag: int) -> None:
        for reader in self._readers.values():
            reader.stats.lag = lag

    def _polled(self) -> None:
        """The queue answered a receive (a long poll that found nothing included)."""
        now = datetime.now(UTC)
        for reader in self._readers.values():
            reader.stats.last_poll_at = now

    def stop_receiving(self) -> None:
        for task in self._receivers:
            task.cancel()

    async def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        self.stop_receiving()
        extend_loop, delete_loop, lag_loop = self._background
        await _cancel_and_wait([lag_loop])
        try:
            async with asyncio.timeout(CLEANUP_TIMEOUT_S):
                await _cancel_and_wait([*self._receivers, delete_loop])
                await self._flush_deletes()
                await _cancel_and_wait([extend_loop])
                await self._release_unacked()
        except TimeoutError:
            self._log.warning(
                "sqs_cleanup_timed_out",
                pending_deletes=len(self._pending_deletes),
                in_flight=len(self._in_flight),
            )
        finally:
            await _cancel_and_wait([extend_loop, *self._delete_tasks])
            await self._exit_stack.aclose()
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

    def _spawn(self, coroutine: Coroutine[Any, Any, None], name: str) -> asyncio.Task[None]:
        task: asyncio.Task[None] = asyncio.create_task(coroutine, name=name)
        task.add_done_callback(self._on_task_done)
        return task

    def _on_task_done(self, task: asyncio.Task[None]) -> None:
        if task.cancelled():
            return
        error = task.exception()
        if error is not None:
            for reader in self._readers.values():
                reader.events.put_nowait(_Failure(error))

    async def _call(self, operation: str, **arguments: Any) -> dict[str, Any]:
        """Call the SQS API, retrying transient errors with jittered exponential backoff.

        Until the session is open an error is raised at once (after botocore's own retries):
        a watcher that cannot start fails, and the supervisor shows the error and restarts it.
        """
        attempt = 0
        while True:
            try:
                response: dict[str, Any] = await getattr(self._client, operation)(**arguments)
            except (ClientError, HTTPClientError, BotoConnectionError) as error:
                if not (self._opened and _is_transient(error)):
                    raise
                attempt += 1
                jitter = random.uniform(0.5, 1.0)  # noqa: S311 - spreads retries, not a secret
                delay_s = min(10.0, 0.1 * 2**attempt) * jitter
                self._log.warning(
                    "sqs_call_failed",
                    operation=operation,
                    error=str(error),
                    attempt=attempt,
                    retry_in_s=round(delay_s, 2),
                )
                await asyncio.sleep(delay_s)
            else:
                return response

    async def _lag_loop(self) -> None:
        while True:
            await asyncio.sleep(LAG_INTERVAL_S)
            response = await self._call(
                "get_queue_attributes",
                QueueUrl=self._queue_url,
                AttributeNames=["ApproximateNumberOfMessages"],
            )
            self._set_lag(int(response["Attributes"]["ApproximateNumberOfMessages"]))

    async def _receive_loop(self) -> None:
        arguments: dict[str, Any] = {
            "QueueUrl": self._queue_url,
            "MaxNumberOfMessages": self._spec.max_messages,
            "WaitTimeSeconds": self._spec.wait_time_s,
            "MessageSystemAttributeNames": ["All"],
            "MessageAttributeNames": ["All"],
            "VisibilityTimeout": self._visibility_timeout_s,
        }
        await self._all_joined()
        while True:
            asked_at = time.monotonic()
            response = await self._call("receive_message", **arguments)
            self._polled()
            messages: list[dict[str, Any]] = response.get("Messages", [])
            if not messages:
                self._set_lag(0)  # a long poll waits for any message: none is waiting
                continue
            held = [self._hold(message, asked_at) for message in messages]
            if self._expected() - set(self._readers):
                for entry in held:
                    entry.redeliver = True  # a watcher of the queue is not running now
            for reader in list(self._readers.values()):
                await self._hand(reader, messages, held)
            for entry in held:
                entry.dispatching = False
                self._settle(entry)

    async def _all_joined(self) -> None:
        """Wait (a little) for the watchers expected on the queue, so none misses the first
        messages."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(JOIN_WAIT_S):
                while self._expected() - set(self._readers):
                    self._joined.clear()
                    await self._joined.wait()

    async def _hand(
        self, reader: Reader, messages: list[dict[str, Any]], held: list[_InFlight]
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
                entry.owners += 1
            reader.unacked[token] = entries
            reader.events.put_nowait(event)

    def _settle(self, entry: _InFlight) -> None:
        """Once every reader is done with the message: delete it, or leave it to reappear."""
        if entry.dispatching or entry.owners or entry.acked:
            return
        if entry.redeliver:
            self._in_flight.pop(entry.receipt_handle, None)  # no longer extended
        else:
            self._delete_later(entry)

    def _hold(self, message: dict[str, Any], asked_at: float) -> _InFlight:
        entry = _InFlight(
            message["MessageId"],
            message["ReceiptHandle"],
            asked_at + self._visibility_timeout_s,
            _sent_timestamp(message),
        )
        self._in_flight[entry.receipt_handle] = entry
        self._in_flight_added.set()
        return entry

    async def _events_of(
        self, reader: Reader, messages: list[dict[str, Any]], held: list[_InFlight]
    ) -> list[tuple[TriggerEvent, object, list[_InFlight]]]:
        """The reader's events of the messages that pass, with their ack tokens and messages;
        filtered and failing messages are done for this reader."""
        kept: list[tuple[Any, str | None, _InFlight]] = []
        for message, entry in zip(messages, held, strict=True):
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
            kept.append((payload, partition_key, entry))
        if not reader.spec.batch:
            return [self._event(reader, payload, key, [entry]) for payload, key, entry in kept]
        groups: dict[str | None, list[tuple[Any, _InFlight]]] = {}
        for payload, key, entry in kept:
            groups.setdefault(key, []).append((payload, entry))
        return [
            self._event(
                reader,
                {"message_batch": [payload for payload, _ in items]},
                key,
                [entry for _, entry in items],
            )
            for key, items in groups.items()
        ]

    def _event(
        self, reader: Reader, payload: Any, partition_key: str | None, entries: list[_InFlight]
    ) -> tuple[TriggerEvent, object, list[_InFlight]]:
        ids = ",".join(entry.message_id for entry in entries)
        token = object()

        async def ack() -> None:
            self._ack(reader, token, entries)

        sent = [entry.sent_at for entry in entries if entry.sent_at is not None]
        event = TriggerEvent(
            payload,
            dedup_key=f"{self._name}/{ids}",
            ack=ack,
            partition_key=partition_key,
            sent_at=min(sent, default=None),  # a batch: since its oldest message
        )
        return event, token, entries

    def _ack(self, reader: Reader, token: object, entries: list[_InFlight]) -> None:
        if self._closed:
            # The messages were made visible again at cleanup: redelivered, then deduplicated.
            self._log.warning("sqs_ack_after_cleanup", message_ids=[e.message_id for e in entries])
            return
        if reader.unacked.pop(token, None) is None:
            return  # acked already, or its reader left and the messages reappear for it
        for entry in entries:
            entry.owners -= 1
            self._settle(entry)

    def _delete_later(self, entry: _InFlight) -> None:
        entry.acked = True
        self._pending_deletes.append(entry)
        self._deletes_ready.set()
        if len(self._pending_deletes) >= MAX_MESSAGES:
            self._deletes_full.set()

    async def _failed(
        self, stats: ReaderStats, message: dict[str, Any], entry: _InFlight, error: Exception
    ) -> None:
        """Leave a failing message for redelivery, or dead-letter it after ``max_receives``."""
        stats.failed += 1
        reason = f"{type(error).__name__}: {error}"[:_MAX_REASON_CHARS]
        receives = int(message.get("Attributes", {}).get("ApproximateReceiveCount", 1))
        if receives < self._max_receives:
            self._log.warning(
                "sqs_message_failed",
                message_id=entry.message_id,
                reason=reason,
                receives=receives,
                max_receives=self._max_receives,
            )
            entry.redeliver = True
            return
        if self._dead_letter_url is None:
            self._log.error(
                "sqs_message_not_dead_lettered",
                message_id=entry.message_id,
                reason=reason,
                receives=receives,
                why="no dead_letter_queue and no RedrivePolicy: it stays in the queue",
            )
            entry.redeliver = True
            return
        try:
            await self._call("send_message", **self._dead_letter_message(message, reason))
        except ClientError as send_error:
            self._log.error(
                "sqs_dead_letter_failed",
                message_id=entry.message_id,
                reason=reason,
                error=str(send_error),
                why="it stays in the queue and is retried on its next receive",
            )
            entry.redeliver = True
            return
        stats.dead_lettered += 1
        self._log.error(
            "sqs_message_dead_lettered",
            message_id=entry.message_id,
            reason=reason,
            receives=receives,
            dead_letter_queue=self._dead_letter_url,
        )

    def _dead_letter_message(self, message: dict[str, Any], reason: str) -> dict[str, Any]:
        ours = {
            DEAD_LETTER_REASON_ATTRIBUTE: {"DataType": "String", "StringValue": reason},
            DEAD_LETTER_SOURCE_ATTRIBUTE: {"DataType": "String", "StringValue": self._queue_url},
        }
        theirs = list(message.get("MessageAttributes", {}).items())
        theirs = theirs[: _MAX_MESSAGE_ATTRIBUTES - len(ours)]
        arguments: dict[str, Any] = {
            "QueueUrl": self._dead_letter_url,
            "MessageBody": message.get("Body", ""),
            "MessageAttributes": {**dict(theirs), **ours},
        }
        if (self._dead_letter_url or "").endswith(".fifo"):
            attributes = message.get("Attributes", {})
            arguments["MessageGroupId"] = attributes.get("MessageGroupId", self._name)
            arguments["MessageDeduplicationId"] = message["MessageId"]
        return arguments

    async def _delete_loop(self) -> None:
        while True:
            await self._deletes_ready.wait()
            if len(self._pending_deletes) < MAX_MESSAGES:
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(DELETE_WINDOW_S):
                        await self._deletes_full.wait()
            await self._delete_slots.acquire()
            batch = self._take_deletes()
            task = asyncio.create_task(self._delete_batch(batch), name="sqs-delete-batch")
            self._delete_tasks.add(task)
            task.add_done_callback(self._delete_batch_done)

    def _take_deletes(self) -> list[_InFlight]:
        batch = self._pending_deletes[:MAX_MESSAGES]
        del self._pending_deletes[:MAX_MESSAGES]
        if len(self._pending_deletes) < MAX_MESSAGES:
            self._deletes_full.clear()
        if not self._pending_deletes:
            self._deletes_ready.clear()
        return batch

    def _delete_batch_done(self, task: asyncio.Task[None]) -> None:
        self._delete_tasks.discard(task)
        self._delete_slots.release()
        self._on_task_done(task)

    async def _delete_batch(self, batch: list[_InFlight], *, attempt: int = 0) -> None:
        """Delete up to ten messages; entries that failed on the server side are retried."""
        entries = [
            {"Id": str(number), "ReceiptHandle": entry.receipt_handle}
            for number, entry in enumerate(batch)
        ]
        response = await self._call(
            "delete_message_batch", QueueUrl=self._queue_url, Entries=entries
        )
        retry = []
        for failure in response.get("Failed", []):
            entry = batch[int(failure["Id"])]
            if failure.get("SenderFault"):
                # The receipt handle expired: SQS redelivers the message and its dedup key
                # keeps a second event out.
                self._log.warning(
                    "sqs_delete_rejected",
                    message_id=entry.message_id,
                    code=failure.get("Code"),
                    error=failure.get("Message"),
                )
                self._in_flight.pop(entry.receipt_handle, None)
            else:
                retry.append(entry)
        done = len(batch) - len(retry)
        for reader in self._readers.values():
            reader.stats.deleted += len(response.get("Successful", []))
        for entry in batch:
            if entry not in retry:
                self._in_flight.pop(entry.receipt_handle, None)
        if retry:
            delay_s = min(10.0, 0.1 * 2 ** (attempt + 1))
            self._log.warning(
                "sqs_delete_retrying", failed=len(retry), deleted=done, retry_in_s=delay_s
            )
            await asyncio.sleep(delay_s)
            await self._delete_batch(retry, attempt=attempt + 1)

    async def _flush_deletes(self) -> None:
        """Delete everything acked so far: wait for the running batches, then send the rest."""
        while self._delete_tasks or self._pending_deletes:
            if self._delete_tasks:
                await asyncio.wait(list(self._delete_tasks))
            batch = self._take_deletes()
            if batch:
                await self._delete_batch(batch)

    async def _extend_loop(self) -> None:
        """Keep held messages invisible: renew each one when half its visibility is used up."""
        margin_s = self._visibility_timeout_s / 2
        while True:
            now = time.monotonic()
            due = [e for e in self._in_flight.values() if e.visible_until - now <= margin_s]
            if not due:
                self._in_flight_added.clear()
                next_due = min((e.visible_until for e in self._in_flight.values()), default=None)
                timeout_s = None if next_due is None else next_due - margin_s - now
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(timeout_s):
                        await self._in_flight_added.wait()
                continue
            for start in range(0, len(due), MAX_MESSAGES):
                await self._change_visibility(
                    due[start : start + MAX_MESSAGES], self._visibility_timeout_s
                )

    async def _change_visibility(self, batch: list[_InFlight], timeout_s: int) -> None:
        sent_at = time.monotonic()
        response = await self._call(
            "change_message_visibility_batch",
            QueueUrl=self._queue_url,
            Entries=[
                {
                    "Id": str(number),
                    "ReceiptHandle": entry.receipt_handle,
                    "VisibilityTimeout": timeout_s,
                }
                for number, entry in enumerate(batch)
            ],
        )
        for entry in batch:
            entry.visible_until = sent_at + timeout_s
        for failure in response.get("Failed", []):
            entry = batch[int(failure["Id"])]
            if self._in_flight.pop(entry.receipt_handle, None) is None:
                continue  # deleted while the call was on its way
            # Past the 12-hour limit, or the handle expired: SQS redelivers the message.
            self._log.warning(
                "sqs_visibility_change_failed",
                message_id=entry.message_id,
                code=failure.get("Code"),
                error=failure.get("Message"),
            )

    async def _release_unacked(self) -> None:
        """Make messages this process will never ack visible again at once."""
        unacked = [entry for entry in self._in_flight.values() if not entry.acked]
        self._in_flight.clear()
        for start in range(0, len(unacked), MAX_MESSAGES):
            await self._change_visibility(unacked[start : start + MAX_MESSAGES], 0)


def _is_transient(error: Exception) -> bool:
    if isinstance(error, ClientError):
        status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0)
        return bool(status >= 500 or _error_code(error) in _THROTTLING_CODES)
    return True


def is_missing_queue(error: ClientError) -> bool:
    """Whether the service answered that the queue does not exist."""
    return _error_code(error) in ("AWS.SimpleQueueService.NonExistentQueue", "QueueDoesNotExist")


def _error_code(error: ClientError) -> str:
    code: str = error.response.get("Error", {}).get("Code", "")
    return code


async def _cancel_and_wait(tasks: list[asyncio.Task[None]] | set[asyncio.Task[None]]) -> None:
    """Cancel ``tasks`` and wait for them; their own errors were already reported."""
    tasks = list(tasks)
    for task in tasks:
        task.cancel()
    await asyncio.gather(*tasks, return_exceptions=True)


def _sent_timestamp(message: dict[str, Any]) -> float | None:
    """When SQS took ``message`` in (its ``SentTimestamp`` attribute, milliseconds), as epoch
    seconds; ``None`` without one."""
    stamp = message.get("Attributes", {}).get("SentTimestamp")
    return int(stamp) / 1000 if isinstance(stamp, str) and stamp.isdecimal() else None
