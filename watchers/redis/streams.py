"""RedisStreamTrigger: a Redis stream read in a consumer group, each entry acknowledged (XACK)
only after its event is stored; ``PROVIDER`` reads ``redis+stream://`` URIs. The group I/O
(reads, claims, acks) is :class:`~watchers.redis.stream_group.StreamGroupReader`'s."""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import AsyncGenerator, Iterable
from typing import Any

import structlog

from triggerer.backoff import Backoff
from triggerer.providers import Provider
from triggerer.triggers import TriggerEvent, WatchedAsset
from watchers import cloudevents, redeliveries
from watchers.clients import require
from watchers.first_start import FirstStart, first_start, started_key
from watchers.payloads import decode_body
from watchers.processing import ADDED_LATER, UNREADABLE, CountingTrigger, Processing, check_range
from watchers.redis.address import (
    DEFAULT_REDIS_PORT,
    RedisAddress,
    check_address,
    client,
    parse_redis_uri,
    pipelined,
    transient_errors,
)
from watchers.redis.stream_group import EntryAck, StreamGroupReader
from watchers.redis.stream_group import RedisStreamMissing as RedisStreamMissing

log = structlog.get_logger(__name__)

SCHEME = "redis+stream"
BACKOFF_MAX_S = 10.0
#: The largest sequence part of an entry id (an unsigned 64-bit number).
MAX_SEQUENCE = 2**64 - 1


