"""NatsTrigger: a durable JetStream pull consumer whose messages are acked only after their
events are stored. ``PROVIDER`` is the NATS provider (``nats://`` URIs, ``triggerer post nats``).
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import dataclasses
import hashlib
import json
import re
from collections.abc import AsyncIterator, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import structlog

from triggerer.backoff import Backoff
from triggerer.providers import Provider, SharedReaders
from triggerer.triggers import BaseEventTrigger, SourceMissing, TriggerEvent, WatchedAsset
from watchers import cloudevents
from watchers.clients import require
from watchers.first_start import FirstStart, first_start, started_key
from watchers.nats import client as nats_client
from watchers.nats.in_flight import InFlight, MessageAck
from watchers.nats.pull import Pull, PullEnded
from watchers.payloads import decode_body
from watchers.processing import ADDED_LATER, UNREADABLE, CountingTrigger, Processing, check_range
from watchers.redeliveries import DeliveredHere, delivered_here, redelivered_too_often

if TYPE_CHECKING:
    from datetime import datetime

    from nats.aio.client import Client
    from nats.aio.msg import Msg
    from nats.js.api import DeliverPolicy
    from nats.js.client import JetStreamContext

log = structlog.get_logger(__name__)

BACKOFF_MAX_S = 5.0
#: How often the consumer's pending counts are read to correct :attr:`NatsTrigger.lag`.
LAG_INTERVAL_S = 30.0
DELIVER_POLICIES = ("all", "new")
#: The durable's ``max_deliver``: the server never stops delivering a message; the trigger
#: dead-letters it past ``max_deliveries`` (a server that gave up would drop it).
UNLIMITED = -1
_DURABLE_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")
_DEPLOYMENT: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "nats_deployment", default=None
)


@dataclasses.dataclass(eq=False, repr=False, kw_only=True)
class NatsTrigger(CountingTrigger):
    """Yield one event per message of ``subject`` in JetStream stream ``stream``, read through
    the durable pull consumer ``durable`` (created, or updated, with ``subject`` as its filter).

    The payload is ``{"body", "subject", "stream", "sequence", "published_at", "headers"}``:
    ``body`` decoded (JSON, else text, else ``{"base64": ...}``), ``sequence`` the stream
    sequence, ``published_at`` the time the stream stored it (ISO 8601, UTC), ``headers`` as
    text. ``filter`` is checked on it, then ``apply_function`` (dotted path) may replace it;
    ``partition_key_path`` picks the partition key. The dedup key is
    ``<stream>/<sequence>@<stream created ns>``: the stream's creation time (read at each
    connection) tells a stream deleted and created again, whose sequences start over, apart.

    An event's message is acked once the daemon has stored it; until then it is marked in
    progress every third of ``ack_wait_s``, so the server does not redeliver it meanwhile. A
    filtered message is acked at once. A message whose processing raises is nakked (delivered
    again at once); on its ``max_deliveries``-th delivery it is yielded as a dead letter
    (``TriggerEvent.dead_letter``) and acked once stored. A message delivered more than
    ``max_deliveries`` times (the daemon stopped during each delivery, killed by it maybe) is
    yielded as a dead letter without being processed, once decoded (a schema registry that does
    not answer fails the watcher whatever the count), unless this process had it delivered
    before (its watcher failed, the process lived: :mod:`watchers.redeliveries`). The
    durable's ``max_deliver`` is unlimited (an existing durable is updated to it), so the server
    never gives up on a message on its own. The stream must exist; a missing one is the
    watcher's error. Credentials and TLS come from the named ``connection``.

    In the daemon, the durable is derived from the watcher (:func:`watcher_durable`), so each
    watcher of a subject sees every message and instances of one deployment share its work.
    """

    servers: str
    stream: str
    subject: str
    durable: str | None = None
    #: Where a new durable starts: every message the stream holds, or those stored from now on.
    deliver_policy: str = "all"
    ack_wait_s: float = 30.0
    max_deliveries: int = 5
    #: Messages asked for per pull.
    fetch_batch: int = 256
    #: How long a pull stays open waiting for messages (its ``expires``).
    fetch_wait_s: float = 5.0
    #: Messages received and not yet acked before pulling pauses (backpressure); the
    #: consumer's ``max_ack_pending`` as well.
    max_in_flight: int = 5000
    filter: dict[str, Any] | None = None
    apply_function: str | None = None
    partition_key_path: str | None = None
    connection: str | None = None
    value_format: str = dataclasses.field(default="json", metadata=ADDED_LATER)
    schema_registry: str | None = dataclasses.field(default=None, metadata=ADDED_LATER)

    #: Its own counters: deliveries whose processing raised, dead letters yielded (and
    #: :attr:`acked`).
    failed: int = dataclasses.field(default=0, init=False)
    dead_lettered: int = dataclasses.field(default=0, init=False)

    _client: Client | None = dataclasses.field(default=None, init=False)
    _lag: int | None = dataclasses.field(default=None, init=False)
    # The stream's creation time (ns since the epoch) and the durable's, read at connection.
    _created_ns: int = dataclasses.field(default=0, init=False)
    _consumer_created: datetime | None = dataclasses.field(default=None, init=False)
    _pull: Pull | None = dataclasses.field(default=None, init=False)
    _in_flight: InFlight = dataclasses.field(init=False)
    _delivered_here: DeliveredHere = dataclasses.field(init=False)
    _processing: Processing = dataclasses.field(init=False)

    shareable = True

    def __post_init__(self) -> None:
        where = f"NatsTrigger servers={self.servers!r}"
        self.servers = nats_client.check_servers(self.servers, where)
        nats_client.check_stream(self.stream, where)
        nats_client.check_subject(self.subject, where, wildcards=True)
        if self.durable is not None and (not self.durable or _DURABLE_UNSAFE.search(self.durable)):
            raise ValueError(
                f"NatsTrigger durable={self.durable!r} must be letters, digits, '-' and '_'"
            )
        if self.deliver_policy not in DELIVER_POLICIES:
            raise ValueError(
                f"NatsTrigger deliver_policy={self.deliver_policy!r} must be one of "
                f"{', '.join(DELIVER_POLICIES)}"
            )
        for name, low in (("ack_wait_s", 1), ("fetch_wait_s", 0.1)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or value < low:
                raise ValueError(f"NatsTrigger {name}={value!r} must be a number >= {low}")
        for name in ("max_deliveries", "fetch_batch", "max_in_flight"):
            check_range(f"NatsTrigger {name}", getattr(self, name), 1)
        self._processing = Processing.of_trigger(self)
        self._in_flight = InFlight(ack_wait_s=self.ack_wait_s, limit=self.max_in_flight)

    @property
    def durable_name(self) -> str:
        """The durable consumer in use: ``durable``, else one named after stream and subject."""
        if self.durable is not None:
            return self.durable
        digest = hashlib.sha256(self.subject.encode()).hexdigest()[:12]
        return f"triggerer-{self.stream}-{digest}"

    @property
    def reads_as(self) -> str | None:
        """The durable consumer it reads through."""
        return self.durable_name

    @property
    def acked(self) -> int:
        """Events acked (the counter of the daemon's ``/watchers``)."""
        return self._in_flight.acked

    @property
    def lag(self) -> int | None:
        """Messages of the consumer not yet delivered plus those received and not yet acked:
        from each message's metadata, corrected from the consumer's info every
        ``LAG_INTERVAL_S``; ``None`` until connected."""
        return self._lag

    def for_watcher(self, asset: WatchedAsset, watcher_name: str) -> NatsTrigger:
        """This trigger reading through a durable named after the watcher (and the daemon's
        deployment), unless ``durable`` is set."""
        if self.durable is not None:
            return self
        return dataclasses.replace(
            self, durable=watcher_durable(asset, watcher_name, _DEPLOYMENT.get())
        )

    def exclusive_sources(self) -> tuple[str, ...]:
        """The durable consumer: two different triggers reading through it split its messages."""
        return (
            f"NATS durable consumer {self.durable_name!r} of stream {self.stream!r} "
            f"at {self.servers}",
        )

    async def run(self) -> AsyncIterator[TriggerEvent]:
        await self.cleanup()  # a previous run's connection, when the daemon restarts it
        errors = require("nats.errors", "nats")
        self._processing.load()
        self._delivered_here = delivered_here(
            f"nats {self.servers} {self.stream} {self.durable_name}",
            self.max_in_flight + self.fetch_batch,
        )
        first = None
        if self.deliver_policy == "new":
            first = await first_start(started_key(f"nats/{self.stream}/{self.durable_name}/"))
            if first.now:
                # Stored before the stream is looked for: a stream created later is new.
                yield first.checkpoint()
        backoff = Backoff(max_s=BACKOFF_MAX_S)
        while True:
            try:
                client, pull = await self._open(first)
                backoff.attempt = 0
                async for event in self._read(client, pull):
                    yield event
            except (OSError, errors.Error, PullEnded) as error:
                retry_in_s = backoff.next_s()
                log.warning(
                    "nats_reconnecting",
                    stream=self.stream,
                    durable=self.durable_name,
                    error=f"{type(error).__name__}: {error}",
                    retry_in_s=round(retry_in_s, 2),
                )
                await self._close()
                await asyncio.sleep(retry_in_s)

    async def cleanup(self) -> None:
        """Close the connection (a message received and not acked is delivered again after
        ``ack_wait_s``); idempotent."""
        await self._close()
        self._in_flight.clear()
        self._lag = None

    # -- connecting

    async def _open(self, first: FirstStart | None) -> tuple[Client, Pull]:
        """Connect, read the stream's creation time, create or update the durable; the pulls of
        the durable. ``first``: when the watcher first started (``deliver_policy`` ``new``)."""
        errors = require("nats.js.errors", "nats")
        api = require("nats.js.api", "nats")
        address = nats_client.NatsAddress(self.servers, self.stream, self.subject)
        client = self._client = await nats_client.connect(
            address, self.connection, on_closed=self._closed
        )
        jetstream = client.jetstream()
        try:
            created_ns = await nats_client.stream_created_ns(client, self.stream)
        except errors.NotFoundError:
            raise SourceMissing(
                f"NATS stream {self.stream!r} does not exist at {self.servers}: create it "
                f"(nats stream add {self.stream} --subjects '{self.subject}'); "
                "triggerer does not create streams"
            ) from None
        if created_ns != self._created_ns:
            # Messages held name sequences of the stream they came from (its durable is gone
            # with it), not of this one.
            self._in_flight.forget()
            self._created_ns = created_ns
        config = api.ConsumerConfig(
            durable_name=self.durable_name,
            filter_subject=self.subject,
            ack_policy=api.AckPolicy.EXPLICIT,
            ack_wait=float(self.ack_wait_s),
            # A durable made by an earlier version (max_deliver=max_deliveries) is updated: the
            # server takes a new max_deliver for an existing durable.
            max_deliver=UNLIMITED,
            max_ack_pending=self.max_in_flight,
            deliver_policy=await self._durable_policy(jetstream, created_ns, first),
        )
        try:
            consumer = await jetstream.add_consumer(self.stream, config)
        except errors.BadRequestError as error:
            raise ValueError(
                f"NATS durable consumer {self.durable_name!r} of stream {self.stream!r} cannot "
                f"be created or updated for subject {self.subject!r}: {error.description} "
                f"(a subject outside the stream's, or a change the server does not allow: "
                f"nats consumer rm {self.stream} {self.durable_name})"
            ) from None
        self._consumer_created = consumer.created
        self._lag = (consumer.num_pending or 0) + (consumer.num_ack_pending or 0)
        pull = self._pull = Pull(
            client,
            self.stream,
            self.durable_name,
            batch=self.fetch_batch,
            expires_s=self.fetch_wait_s,
        )
        await pull.start()
        self._in_flight.connected(client, name=f"nats-in-progress-{self.durable_name}")
        log.info(
            "nats_consumer_ready",
            stream=self.stream,
            durable=self.durable_name,
            stream_created_ns=self._created_ns,
        )
        return client, pull

    async def _durable_policy(
        self, jetstream: JetStreamContext, created_ns: int, first: FirstStart | None
    ) -> DeliverPolicy:
        """The deliver policy of the durable: an existing durable's own (the server changes
        it for none), else ``deliver_policy``, but ``all`` for ``new`` on a stream created
        since the watcher first started: every message of such a stream is new to it (made
        after the watcher was deployed, maybe while the daemon was down)."""
        api = require("nats.js.api", "nats")
        errors = require("nats.js.errors", "nats")
        try:
            info = await jetstream.consumer_info(self.stream, self.durable_name)
        except errors.NotFoundError:
            if first is not None and not first.now and created_ns >= first.at_ms * 1_000_000:
                return api.DeliverPolicy.ALL  # type: ignore[no-any-return]  # an untyped client
            return api.DeliverPolicy(self.deliver_policy)  # type: ignore[no-any-return]
        return info.config.deliver_policy  # type: ignore[no-any-return]

    async def _closed(self) -> None:
        # A reader waiting for room or for messages finds the connection gone.
        self._in_flight.wake()
        if self._pull is not None:
            self._pull.wake()

    async def _close(self) -> None:
        await self._in_flight.disconnected()
        if self._pull is not None:
            # Delivered, not taken: they come back after the ack wait, counted once more.
            self._delivered_here.note(self._key_of(message) for message in self._pull.untaken())
        self._pull = None
        client, self._client = self._client, None
        if client is not None and not client.is_closed:
            await client.close()

    # -- reading

    async def _read(self, client: Client, pull: Pull) -> AsyncIterator[TriggerEvent]:
        lag_read_at = asyncio.get_running_loop().time()
        while True:
            await self._in_flight.room()
            now = asyncio.get_running_loop().time()
            if now - lag_read_at > LAG_INTERVAL_S:
                lag_read_at = now
                info = await client.jetstream().consumer_info(self.stream, self.durable_name)
                if info.created != self._consumer_created:
                    # Made again (its stream too, maybe) since this connection read the
                    # stream's creation time: read it again.
                    raise PullEnded(f"the durable {self.durable_name!r} was created again")
                self._lag = (info.num_pending or 0) + (info.num_ack_pending or 0)
            messages = await pull.take(self.max_in_flight - len(self._in_flight))
            self.polled()
            if not messages:
                self._lag = len(self._in_flight)
                continue
            # Noted before any is handled: a watcher failing on one leaves the others too.
            keys = [self._key_of(message) for message in messages]
            had = self._delivered_here.note(keys)
            for message, key, delivered_before in zip(messages, keys, had, strict=True):
                event = await self._handle(message, key, delivered_before=delivered_before)
                if event is not None:
                    yield event

    def _key_of(self, message: Msg) -> str:
        return dedup_key(self.stream, message.metadata.sequence.stream, self._created_ns)

    async def _handle(
        self, message: Msg, key: str, *, delivered_before: bool
    ) -> TriggerEvent | None:
        """The event (or dead letter) of ``message`` (of dedup key ``key``; this process had it
        delivered before, or not); ``None`` once it is filtered (and acked) or its processing
        raised (nakked, to be delivered again)."""
        self.messages += 1
        metadata = message.metadata
        sequence = metadata.sequence.stream
        delivered = metadata.num_delivered
        ack = self._in_flight.received(sequence, message.reply)
        self._lag = metadata.num_pending + len(self._in_flight)
        payload = message_payload(
            self.stream,
            message.subject,
            sequence,
            metadata.timestamp,
            message.data,
            message.headers,
        )
        headers = message.headers
        try:
            payload, cloudevent = await self._processing.decoded(
                payload, message.data, cloudevents.NATS, headers.items() if headers else ()
            )
        except UNREADABLE as error:
            return self._dead_letter(payload, key, ack, str(error))
        # Counted once the message is decoded: a registry that does not answer fails the
        # watcher above whatever the count, and each restart delivers the message again.
        too_often = redelivered_too_often(delivered, self.max_deliveries, had_here=delivered_before)
        if too_often is not None:
            return self._dead_letter(payload, key, ack, too_often)
        try:
            prepared = self._processing.prepare(payload)
        # Processing runs user code (apply_function) that may raise anything: the message is
        # delivered again, and dead-lettered at its last delivery; the watcher carries on.
        except Exception as error:  # noqa: BLE001
            self.failed += 1
            reason = (
                f"{type(error).__name__}: {error} (delivery {delivered} of max_deliveries="
                f"{self.max_deliveries})"
            )
            if delivered >= self.max_deliveries:
                return self._dead_letter(payload, key, ack, reason)
            log.info("nats_message_failed", key=key, error=reason)
            await ack.nak()
            return None
        if prepared is None:
            self.filtered += 1
            await ack()
            return None
        self.events += 1
        result, partition_key = prepared
        # prepare() checked what an apply_function returned: the rest is decoded JSON.
        event = TriggerEvent.of_decoded_json(
            result,
            dedup_key=key,
            ack=ack,
            partition_key=partition_key,
            sent_at=metadata.timestamp.timestamp(),
        )
        return cloudevents.with_cloudevent(event, cloudevent)

    def _dead_letter(
        self, payload: dict[str, Any], key: str, ack: MessageAck, reason: str
    ) -> TriggerEvent:
        self.dead_lettered += 1
        log.warning("nats_message_dead_lettered", key=key, durable=self.durable_name, error=reason)
        return TriggerEvent.of_decoded_json(payload, dedup_key=key, ack=ack, dead_letter=reason)


def message_payload(
    stream: str,
    subject: str,
    sequence: int,
    published: datetime | None,
    data: bytes | None,
    headers: dict[str, str] | None,
) -> dict[str, Any]:
    """The event payload of a stream's message."""
    payload: dict[str, Any] = {
        "body": decode_body(data or b""),
        "subject": subject,
        "stream": stream,
        "sequence": sequence,
        "published_at": None if published is None else published.isoformat(),
        "headers": dict(headers) if headers else {},
    }
    return payload


def dedup_key(stream: str, sequence: int, created_ns: int) -> str:
    """``<stream>/<stream sequence>@<stream created ns>``: the same for each delivery of a
    message, and another for a message of a stream of the same name created again (whose
    sequences start over)."""
    return f"{stream}/{sequence}@{created_ns}"


def watcher_durable(asset: WatchedAsset, watcher_name: str, deployment: str | None) -> str:
    """The durable consumer of a watcher: ``triggerer-<watcher name>-<digest>``.

    The digest of the deployment (the daemon's metadata database), the asset's name and URI and
    the watcher's name keeps watchers of one name on different assets apart, and deployments
    apart (instances of one deployment share the durable, and its work); none of the trigger's
    options take part, so editing them keeps the durable and its place.
    """
    identity = json.dumps([deployment, asset.name, asset.uri, watcher_name]).encode()
    name = _DURABLE_UNSAFE.sub("_", watcher_name)[:64]
    return f"triggerer-{name}-{hashlib.sha256(identity).hexdigest()[:12]}"


# -- the NATS provider


def _trigger_of_uri(uri: str, **options: Any) -> NatsTrigger:
    address = nats_client.parse_nats_uri(uri)
    return NatsTrigger(
        servers=address.servers, stream=address.stream, subject=address.subject, **options
    )


class _Deployment(SharedReaders):
    """Nothing is shared (each watcher has its durable, and the server fans messages out to
    each): the daemon's deployment is only made known, for the durable names."""

    def __init__(self, deployment: str) -> None:
        self._deployment = deployment

    @contextlib.contextmanager
    def _sharing(self) -> Iterator[None]:
        token = _DEPLOYMENT.set(self._deployment)
        try:
            yield
        finally:
            _DEPLOYMENT.reset(token)

    def sharing(self) -> contextlib.AbstractContextManager[None]:
        return self._sharing()

    def keep(self, triggers: Iterable[BaseEventTrigger]) -> None:
        """Nothing is held for a trigger."""


PROVIDER = Provider(
    name="nats",
    schemes=("nats",),
    trigger=_trigger_of_uri,
    send=nats_client.send,
    shared=_Deployment,
)

# A stored trigger keeps its key: serialize() writes the classpath a store holds from before the
# package, ``watchers.nats.NatsTrigger``. Set once the class is made, as the dataclass decorator
# reads the annotations in the module that defines the class.
NatsTrigger.__module__ = "watchers.nats"
