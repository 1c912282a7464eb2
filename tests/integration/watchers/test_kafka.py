"""KafkaTrigger against the real tansu broker, a unique topic per test."""

from __future__ import annotations

import asyncio
import collections
import contextlib
from collections.abc import AsyncIterator, Callable, Iterable
from typing import TYPE_CHECKING, Any

import anyio
from aiokafka import AIOKafkaConsumer, AIOKafkaProducer, TopicPartition

from watchers.kafka import KafkaTrigger

if TYPE_CHECKING:
    from deploy.local.services import Service
    from tests.fixtures.brokers import MakeTopic
    from triggerer.triggers import TriggerEvent

FAST = {"session_timeout_ms": 3000, "heartbeat_interval_ms": 500, "commit_interval_ms": 100}
ATTEMPTS: collections.Counter[str] = collections.Counter()


def keep_orders(payload: dict[str, Any]) -> dict[str, Any] | None:
    """An apply_function: drops messages marked ``drop``, tags the rest."""
    if payload["value"].get("drop"):
        return None
    return {**payload, "tagged": True}


def reject_poison(payload: dict[str, Any]) -> dict[str, Any]:
    """An apply_function that fails on every attempt at a ``poison`` message."""
    ATTEMPTS[f"{payload['topic']}/{payload['offset']}"] += 1
    if payload["value"] == "poison":
        raise ValueError("poison pill")
    return payload


Record = dict[str, Any]


async def produce(bootstrap: str, topic: str, records: Iterable[Record | bytes]) -> None:
    """Send ``records`` (raw values, or keyword arguments of ``send``) and wait until stored."""
    producer = AIOKafkaProducer(bootstrap_servers=bootstrap, linger_ms=5)
    await producer.start()
    try:
        sent = [
            await producer.send(topic, **(r if isinstance(r, dict) else {"value": r}))
            for r in records
        ]
        await asyncio.gather(*sent)
    finally:
        await producer.stop()


async def wait_committed(
    trigger: KafkaTrigger, expected: dict[int, int], *, timeout_s: float = 20
) -> None:
    """Wait until the committed offsets of the trigger's group and topic are ``expected``."""
    [topic] = trigger.topics
    consumer = AIOKafkaConsumer(
        bootstrap_servers=trigger.bootstrap_servers,
        group_id=trigger.consumer_group,
        enable_auto_commit=False,
    )
    await consumer.start()
    try:
        with anyio.fail_after(timeout_s):
            while True:
                found = {p: await consumer.committed(TopicPartition(topic, p)) for p in expected}
                if found == expected:
                    return
                await asyncio.sleep(0.1)  # no change notification for commits: poll the broker
    finally:
        await consumer.stop()


class Received:
    """The events a running trigger yielded, in order; waits with a deadline."""

    def __init__(self) -> None:
        self.events: list[TriggerEvent] = []
        self.error: BaseException | None = None
        self._changed = asyncio.Event()

    def add(self, event: TriggerEvent) -> None:
        self.events.append(event)
        self._changed.set()

    def fail(self, error: BaseException) -> None:
        self.error = error
        self._changed.set()

    @property
    def keys(self) -> list[str]:
        """The events' dedup keys up to the record's timestamp: ``topic/partition/offset``."""
        return [str(event.dedup_key).split("@")[0] for event in self.events]

    async def wait_until(self, done: Callable[[], bool], *, timeout_s: float = 20) -> None:
        with anyio.fail_after(timeout_s):
            while not done():
                if self.error is not None:
                    raise AssertionError("the trigger failed") from self.error
                self._changed.clear()
                await self._changed.wait()

    async def wait_for(self, count: int, *, timeout_s: float = 20) -> list[TriggerEvent]:
        await self.wait_until(lambda: len(self.events) >= count, timeout_s=timeout_s)
        return self.events


@contextlib.asynccontextmanager
async def running(
    trigger: KafkaTrigger,
    *,
    ack: bool = True,
    gate: Callable[[Received], asyncio.Event | None] = lambda _: None,
) -> AsyncIterator[Received]:
    """Run ``trigger`` in a task, acking each event when ``ack``; ``gate`` may pause acking."""
    received = Received()

    async def consume() -> None:
        try:
            async with contextlib.aclosing(trigger.run()) as events:
                async for event in events:
                    received.add(event)
                    if (event_gate := gate(received)) is not None:
                        await event_gate.wait()
                    if ack and event.ack is not None:
                        await event.ack()
        except asyncio.CancelledError:
            raise
        except Exception as error:  # noqa: BLE001 - reported to the waiting test instead
            received.fail(error)

    task = asyncio.create_task(consume())
    try:
        yield received
    finally:
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await task
        await trigger.cleanup()


def trigger_for(bootstrap: str, topic: str, **options: Any) -> KafkaTrigger:
    return KafkaTrigger(bootstrap_servers=bootstrap, topics=[topic], **{**FAST, **options})


