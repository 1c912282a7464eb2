"""The puller of one Google Pub/Sub subscription, and the readers it hands each message to.

The puller composes the rest: its clients (:mod:`watchers.pubsub.client`) and the messages it
holds, with their acks, nacks and deadline extensions (:mod:`watchers.pubsub.acks`).

Every trigger reading the subscription is a reader of its puller and is handed each message; a
message is acknowledged once every reader is done with it (its event committed and acked, or
filtered, or dead-lettered); until then its ack deadline is extended. A message a reader could
not process is nacked; one that a watcher of the daemon missed (not running at the moment, or
failed because its schema registry does not answer) is left to its deadline, and comes back
then.

Without a dead-letter policy, deliveries are counted in memory and by message id, so a restart
of the daemon starts the count again: a failing message is yielded as a dead letter on its
``max_deliveries``-th delivery to this process.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import time
from collections.abc import Awaitable, Callable
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

import structlog

from triggerer.backoff import Backoff
from triggerer.triggers import SourceMissing, TriggerEvent
from watchers import cloudevents, shared_readers
from watchers.clients import require
from watchers.payloads import decode_body
from watchers.pubsub.acks import HeldMessages
from watchers.pubsub.client import connect
from watchers.shared_readers import (
    BufferedReader,
    Decode,
    ExpectedReaders,
    ReadingTasks,
    Sharing,
    all_joined,
    cancel_and_wait,
    decoded_for,
)

if TYPE_CHECKING:
    from watchers.processing import Prepared
    from watchers.pubsub.acks import Held
    from watchers.pubsub.client import Clients

log = structlog.get_logger(__name__)

#: How long a pull may wait for messages (Pub/Sub answers at once when some are waiting).
PULL_TIMEOUT_S = 30.0
BACKOFF_MAX_S = 10.0
CALL_TIMEOUT_S = 30.0
#: The PubSubTrigger options of the puller: those of the first reader of a subscription.
PULLER_OPTIONS = ("max_messages", "pullers", "ack_deadline_s", "max_deliveries")
CLEANUP_TIMEOUT_S = 10.0
#: gRPC status codes worth a retry: the service is away for a moment, or busy.
TRANSIENT_CODES = frozenset(
    {"UNAVAILABLE", "DEADLINE_EXCEEDED", "INTERNAL", "UNKNOWN", "ABORTED", "RESOURCE_EXHAUSTED"}
)
_SHARING: Sharing[Pullers] = Sharing("pubsub_pullers")
#: Within ``sharing(pullers)``, PubSubTriggers of one subscription share one puller of
#: ``pullers``.
sharing = _SHARING.sharing
current = _SHARING.current


class MissingSubscription(SourceMissing):
    """The subscription does not exist (the watcher creates none)."""


def message_payload(received: Any) -> dict[str, Any]:
    """The event payload of a received message (a raw ``ReceivedMessage`` protobuf)."""
    message = received.message
    attributes = message.attributes
    return {
        "message_id": message.message_id,
        "body": decode_body(message.data),
        # Copying a protobuf map costs more than the rest of the payload: not when empty.
        "attributes": dict(attributes) if len(attributes) else {},
        "publish_time": _rfc3339(message.publish_time),
        "ordering_key": message.ordering_key or None,
        "delivery_attempt": received.delivery_attempt or None,
    }


def dedup_key(subscription: str, message: Any) -> str:
    """The dedup key of ``message`` (a ``PubsubMessage`` protobuf) read from the subscription
    named ``subscription``: ``<subscription>/<message_id>@<publish_time>``, the publish time in
    RFC 3339 in UTC with all nine digits of its nanoseconds (``2026-01-02T03:04:05.678000000Z``).

    Both parts are the same on every delivery of the message. The publish time tells apart
    messages of one id from two incarnations of the service: the emulator starts its ids
    again when it restarts, which would make a new message look stored already.
    """
    published = message.publish_time
    return f"{subscription}/{message.message_id}@{_rfc3339(published, digits=9)}"


def _rfc3339(timestamp: Any, *, digits: int = 6) -> str:
    """A protobuf Timestamp as RFC 3339 text in UTC, to the microsecond (as Pub/Sub's JSON) or
    with ``digits=9`` to the nanosecond."""
    whole = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(timestamp.seconds))
    fraction = timestamp.nanos // 10 ** (9 - digits)
    return f"{whole}.{fraction:0{digits}d}Z"


@dataclasses.dataclass(frozen=True, kw_only=True, eq=False)
class ReaderSpec:
    """What a puller needs of one reader (a PubSubTrigger)."""

    subscription: str
    """``projects/PROJECT/subscriptions/NAME``."""
    emulator_host: str | None
    connection: str | None
    key: str
    """Tells the reader from the other readers of the subscription; an instance with the same
    key takes the place of one the daemon gave up on."""
    decode: Decode
    """The reader's step decoding a message's data into its payload's ``body``
    (``value_format``) and finding the CloudEvent it is."""
    prepare: Callable[[Any], Prepared]
    """The reader's step from a message's payload to its event's payload and partition key
    (``None``: filtered out). It may raise: the message is then nacked, and dead-lettered at
    last."""
    # The puller's options (PULLER_OPTIONS): the first reader's are the puller's.
    max_messages: int
    pullers: int
    ack_deadline_s: int | None
    max_deliveries: int

    @property
    def source_key(self) -> str:
        """Readers with one source key share a puller."""
        return json.dumps([self.subscription, self.emulator_host, self.connection])


@dataclasses.dataclass(eq=False)
class ReaderStats(shared_readers.ReaderStats):
    """What a puller did for one reader, written by the puller and read by its trigger. ``lag``
    is the messages received and not yet acknowledged: Pub/Sub's API has no count of those not
    yet pulled (that is Cloud Monitoring's ``num_undelivered_messages``)."""


class Pullers(ExpectedReaders):
    """The daemon's pullers, one per subscription (and connection), and the watchers it
    expects to read each (:meth:`keep`): a message is acknowledged only once each of them is
    done with it."""

    def __init__(self) -> None:
        super().__init__()
        self._pullers: dict[str, Puller] = {}

    async def join(self, spec: ReaderSpec, stats: ReaderStats) -> Reader:
        """Read the subscription of ``spec`` through its puller (opened by its first reader)."""
        key = spec.source_key
        puller = self._pullers.get(key)
        if puller is not None and not puller.done:
            return puller.join(spec, stats)
        puller = self._pullers[key] = Puller(spec, expected=self.of(key))
        reader = puller.join(spec, stats)
        await puller.open()
        return reader


@dataclasses.dataclass(eq=False, kw_only=True)
class Reader(BufferedReader[ReaderSpec, ReaderStats, "Held"]):
    """One reader's end of a puller: its events, oldest first, and those not acked yet."""

    puller: Puller

    async def leave(self) -> None:
        """The reader stopped: its unacked messages are nacked; the last reader closes."""
        await self.puller.leave(self)


def is_transient(error: BaseException) -> bool:
    """Whether a call's error is worth a retry (the service away or busy for a moment)."""
    code = getattr(error, "grpc_status_code", None)
    return code is not None and code.name in TRANSIENT_CODES


def missing(subscription: str) -> MissingSubscription:
    return MissingSubscription(
        f"Pub/Sub subscription {subscription!r} does not exist: create it (on its topic) "
        "before a watcher reads it; the watcher creates none"
    )


class Puller(ReadingTasks):
    """The pull loops of one subscription, handing each message to its readers, and the acks,
    nacks and deadline extensions they share."""

    def __init__(self, spec: ReaderSpec, *, expected: Callable[[], set[str]]) -> None:
        self._spec = spec
        self._expected = expected
        self._subscription = spec.subscription
        self._name = spec.subscription.rsplit("/", 1)[-1]
        self._log = log.bind(subscription=spec.subscription)
        self._readers: dict[str, Reader] = {}
        self._joined = asyncio.Event()
        self._held = HeldMessages(spec.subscription, self._call_retrying)
        self._clients: Clients | None = None
        self._dead_letter_topic: str | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._closed = False
        #: Failed or closed: the next reader to join opens a new puller.
        self.done = False

    def join(self, spec: ReaderSpec, stats: ReaderStats) -> Reader:
        old = self._readers.get(spec.key)
        if old is not None:  # an instance the daemon gave up on: the new one takes its place
            self._drop(old)
        reader = self._readers[spec.key] = Reader(
            puller=self, spec=spec, stats=stats, buffer=self._spec.max_messages
        )
        self._joined.set()
        return reader

    async def open(self) -> None:
        try:
            self._clients = await connect(self._spec.emulator_host, self._spec.connection)
            subscription = await self._call_retrying(
                "get_subscription", subscription=self._subscription
            )
        except BaseException as error:
            self.done = self._closed = True
            if self._clients is not None:
                await self._clients.aclose()
            for reader in self._readers.values():
                reader.fail(error)
            raise
        held = self._held
        held.subscription_deadline_s = subscription.ack_deadline_seconds or 10
        held.ack_deadline_s = self._spec.ack_deadline_s or held.subscription_deadline_s
        self._dead_letter_topic = subscription.dead_letter_policy.dead_letter_topic or None
        held.count_deliveries = self._dead_letter_topic is None
        self._tasks = [
            self._spawn(self._pull_loop(), f"pubsub-pull-{number}")
            for number in range(self._spec.pullers)
        ]
        self._tasks += [
            self._spawn(held.send_when_settled(), "pubsub-ack"),
            self._spawn(held.extend_deadlines(), "pubsub-extend"),
        ]
        self._log.info(
            "pubsub_watcher_started",
            topic=subscription.topic,
            ack_deadline_s=held.ack_deadline_s,
            dead_letter_topic=self._dead_letter_topic,
            max_deliveries=None if self._dead_letter_topic else self._spec.max_deliveries,
        )

    async def leave(self, reader: Reader) -> None:
        if self._readers.get(reader.spec.key) is not reader:
            return
        if len(self._readers) == 1:
            await self.close()
        self._drop(reader)

    def _drop(self, reader: Reader) -> None:
        """Stop handing ``reader`` messages; those of its events not yet acked are nacked."""
        del self._readers[reader.spec.key]
        unacked, reader.unacked = reader.unacked, {}
        reader.free_slots()
        for held in unacked.values():
            held.event_done()
            held.redeliver = True
            self._settle(held)

    async def close(self) -> None:
        """Stop pulling, send the acks due, nack what is held, close the clients."""
        if self._closed:
            return
        self.done = self._closed = True
        *pulls, settle_loop, extend_loop = self._tasks
        await cancel_and_wait(pulls)
        try:
            async with asyncio.timeout(CLEANUP_TIMEOUT_S):
                await cancel_and_wait([settle_loop, extend_loop])
                self._held.nack_all()
                await self._held.send_settled()
        except TimeoutError:
            self._log.warning("pubsub_cleanup_timed_out", acks=self._held.acks_due)
        finally:
            if self._clients is not None:
                await self._clients.aclose()
        self._log.info("pubsub_watcher_stopped")

    # -- pulling and handing out

    async def _pull_loop(self) -> None:
        await all_joined(self._joined, lambda: self._expected() - set(self._readers))
        while True:
            response = await self._call_retrying(
                "pull",
                subscription=self._subscription,
                max_messages=self._spec.max_messages,
                call_timeout_s=PULL_TIMEOUT_S,
                empty_on_deadline=True,
            )
            now = datetime.now(UTC)
            for reader in self._readers.values():
                reader.stats.last_poll_at = now
            received = [] if response is None else type(response).pb(response).received_messages
            if not received:
                self._set_lag()
                continue
            held = [self._held.hold(message) for message in received]
            if self._expected() - set(self._readers):
                for entry in held:
                    entry.missed = True  # a watcher of the subscription is not running now
            self._set_lag()
            for reader in list(self._readers.values()):
                await self._hand(reader, received, held)
            for entry in held:
                entry.dispatching = False
                self._settle(entry)

    async def _hand(self, reader: Reader, received: Any, held: list[Held]) -> None:
        reader.stats.received += len(held)
        for message, entry in zip(received, held, strict=True):
            if reader.failed:
                entry.missed = True  # it stopped: the message comes back for its next instance
                continue
            token = object()
            event = await self._event_of(reader, message, entry, self._ack_of(reader, token, entry))
            if event is None:
                continue
            await reader.slots.acquire()
            if self._readers.get(reader.spec.key) is not reader:
                entry.redeliver = True  # it left meanwhile: the message comes back for it
                continue
            entry.event_handed_out()
            reader.unacked[token] = entry
            reader.events.put_nowait(event)

    async def _event_of(
        self, reader: Reader, message: Any, entry: Held, ack: Callable[[], Awaitable[None]]
    ) -> TriggerEvent | None:
        """The reader's event of ``message``; ``None`` when filtered, failing again, or when
        the reader failed on it (its schema registry does not answer: left to its deadline)."""
        key = dedup_key(self._name, message.message)
        timestamp = message.message.publish_time
        sent_at = timestamp.seconds + timestamp.nanos / 1e9
        payload = message_payload(message)
        data, attributes = message.message.data, message.message.attributes
        decoding = reader.spec.decode(
            payload, data, cloudevents.PUBSUB, attributes.items() if len(attributes) else (), None
        )
        decoded = await decoded_for(reader, decoding, payload, self._log)
        if decoded is None:
            entry.missed = True
            return None
        payload, cloudevent, unreadable = decoded
        if unreadable is not None:  # a dead letter at once: it stays unreadable
            reader.stats.dead_lettered += 1
            return TriggerEvent.of_decoded_json(
                payload, dedup_key=key, ack=ack, sent_at=sent_at, dead_letter=unreadable
            )
        try:
            prepared = reader.spec.prepare(payload)
        # A user's apply_function may raise anything: a bad message must not stop the watcher;
        # it is nacked, then dead-lettered with the reason.
        except Exception as error:  # noqa: BLE001
            reader.stats.failed += 1
            reason = self._give_up(entry, error)
            if reason is None:
                entry.redeliver = True
                return None
            reader.stats.dead_lettered += 1
            return TriggerEvent.of_decoded_json(
                payload, dedup_key=key, ack=ack, sent_at=sent_at, dead_letter=reason
            )
        if prepared is None:
            reader.stats.filtered += 1
            return None
        reader.stats.events += 1
        payload, partition_key = prepared
        # prepare() checked what an apply_function returned: the rest is decoded JSON.
        event = TriggerEvent.of_decoded_json(
            payload, dedup_key=key, ack=ack, partition_key=partition_key, sent_at=sent_at
        )
        return cloudevents.with_cloudevent(event, cloudevent)

    def _ack_of(self, reader: Reader, token: object, entry: Held) -> Callable[[], Awaitable[None]]:
        async def ack() -> None:
            if reader.unacked.pop(token, None) is None:
                return  # acked already, or its reader left and the message comes back for it
            entry.event_done()
            self._settle(entry)

        return ack

    def _give_up(self, entry: Held, error: Exception) -> str | None:
        """The dead-letter reason once the message has failed ``max_deliveries`` times here;
        ``None`` while it is to be delivered again (always, under a dead-letter policy)."""
        deliveries = self._held.deliveries(entry.message_id)
        self._log.warning(
            "pubsub_message_failed",
            message_id=entry.message_id,
            deliveries=deliveries or None,
            dead_letter_topic=self._dead_letter_topic,
            error=f"{type(error).__name__}: {error}",
        )
        if self._dead_letter_topic is not None or deliveries < self._spec.max_deliveries:
            return None
        return (
            f"{type(error).__name__}: {error} (delivered {deliveries} times, "
            f"max_deliveries={self._spec.max_deliveries})"
        )

    def _settle(self, entry: Held) -> None:
        """Once every reader is done with the message: ack it, nack it, or let it lapse."""
        if self._held.settle(entry):
            self._set_lag()

    def _set_lag(self) -> None:
        for reader in self._readers.values():
            reader.stats.lag = len(self._held)

    # -- calls, and the tasks making them

    async def _call_retrying(
        self,
        method: str,
        *,
        call_timeout_s: float = CALL_TIMEOUT_S,
        empty_on_deadline: bool = False,
        **request: Any,
    ) -> Any:
        """Call the subscriber, retrying with backoff while Pub/Sub is away; a missing
        subscription is a :class:`MissingSubscription`."""
        exceptions = require("google.api_core.exceptions", "pubsub")
        assert self._clients is not None  # noqa: S101 - set by open() before any call
        call = getattr(self._clients.subscriber, method)
        backoff = Backoff(max_s=BACKOFF_MAX_S)
        while True:
            try:
                return await call(request=request, retry=None, timeout=call_timeout_s)
            except exceptions.NotFound:
                raise missing(self._subscription) from None
            except exceptions.GoogleAPICallError as error:
                if empty_on_deadline and isinstance(error, exceptions.DeadlineExceeded):
                    return None  # a pull that found nothing in its time
                if not is_transient(error):
                    raise
                self._log.warning(
                    "pubsub_call_retry", call=method, error=f"{type(error).__name__}: {error}"
                )
                await backoff.wait()

    def _fail_readers(self, error: BaseException) -> None:
        self.done = True  # its readers fail; the next to join opens a new puller
        super()._fail_readers(error)
