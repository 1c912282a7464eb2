"""RabbitMQ watcher: ``RabbitMqTrigger``, its ``amqp://`` URIs, the producer behind ``triggerer
post rabbitmq`` and the provider.

The consumer that reads a queue (shared by the queue's watchers in the daemon, reconnecting
after a broker restart) lives in :mod:`watchers.rabbitmq.consumer`; which of its readers has read
which message, in :mod:`watchers.rabbitmq.readers`; connecting and declaring, in
:mod:`watchers.rabbitmq.client`. The client, aio-pika (the ``rabbitmq`` extra), is imported when
a trigger runs or a message is sent.
"""

from __future__ import annotations

import hashlib
import json
import time
import uuid
from collections.abc import AsyncIterator, Iterable
from datetime import datetime
from decimal import Decimal
from typing import TYPE_CHECKING, Any

from triggerer.providers import Provider
from watchers.clients import require
from watchers.first_start import first_start, started_key
from watchers.payloads import decode_body
from watchers.processing import Processing, check_range
from watchers.rabbitmq import consumer as rabbitmq_consumer
from watchers.rabbitmq.address import checkpoint_key, parse_rabbitmq_uri
from watchers.rabbitmq.client import connect, declared
from watchers.rabbitmq.readers import Reader, ReaderSpec, ReaderStats
from watchers.shared_readers import SharedReaderTrigger, shared_of_type

if TYPE_CHECKING:
    from aio_pika.abc import AbstractIncomingMessage

    from triggerer.triggers import TriggerEvent, WatchedAsset

STREAM_OFFSETS = ("first", "last", "next")
DEFAULT_READER_NAME = "triggerer"
"""The name a trigger run on its own reads as (in the daemon: one derived from its watcher)."""
#: Headers the broker changes on each delivery, left out of the payload.
_DELIVERY_HEADERS = frozenset({"x-delivery-count", "x-stream-offset"})


def message_payload(message: AbstractIncomingMessage) -> dict[str, Any]:
    """The event payload of a delivered message (the same on each delivery of it)."""
    headers = message.headers or {}
    stream_offset = headers.get("x-stream-offset")
    return {
        "body": decode_body(message.body),
        "message_id": message.message_id,
        "correlation_id": message.correlation_id,
        "content_type": message.content_type,
        "type": message.type,
        "app_id": message.app_id,
        "timestamp": None if message.timestamp is None else int(message.timestamp.timestamp()),
        "exchange": message.exchange,
        "routing_key": message.routing_key,
        "stream_offset": stream_offset if isinstance(stream_offset, int) else None,
        "headers": {
            name: _header_value(value)
            for name, value in headers.items()
            if name not in _DELIVERY_HEADERS
        },
    }


def watcher_reader_name(asset: WatchedAsset, watcher_name: str) -> str:
    """The name a watcher reads a stream queue as by default: ``triggerer-<watcher>-<digest>``,
    the digest of the asset's name and URI and the watcher's name (not of the options, so
    editing them keeps the stored offset)."""
    identity = json.dumps([asset.name, asset.uri, watcher_name]).encode()
    return f"triggerer-{watcher_name}-{hashlib.sha256(identity).hexdigest()[:12]}"


