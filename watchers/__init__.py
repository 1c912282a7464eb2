"""Triggers for message queues (Kafka, SQS, Kinesis, NATS, Redis, RabbitMQ, Pub/Sub, MQTT) and
files; see ``MessageQueueTrigger``."""

import importlib
import typing

if typing.TYPE_CHECKING:
    from watchers.file import FileTrigger
    from watchers.kafka import KafkaTrigger
    from watchers.kinesis import KinesisTrigger
    from watchers.mqtt import MqttTrigger
    from watchers.nats import NatsTrigger
    from watchers.pubsub import PubSubTrigger
    from watchers.queue import MessageQueueTrigger
    from watchers.rabbitmq import RabbitMqTrigger
    from watchers.redis import RedisPubSubTrigger, RedisStreamTrigger
    from watchers.sqs import SqsTrigger

__all__ = (
    "FileTrigger",
    "KafkaTrigger",
    "KinesisTrigger",
    "MessageQueueTrigger",
    "MqttTrigger",
    "NatsTrigger",
    "PubSubTrigger",
    "RabbitMqTrigger",
    "RedisPubSubTrigger",
    "RedisStreamTrigger",
    "SqsTrigger",
)

# The module defining each name, imported when the name is first asked for (PEP 562): a
# module of this package (``watchers.kafka.fetcher``, ``watchers.sqs.address``) is imported
# without the other brokers' clients.
_HOME_OF = {
    "FileTrigger": "watchers.file",
    "KafkaTrigger": "watchers.kafka",
    "KinesisTrigger": "watchers.kinesis",
    "MessageQueueTrigger": "watchers.queue",
    "RabbitMqTrigger": "watchers.rabbitmq",
    "RedisPubSubTrigger": "watchers.redis",
    "RedisStreamTrigger": "watchers.redis",
    "MqttTrigger": "watchers.mqtt",
    "NatsTrigger": "watchers.nats",
    "PubSubTrigger": "watchers.pubsub",
    "SqsTrigger": "watchers.sqs",
}


def __getattr__(name: str) -> object:
    module = _HOME_OF.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # asked once: later lookups find it without this function
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