@dataclasses.dataclass(eq=False, repr=False, kw_only=True)
class RedisStreamTrigger(CountingTrigger):
    """Yield one event per entry of Redis stream ``stream``, as consumer group ``group``.

    The payload is ``{"stream", "id", "timestamp_ms", "body", "fields"}``: ``body`` the entry's
    ``body_field`` decoded (JSON, else text), ``fields`` its other fields as text,
    ``timestamp_ms`` the time part of the entry id. The dedup key is ``<stream>/<entry id>``.
    ``filter`` is checked on that payload, then ``apply_function`` (dotted path) may replace
    it; an entry filtered by either is acknowledged. ``partition_key_path`` picks the partition
    key from the final payload.

    The group is created when it does not exist, at ``start_id``: ``0`` (the whole stream), an
    entry id, or ``$`` (the default: the entries added since the watcher first started). With
    ``$`` the trigger stores the time of its first start (Redis's ``TIME``) as a checkpoint
    (:mod:`watchers.first_start`), and a group it creates, then or on any later start, begins
    with the entries of that millisecond: a stream that did not exist yet when the watcher was
    deployed, made by its first entry while the watcher waited (or while the daemon was down),
    is read from that first entry. The stream must exist: a missing one is
    :class:`RedisStreamMissing` (a ``SourceMissing``, looked for again within seconds). Each
    daemon process reads as a
    consumer of its own (``<host>-<pid>``): an entry is acknowledged (XACK, batched) once its
    event is stored. Entries left pending for ``min_idle_ms`` (a daemon killed, a processing
    error) are claimed again (XAUTOCLAIM) by whichever consumer of the group looks next; one
    delivered ``max_deliveries`` times whose processing still raises is yielded as a dead
    letter with the reason, then acknowledged; one delivered more often (daemons killed during
    each delivery) is a dead letter unprocessed, once decoded (a schema registry that does not
    answer fails the watcher whatever the count), unless this process had it delivered before
    (:mod:`watchers.redeliveries`). Entries trimmed away while pending are counted
    in ``lost`` and logged (``redis_stream_entries_lost``). ``connection`` names the
    credentials (``username``, ``password``, ``ssl``...).
    """

    host: str
    port: int = DEFAULT_REDIS_PORT
    db: int = 0
    stream: str
    group: str | None = None
    start_id: str = "$"
    body_field: str = "body"
    apply_function: str | None = None
    filter: dict[str, Any] | None = None
    partition_key_path: str | None = None
    max_deliveries: int = 5
    #: How long an entry stays pending (unacknowledged) before it is claimed again.
    min_idle_ms: int = 30_000
    #: How long one read waits for new entries.
    block_ms: int = 1_000
    #: Entries asked for per read or claim.
    batch_size: int = 100
    #: Events yielded and not yet acknowledged before reading pauses (backpressure).
    max_in_flight: int = 5_000
    connection: str | None = None
    value_format: str = dataclasses.field(default="json", metadata=ADDED_LATER)
    schema_registry: str | None = dataclasses.field(default=None, metadata=ADDED_LATER)

    #: Its own counters: entries whose processing raised, dead letters yielded, entries
    #: acknowledged, and pending entries found trimmed away (lost).
    failed: int = dataclasses.field(default=0, init=False)
    dead_lettered: int = dataclasses.field(default=0, init=False)
    acked: int = dataclasses.field(default=0, init=False)
    lost: int = dataclasses.field(default=0, init=False)

    _processing: Processing = dataclasses.field(init=False)
    _reader: StreamGroupReader = dataclasses.field(init=False)

    shareable = True

    def __post_init__(self) -> None:
        check_address(self.host, self.port, self.db, self.stream, "stream")
        if self.group is not None and (not isinstance(self.group, str) or not self.group):
            raise ValueError(
                f"RedisStreamTrigger group={self.group!r} must be a non-empty name; "
                "leave it out for the one derived from the watcher"
            )
        if not _is_start_id(self.start_id):
            raise ValueError(
                f"RedisStreamTrigger start_id={self.start_id!r} must be '$' (new entries), "
                "'0' (the whole stream) or an entry id such as '1700000000000-0'"
            )
        if not isinstance(self.body_field, str) or not self.body_field:
            raise ValueError(f"RedisStreamTrigger body_field={self.body_field!r} must be a name")
        for name in ("max_deliveries", "min_idle_ms", "block_ms", "batch_size", "max_in_flight"):
            check_range(name, getattr(self, name), 1)
        self._processing = Processing.of_trigger(self)
        self._reader = StreamGroupReader(
            address=self.address,
            stream=self.stream,
            group=self.consumer_group,
            start_id=self.start_id,
            min_idle_ms=self.min_idle_ms,
            block_ms=self.block_ms,
            batch_size=self.batch_size,
            max_in_flight=self.max_in_flight,
            tally=self,
        )

    @property
    def address(self) -> RedisAddress:
        return RedisAddress(self.host, self.port, self.db, self.stream)

    @property
    def consumer_group(self) -> str:
        """The consumer group in use: ``group``, else ``triggerer-<stream>``."""
        return self.group or f"triggerer-{self.stream}"

    @property
    def reads_as(self) -> str | None:
        """The consumer group (``watchers list`` shows it)."""
        return self.consumer_group

    @property
    def lag(self) -> int | None:
        """Entries of the stream the group has not acknowledged: not yet delivered (XINFO
        GROUPS ``lag``) plus pending; read every second (``LAG_INTERVAL_S``). ``None`` while
        unknown (not read yet, or Redis cannot tell after entries were deleted from the middle)."""
        return self._reader.lag

    def for_watcher(self, asset: WatchedAsset, watcher_name: str) -> RedisStreamTrigger:
        """This trigger with the consumer group named after the watcher, unless ``group`` is
        set: each watcher of a stream sees every entry."""
        if self.group is not None:
            return self
        return dataclasses.replace(self, group=watcher_group(asset, watcher_name))

    def exclusive_sources(self) -> tuple[str, ...]:
        """The stream within the group: two different triggers in one group split its entries."""
        return (
            f"Redis stream {self.stream!r} in consumer group {self.consumer_group!r} "
            f"at {self.address}",
        )

    async def run(self) -> AsyncGenerator[TriggerEvent, None]:
        await self.cleanup()  # a previous run's client, when the daemon restarts this trigger
        self._processing.load()
        response_error = require("redis.exceptions", "redis").ResponseError
        transient = transient_errors()
        reader = self._reader
        delivered_here = redeliveries.delivered_here(
            f"redis {self.address} {self.stream} {self.consumer_group}",
            self.max_in_flight + self.batch_size,
        )
        reader.open(
            client(self.address, self.connection, socket_timeout_s=self.block_ms / 1000 + 10)
        )
        backoff = Backoff(max_s=BACKOFF_MAX_S)
        first: FirstStart | None = None  # with start_id "$": when the watcher first started
        ready = False
        while True:
            try:
                if not ready:
                    if first is None and self.start_id == "$":
                        first = await first_start(self._started_key(), reader.server_time_ms)
                        if first.now:
                            # Stored before the stream is looked for: a stream missing now,
                            # made later, is read from this time on.
                            yield first.checkpoint()
                    # A group made again under a running watcher starts after what it read.
                    start = self.start_id if first is None else _since(first)
                    await reader.prepare(reader.last_read or start)
                    ready = True
                entries = await reader.next_entries()
            except transient as error:
                log.warning(
                    "redis_stream_reconnecting",
                    stream=self.stream,
                    address=str(self.address),
                    attempt=backoff.attempt + 1,
                    error=str(error) or type(error).__name__,
                )
                await backoff.wait()
                continue
            except response_error as error:
                # A read in a pipeline has the server's error after the command's text.
                if "NOGROUP " not in str(error):
                    raise
                log.warning(
                    "redis_stream_group_gone", stream=self.stream, group=self.consumer_group
                )
                ready = False  # the group (or the stream) went: prepared again, or the error
                continue
            if backoff.attempt:
                log.info("redis_stream_reconnected", stream=self.stream, attempts=backoff.attempt)
                backoff = Backoff(max_s=BACKOFF_MAX_S)
            # Noted before any is handled: a watcher failing on one leaves the others too.
            had = delivered_here.note(entry_id for entry_id, _, _ in entries)
            for (entry_id, fields, delivered), delivered_before in zip(entries, had, strict=True):
                event = await self._handle(
                    entry_id, fields, delivered, delivered_before=delivered_before
                )
                if event is not None:
                    yield event

    def _started_key(self) -> str:
        """The checkpoint key of the watcher's first start (see :mod:`watchers.first_start`)."""
        return started_key(f"redis-stream/{self.address}/{self.stream}/{self.consumer_group}/")

    async def cleanup(self) -> None:
        """Acknowledge what is acknowledged but not yet sent, then close the client;
        idempotent. Entries yielded and not acknowledged stay pending, claimed again later."""
        await self._reader.close()

    # -- handling one entry

    async def _handle(
        self,
        entry_id: str,
        fields: dict[bytes, bytes],
        delivered: int,
        *,
        delivered_before: bool,
    ) -> TriggerEvent | None:
        """The event of an entry (this process had it delivered before, or not), or its dead
        letter; ``None`` once it is filtered (and acknowledged) or failed (left pending, to be
        claimed again)."""
        self.messages += 1
        payload = entry_payload(self.stream, entry_id, fields, self.body_field)
        ack = EntryAck(self._reader, entry_id)
        key = f"{self.stream}/{entry_id}"
        sent_at = payload["timestamp_ms"] / 1000
        try:
            payload, cloudevent = await self._processing.decoded(
                payload, fields.get(self.body_field.encode())
            )
        except UNREADABLE as error:
            return self._dead_letter(payload, key, ack, str(error))
        # Counted once the entry is decoded: a registry that does not answer fails the watcher
        # above whatever the count, and each restart claims the entry again. One this process
        # had before is not counted against it either: the watcher failed, the process lived.
        too_often = redeliveries.redelivered_too_often(
            delivered, self.max_deliveries, had_here=delivered_before
        )
        if too_often is not None:
            return self._dead_letter(payload, key, ack, too_often)
        try:
            prepared = self._processing.prepare(payload)
        # Processing runs user code (apply_function) that may raise anything: the entry stays
        # pending, to be claimed and tried again, and the watcher carries on.
        except Exception as error:  # noqa: BLE001
            self.failed += 1
            reason = f"{type(error).__name__}: {error}"
            if delivered >= self.max_deliveries:
                return self._dead_letter(
                    payload,
                    key,
                    ack,
                    f"{reason} (delivered {delivered} times; max_deliveries={self.max_deliveries})",
                )
            log.warning(
                "redis_stream_entry_failed",
                stream=self.stream,
                entry_id=entry_id,
                delivered=delivered,
                max_deliveries=self.max_deliveries,
                retry_in_ms=self.min_idle_ms,
                error=reason,
            )
            self._reader.released(entry_id)
            return None
        if prepared is None:
            self.filtered += 1
            self._reader.skipped(entry_id)
            return None
        self.events += 1
        result, partition_key = prepared
        # prepare() checked what an apply_function returned: the rest is decoded JSON.
        event = TriggerEvent.of_decoded_json(
            result, dedup_key=key, ack=ack, partition_key=partition_key, sent_at=sent_at
        )
        return cloudevents.with_cloudevent(event, cloudevent)

    def _dead_letter(
        self, payload: dict[str, Any], key: str, ack: EntryAck, reason: str
    ) -> TriggerEvent:
        self.dead_lettered += 1
        log.warning("redis_stream_entry_dead_lettered", dedup_key=key, reason=reason)
        return TriggerEvent.of_decoded_json(payload, dedup_key=key, ack=ack, dead_letter=reason)