async def test_payload_shape(kafka_broker: str, kafka_topic: str) -> None:
    await produce(
        kafka_broker,
        kafka_topic,
        [{"key": b"k-1", "value": b'{"day": "2026-03-16"}', "headers": [("type", b'"order"')]}],
    )
    trigger = trigger_for(kafka_broker, kafka_topic, partition_key_path="$.value.day")

    async with running(trigger) as received:
        [event] = await received.wait_for(1)

    timestamp = event.payload.pop("timestamp")
    assert isinstance(timestamp, int)
    assert timestamp > 1_700_000_000_000
    assert event.payload == {
        "topic": kafka_topic,
        "partition": 0,
        "offset": 0,
        "key": "k-1",
        "value": {"day": "2026-03-16"},
        "headers": {"type": "order"},
    }
    assert event.dedup_key == f"{kafka_topic}/0/0@{timestamp}"
    assert event.sent_at == timestamp / 1000
    assert event.partition_key == "2026-03-16"
    assert (trigger.messages, trigger.events, trigger.acked) == (1, 1, 1)


async def test_values_decoded_as_json_text_or_base64(kafka_broker: str, kafka_topic: str) -> None:
    await produce(kafka_broker, kafka_topic, [b'{"a": [1, 2]}', b"plain text", b"\xff\xfe\x00"])
    trigger = trigger_for(kafka_broker, kafka_topic)

    async with running(trigger) as received:
        events = await received.wait_for(3)

    assert [e.payload["value"] for e in events] == [
        {"a": [1, 2]},
        "plain text",
        {"base64": "//4A"},
    ]
    assert [e.payload["key"] for e in events] == [None, None, None]


async def test_unacked_message_is_redelivered_and_acked_one_is_not(
    kafka_broker: str, kafka_topic: str
) -> None:
    await produce(kafka_broker, kafka_topic, [b"0", b"1", b"2"])
    first = trigger_for(kafka_broker, kafka_topic)
    async with running(first, ack=False) as received:
        events = await received.wait_for(3)
        assert events[0].ack is not None
        await events[0].ack()

    second = trigger_for(kafka_broker, kafka_topic)
    async with running(second) as received:
        events = await received.wait_for(2)

    assert received.keys == [f"{kafka_topic}/0/1", f"{kafka_topic}/0/2"]
    assert second.serialize() == first.serialize()


async def test_commits_only_up_to_the_first_unacked_offset(
    kafka_broker: str, kafka_topic: str
) -> None:
    await produce(kafka_broker, kafka_topic, [b"0", b"1", b"2"])
    trigger = trigger_for(kafka_broker, kafka_topic)

    async with running(trigger, ack=False) as received:
        events = await received.wait_for(3)
        acks = [event.ack for event in events]
        assert None not in acks
        await acks[0]()  # type: ignore[misc]  # checked not None above
        await acks[2]()  # type: ignore[misc]
        await wait_committed(trigger, {0: 1})
        await acks[1]()  # type: ignore[misc]
        await wait_committed(trigger, {0: 3})


async def test_filter_and_apply_function_ack_and_count(kafka_broker: str, kafka_topic: str) -> None:
    await produce(
        kafka_broker,
        kafka_topic,
        [
            b'{"type": "order", "id": 1}',
            b'{"type": "refund", "id": 2}',
            b'{"type": "order", "id": 3, "drop": true}',
            b'{"type": "order", "id": 4}',
        ],
    )
    trigger = trigger_for(
        kafka_broker,
        kafka_topic,
        filter={"path": "$.value.type", "equals": "order"},
        apply_function=f"{__name__}.keep_orders",
    )

    async with running(trigger) as received:
        events = await received.wait_for(2)
        await wait_committed(trigger, {0: 4})

    assert [(e.payload["value"]["id"], e.payload["tagged"]) for e in events] == [
        (1, True),
        (4, True),
    ]
    assert (trigger.messages, trigger.filtered, trigger.events) == (4, 2, 2)


async def test_poison_message_goes_to_dead_letter_topic(
    kafka_broker: str, kafka_topic: str
) -> None:
    await produce(
        kafka_broker,
        kafka_topic,
        [b'"ok"', {"value": b'"poison"', "key": b"bad", "headers": [("trace", b"t-1")]}, b'"ok"'],
    )
    trigger = trigger_for(kafka_broker, kafka_topic, apply_function=f"{__name__}.reject_poison")

    async with running(trigger) as received:
        events = await received.wait_for(2)
        await wait_committed(trigger, {0: 3})

    assert [str(e.dedup_key).split("@")[0] for e in events] == [
        f"{kafka_topic}/0/0",
        f"{kafka_topic}/0/2",
    ]
    assert ATTEMPTS[f"{kafka_topic}/1"] == trigger.max_attempts == 3
    assert trigger.dead_lettered == 1
    dead = await read_one(kafka_broker, f"{kafka_topic}.dlq")
    assert (dead.key, dead.value) == (b"bad", b'"poison"')
    headers = dict(dead.headers)
    assert headers["trace"] == b"t-1"
    assert headers["triggerer-error"] == b"ValueError: poison pill"
    assert headers["triggerer-source"] == f"{kafka_topic}/0/1".encode()
    assert headers["triggerer-attempts"] == b"3"


