"""What a KafkaTrigger's own consumer and the shared fetcher both do with aiokafka: connect,
poll and wait out transient broker errors, and hear about rebalances."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterable
from datetime import UTC, datetime
from typing import Any, TypeAlias

import structlog
from aiokafka import AIOKafkaConsumer, ConsumerRecord, TopicPartition
from aiokafka.abc import ConsumerRebalanceListener
from aiokafka.errors import IllegalStateError, KafkaConnectionError, KafkaError

from triggerer.backoff import Backoff
from watchers.kafka.metadata import topic_ids

log = structlog.get_logger(__name__)

Record: TypeAlias = "ConsumerRecord[bytes, bytes]"

POLL_TIMEOUT_MS = 1000
BACKOFF_MAX_S = 5.0
"""The longest wait between retries of a transient broker error."""
TOPIC_LOOK_INTERVAL_S = 5.0
"""How often a consumer asks the cluster whether its topics were recreated."""
CONNECT_TRIES = 3
"""Tries to reach the brokers (0.1 and 0.2 s apart) before a watcher fails with the error."""


def raise_unless_transient(error: KafkaError) -> None:
    if not (error.retriable or isinstance(error, KafkaConnectionError)):
        raise error


def last_answer(
    consumer: AIOKafkaConsumer, partitions: Iterable[TopicPartition]
) -> datetime | None:
    """When a broker last answered the consumer's fetch of one of ``partitions`` it holds, an
    empty answer included; ``None`` before the first.

    aiokafka fetches in the background: ``getmany`` returns empty after its timeout whether or
    not a broker answers, so its return says nothing of the brokers.
    """
    assigned = consumer.assignment()
    answered = [consumer.last_poll_timestamp(tp) for tp in partitions if tp in assigned]
    newest_ms = max(filter(None, answered), default=None)
    return None if newest_ms is None else datetime.fromtimestamp(newest_ms / 1000, UTC)


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
    backoff = Backoff(max_s=BACKOFF_MAX_S)
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


class Poller:
    """Takes batches from one consumer, waiting out transient broker errors, and starts a topic
    recreated under its name over from its beginning (or end, as ``auto_offset_reset`` says).

    A topic deleted and created again starts its offsets at 0. The consumer, at its old
    position, would skip the new topic's messages below it (and wait silently while the new
    topic is shorter: some brokers, tansu among them, do not answer OFFSET_OUT_OF_RANGE there).
    Every :data:`TOPIC_LOOK_INTERVAL_S` the poller asks the cluster for the ids of the assigned
    topics (:mod:`watchers.kafka.metadata`); a topic whose id changed is moved as Kafka moves a
    partition out of range. Messages of the new topic fetched before the look are fetched
    again, and their dedup keys absorb them.
    """

    def __init__(self, consumer: AIOKafkaConsumer, group_id: str, auto_offset_reset: str) -> None:
        self._consumer = consumer
        self._group_id = group_id
        self._auto_offset_reset = auto_offset_reset
        self._topic_ids: dict[str, bytes] | None = {}
        self._next_look = 0.0

    async def poll(self, *, max_records: int) -> dict[TopicPartition, list[Record]]:
        """The next batch (empty after :data:`POLL_TIMEOUT_MS` without messages)."""
        backoff = Backoff(max_s=BACKOFF_MAX_S)
        while True:
            try:
                batch: dict[TopicPartition, list[Record]] = await self._consumer.getmany(
                    timeout_ms=POLL_TIMEOUT_MS, max_records=max_records
                )
            except KafkaError as error:
                raise_unless_transient(error)
                log.warning("kafka_poll_failed", group_id=self._group_id, error=str(error))
                await backoff.wait()
            else:
                break
        now = asyncio.get_running_loop().time()
        if self._topic_ids is not None and now >= self._next_look:
            self._next_look = now + TOPIC_LOOK_INTERVAL_S
            await self._restart_recreated_topics()
        return batch

    async def _restart_recreated_topics(self) -> None:
        consumer = self._consumer
        assigned = consumer.assignment()
        try:
            ids = await topic_ids(consumer, {tp.topic for tp in assigned})
        except KafkaError as error:
            raise_unless_transient(error)
            return  # looked at again next time
        if ids is None:
            log.info("kafka_topic_ids_unavailable", group_id=self._group_id)
            self._topic_ids = None  # brokers before Kafka 2.8: nothing to look at
            return
        known = self._topic_ids or {}
        self._topic_ids = {**known, **ids}
        for topic, topic_id in ids.items():
            if known.get(topic, topic_id) != topic_id:
                await self._restart(topic, [tp for tp in assigned if tp.topic == topic])

    async def _restart(self, topic: str, partitions: list[TopicPartition]) -> None:
        if self._auto_offset_reset == "none":
            raise LookupError(
                f"Kafka topic {topic!r} was deleted and created again, and "
                "auto_offset_reset='none' says not to move the consumer from its old offsets"
            )
        log.warning(
            "kafka_topic_recreated",
            group_id=self._group_id,
            topic=topic,
            moved_to=self._auto_offset_reset,
        )
        try:
            if self._auto_offset_reset == "earliest":
                await self._consumer.seek_to_beginning(*partitions)
            else:
                await self._consumer.seek_to_end(*partitions)
        except IllegalStateError:
            return  # revoked meanwhile: its next owner starts from the committed offset
