"""KafkaTrigger: a consumer-group watcher that commits an offset only after its event is stored."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import AsyncGenerator, Iterable, Mapping
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Any

import anyio
import structlog
from aiokafka import AIOKafkaProducer, ConsumerRecord, TopicPartition
from aiokafka.errors import KafkaConnectionError, KafkaError
from aiokafka.helpers import create_ssl_context

from triggerer.backoff import Backoff
from triggerer.connections import get_connection
from triggerer.providers import Provider, SharedReaders
from triggerer.triggers import BaseEventTrigger, TriggerEvent, WatchedAsset
from watchers import cloudevents
from watchers.clients import check_settings
from watchers.filters import lookup
from watchers.kafka import fetcher as kafka_fetcher
from watchers.kafka.client import (
    BACKOFF_MAX_S,
    raise_unless_transient,
)
from watchers.payloads import decode_body
from watchers.processing import ADDED_LATER, UNREADABLE, CountingTrigger, Processing
from watchers.schemas.decoding import BodyFormat, Decoded
from watchers.schemas.registries import RegistryError
from watchers.uris import split_uri

if TYPE_CHECKING:
    from datetime import datetime


log = structlog.get_logger(__name__)

#: Settings a named connection may hold, passed to aiokafka as they are.
CONNECTION_KEYS = frozenset(
    {
        "security_protocol",
        "sasl_mechanism",
        "sasl_plain_username",
        "sasl_plain_password",
        "sasl_kerberos_service_name",
        "sasl_kerberos_domain_name",
        "client_id",
    }
)
#: Settings of a named connection that build the TLS context.
SSL_KEYS = frozenset({"ssl_cafile", "ssl_certfile", "ssl_keyfile", "ssl_password"})
AUTO_OFFSET_RESETS = ("earliest", "latest", "none")

_CLOSE_TIMEOUT_S = 10.0
_ERROR_HEADER_MAX_BYTES = 1000


@dataclasses.dataclass(eq=False, repr=False, kw_only=True)
class KafkaTrigger(CountingTrigger):
    """Yield one event per Kafka message of ``topics``, as a member of consumer group ``group_id``.

    The payload is ``{"topic", "partition", "offset", "key", "value", "timestamp", "headers"}``:
    ``key``, ``value`` and header values decoded (JSON, else text, else ``{"base64": ...}``),
    ``headers`` a mapping (the last value of a repeated header wins), ``timestamp`` in
    milliseconds since the epoch. ``filter`` (``{"path": "$.value.type", "equals": ...}``) is
    checked on that payload, then ``apply_function`` (dotted path) may replace it; a message
    filtered by either is acknowledged and counted in ``filtered``. A message whose processing
    raises ``max_attempts`` times goes to ``dead_letter_topic`` (default ``<topic>.dlq``) with
    the reason in its headers. Offsets are committed per partition up to the highest offset
    below which every message is acknowledged. ``connection`` names the SASL/TLS settings.

    ``value_format`` and ``key_format`` (``"json"``, the default, or ``"avro"``,
    ``"protobuf"``, ``"json_schema"``) decode values and keys written in Confluent's wire
    format (or AWS Glue's) with the writer's schema from ``schema_registry`` (a URL, or a
    connection's name): ``value`` and ``key`` are then the decoded records, and the payload
    gains ``schema_id`` (``key_schema_id``). A message that cannot be decoded is a dead letter
    in the daemon's table at once (not the dead-letter topic: decoding it again would fail
    again); a registry that does not answer fails the watcher, the message unacknowledged.
    A CloudEvent (:mod:`watchers.cloudevents`: ``ce_*`` headers, or a ``content-type`` of
    ``application/cloudevents+json``, or a JSON value with ``specversion``) is keyed by its
    ``source`` and ``id``; in binary mode its data is the value decoded by ``value_format``;
    a malformed one is a dead letter of the daemon's table at once.

    In the daemon, watchers without a ``group_id`` read through one shared consumer per
    cluster and consumer settings (:mod:`watchers.kafka.fetcher`): each topic is fetched once
    and every message handed to each watcher reading it, so watchers of one topic with
    different options each see every message, and idle watchers cost no polling of their own.
    Each such watcher keeps its place in the shared consumer group under a name of its own
    (:func:`watcher_group_id`, set by :meth:`for_watcher` with ``shared_fetch``), so editing
    its options keeps its place. Assets watching one identical trigger share its instance and
    the name of the first of their watchers (the asset registered first, then the watcher
    name). Run on its own, the trigger is a member of ``group_id``, by default
    ``triggerer-<topics>``. A watcher with an explicit ``group_id`` has a consumer of its own.
    """

    bootstrap_servers: str
    topics: list[str]
    group_id: str | None = None
    auto_offset_reset: str = "earliest"
    apply_function: str | None = None
    filter: dict[str, Any] | None = None
    partition_key_path: str | None = None
    dead_letter_topic: str | None = None
    max_attempts: int = 3
    #: Events yielded and not yet acknowledged before polling pauses (backpressure); enough to
    #: keep the daemon's ingest batches full while earlier ones are being committed.
    max_in_flight: int = 5000
    connection: str | None = None
    value_format: str = dataclasses.field(default="json", metadata=ADDED_LATER)
    key_format: str = dataclasses.field(default="json", metadata=ADDED_LATER)
    schema_registry: str | None = dataclasses.field(default=None, metadata=ADDED_LATER)
    session_timeout_ms: int = 10_000
    heartbeat_interval_ms: int = 3_000
    commit_interval_ms: int = 1_000
    #: How long the broker may hold a fetch that has no data yet (Kafka answers as soon as data
    #: arrives; a broker that does not, like the tansu test broker, adds up to this latency).
    fetch_max_wait_ms: int = 500
    #: Read through the daemon's shared consumer (when it runs in the daemon), ``group_id``
    #: naming this watcher's place there; set by :meth:`for_watcher`.
    shared_fetch: bool = False

    #: Its own counters: messages sent to the dead-letter topic, and acknowledgements that
    #: took effect.
    dead_lettered: int = dataclasses.field(default=0, init=False)
    acked: int = dataclasses.field(default=0, init=False)
    #: Messages whose key or value could not be decoded, or that are malformed CloudEvents
    #: (dead letters of the daemon's table).
    undecodable: int = dataclasses.field(default=0, init=False)

    _processing: Processing = dataclasses.field(init=False)
    _key_format: BodyFormat = dataclasses.field(init=False)
    _producer: AIOKafkaProducer | None = dataclasses.field(default=None, init=False)
    _reader: kafka_fetcher.Reader | None = dataclasses.field(default=None, init=False)

    shareable = True

    def __post_init__(self) -> None:
        if not self.topics or not all(isinstance(t, str) and t for t in self.topics):
            raise ValueError(f"KafkaTrigger topics={self.topics!r} must be a non-empty list")
        self.topics = list(self.topics)  # a tuple would not survive a JSON round trip as itself
        if self.group_id is not None and not self.group_id:
            raise ValueError(
                "KafkaTrigger group_id must not be empty; leave it out for the default"
            )
        if not self.bootstrap_servers:
            raise ValueError("KafkaTrigger bootstrap_servers must be 'host:port[,host:port]'")
        if self.auto_offset_reset not in AUTO_OFFSET_RESETS:
            raise ValueError(
                f"KafkaTrigger auto_offset_reset={self.auto_offset_reset!r} must be one of "
                f"{', '.join(AUTO_OFFSET_RESETS)}"
            )
        for name in ("max_attempts", "max_in_flight", "commit_interval_ms"):
            if getattr(self, name) < 1:
                raise ValueError(f"KafkaTrigger {name}={getattr(self, name)!r} must be >= 1")
        self._processing = _KafkaProcessing.of_trigger(self)
        self._key_format = BodyFormat(self.key_format, self.schema_registry, option="key_format")

    @property
    def consumer_group(self) -> str:
        """The consumer group in use: ``group_id``, else ``triggerer-<sorted topics>``."""
        return self.group_id or "triggerer-" + ",".join(sorted(self.topics))

    @property
    def reads_as(self) -> str | None:
        """The Kafka consumer group its offsets are committed in: its own, or the shared
        consumer's once it reads through it (``None`` until then)."""
        if self._reader is not None:
            return self._reader.fetcher.group_id
        return None if self.shared_fetch else self.consumer_group

    def for_watcher(self, asset: WatchedAsset, watcher_name: str) -> KafkaTrigger:
        """This trigger reading through the daemon's shared consumer, its place named after the
        watcher, unless ``group_id`` is set."""
        if self.group_id is not None:
            return self
        return dataclasses.replace(
            self, group_id=watcher_group_id(asset, watcher_name), shared_fetch=True
        )

    def exclusive_sources(self) -> tuple[str, ...]:
        """Each topic within the consumer group: two different triggers reading one topic in one
        group split its partitions. None with the shared fetch, where each sees every message."""
        if self.shared_fetch:
            return ()
        return tuple(
            f"Kafka topic {topic!r} in consumer group {self.consumer_group!r} "
            f"at {self.bootstrap_servers}"
            for topic in sorted(self.topics)
        )

    @property
    def assignment(self) -> list[str]:
        """The partitions this member owns now, as ``topic/partition``."""
        return [] if self._reader is None else _names(set(self._reader.cursors))

    @property
    def lag(self) -> int | None:
        """Messages of the assigned partitions not yet done, as of the last poll; ``None`` while
        unknown (no partition assigned or fetched yet)."""
        by_partition = self.lag_by_partition
        return sum(by_partition.values()) if by_partition else None

    @property
    def lag_by_partition(self) -> dict[tuple[str, int], int]:
        """The lag of each assigned ``(topic, partition)`` as of the last poll (the parts of
        :attr:`lag`); empty while unknown."""
        return {} if self._reader is None else self._reader.lag_by_partition

    @property
    def last_poll_at(self) -> datetime | None:
        """When a broker last answered a fetch of the assigned partitions (aiokafka fetches in
        the background), an empty answer included."""
        return None if self._reader is None else self._reader.last_answer

    def consumer_settings(self) -> dict[str, Any]:
        """The options of this trigger's consumer (aiokafka's), but its group and topics."""
        return {
            "bootstrap_servers": self.bootstrap_servers,
            "auto_offset_reset": self.auto_offset_reset,
            "session_timeout_ms": self.session_timeout_ms,
            "heartbeat_interval_ms": self.heartbeat_interval_ms,
            "fetch_max_wait_ms": self.fetch_max_wait_ms,
            **security_options(self.connection),
        }

    def reader_spec(self) -> kafka_fetcher.ReaderSpec:
        """What a fetcher (the daemon's shared one, or its own) needs of this trigger."""
        return kafka_fetcher.ReaderSpec(
            topics=frozenset(self.topics),
            place=self.consumer_group,
            max_in_flight=self.max_in_flight,
            shared_key=kafka_fetcher.shared_key(self.serialize()[1]),
            consumer_settings=self.consumer_settings(),
            commit_interval_ms=self.commit_interval_ms,
        )

    async def run(self) -> AsyncGenerator[TriggerEvent, None]:
        await self.cleanup()  # a previous run's reader, when the daemon restarts this trigger
        self._processing.load()
        self._key_format.load()
        spec = self.reader_spec()
        shared = kafka_fetcher.current() if self.shared_fetch else None
        if shared is not None:
            reader = self._reader = await shared.join(spec)
        else:
            # A consumer of its own, a member of ``consumer_group``: a fetcher it alone reads.
            fetcher = kafka_fetcher.Fetcher.of(spec, group_id=spec.place)
            reader = self._reader = await fetcher.join(spec)
        messages = reader.messages
        while True:
            if not messages:
                await reader.wait()
            record, cursor = messages.popleft()
            ack = _Ack(self, cursor, record.offset)
            event = await self._handle(record, ack)
            if event is None:
                reader.done(cursor, record.offset)
            else:
                yield event

    async def cleanup(self) -> None:
        """Leave the fetcher (whose last reader commits what is acknowledged and stops its
        consumer), then stop the dead-letter producer; idempotent."""
        reader, self._reader = self._reader, None
        if reader is not None:
            await reader.fetcher.leave(reader)
        producer, self._producer = self._producer, None
        if producer is not None:
            with anyio.CancelScope(shield=True):
                await producer.stop()

    # -- handling one message

    async def _handle(self, record: ConsumerRecord[bytes, bytes], ack: _Ack) -> TriggerEvent | None:
        """The event of ``record``; a dead letter when it cannot be decoded or is a malformed
        CloudEvent (processing it again fails again); ``None`` once it is filtered or sent to
        the dead-letter topic."""
        self.messages += 1
        key_format = self._key_format
        try:
            # JSON, the default, is decoded here: no step through the event loop per message.
            key = (
                Decoded(decode_body(record.key))
                if key_format.plain
                else await key_format.decode(record.key)
            )
            if self._processing.body_format.plain:
                value = Decoded(decode_body(record.value))
                cloudevent = cloudevents.KAFKA.recognise(record.headers, record.value)
            else:
                value, cloudevent = await self._processing.read(
                    record.value, cloudevents.KAFKA, record.headers
                )
        except UNREADABLE as error:
            return self._undecodable(record, ack, str(error))
        except RegistryError:
            raise  # not the message's fault: the watcher fails, the message is read again
        # A decoding step's error none of them turned into a reason (a library's, a bug): the
        # message would fail again each time it is read, stalling its partition. A dead letter.
        except Exception as error:  # noqa: BLE001
            return self._undecodable(record, ack, f"{type(error).__name__}: {error}")
        try:
            event = self._process(record, ack, (key, value))
        # Processing runs user code (apply_function) that may raise anything: the message goes
        # to the dead-letter topic and the watcher carries on.
        except Exception as error:  # noqa: BLE001
            await self._dead_letter(record, error)
            return None
        if event is None:
            self.filtered += 1
            return None
        self.events += 1
        return cloudevents.with_cloudevent(event, cloudevent)

    def _process(
        self, record: ConsumerRecord[bytes, bytes], ack: _Ack, decoded: tuple[Decoded, Decoded]
    ) -> TriggerEvent | None:
        """The event of ``record``, ``None`` when filtered; the last error after max_attempts."""
        for _ in range(self.max_attempts - 1):
            try:
                return self._event(record, ack, decoded)
            except Exception:  # noqa: BLE001, S112 - user code may raise anything; tried again
                continue
        return self._event(record, ack, decoded)

    def _event(
        self, record: ConsumerRecord[bytes, bytes], ack: _Ack, decoded: tuple[Decoded, Decoded]
    ) -> TriggerEvent | None:
        payload = self._payload(record, *decoded)
        prepared = self._processing.prepare(payload)
        if prepared is None:
            return None
        result, partition_key = prepared
        # prepare() checked what an apply_function returned: the rest is decoded JSON.
        return TriggerEvent.of_decoded_json(
            result,
            dedup_key=dedup_key(record),
            ack=ack,
            partition_key=partition_key,
            sent_at=record.timestamp / 1000 if record.timestamp > 0 else None,
        )

    def _payload(
        self, record: ConsumerRecord[bytes, bytes], key: Decoded, value: Decoded
    ) -> dict[str, Any]:
        payload: dict[str, Any] = {
            "topic": record.topic,
            "partition": record.partition,
            "offset": record.offset,
            "key": key.value,
            "value": value.value,
            "timestamp": record.timestamp,
            "headers": {k: decode_body(v) for k, v in record.headers} if record.headers else {},
        }
        if value.schema_id is not None:
            payload["schema_id"] = value.schema_id
        if key.schema_id is not None:
            payload["key_schema_id"] = key.schema_id
        return payload

    def _undecodable(
        self, record: ConsumerRecord[bytes, bytes], ack: _Ack, reason: str
    ) -> TriggerEvent:
        """The dead letter of a message whose key or value cannot be decoded, or that is a
        malformed CloudEvent: its payload with both as ``value_format="json"`` gives them."""
        self.undecodable += 1
        log.warning(
            "kafka_message_undecodable",
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            error=reason,
        )
        payload = self._payload(
            record, Decoded(decode_body(record.key)), Decoded(decode_body(record.value))
        )
        return TriggerEvent.of_decoded_json(
            payload,
            dedup_key=dedup_key(record),
            ack=ack,
            sent_at=record.timestamp / 1000 if record.timestamp > 0 else None,
            dead_letter=reason,
        )

    async def _dead_letter(self, record: ConsumerRecord[bytes, bytes], error: Exception) -> None:
        topic = self.dead_letter_topic or f"{record.topic}.dlq"
        reason = f"{type(error).__name__}: {error}".encode()[:_ERROR_HEADER_MAX_BYTES]
        headers = [
            *record.headers,
            ("triggerer-error", reason),
            ("triggerer-attempts", str(self.max_attempts).encode()),
            ("triggerer-source", f"{record.topic}/{record.partition}/{record.offset}".encode()),
        ]
        log.warning(
            "kafka_message_dead_lettered",
            topic=record.topic,
            partition=record.partition,
            offset=record.offset,
            dead_letter_topic=topic,
            error=reason.decode(errors="replace"),
        )
        backoff = Backoff(max_s=BACKOFF_MAX_S)
        while True:
            try:
                producer = await self._dead_letter_producer()
                await producer.send_and_wait(topic, record.value, record.key, headers=headers)
            except KafkaError as exc:
                raise_unless_transient(exc)
                log.warning("kafka_dead_letter_retry", dead_letter_topic=topic, error=str(exc))
                await backoff.wait()
            else:
                self.dead_lettered += 1
                return

    async def _dead_letter_producer(self) -> AIOKafkaProducer:
        if self._producer is None:
            producer = AIOKafkaProducer(
                bootstrap_servers=self.bootstrap_servers, **security_options(self.connection)
            )
            try:
                await producer.start()
            except BaseException:
                await producer.stop()
                raise
            self._producer = producer
        return self._producer


@dataclasses.dataclass(frozen=True)
class _KafkaProcessing(Processing):
    """Kafka's steps, whose partition key is lenient: a path that leads nowhere gives no key,
    and a number (a float too) is its text. Kafka's watchers had this before the others shared
    :class:`Processing`, which dead-letters such a message; stored Kafka pipelines rely on it."""

    def partition_key(self, payload: Any) -> str | None:
        path = self.partition_key_path
        if path is None:
            return None
        value = lookup(payload, path)
        if isinstance(value, str | int | float) and not isinstance(value, bool):
            return str(value)
        return None


def security_options(connection: str | None) -> dict[str, Any]:
    """aiokafka's options of the named connection's SASL/TLS settings (none without one)."""
    if connection is None:
        return {}
    settings = get_connection(connection)
    check_settings(connection, settings, CONNECTION_KEYS | SSL_KEYS, "KafkaTrigger")
    options = {key: value for key, value in settings.items() if key in CONNECTION_KEYS}
    ssl = {key.removeprefix("ssl_"): value for key, value in settings.items() if key in SSL_KEYS}
    if ssl:
        options["ssl_context"] = create_ssl_context(**ssl)
    return options


class _Ack:
    """The ``ack`` of one event: marks its offset done for its reader, once."""

    __slots__ = ("_acked", "_cursor", "_offset", "_trigger")

    def __init__(self, trigger: KafkaTrigger, cursor: kafka_fetcher.Cursor, offset: int) -> None:
        self._trigger = trigger
        self._cursor = cursor
        self._offset = offset
        self._acked = False

    async def __call__(self) -> None:
        if not self._acked:
            self._acked = True
            if not self._cursor.gone:
                self._trigger.acked += 1
            self._cursor.reader.done(self._cursor, self._offset)


def dedup_key(record: ConsumerRecord[bytes, bytes]) -> str:
    """``<topic>/<partition>/<offset>@<timestamp>``: a message delivered again has the same key;
    a message of a recreated topic does not, though its offsets start again at 0.

    The offset alone names a message of one incarnation of the topic. A topic deleted and
    created again (or a broker that keeps topics in memory, restarted under a store that kept
    its events) reuses offsets, so the record's timestamp (milliseconds, set by the producer or
    the broker) tells the incarnations apart: messages at one offset of two incarnations would
    need to be stamped in the same millisecond.
    """
    return f"{record.topic}/{record.partition}/{record.offset}@{record.timestamp}"


def watcher_group_id(asset: WatchedAsset, watcher_name: str) -> str:
    """The default consumer group of a watcher: ``triggerer-<watcher name>-<digest>``.

    The digest of the asset's name and URI and the watcher's name keeps watchers of the same
    name on different assets apart; none of the trigger's options take part, so editing them
    keeps the group and its committed offsets.
    """
    identity = json.dumps([asset.name, asset.uri, watcher_name]).encode()
    return f"triggerer-{watcher_name}-{hashlib.sha256(identity).hexdigest()[:12]}"


def _names(tps: set[TopicPartition]) -> list[str]:
    return sorted(f"{tp.topic}/{tp.partition}" for tp in tps)


# -- the Kafka provider: kafka:// URIs, and the consumers its triggers share in one daemon

DEFAULT_KAFKA_PORT = 9092
_KAFKA_FORM = "kafka://host:port[,host:port]/topic[,topic]"


def parse_kafka_uri(uri: str) -> tuple[str, list[str]]:
    """The bootstrap servers (``host:port,...``) and topics of a ``kafka://`` URI."""
    parts, _ = split_uri(uri, kind="Kafka", form=_KAFKA_FORM, schemes=("kafka",))
    topics = [topic for topic in parts.path.strip("/").split(",") if topic]
    if not parts.netloc or not topics or "/" in parts.path.strip("/"):
        raise ValueError(f"Kafka URI {uri!r} must have the form {_KAFKA_FORM}")
    servers = []
    for server in parts.netloc.split(","):
        host, _, port = server.rpartition(":") if ":" in server else (server, "", "")
        if not host or (port and not port.isdigit()):
            raise ValueError(
                f"Kafka URI {uri!r}: bootstrap server {server!r} must be host or host:port"
            )
        servers.append(f"{host}:{port or DEFAULT_KAFKA_PORT}")
    return ",".join(servers), topics


def _trigger_of_uri(uri: str, **options: Any) -> KafkaTrigger:
    servers, topics = parse_kafka_uri(uri)
    return KafkaTrigger(bootstrap_servers=servers, topics=topics, **options)


async def send(
    uri: str,
    bodies: Iterable[str],
    connection: str | None = None,
    *,
    key: str | None = None,
    headers: Mapping[str, str] | None = None,
) -> list[str]:
    """Produce each body as one message to the topic of ``uri``, which must exist, with ``key``
    and ``headers`` when given; ``<topic>/<partition>/<offset>`` of each, in order."""
    servers, topics = parse_kafka_uri(uri)
    if len(topics) != 1:
        raise ValueError(f"Kafka URI {uri!r} must name one topic to send to, not {len(topics)}")
    [topic] = topics
    header_list = [(name, value.encode()) for name, value in (headers or {}).items()]
    producer = AIOKafkaProducer(
        bootstrap_servers=servers, acks="all", **security_options(connection)
    )
    try:
        await producer.start()
        metadata = await producer.client.fetch_all_metadata()
        if topic not in metadata.topics():
            raise LookupError(
                f"Kafka topic {topic!r} does not exist on {servers}; "
                f"existing topics: {', '.join(sorted(metadata.topics())) or 'none'}"
            )
        futures = [
            await producer.send(
                topic,
                body.encode(),
                key=None if key is None else key.encode(),
                headers=header_list or None,
            )
            for body in bodies
        ]
        records = [await future for future in futures]
    except KafkaConnectionError:
        raise ConnectionError(f"cannot reach a Kafka broker at {servers}") from None
    except KafkaError as error:
        raise ConnectionError(f"Kafka at {servers}, topic {topic!r}: {error}") from None
    finally:
        await producer.stop()  # also after a failed start: it closes the client's connections
    return [f"{topic}/{record.partition}/{record.offset}" for record in records]


class _SharedConsumers(SharedReaders):
    """The daemon's Kafka consumers, one per cluster and consumer settings
    (:mod:`watchers.kafka.fetcher`), read by the KafkaTriggers made for watchers."""

    def __init__(self, deployment: str) -> None:
        self._fetchers = kafka_fetcher.Fetchers(kafka_fetcher.group_prefix(deployment))

    def sharing(self) -> AbstractContextManager[None]:
        return kafka_fetcher.sharing(self._fetchers)

    def keep(self, triggers: Iterable[BaseEventTrigger]) -> None:
        self._fetchers.keep(
            {
                trigger.consumer_group
                for trigger in triggers
                if isinstance(trigger, KafkaTrigger) and trigger.shared_fetch
            }
        )


PROVIDER = Provider(
    name="kafka", schemes=("kafka",), trigger=_trigger_of_uri, shared=_SharedConsumers, send=send
)

# A stored trigger keeps its key: serialize() writes the classpath a store holds from before the
# package, ``watchers.kafka.KafkaTrigger`` (the one migration 0004 names). Set once the class is
# made, as the dataclass decorator reads the annotations in the module that defines the class.
KafkaTrigger.__module__ = "watchers.kafka"
