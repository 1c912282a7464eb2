"""The shared fetcher against the real tansu broker: KafkaTriggers of one cluster read through
one consumer, each sees every message of its topics, and a partition's offset is committed
only as far as every trigger reading it has acknowledged."""

from __future__ import annotations

import asyncio
import json
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import anyio
from aiokafka import AIOKafkaConsumer, TopicPartition
from aiokafka.errors import KafkaError

from tests.integration.watchers.test_kafka import produce, running, trigger_for
from tests.integration.watchers.test_kafka import wait_committed as own_commit
from watchers.kafka import fetcher as kafka_fetcher

if TYPE_CHECKING:
    from tests.fixtures.brokers import MakeTopic
    from watchers.kafka import KafkaTrigger


def sale(n: int, *, partitions: int = 1) -> dict[str, Any]:
    kind = "order" if n % 2 == 0 else "refund"
    return {"value": json.dumps({"n": n, "type": kind}).encode(), "partition": n % partitions}


def watcher(bootstrap: str, topic: str, place: str, **options: Any) -> KafkaTrigger:
    """A trigger as the daemon makes it for a watcher: reading through the shared fetcher."""
    return trigger_for(bootstrap, topic, group_id=place, shared_fetch=True, **options)


@contextmanager
def shared() -> Iterator[kafka_fetcher.Fetchers]:
    fetchers = kafka_fetcher.Fetchers(f"test-{uuid.uuid4().hex[:8]}")
    with kafka_fetcher.sharing(fetchers):
        yield fetchers


async def wait_committed(bootstrap: str, group: str, topic: str, expected: int) -> None:
    """Wait until ``group`` has committed ``expected`` for partition 0 of ``topic``."""
    consumer = AIOKafkaConsumer(bootstrap_servers=bootstrap, group_id=group)
    await consumer.start()
    try:
        with anyio.fail_after(20):
            while await consumer.committed(TopicPartition(topic, 0)) != expected:  # noqa: ASYNC110
                await asyncio.sleep(0.1)  # no change notification for commits: poll the broker
    finally:
        await consumer.stop()


def offsets(events: list[Any]) -> list[int]:
    return sorted(event.payload["offset"] for event in events)


async def test_triggers_of_one_topic_each_see_every_message_fetched_once(
    kafka_broker: str, make_topic: MakeTopic
) -> None:
    topic = await make_topic(partitions=2)
    await produce(kafka_broker, topic, (sale(n, partitions=2) for n in range(20)))
    orders_only = {"path": "$.value.type", "equals": "order"}

    with shared() as fetchers:
        orders = watcher(kafka_broker, topic, "orders", filter=orders_only)
        everything = watcher(kafka_broker, topic, "everything")
        async with running(orders) as got_orders, running(everything) as got_everything:
            await got_everything.wait_for(20)
            await got_orders.wait_for(10)
            [fetcher] = list(fetchers)
            assert fetcher.fetched == 20  # read once, handed to both
        assert sorted(e.payload["value"]["n"] for e in got_orders.events) == list(range(0, 20, 2))
        assert sorted(e.payload["value"]["n"] for e in got_everything.events) == list(range(20))
        assert orders.filtered == 10


async def test_the_commit_waits_for_every_reader_and_a_restarted_one_resumes_at_its_place(
    kafka_broker: str, kafka_topic: str
) -> None:
    await produce(kafka_broker, kafka_topic, (sale(n) for n in range(10)))

    with shared() as fetchers:
        fast = watcher(kafka_broker, kafka_topic, "fast")
        slow = watcher(kafka_broker, kafka_topic, "slow")
        async with running(fast) as got_fast:
            async with running(slow, ack=False) as got_slow:
                await got_slow.wait_for(10)
                for event in got_slow.events[:4]:  # partial acks: 0-3 of 0-9
                    assert event.ack is not None
                    await event.ack()
                await got_fast.wait_for(10)
                [fetcher] = list(fetchers)
                await wait_committed(kafka_broker, fetcher.group_id, kafka_topic, 4)
            # The slow one stopped (a failure the daemon restarts from): its place holds.
            await produce(kafka_broker, kafka_topic, (sale(n) for n in range(10, 15)))
            await got_fast.wait_for(15)
            await asyncio.sleep(0.5)  # commits come every 100 ms: none may pass the place
            await wait_committed(kafka_broker, fetcher.group_id, kafka_topic, 4)

            restarted = watcher(kafka_broker, kafka_topic, "slow")
            async with running(restarted) as got_restarted:
                await got_restarted.wait_for(11)
                await wait_committed(kafka_broker, fetcher.group_id, kafka_topic, 15)
            assert offsets(got_restarted.events) == list(range(4, 15))
        assert offsets(got_fast.events) == list(range(15))


