"""What a KafkaTrigger's own consumer and the shared fetcher both do with aiokafka: connect,
poll and wait out transient broker errors, and hear about rebalances."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Awaitable, Callable
from typing import Any, TypeAlias

import structlog
from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.errors import KafkaConnectionError, KafkaError

log = structlog.get_logger(__name__)

Record: TypeAlias = "ConsumerRecord[bytes, bytes]"

POLL_TIMEOUT_MS = 1000
_BACKOFF_MIN_S = 0.1
_BACKOFF_MAX_S = 5.0
CONNECT_TRIES = 3
"""Tries to reach the brokers (0.1 and 0.2 s apart) before a watcher fails with the error."""


class Backoff:
    """Jittered exponential waits between retries of a transient broker error."""

    def __init__(self) -> None:
        self._delay_s = _BACKOFF_MIN_S

    async def wait(self) -> None:
        await asyncio.sleep(self._delay_s * random.uniform(0.5, 1.0))  # noqa: S311 - jitter
        self._delay_s = min(self._delay_s * 2, _BACKOFF_MAX_S)


def raise_unless_transient(error: KafkaError) -> None:
    if not (error.retriable or isinstance(error, KafkaConnectionError)):
        raise error


class Listener(ConsumerRebalanceListener):  # type: ignore[misc]  # aiokafka is untyped
    """Calls ``revoked`` before a rebalance takes partitions away, ``assigned`` after it gives
    some (before any of them is fetched)."""

    def __init__(
        self,
        revoked: Callable[[set[TopicPartition]], Awaitable[None]],
        assigned: Callable[[set[TopicPartition]], None],
    ) -> None:
        self._revoked = revoked
        self._assigned = assigned

    async def on_partitions_revoked(self, revoked: set[TopicPartition]) -> None:
        await self._revoked(revoked)

    async def on_partitions_assigned(self, assigned: set[TopicPartition]) -> None:
        self._assigned(assigned)


async def connect(
    settings: dict[str, Any], *, group_id: str, topics: list[str], listener: Listener
) -> AIOKafkaConsumer:
    """A started consumer of ``topics`` in ``group_id``.

    Brokers that do not answer :data:`CONNECT_TRIES` quick tries raise ``ConnectionError``
    naming them: the trigger fails, so its watcher shows the error and is started again with
    the daemon's backoff, instead of showing ``running``.
    """
    backoff = Backoff()
    servers = settings["bootstrap_servers"]
    tries = 0
    while True:
        tries += 1
        consumer = AIOKafkaConsumer(group_id=group_id, enable_auto_commit=False, **settings)
        consumer.subscribe(topics, listener=listener)
        try:
            await consumer.start()
        except KafkaConnectionError as error:
            await consumer.stop()
            log.warning("kafka_connect_failed", servers=servers, error=str(error))
            if tries == CONNECT_TRIES:
                raise ConnectionError(
                    f"cannot reach the Kafka brokers at {servers} (tried {tries} times)"
                ) from error
            await backoff.wait()
        except BaseException:
            await consumer.stop()
            raise
        else:
            log.info("kafka_consumer_started", group_id=group_id, topics=topics)
            return consumer


async def poll(
    consumer: AIOKafkaConsumer, group_id: str, *, max_records: int
) -> dict[TopicPartition, list[Record]]:
    """The next batch, waiting out transient broker errors."""
    backoff = Backoff()
    while True:
        try:
            batch: dict[TopicPartition, list[Record]]
            batch = await consumer.getmany(timeout_ms=POLL_TIMEOUT_MS, max_records=max_records)
        except KafkaError as error:
            raise_unless_transient(error)
            log.warning("kafka_poll_failed", group_id=group_id, error=str(error))
            await backoff.wait()
        else:
            return batch
