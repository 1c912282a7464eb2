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
from collections import deque
from collections.abc import AsyncIterator, Callable, Iterable, Iterator
from typing import TYPE_CHECKING, Any

import structlog

from triggerer.backoff import Backoff
from triggerer.providers import Provider, SharedReaders
from triggerer.triggers import BaseEventTrigger, TriggerEvent, WatchedAsset
from watchers import nats_client
from watchers.clients import require
from watchers.filters import PayloadFilter, lookup
from watchers.nats_pull import Pull, PullEnded
from watchers.payloads import decode_body, import_callable

if TYPE_CHECKING:
    from datetime import datetime

    from nats.aio.client import Client
    from nats.aio.msg import Msg

log = structlog.get_logger(__name__)

BACKOFF_MAX_S = 5.0
#: How often the consumer's pending counts are read to correct :attr:`NatsTrigger.lag`.
LAG_INTERVAL_S = 30.0
DELIVER_POLICIES = ("all", "new")
ADVISORY_SUBJECT = "$JS.EVENT.ADVISORY.CONSUMER.MAX_DELIVERIES.{stream}.{durable}"
_ACK = b"+ACK"
_NAK = b"-NAK"
_IN_PROGRESS = b"+WPI"
_DURABLE_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")
_DEPLOYMENT: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "nats_deployment", default=None
)