def entry_payload(
    stream: str, entry_id: str, fields: dict[bytes, bytes], body_field: str
) -> dict[str, Any]:
    """The payload of a stream entry (see :class:`RedisStreamTrigger`)."""
    body_key = body_field.encode()
    return {
        "stream": stream,
        "id": entry_id,
        "timestamp_ms": int(entry_id.partition("-")[0]),
        "body": decode_body(fields.get(body_key)),
        "fields": {
            name.decode(errors="replace"): value.decode(errors="replace")
            for name, value in fields.items()
            if name != body_key
        },
    }


def watcher_group(asset: WatchedAsset, watcher_name: str) -> str:
    """The consumer group of a watcher: ``triggerer-<watcher name>-<digest>``, the digest of
    the asset's name and URI and the watcher's name (none of the options: editing them keeps
    the group and its place)."""
    identity = json.dumps([asset.name, asset.uri, watcher_name]).encode()
    return f"triggerer-{watcher_name}-{hashlib.sha256(identity).hexdigest()[:12]}"


def _since(first: FirstStart) -> str:
    """The group start that delivers the entries added from ``first`` on: the last entry id
    of the millisecond before it (a group delivers the entries after its start id)."""
    return f"{first.at_ms - 1}-{MAX_SEQUENCE}"


def _is_start_id(value: object) -> bool:
    if not isinstance(value, str):
        return False
    if value in ("$", "0"):
        return True
    milliseconds, _, sequence = value.partition("-")
    return milliseconds.isdigit() and (not sequence or sequence.isdigit())


