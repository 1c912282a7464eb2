"""Triggers for message queues (SQS, Kafka) and files; see ``MessageQueueTrigger``."""

from __future__ import annotations

from watchers.file import FileTrigger
from watchers.kafka import KafkaTrigger
from watchers.queue import MessageQueueTrigger
from watchers.sqs import SqsTrigger

__all__ = ("FileTrigger", "KafkaTrigger", "MessageQueueTrigger", "SqsTrigger")