async def read_one(bootstrap: str, topic: str) -> Any:
    consumer = AIOKafkaConsumer(topic, bootstrap_servers=bootstrap, auto_offset_reset="earliest")
    await consumer.start()
    try:
        with anyio.fail_after(20):
            return await consumer.getone()
    finally:
        await consumer.stop()


async def test_in_flight_messages_are_bounded(kafka_broker: str, kafka_topic: str) -> None:
    await produce(kafka_broker, kafka_topic, [b"0", b"1", b"2"])
    trigger = trigger_for(kafka_broker, kafka_topic, max_in_flight=2)
    events = trigger.run()
    try:
        first, _second = await anext(events), await anext(events)
        third = asyncio.ensure_future(anext(events))
        done, _ = await asyncio.wait({third}, timeout=1.0)  # a bounded check of a negative
        assert not done
        assert first.ack is not None
        await first.ack()
        with anyio.fail_after(10):
            assert (await third).dedup_key.startswith(f"{kafka_topic}/0/2@")
    finally:
        await events.aclose()
        await trigger.cleanup()


async def test_two_consumers_share_a_group_and_lose_nothing_on_rebalance(
    kafka_broker: str, make_topic: MakeTopic
) -> None:
    topic, total = await make_topic(partitions=4), 10_000
    await produce(
        kafka_broker,
        topic,
        ({"value": b"%d" % i, "partition": i % 4} for i in range(total)),
    )
    first, second = trigger_for(kafka_broker, topic), trigger_for(kafka_broker, topic)
    first_paused, first_resumed = asyncio.Event(), asyncio.Event()
    second_started = asyncio.Event()

    def first_gate(received: Received) -> asyncio.Event | None:
        """Pause the first consumer at 1,000 events and for good at 3,500."""
        if len(received.events) in (1_000, 3_500):
            first_paused.set()
            return first_resumed if len(received.events) == 1_000 else asyncio.Event()
        return None

    def second_gate(received: Received) -> asyncio.Event | None:
        second_started.set()
        return None

    async with running(first, gate=first_gate) as received_first:
        with anyio.fail_after(20):
            await first_paused.wait()
        first_paused.clear()
        async with running(second, gate=second_gate) as received_second:
            with anyio.fail_after(20):
                await second_started.wait()  # joined: the partitions are split
            first_resumed.set()
            with anyio.fail_after(20):
                await first_paused.wait()  # half-way
            await first.cleanup()  # stopped half-way, one event yielded and never acked
            await received_second.wait_until(
                lambda: second.acked + first.acked >= total, timeout_s=30
            )
            await wait_committed(second, dict.fromkeys(range(4), total // 4))

    acked = set(received_first.keys[:-1]) | set(received_second.keys)
    assert acked == {f"{topic}/{i % 4}/{i // 4}" for i in range(total)}
    assert first.acked + second.acked == total  # each offset acknowledged once, by its owner
    assert first.acked >= 1_000
    assert second.acked >= total // 2


async def test_resumes_from_committed_offsets_after_broker_restart(
    restartable_kafka_broker: Service, make_topic: MakeTopic
) -> None:
    bootstrap = restartable_kafka_broker.address
    topic = await make_topic(bootstrap=bootstrap)
    await produce(bootstrap, topic, [b"0", b"1", b"2"])
    trigger = trigger_for(bootstrap, topic)

    async with running(trigger) as received:
        await received.wait_for(3)
        await wait_committed(trigger, {0: 3})

        restartable_kafka_broker.stop()
        restartable_kafka_broker.start()
        await wait_committed(trigger, {0: 3})  # kept in s3 storage across the restart
        await produce(bootstrap, topic, [b"3", b"4"])

        await received.wait_for(5, timeout_s=60)
        await wait_committed(trigger, {0: 5}, timeout_s=30)

    assert received.keys == [f"{topic}/0/{offset}" for offset in range(5)]


async def wait_lag(trigger: KafkaTrigger, expected: int, *, timeout_s: float = 20) -> None:
    """Wait until the trigger's lag is ``expected``; it is measured once per poll."""
    with anyio.fail_after(timeout_s):
        # An attribute the poll loop sets: there is no event to wait on.
        while trigger.lag != expected:  # noqa: ASYNC110
            await asyncio.sleep(0.05)


async def test_lag_counts_messages_not_yet_acked_over_every_partition(
    kafka_broker: str, make_topic: MakeTopic
) -> None:
    topic = await make_topic(partitions=2)
    await produce(kafka_broker, topic, ({"value": b"%d" % i, "partition": 0} for i in range(5)))
    trigger = trigger_for(kafka_broker, topic)
    assert trigger.lag is None

    async with running(trigger, ack=False) as received:
        events = await received.wait_for(5)
        await wait_lag(trigger, 5)  # partition 1 is empty: it counts 0, not unknown
        for event in events[:2]:
            assert event.ack is not None
            await event.ack()
        await wait_lag(trigger, 3)
        for event in events[2:]:
            assert event.ack is not None
            await event.ack()
        await wait_lag(trigger, 0)

    assert trigger.lag is None  # stopped: unknown