def _header_value(value: Any) -> Any:
    """A header as JSON: text and numbers as they are, bytes decoded like the body, tables and
    arrays item by item, anything else (a timestamp, a decimal) as text."""
    if value is None or isinstance(value, str | bool | int):
        return value
    if isinstance(value, float):
        return value if value == value and abs(value) != float("inf") else str(value)
    if isinstance(value, bytes | bytearray):
        return decode_body(bytes(value))
    if isinstance(value, dict):
        return {str(k): _header_value(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_header_value(v) for v in value]
    if isinstance(value, datetime | Decimal):
        return str(value)
    return str(value)


class RabbitMqTrigger(SharedReaderTrigger):
    """Yield one event per message of a RabbitMQ queue, acked after the event is stored.

    ``queue`` is ``amqp://HOST[:5672]/VHOST/QUEUE`` (``%2F`` for the default vhost ``/``;
    ``amqps://`` for TLS); the queue must exist. The payload is ``{"body", "message_id",
    "correlation_id", "content_type", "type", "app_id", "timestamp", "exchange", "routing_key",
    "stream_offset", "headers"}``; the dedup key ``<vhost>/<queue>/<message_id>`` (the
    publisher's id), ``<vhost>/<queue>@<offset>@<timestamp or body digest>`` for a stream
    queue's message without one, else none (at least once). ``value_format`` (``"json"``, the
    default, or ``"avro"``, ``"protobuf"``, ``"json_schema"`` with ``schema_registry``) decodes
    the body (:mod:`watchers.schemas.decoding`): one that cannot be decoded is a dead letter at
    once; a registry that does not answer fails the watcher, the message held unacked for it.
    ``filter`` is checked on the payload, then ``apply_function`` (dotted path to a plain
    function) may replace it (``None``: dropped); a dropped message is acked.
    ``partition_key_path`` picks the partition key from the final payload.

    At most ``prefetch`` messages are delivered and not yet acked. A message whose processing
    raises goes back to the queue (nack); once delivered ``max_deliveries`` times (the broker's
    ``x-delivery-count`` of a quorum queue, else counted by the watcher) it goes to the
    dead-letter table and is acked, or, with ``broker_dead_letters=True``, is rejected to the
    queue's own dead-letter exchange. A quorum queue's ``x-delivery-limit`` below
    ``max_deliveries`` dead-letters it first. ``stream_offset`` (``first``, ``last``, ``next``
    or an offset) is where a stream queue is read from the first time; ``next`` (or none, the
    default) means the messages published since the watcher first started, which it stores
    (:mod:`watchers.first_start`) before it looks for the queue. Each event of a stream
    queue's message carries its offset, which the daemon stores with the event under
    ``reader_name`` (by default derived from the watcher, :meth:`for_watcher`; ``reads_as``
    shows it), and a watcher (re)connecting reads on from there. Credentials come from the named
    ``connection`` (``login``, ``password``, ``ssl``, ``ssl_cafile``, ``ssl_certfile``,
    ``ssl_keyfile``), else guest/guest.

    In the daemon, the triggers of one queue share one consumer: each sees every message, acked
    once every watcher of the queue is done with it (held, unacked, while a watcher the daemon
    runs is not running at the moment). The consumer's options (``prefetch``,
    ``max_deliveries``, ``broker_dead_letters``, ``stream_offset``) are those of the queue's
    first watcher.
    """

    _stats: ReaderStats

    shareable = True

    def __init__(
        self,
        queue: str,
        *,
        prefetch: int = 100,
        filter: dict[str, Any] | None = None,
        apply_function: str | None = None,
        partition_key_path: str | None = None,
        max_deliveries: int = 5,
        broker_dead_letters: bool = False,
        stream_offset: str | int | None = None,
        reader_name: str | None = None,
        connection: str | None = None,
        value_format: str = "json",
        schema_registry: str | None = None,
    ) -> None:
        self.location = parse_rabbitmq_uri(queue)
        check_range("prefetch", prefetch, 1, 65_535)
        check_range("max_deliveries", max_deliveries, 1, 1_000)
        if not isinstance(broker_dead_letters, bool):
            raise ValueError(f"broker_dead_letters={broker_dead_letters!r} must be true or false")
        if stream_offset is not None and not (
            stream_offset in STREAM_OFFSETS
            or (
                isinstance(stream_offset, int)
                and not isinstance(stream_offset, bool)
                and stream_offset >= 0
            )
        ):
            raise ValueError(
                f"stream_offset={stream_offset!r} must be one of {', '.join(STREAM_OFFSETS)} "
                "or an offset (an integer >= 0)"
            )
        if reader_name is not None and (not isinstance(reader_name, str) or not reader_name):
            raise ValueError(
                f"reader_name={reader_name!r} must be non-empty text; leave it out for the "
                "watcher's own"
            )
        if connection is not None and (not isinstance(connection, str) or not connection):
            raise ValueError(f"connection={connection!r} must name a [connections.NAME] section")
        self._kwargs: dict[str, Any] = {
            "queue": queue,
            "prefetch": prefetch,
            "filter": filter,
            "apply_function": apply_function,
            "partition_key_path": partition_key_path,
            "max_deliveries": max_deliveries,
            "broker_dead_letters": broker_dead_letters,
            "stream_offset": stream_offset,
            "reader_name": reader_name,
            "connection": connection,
            "value_format": value_format,
            "schema_registry": schema_registry,
        }
        self._processing = Processing.of_kwargs(self._kwargs)
        self._stats = ReaderStats()
        self._reader: Reader | None = None

    @property
    def reader(self) -> str:
        """The name its place in a stream queue is stored under."""
        return self._kwargs["reader_name"] or DEFAULT_READER_NAME

    @property
    def reads_as(self) -> str | None:
        """:attr:`reader`, once the queue is known to be a stream queue (``stream_offset``
        given, or a stream message read): other queues keep no place for it."""
        if self._kwargs["stream_offset"] is None and not self._stats.stream:
            return None
        return self.reader

    def for_watcher(self, asset: WatchedAsset, watcher_name: str) -> RabbitMqTrigger:
        """This trigger keeping its place in a stream queue under a name of the watcher's own,
        unless ``reader_name`` is set."""
        if self._kwargs["reader_name"] is not None:
            return self
        kwargs = {**self._kwargs, "reader_name": watcher_reader_name(asset, watcher_name)}
        return RabbitMqTrigger(**kwargs)

    def reader_spec(self) -> ReaderSpec:
        """What the queue's consumer needs of this trigger."""
        kwargs = self._kwargs
        return ReaderSpec(
            queue=self.location,
            connection=kwargs["connection"],
            key=self.reader_key,
            payload=message_payload,
            decode=self._processing.decoded,
            prepare=self._processing.prepare,
            checkpoint_key=checkpoint_key(self.location, self.reader),
            **self.options(rabbitmq_consumer.CONSUMER_OPTIONS),
        )

    # Counters since the trigger was made: SharedReaderTrigger's and these.

    @property
    def acked(self) -> int:
        """Events acked (after their commit)."""
        return self._stats.acked

    @property
    def reconnects(self) -> int:
        """Connections lost and made again."""
        return self._stats.reconnects

    async def run(self) -> AsyncIterator[TriggerEvent]:
        await self.cleanup()
        self._processing.load()
        # On its own (outside the daemon), the trigger has a consumer of its own.
        consumers = rabbitmq_consumer.current() or rabbitmq_consumer.Consumers()
        first = None
        if self._kwargs["stream_offset"] in rabbitmq_consumer.NEW_MESSAGES:
            first = await first_start(started_key(checkpoint_key(self.location, self.reader) + "/"))
            if first.now:
                # Stored before the queue is looked for: a stream queue declared later is
                # read from this time on.
                yield first.checkpoint()
        reader = self._reader = await consumers.join(
            self.reader_spec(),
            self._stats,
            first_started_ms=None if first is None else first.at_ms,
        )
        while True:
            yield await reader.next_event()


# -- the RabbitMQ provider: amqp:// URIs, the producer, and the consumers triggers share


async def send(uri: str, bodies: Iterable[str], connection: str | None = None) -> list[str]:
    """Publish each of ``bodies`` to the queue at ``uri`` through the default exchange:
    persistent, with a new ``message_id`` (returned, in order), each confirmed by the broker.
    A queue that does not exist is a ``LookupError`` naming it."""
    aio_pika = require("aio_pika", "rabbitmq")
    queue = parse_rabbitmq_uri(uri)
    opened = await connect(queue, connection)
    async with opened:
        channel = await opened.channel(publisher_confirms=True)
        await declared(channel, queue)
        sent = []
        for body in bodies:
            message_id = str(uuid.uuid4())
            await channel.default_exchange.publish(
                aio_pika.Message(
                    body.encode(),
                    message_id=message_id,
                    delivery_mode=aio_pika.DeliveryMode.PERSISTENT,
                    content_type="application/json" if _is_json(body) else "text/plain",
                    timestamp=time.time(),
                ),
                routing_key=queue.name,
            )
            sent.append(message_id)
    return sent


def _is_json(text: str) -> bool:
    try:
        json.loads(text)
    except ValueError:
        return False
    return True


PROVIDER = Provider(
    name="rabbitmq",
    schemes=("amqp", "amqps"),
    trigger=lambda uri, **options: RabbitMqTrigger(queue=uri, **options),
    shared=shared_of_type(rabbitmq_consumer.Consumers, rabbitmq_consumer.sharing, RabbitMqTrigger),
    send=send,
)

# A stored trigger keeps its key: serialize() writes the classpath a store holds from before the
# package, ``watchers.rabbitmq.RabbitMqTrigger``.
RabbitMqTrigger.__module__ = "watchers.rabbitmq"
