"""Where ``RedisPubSubTrigger`` lived before ``watchers/redis/``: the classpath its
``serialize()`` still writes (``watchers.redis_pubsub.RedisPubSubTrigger``), so the triggers a
store holds keep their keys. The trigger is :mod:`watchers.redis.pubsub`'."""

from watchers.redis.pubsub import RedisPubSubTrigger

__all__ = ("RedisPubSubTrigger",)
