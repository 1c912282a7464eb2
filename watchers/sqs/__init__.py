"""The Amazon SQS provider: ``SqsTrigger``, a message's payload, ``send`` and the provider
(:mod:`watchers.sqs.trigger`), where a queue lives (:mod:`watchers.sqs.address`), the shared
poller of a queue (:mod:`watchers.sqs.session`) and its client, held messages, batched deletes
and dead letters (:mod:`watchers.sqs.client`, :mod:`watchers.sqs.in_flight`,
:mod:`watchers.sqs.deletes`, :mod:`watchers.sqs.dead_letters`)."""

from watchers.sqs.trigger import PROVIDER, SqsTrigger, message_payload, send

__all__ = ("PROVIDER", "SqsTrigger", "message_payload", "send")
