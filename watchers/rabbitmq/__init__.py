"""The RabbitMQ provider: ``RabbitMqTrigger``, ``send`` and the provider
(:mod:`watchers.rabbitmq.trigger`), ``amqp://`` URIs (:mod:`watchers.rabbitmq.address`), the
shared consumer of a queue (:mod:`watchers.rabbitmq.consumer`), its readers
(:mod:`watchers.rabbitmq.readers`) and connecting (:mod:`watchers.rabbitmq.client`)."""

from watchers.rabbitmq.trigger import PROVIDER, RabbitMqTrigger, send

__all__ = ("PROVIDER", "RabbitMqTrigger", "send")
