"""The Redis providers: streams (``RedisStreamTrigger``, :mod:`watchers.redis.streams`, its
consumer group's reads in :mod:`watchers.redis.stream_group`) and pub/sub channels
(``RedisPubSubTrigger``, :mod:`watchers.redis.pubsub`), on the addresses and connections of
:mod:`watchers.redis.address`."""

from watchers.redis.pubsub import RedisPubSubTrigger
from watchers.redis.streams import RedisStreamTrigger

__all__ = ("RedisPubSubTrigger", "RedisStreamTrigger")