# -- the provider: redis+stream:// URIs, and XADD for `triggerer post redis-streams`


def parse_stream_uri(uri: str) -> RedisAddress:
    """The address of a ``redis+stream://HOST[:6379]/DB/STREAM`` URI."""
    return parse_redis_uri(uri, SCHEME, "STREAM")


def _trigger_of_uri(uri: str, **options: Any) -> RedisStreamTrigger:
    address = parse_stream_uri(uri)
    return RedisStreamTrigger(
        host=address.host, port=address.port, db=address.db, stream=address.key, **options
    )


async def send(uri: str, bodies: Iterable[str], connection: str | None = None) -> list[str]:
    """Add each body as one entry (field ``body``) to the stream at ``uri`` (XADD creates the
    stream when it does not exist); the entry ids, in order."""
    address = parse_stream_uri(uri)
    ids = await pipelined(
        address,
        connection,
        lambda pipe: [pipe.xadd(address.key, {"body": body}) for body in bodies],
    )
    return [entry_id.decode() for entry_id in ids]


PROVIDER = Provider(name="redis-streams", schemes=(SCHEME,), trigger=_trigger_of_uri, send=send)

# serialize() writes the package's classpath, ``watchers.redis.RedisStreamTrigger`` (migration
# 0017 moved the stored ones there). Set once the class is made, as the dataclass decorator reads
# the annotations in the module that defines the class.
RedisStreamTrigger.__module__ = "watchers.redis"