async def test_a_watcher_that_is_gone_no_longer_holds_the_commit(
    kafka_broker: str, kafka_topic: str
) -> None:
    await produce(kafka_broker, kafka_topic, (sale(n) for n in range(6)))

    with shared() as fetchers:
        kept = watcher(kafka_broker, kafka_topic, "kept")
        removed = watcher(kafka_broker, kafka_topic, "removed")
        async with running(kept) as got_kept:
            async with running(removed, ack=False) as got_removed:
                await got_removed.wait_for(6)
                await got_kept.wait_for(6)
            [fetcher] = list(fetchers)
            await asyncio.sleep(0.5)
            await wait_committed(kafka_broker, fetcher.group_id, kafka_topic, 0)
            fetchers.keep({"kept"})  # the daemon's registry no longer has "removed"
            await wait_committed(kafka_broker, fetcher.group_id, kafka_topic, 6)


async def test_a_watcher_that_joins_later_starts_at_the_last_commit(
    kafka_broker: str, kafka_topic: str
) -> None:
    await produce(kafka_broker, kafka_topic, (sale(n) for n in range(5)))

    with shared() as fetchers:
        first = watcher(kafka_broker, kafka_topic, "first")
        async with running(first) as got_first:
            await got_first.wait_for(5)
            [fetcher] = list(fetchers)
            await wait_committed(kafka_broker, fetcher.group_id, kafka_topic, 5)
            later = watcher(kafka_broker, kafka_topic, "later")
            async with running(later) as got_later:
                await produce(kafka_broker, kafka_topic, (sale(n) for n in range(5, 8)))
                await got_later.wait_for(3)
                await got_first.wait_for(8)
            assert offsets(got_later.events) == [5, 6, 7]


async def test_a_trigger_outside_the_daemon_has_a_consumer_of_its_own(
    kafka_broker: str, kafka_topic: str
) -> None:
    await produce(kafka_broker, kafka_topic, (sale(n) for n in range(3)))
    trigger = watcher(kafka_broker, kafka_topic, "alone")

    async with running(trigger) as received:  # no sharing() here: group "alone" is its own
        await received.wait_for(3)
    await own_commit(trigger, {0: 3})


async def test_what_stops_the_shared_consumer_reaches_its_readers_and_a_new_one_takes_over(
    kafka_broker: str, kafka_topic: str
) -> None:
    await produce(kafka_broker, kafka_topic, (sale(n) for n in range(2)))

    with shared() as fetchers:
        # No committed offset and no reset allowed: the consumer cannot start reading.
        strict = watcher(kafka_broker, kafka_topic, "strict", auto_offset_reset="none")
        async with running(strict) as received:
            with anyio.fail_after(30):
                while received.error is None:  # noqa: ASYNC110 - the helper has no error event
                    await asyncio.sleep(0.1)
        assert isinstance(received.error, KafkaError)
        [failed] = list(fetchers)
        assert failed.failed

        lenient = watcher(kafka_broker, kafka_topic, "strict", auto_offset_reset="none")
        reader = await fetchers.join(lenient.reader_spec())
        try:
            assert reader.fetcher is not failed  # a failed consumer is replaced, not reused
        finally:
            await reader.fetcher.leave(reader)
