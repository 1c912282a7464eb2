"""Triggers for message queues (SQS, Kafka) and files; see ``MessageQueueTrigger``."""

import importlib
import typing

if typing.TYPE_CHECKING:
    from watchers.file import FileTrigger
    from watchers.kafka import KafkaTrigger
    from watchers.queue import MessageQueueTrigger
    from watchers.sqs import SqsTrigger

__all__ = ("FileTrigger", "KafkaTrigger", "MessageQueueTrigger", "SqsTrigger")

# The module defining each name, imported when the name is first asked for (PEP 562): a
# module of this package (``watchers.producers``, ``watchers.kafka_fetcher``) is imported
# without the other brokers' clients.
_HOME_OF = {
    "FileTrigger": "watchers.file",
    "KafkaTrigger": "watchers.kafka",
    "MessageQueueTrigger": "watchers.queue",
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
