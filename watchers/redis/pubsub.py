"""RedisPubSubTrigger: the messages of a Redis pub/sub channel, at most once; ``PROVIDER`` reads
``redis+pubsub://`` URIs.

Redis pub/sub keeps nothing: a message published while no subscriber listens (the daemon
stopped, restarting, reconnecting) is gone, and one received is not acknowledged to anyone. So
a watcher of a channel says so when it starts (``redis_pubsub_at_most_once``) and in
``watchers list`` (its ``reads_as``); a stream (``redis+stream://``) is the at-least-once kind.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import AsyncGenerator, Iterable
from typing import TYPE_CHECKING, Any

import structlog

from triggerer.backoff import Backoff
from triggerer.providers import Provider
from triggerer.triggers import TriggerEvent, WatchedAsset
from watchers import cloudevents
from watchers.payloads import decode_body
from watchers.processing import ADDED_LATER, UNREADABLE, CountingTrigger, Processing
from watchers.redis.address import (
    DEFAULT_REDIS_PORT,
    RedisAddress,
    check_address,
    client,
    parse_redis_uri,
    pipelined,
    transient_errors,
)

if TYPE_CHECKING:
    import redis.asyncio

log = structlog.get_logger(__name__)

SCHEME = "redis+pubsub"
BACKOFF_MAX_S = 10.0
AT_MOST_ONCE = "at-most-once (pub/sub)"
"""What ``watchers list`` shows of such a watcher (its ``reads_as``)."""
_POLL_S = 1.0


@dataclasses.dataclass(eq=False, repr=False, kw_only=True)
class RedisPubSubTrigger(CountingTrigger):
    """Yield one event per message published on Redis channel ``channel``, at most once.

    The payload is ``{"channel", "body", "received_at"}``: ``body`` the message decoded (JSON,
    else text), ``received_at`` epoch seconds. There is no dedup key and no ack: pub/sub keeps
    no message, so one published while the watcher is not subscribed (the daemon down or
    reconnecting after a server restart, with backoff) is lost. ``filter`` is checked on the
    payload, then ``apply_function`` (dotted path) may replace it; ``partition_key_path``
    picks the partition key from the final payload; a message whose processing raises is logged
    and dropped (there is nothing to redeliver it). ``connection`` names the credentials.

    Not shareable: every subscriber gets every message, so the watcher runs in one daemon
    instance at a time (under a lease).
    """

    host: str
    port: int = DEFAULT_REDIS_PORT
    db: int = 0
    channel: str
    apply_function: str | None = None
    filter: dict[str, Any] | None = None
    partition_key_path: str | None = None
    connection: str | None = None
    value_format: str = dataclasses.field(default="json", metadata=ADDED_LATER)
    schema_registry: str | None = dataclasses.field(default=None, metadata=ADDED_LATER)
    #: The watcher it runs for (set by :meth:`for_watcher`), named in the start-up warning.
    watcher: str | None = None

    #: Its own counter: messages dropped because their processing raised.
    failed: int = dataclasses.field(default=0, init=False)

    _processing: Processing = dataclasses.field(init=False)
    _redis: redis.asyncio.Redis | None = dataclasses.field(default=None, init=False)
    _subscribed: bool = dataclasses.field(default=False, init=False)

    def __post_init__(self) -> None:
        check_address(self.host, self.port, self.db, self.channel, "channel")
        self._processing = Processing.of_trigger(self)

    @property
    def address(self) -> RedisAddress:
        return RedisAddress(self.host, self.port, self.db, self.channel)

    @property
    def reads_as(self) -> str | None:
        """Not a name the broker keeps (it keeps none): the delivery guarantee, for
        ``watchers list``."""
        return AT_MOST_ONCE

    @property
    def lag(self) -> int | None:
        """0 while subscribed: a channel holds no messages waiting."""
        return 0 if self._subscribed else None

    def for_watcher(self, asset: WatchedAsset, watcher_name: str) -> RedisPubSubTrigger:
        """This trigger naming the watcher, for its start-up warning."""
        return dataclasses.replace(self, watcher=watcher_name)

    async def run(self) -> AsyncGenerator[TriggerEvent, None]:
        await self.cleanup()
        self._processing.load()
        log.warning(
            "redis_pubsub_at_most_once",
            watcher=self.watcher,
            channel=self.channel,
            address=str(self.address),
            detail="messages published while the watcher is not subscribed are lost",
        )
        transient = transient_errors()
        redis_client = self._redis = client(self.address, self.connection)
        backoff = Backoff(max_s=BACKOFF_MAX_S)
        while True:
            try:
                async with redis_client.pubsub(ignore_subscribe_messages=True) as pubsub:
                    await pubsub.subscribe(self.channel)
                    self._subscribed = True
                    log.info("redis_pubsub_subscribed", channel=self.channel, watcher=self.watcher)
                    backoff = Backoff(max_s=BACKOFF_MAX_S)
                    while True:
                        message = await pubsub.get_message(timeout=_POLL_S)
                        self.polled()
                        if message is None or message["type"] != "message":
                            continue
                        event = await self._handle(message["data"])
                        if event is not None:
                            yield event
            except transient as error:
                self._subscribed = False
                log.warning(
                    "redis_pubsub_reconnecting",
                    channel=self.channel,
                    watcher=self.watcher,
                    address=str(self.address),
                    attempt=backoff.attempt + 1,
                    error=str(error) or type(error).__name__,
                )
                await backoff.wait()

    async def cleanup(self) -> None:
        """Close the client; idempotent."""
        redis_client, self._redis = self._redis, None
        self._subscribed = False
        if redis_client is not None:
            await redis_client.aclose()

    async def _handle(self, data: bytes) -> TriggerEvent | None:
        self.messages += 1
        payload = {"channel": self.channel, "body": decode_body(data), "received_at": time.time()}
        try:
            payload, cloudevent = await self._processing.decoded(payload, data)
        except UNREADABLE as error:
            log.warning("redis_pubsub_message_undecodable", channel=self.channel, error=str(error))
            return TriggerEvent.of_decoded_json(payload, dead_letter=str(error))
        try:
            prepared = self._processing.prepare(payload)
        # apply_function is user code that may raise anything: the message is dropped (nothing
        # could redeliver it) and the watcher carries on.
        except Exception as error:  # noqa: BLE001
            self.failed += 1
            log.warning(
                "redis_pubsub_message_dropped",
                channel=self.channel,
                watcher=self.watcher,
                error=f"{type(error).__name__}: {error}",
            )
            return None
        if prepared is None:
            self.filtered += 1
            return None
        self.events += 1
        result, partition_key = prepared
        # prepare() checked what an apply_function returned: the rest is decoded JSON.
        event = TriggerEvent.of_decoded_json(result, partition_key=partition_key)
        return cloudevents.with_cloudevent(event, cloudevent)


# -- the provider: redis+pubsub:// URIs, and PUBLISH for `triggerer post redis-pubsub`


def parse_channel_uri(uri: str) -> RedisAddress:
    """The address of a ``redis+pubsub://HOST[:6379]/DB/CHANNEL`` URI (the channel: the rest
    of the path, percent-decoded)."""
    return parse_redis_uri(uri, SCHEME, "CHANNEL")


def _trigger_of_uri(uri: str, **options: Any) -> RedisPubSubTrigger:
    address = parse_channel_uri(uri)
    return RedisPubSubTrigger(
        host=address.host, port=address.port, db=address.db, channel=address.key, **options
    )


async def send(uri: str, bodies: Iterable[str], connection: str | None = None) -> list[str]:
    """Publish each body on the channel at ``uri``. Pub/sub messages have no id: for each, the
    number of subscribers that received it, as text (``"0"``: nobody listened, it is gone)."""
    address = parse_channel_uri(uri)
    receivers = await pipelined(
        address, connection, lambda pipe: [pipe.publish(address.key, body) for body in bodies]
    )
    return [str(count) for count in receivers]


PROVIDER = Provider(name="redis-pubsub", schemes=(SCHEME,), trigger=_trigger_of_uri, send=send)

# serialize() writes the package's classpath, ``watchers.redis.RedisPubSubTrigger`` (migration
# 0017 moved the stored ones there). Set once the class is made, as the dataclass decorator reads
# the annotations in the module that defines the class.
RedisPubSubTrigger.__module__ = "watchers.redis"