@dataclasses.dataclass(eq=False, repr=False, kw_only=True)
class NatsTrigger(BaseEventTrigger):
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
    (``TriggerEvent.dead_letter``) and acked once stored. The consumer's ``max_deliver`` is
    ``max_deliveries`` too: a message the server stops delivering without an ack (the daemon
    stopped during each of its deliveries) is announced by its max-deliveries advisory, read
    from the stream and dead-lettered. The stream must exist; a missing one is the watcher's
    error. Credentials and TLS come from the named ``connection``.

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

    #: Counters for the daemon's ``/watchers``: messages received, events yielded, messages
    #: filtered, deliveries whose processing raised, dead letters yielded, acks sent.
    messages: int = dataclasses.field(default=0, init=False)
    events: int = dataclasses.field(default=0, init=False)
    filtered: int = dataclasses.field(default=0, init=False)
    failed: int = dataclasses.field(default=0, init=False)
    dead_lettered: int = dataclasses.field(default=0, init=False)
    acked: int = dataclasses.field(default=0, init=False)

    _client: Client | None = dataclasses.field(default=None, init=False)
    _lag: int | None = dataclasses.field(default=None, init=False)
    # The stream's creation time (ns since the epoch) and the durable's, read at connection.
    _created_ns: int = dataclasses.field(default=0, init=False)
    _consumer_created: datetime | None = dataclasses.field(default=None, init=False)
    _pull: Pull | None = dataclasses.field(default=None, init=False)
    # Received and not acked yet: stream sequence -> the reply subject its acks go to.
    _unacked: dict[int, str] = dataclasses.field(default_factory=dict, init=False)
    _room: asyncio.Event = dataclasses.field(default_factory=asyncio.Event, init=False)
    _advisories: deque[dict[str, Any]] = dataclasses.field(default_factory=deque, init=False)
    _keepalive: asyncio.Task[None] | None = dataclasses.field(default=None, init=False)

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
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"NatsTrigger {name}={value!r} must be an integer >= 1")
        if self.filter is not None:
            PayloadFilter.from_option(self.filter)
        if self.partition_key_path is not None:
            lookup(None, self.partition_key_path)
        if self.apply_function is not None and "." not in self.apply_function:
            raise ValueError(
                f"apply_function={self.apply_function!r} must be a dotted path "
                "'package.module.function'"
            )

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
        apply = None
        if self.apply_function is not None:
            apply = import_callable(self.apply_function, option="apply_function")
        payload_filter = PayloadFilter.from_option(self.filter) if self.filter else None
        backoff = Backoff(max_s=BACKOFF_MAX_S)
        while True:
            try:
                client, pull = await self._open()
                backoff.attempt = 0
                async for event in self._read(client, pull, apply, payload_filter):
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
        self._unacked.clear()
        self._lag = None

    # -- connecting

    async def _open(self) -> tuple[Client, Pull]:
        """Connect, read the stream's creation time, create or update the durable, listen to its
        advisories; the pulls of the durable."""
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
            raise LookupError(
                f"NATS stream {self.stream!r} does not exist at {self.servers}: create it "
                f"(nats stream add {self.stream} --subjects '{self.subject}'); "
                "triggerer does not create streams"
            ) from None
        if created_ns != self._created_ns:
            # Advisories and unacked messages name sequences of the stream they came from (its
            # durable is gone with it), not of this one.
            self._advisories.clear()
            self._unacked.clear()
            self._created_ns = created_ns
        config = api.ConsumerConfig(
            durable_name=self.durable_name,
            filter_subject=self.subject,
            ack_policy=api.AckPolicy.EXPLICIT,
            ack_wait=float(self.ack_wait_s),
            max_deliver=self.max_deliveries,
            max_ack_pending=self.max_in_flight,
            deliver_policy=api.DeliverPolicy(self.deliver_policy),
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
        await client.subscribe(
            ADVISORY_SUBJECT.format(stream=self.stream, durable=self.durable_name),
            queue=self.durable_name,  # one instance of a deployment dead-letters each
            cb=self._advised,
        )
        pull = self._pull = Pull(
            client,
            self.stream,
            self.durable_name,
            batch=self.fetch_batch,
            expires_s=self.fetch_wait_s,
        )
        await pull.start()
        self._keepalive = asyncio.create_task(
            self._mark_in_progress(client), name=f"nats-in-progress-{self.durable_name}"
        )
        log.info(
            "nats_consumer_ready",
            stream=self.stream,
            durable=self.durable_name,
            stream_created_ns=self._created_ns,
        )
        return client, pull

    async def _closed(self) -> None:
        # A reader waiting for room or for messages finds the connection gone.
        self._room.set()
        if self._pull is not None:
            self._pull.wake()

    async def _close(self) -> None:
        keepalive, self._keepalive = self._keepalive, None
        if keepalive is not None:
            keepalive.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await keepalive
        self._pull = None
        client, self._client = self._client, None
        if client is not None and not client.is_closed:
            await client.close()

    async def _mark_in_progress(self, client: Client) -> None:
        """Every third of ``ack_wait_s``, tell the server each unacked message is in progress."""
        while True:
            await asyncio.sleep(self.ack_wait_s / 3)
            if not client.is_connected:
                return
            for reply in list(self._unacked.values()):
                await client.publish(reply, _IN_PROGRESS)

    async def _advised(self, message: Msg) -> None:
        self._advisories.append(json.loads(message.data))

    # -- reading

    async def _read(
        self,
        client: Client,
        pull: Pull,
        apply: Callable[..., Any] | None,
        payload_filter: PayloadFilter | None,
    ) -> AsyncIterator[TriggerEvent]:
        errors = require("nats.errors", "nats")
        lag_read_at = asyncio.get_running_loop().time()
        while True:
            while self._advisories:
                advisory = self._advisories.popleft()
                event = await self._given_up(client, advisory, apply, payload_filter)
                if event is not None:
                    yield event
            if len(self._unacked) >= self.max_in_flight:
                self._room.clear()
                await self._room.wait()
                if client.is_closed:
                    raise errors.ConnectionClosedError
                continue
            now = asyncio.get_running_loop().time()
            if now - lag_read_at > LAG_INTERVAL_S:
                lag_read_at = now
                info = await client.jetstream().consumer_info(self.stream, self.durable_name)
                if info.created != self._consumer_created:
                    # Made again (its stream too, maybe) since this connection read the
                    # stream's creation time: read it again.
                    raise PullEnded(f"the durable {self.durable_name!r} was created again")
                self._lag = (info.num_pending or 0) + (info.num_ack_pending or 0)
            messages = await pull.take(self.max_in_flight - len(self._unacked))
            self.polled()
            if not messages:
                self._lag = len(self._unacked)
                continue
            for message in messages:
                metadata = message.metadata
                sequence = metadata.sequence.stream
                self._unacked[sequence] = message.reply
                self._lag = metadata.num_pending + len(self._unacked)
                event = await self._handle(message, apply, payload_filter)
                if event is not None:
                    yield event

    async def _handle(
        self,
        message: Msg,
        apply: Callable[..., Any] | None,
        payload_filter: PayloadFilter | None,
    ) -> TriggerEvent | None:
        """The event (or dead letter) of ``message``; ``None`` once it is filtered or nakked."""
        self.messages += 1
        metadata = message.metadata
        sequence = metadata.sequence.stream
        ack = _Ack(self, sequence, message.reply)
        payload = message_payload(
            self.stream,
            message.subject,
            sequence,
            metadata.timestamp,
            message.data,
            message.headers,
        )
        try:
            event = self._event(
                payload, sequence, ack, apply, payload_filter, metadata.timestamp.timestamp()
            )
        # Processing runs user code (apply_function) that may raise anything: the message is
        # delivered again, and dead-lettered at its last delivery; the watcher carries on.
        except Exception as error:  # noqa: BLE001
            self.failed += 1
            delivered = metadata.num_delivered
            reason = (
                f"{type(error).__name__}: {error} (delivery {delivered} of max_deliveries="
                f"{self.max_deliveries})"
            )
            if delivered < self.max_deliveries:
                log.info(
                    "nats_message_failed",
                    key=dedup_key(self.stream, sequence, self._created_ns),
                    error=reason,
                )
                await ack.send(_NAK)
                return None
            return self._dead_letter(payload, sequence, ack, reason)
        if event is None:
            self.filtered += 1
            await ack()
            return None
        self.events += 1
        return event

    def _event(
        self,
        payload: dict[str, Any],
        sequence: int,
        ack: _Ack | None,
        apply: Callable[..., Any] | None,
        payload_filter: PayloadFilter | None,
        sent_at: float | None = None,
    ) -> TriggerEvent | None:
        if payload_filter is not None and not payload_filter.matches(payload):
            return None
        result: Any = payload
        make_event = TriggerEvent.of_decoded_json
        if apply is not None:
            result = apply(payload)
            if result is None:
                return None
            make_event = TriggerEvent  # checks that what the function returned is JSON
        partition_key = None
        if self.partition_key_path is not None:
            value = lookup(result, self.partition_key_path)
            if isinstance(value, str | int) and not isinstance(value, bool):
                partition_key = str(value)
            else:
                raise ValueError(
                    f"partition_key_path {self.partition_key_path!r} does not lead to a text "
                    "or integer value"
                )
        return make_event(
            result,
            dedup_key=dedup_key(self.stream, sequence, self._created_ns),
            ack=ack,
            partition_key=partition_key,
            sent_at=sent_at,
        )

    def _dead_letter(
        self, payload: dict[str, Any], sequence: int, ack: _Ack | None, reason: str
    ) -> TriggerEvent:
        self.dead_lettered += 1
        key = dedup_key(self.stream, sequence, self._created_ns)
        log.warning("nats_message_dead_lettered", key=key, durable=self.durable_name, error=reason)
        return TriggerEvent.of_decoded_json(payload, dedup_key=key, ack=ack, dead_letter=reason)

    async def _given_up(
        self,
        client: Client,
        advisory: dict[str, Any],
        apply: Callable[..., Any] | None,
        payload_filter: PayloadFilter | None,
    ) -> TriggerEvent | None:
        """The dead letter of a message the server stopped delivering (its max-deliveries
        advisory), read from the stream; ``None`` when this trigger holds it (its event is on
        its way) or the stream no longer has it (logged as lost)."""
        errors = require("nats.js.errors", "nats")
        sequence = int(advisory["stream_seq"])
        deliveries = int(advisory.get("deliveries", self.max_deliveries))
        key = dedup_key(self.stream, sequence, self._created_ns)
        if sequence in self._unacked:
            log.info("nats_max_deliveries_held", key=key, deliveries=deliveries)
            return None
        try:
            stored = await client.jetstream().get_msg(self.stream, sequence)
        except errors.NotFoundError:
            log.error("nats_message_lost", key=key, deliveries=deliveries)
            return None
        payload = message_payload(
            self.stream, stored.subject or "", sequence, stored.time, stored.data, stored.headers
        )
        reason = (
            f"NATS stopped delivering it after {deliveries} deliveries without an ack "
            f"(max_deliveries={self.max_deliveries})"
        )
        try:
            self._event(payload, sequence, None, apply, payload_filter)
        # As in _handle: user code may raise anything; its error joins the reason.
        except Exception as error:  # noqa: BLE001
            reason += f"; its processing raises {type(error).__name__}: {error}"
        return self._dead_letter(payload, sequence, None, reason)


class _Ack:
    """The ``ack`` of one event: acks its message, once, on the trigger's current connection
    (one made again after a broker restart acks it as well)."""

    __slots__ = ("_done", "_reply", "_sequence", "_trigger")

    def __init__(self, trigger: NatsTrigger, sequence: int, reply: str) -> None:
        self._trigger = trigger
        self._sequence = sequence
        self._reply = reply
        self._done = False

    async def __call__(self) -> None:
        if not self._done:
            await self.send(_ACK)
            self._trigger.acked += 1

    async def send(self, answer: bytes) -> None:
        """Send ``answer`` (an ack or a nak) once; a message answered by no connection is
        delivered again after ``ack_wait_s``, and its dedup key absorbs it."""
        if self._done:
            return
        self._done = True
        trigger = self._trigger
        if trigger._unacked.pop(self._sequence, None) is not None:
            trigger._room.set()
        client = trigger._client
        if client is None or not client.is_connected:
            log.info(
                "nats_ack_deferred",
                key=dedup_key(trigger.stream, self._sequence, trigger._created_ns),
            )
            return
        await client.publish(self._reply, answer)


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
