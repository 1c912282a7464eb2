"""Where ``RedisStreamTrigger`` lived before ``watchers/redis/``: the classpath its
``serialize()`` still writes (``watchers.redis_streams.RedisStreamTrigger``), so the triggers a
store holds keep their keys. The trigger is :mod:`watchers.redis.streams`'."""

from watchers.redis.streams import RedisStreamTrigger

__all__ = ("RedisStreamTrigger",)
